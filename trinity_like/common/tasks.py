"""Task sets: Parquet files with columns ``task_id``, ``prompt``, ``answer`` (and optionally ``data_source``,
which picks the reward scorer); a generator for one, and demonstrations (the correct answers as chat
records) for a supervised warm-up.

verl's data files are task sets too (``load_taskset`` tells them apart by their columns): a ``prompt`` column
of chat messages (``[{"role": "user", "content": ...}]``), ``data_source``, ``reward_model`` (a struct whose
``ground_truth`` is the answer: a string, or any JSON value for scorers such as countdown) and ``extra_info``
(a struct handed to the reward function; its ``index`` and ``split`` name the task). Their prompts are
rendered by the tokenizer's chat template (``prompt_ids``).

The built-in ``arithmetic`` set asks for the sum of two small numbers ("7+12=") and has an exact answer, so
the reward is checkable and a tiny model can improve on it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trinity_like.common.fs import atomic_write_with

TASK_COLUMNS = ("task_id", "prompt", "answer")


VERL_COLUMNS = ("prompt", "reward_model")
"""Columns that make a Parquet file a verl data file (``data_source`` and ``extra_info`` are read when present)."""


@dataclass(frozen=True)
class Task:
    task_id: str
    prompt: str
    """The prompt text; for a task given as chat messages, the last user message (for display)."""
    answer: Any
    """The ground truth the reward function receives (a string for ours; any JSON value in verl's files)."""
    data_source: str = ""
    """Which scorer judges the answer (e.g. ``arithmetic``, ``math``); empty = the reward config decides."""
    messages: tuple[dict[str, Any], ...] | None = None
    """Chat messages that form the prompt (verl's data files); None = ``prompt`` is the raw text."""
    extra_info: dict[str, Any] = field(default_factory=dict)
    """Per-task extras handed to the reward function (verl's ``extra_info``)."""


def prompt_ids(task: Task, tokenizer) -> list[int]:
    """The prompt's token ids: the chat messages rendered with a generation prompt by the tokenizer's chat template
    (``trinity_like.common.chat.render_ids``), or the raw prompt text encoded."""
    if task.messages:
        from trinity_like.common.chat import render_ids

        return list(render_ids(list(task.messages), tokenizer, add_generation_prompt=True))
    return list(tokenizer.encode(task.prompt))


def generate_arithmetic(size: int, max_operand: int, seed: int) -> list[Task]:
    """``size`` distinct-as-possible addition tasks ``a+b=`` with 0 <= a, b <= max_operand."""
    rng = random.Random(seed)
    return [
        Task(task_id=f"add-{i:06d}", prompt=f"{a}+{b}=", answer=str(a + b), data_source="arithmetic")
        for i, (a, b) in enumerate((rng.randint(0, max_operand), rng.randint(0, max_operand))
                                   for _ in range(size))
    ]


TASKSET_GENERATORS = {"arithmetic": generate_arithmetic}
"""``explorer.taskset.generate`` / ``eval_tasksets[].generate`` name -> generator ``(size, max_operand, seed)``."""


def demonstrations(tasks: list[Task]) -> list[dict]:
    """One demonstration per task: a chat record whose user turn is the task's prompt and whose assistant turn
    is its answer, ``{"task_id", "messages": [{"role": "user", ...}, {"role": "assistant", ...}], "reward":
    1.0}`` (the import format of ``buffer ingest``)."""
    return [{"task_id": t.task_id,
             "messages": [{"role": "user", "content": t.prompt}, {"role": "assistant", "content": t.answer}],
             "reward": 1.0} for t in tasks]


def write_taskset(path: str | Path, tasks: list[Task]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({c: [getattr(t, c) for t in tasks] for c in (*TASK_COLUMNS, "data_source")})
    return atomic_write_with(path, lambda tmp: pq.write_table(table, tmp))


def load_taskset(path: str | Path) -> list[Task]:
    """Read a task file; raise ValueError naming the file and the missing columns if it is wrong."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file '{path}' does not exist; set explorer.taskset.path to a Parquet "
                                f"file with columns {', '.join(TASK_COLUMNS)}, or leave it empty to generate one")
    import pyarrow as pa

    try:
        table = pq.read_table(path)
    except pa.ArrowException:
        raise ValueError(f"task file '{path}' cannot be read as Parquet; write the tasks as a Parquet file with "
                         f"columns {', '.join(TASK_COLUMNS)}") from None
    missing = [c for c in TASK_COLUMNS if c not in table.column_names]
    if missing and not all(c in table.column_names for c in VERL_COLUMNS):
        raise ValueError(f"task file '{path}' lacks column(s) {', '.join(missing)} (it has "
                         f"{', '.join(table.column_names) or 'none'}); a task file needs columns "
                         f"{', '.join(TASK_COLUMNS)} (and optionally data_source), or verl's columns prompt (chat "
                         "messages), reward_model (with ground_truth), data_source and extra_info")
    if table.num_rows == 0:
        raise ValueError(f"task file '{path}' has no rows")
    rows = table.to_pylist()
    if all(c in table.column_names for c in VERL_COLUMNS):
        return [_verl_task(path, i, r) for i, r in enumerate(rows)]
    return [Task(str(r["task_id"]), str(r["prompt"]), str(r["answer"]), str(r.get("data_source") or ""))
            for r in rows]


def _verl_task(path: Path, i: int, row: dict[str, Any]) -> Task:
    """One row of a verl data file as a Task; a clear error naming the row when it is not in verl's format."""
    from trinity_like.common.chat import ChatFormatError, normalize_messages

    where = f"task file '{path}' row {i}"
    prompt = row["prompt"]
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    try:
        messages = normalize_messages(prompt)
    except ChatFormatError as e:
        raise ValueError(f"{where}: its prompt is not a list of chat messages ({e})") from None
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise ValueError(f"{where}: reward_model has no ground_truth (verl's format: reward_model = "
                         "{style: rule, ground_truth: ...})")
    extra = row.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise ValueError(f"{where}: extra_info must be a struct (a dict), got {type(extra).__name__}")
    index = extra.get("index", i)
    task_id = f"{extra['split']}-{index}" if extra.get("split") else f"row-{index}"
    users = [m for m in messages if m["role"] == "user"]
    text = users[-1]["content"] if users else messages[-1]["content"]
    return Task(task_id=task_id, prompt=str(text or ""), answer=reward_model["ground_truth"],
                data_source=str(row.get("data_source") or ""), messages=tuple(messages), extra_info=dict(extra))
