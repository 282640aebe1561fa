"""Task sets: Parquet files with columns ``task_id``, ``prompt``, ``answer`` (and optionally ``data_source``,
which picks the reward scorer); a generator for one, and demonstrations (the correct answers as chat
records) for a supervised warm-up.

verl's data files are task sets too (``load_taskset`` tells them apart by their columns): a ``prompt`` column
of chat messages (``[{"role": "user", "content": ...}]``), ``data_source``, ``reward_model`` (a struct whose
``ground_truth`` is the answer: a string, or any JSON value for scorers such as countdown) and ``extra_info``
(a struct handed to the reward function; its ``index`` and ``split`` name the task). Their prompts are
rendered by the tokenizer's chat template (``prompt_ids``).

A task file of ours keeps what a verl task carries beyond text in three more columns, JSON text that
``write_taskset`` writes when a task carries it: ``messages`` (the chat messages; null = ``prompt`` is the raw
text), ``extra_info`` (an object) and ``ground_truth`` (the answer when it is not a string; null = ``answer``
is it). A verl task written by ``write_taskset`` therefore loads back as the same Task, whatever the schema of
the verl file it came from; and tasks of files whose columns cannot share one Arrow schema (ours and verl's, a
string ground truth and a struct one, two ``extra_info`` structs with other fields) share one file of ours.
``concat_tasksets`` makes one task set of several files (``explorer.taskset.files``, verl's list-valued
``data.train_files``) that way.

The built-in ``arithmetic`` set asks for the sum of two small numbers ("7+12=") and has an exact answer, so
the reward is checkable and a tiny model can improve on it.

A prompt token limit (``limit_prompts``: ``explorer.max_prompt_tokens``, verl's ``data.max_prompt_length`` with
``data.truncation`` and ``data.filter_overlong_prompts``) is applied once, when the explorer loads its task sets,
to the prompt as ``prompt_ids`` gives it (after the chat template). A task it cuts carries the kept ids
(``Task.prompt_token_ids``, what ``prompt_ids`` then returns) and the text of those ids as its ``prompt``, so the
workflows that build their prompt from the text (``guess_number``, ``tool_agent``) start from the same cut
prompt; what they add around it (an instruction, the tool descriptions) is not counted, as verl counts the data
file's prompt only. For a chat-message task that text is the whole rendered conversation (role headers
included), since the cut applies to it.
"""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trinity_like.common.errors import RunError
from trinity_like.common.fs import atomic_write_with

logger = logging.getLogger(__name__)

TASK_COLUMNS = ("task_id", "prompt", "answer")


TASK_JSON_COLUMNS = ("messages", "extra_info", "ground_truth")
"""Optional columns of ours, JSON text: a task's chat messages, its ``extra_info`` and a ground truth that is not a
string (module docstring)."""

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
    prompt_token_ids: tuple[int, ...] | None = None
    """The prompt's token ids as the prompt limit cut them (``limit_prompts``); None = not cut, ``prompt_ids``
    renders them from ``messages`` or ``prompt``."""


def prompt_ids(task: Task, tokenizer) -> list[int]:
    """The prompt's token ids: those the prompt limit kept (``Task.prompt_token_ids``) for a task it cut, else the
    chat messages rendered with a generation prompt by the tokenizer's chat template
    (``trinity_like.common.chat.render_ids``), or the raw prompt text encoded."""
    if task.prompt_token_ids is not None:
        return list(task.prompt_token_ids)
    if task.messages:
        from trinity_like.common.chat import render_ids

        return list(render_ids(list(task.messages), tokenizer, add_generation_prompt=True))
    return list(tokenizer.encode(task.prompt))


TRUNCATIONS = ("error", "left", "right", "middle")
"""What becomes of a prompt over the token limit (verl's ``data.truncation``): ``error`` refuses the task set,
``left`` keeps the last tokens, ``right`` the first, ``middle`` the first and the last halves."""


def truncate_ids(ids: list[int], max_tokens: int, truncation: str) -> list[int]:
    """``ids`` cut to ``max_tokens`` as verl cuts a prompt: ``left`` keeps the last ``max_tokens``, ``right`` the
    first ``max_tokens``, ``middle`` the first ``max_tokens // 2`` and the last ``max_tokens - max_tokens // 2``.
    ``ids`` no longer than the limit (or a limit of 0) come back whole; ``error`` never cuts (ValueError)."""
    if max_tokens <= 0 or len(ids) <= max_tokens:
        return list(ids)
    if truncation == "left":
        return list(ids[-max_tokens:])
    if truncation == "right":
        return list(ids[:max_tokens])
    if truncation == "middle":
        head = max_tokens // 2
        return list(ids[:head]) + list(ids[len(ids) - (max_tokens - head):])
    raise ValueError(f"a prompt of {len(ids)} tokens is over the limit of {max_tokens} and truncation is "
                     f"{truncation!r}; truncation is one of {', '.join(TRUNCATIONS[1:])} to cut it")


def limit_prompts(tasks: list[Task], tokenizer, max_tokens: int, truncation: str = "error",
                  filter_overlong: bool = False, source: str = "the task set") -> list[Task]:
    """The task set under a prompt token limit, as verl applies ``data.max_prompt_length``: with
    ``filter_overlong`` the tasks whose prompt (``prompt_ids``) is over ``max_tokens`` are dropped (logged with
    their count); else they are cut by ``truncation`` (``truncate_ids``; the cut tasks carry the kept ids and
    their text, module docstring), and with ``error`` the first of them stops the load (RunError naming the
    task, its length, the limit and the fixes). ``max_tokens`` 0 returns ``tasks`` as they are. ``source`` names
    the set in messages. RunError too when the filter drops every task."""
    if max_tokens <= 0:
        return tasks
    lengths = [len(prompt_ids(t, tokenizer)) for t in tasks]
    over = [i for i, n in enumerate(lengths) if n > max_tokens]
    if not over:
        return tasks
    if filter_overlong:
        kept = [t for t, n in zip(tasks, lengths, strict=True) if n <= max_tokens]
        if not kept:
            raise RunError(f"explorer.filter_overlong_prompts dropped all {len(tasks)} tasks of {source}: every "
                           f"prompt is over explorer.max_prompt_tokens={max_tokens} (the shortest has "
                           f"{min(lengths)} tokens); raise max_prompt_tokens")
        logger.warning("%s: dropped %d of %d tasks whose prompt is over %d tokens (explorer.filter_overlong_prompts)",
                       source, len(over), len(tasks), max_tokens)
        return kept
    if truncation == "error":
        first = tasks[over[0]]
        more = f" (and {len(over) - 1} more task(s) over it)" if len(over) > 1 else ""
        raise RunError(f"task '{first.task_id}' of {source} has a prompt of {lengths[over[0]]} tokens, over "
                       f"explorer.max_prompt_tokens={max_tokens}{more}; raise max_prompt_tokens, set "
                       "explorer.prompt_truncation to left, right or middle to cut such prompts, or "
                       "explorer.filter_overlong_prompts=true to drop such tasks")
    out = list(tasks)
    for i in over:
        kept_ids = truncate_ids(prompt_ids(tasks[i], tokenizer), max_tokens, truncation)
        out[i] = replace(tasks[i], prompt_token_ids=tuple(kept_ids),
                         prompt=tokenizer.decode(kept_ids, skip_special_tokens=True))
    logger.warning("%s: cut %d of %d prompts to %d tokens (explorer.prompt_truncation=%s)",
                   source, len(over), len(tasks), max_tokens, truncation)
    return out


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


def taskset_table(tasks: list[Task]):
    """The Arrow table ``write_taskset`` writes: columns ``task_id``, ``prompt``, ``answer`` (text; a ground truth
    that is not a string as JSON), ``data_source``, and ``TASK_JSON_COLUMNS`` when a task carries messages,
    ``extra_info`` or such a ground truth. ValueError naming the task when a value is not JSON (a date, bytes)."""
    import pyarrow as pa

    cols: dict[str, list] = {"task_id": [t.task_id for t in tasks], "prompt": [t.prompt for t in tasks],
                             "answer": [t.answer if isinstance(t.answer, str) else _json(t, "answer", t.answer)
                                        for t in tasks],
                             "data_source": [t.data_source for t in tasks]}
    if any(t.messages is not None or t.extra_info or not isinstance(t.answer, str) for t in tasks):
        cols["messages"] = [None if t.messages is None else _json(t, "messages", list(t.messages)) for t in tasks]
        cols["extra_info"] = [_json(t, "extra_info", t.extra_info) for t in tasks]
        cols["ground_truth"] = [None if isinstance(t.answer, str) else cols["answer"][i] for i, t in enumerate(tasks)]
    return pa.table(cols, schema=pa.schema([(c, pa.string()) for c in cols]))


def _json(task: Task, what: str, value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"task '{task.task_id}': its {what} holds a value a task file keeps only as JSON ({e})") from None


def write_taskset(path: str | Path, tasks: list[Task]) -> Path:
    """Write ``tasks`` as a task file of ours (``taskset_table``), atomically; ``load_taskset`` reads back the same
    Tasks (``prompt_token_ids`` aside: the prompt limit is applied at load)."""
    import pyarrow.parquet as pq

    table = taskset_table(tasks)
    return atomic_write_with(path, lambda tmp: pq.write_table(table, tmp))


def taskset_labels(paths: list[str | Path]) -> list[str]:
    """One label per task file that tells it apart from the others: its name without ``.parquet``, with as many
    parent folders (the same number for every file) as that takes: ``[a.parquet, b.parquet]`` -> ``a``, ``b``;
    verl's ``[~/data/gsm8k/train.parquet, ~/data/math/train.parquet]`` -> ``gsm8k/train``, ``math/train``.
    ValueError when a file is named twice."""
    parts = [Path(os.path.abspath(p)).with_suffix("").parts for p in paths]
    for depth in range(1, max((len(p) for p in parts), default=1) + 1):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    twice = next(p for i, p in enumerate(paths) if parts[i] in parts[:i])
    raise ValueError(f"task file '{twice}' is named twice; name each file once")


def concat_tasksets(paths: list[str | Path]) -> list[Task]:
    """The task files ``paths`` (ours or verl's format, mixed) as one task set: their tasks in order, each id
    prefixed by its file's label (``taskset_labels``) as ``<label>:<id>``, so ids stay unique across files (verl's
    gsm8k and MATH files both have ``train-0``: ``gsm8k/train:train-0``, ``math/train:train-0``). Every file's
    label, even where ids would not collide: a task's id then depends on its file alone, never on what the other
    files hold, and names the file it came from (``WHERE task_id LIKE 'math/train:%'`` in a buffer query).
    Errors as ``load_taskset`` raises them, naming the file."""
    out: list[Task] = []
    for path, label in zip(paths, taskset_labels(paths), strict=True):
        out += [replace(t, task_id=f"{label}:{t.task_id}") for t in load_taskset(path)]
    return out


def load_taskset(path: str | Path) -> list[Task]:
    """Read a task file; raise ValueError naming the file and the missing columns if it is wrong."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file '{path}' does not exist; set explorer.taskset.path (or .files) to "
                                f"Parquet files with columns {', '.join(TASK_COLUMNS)}, or leave both empty to "
                                "generate one")
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
    return [_our_task(path, i, r) for i, r in enumerate(rows)]


def data_sources_of(path: str | Path) -> dict[str, int]:
    """The data sources of a task file and how many rows have each, in order of first appearance, read from its
    ``data_source`` column alone (none: every row ``""``). Errors as pyarrow raises them (``load_taskset`` says
    what is wrong with a file in words)."""
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    if "data_source" not in schema.names:
        return {"": pq.ParquetFile(path).metadata.num_rows}
    counts: dict[str, int] = {}
    for value in pq.read_table(path, columns=["data_source"]).column("data_source").to_pylist():
        key = str(value or "")
        counts[key] = counts.get(key, 0) + 1
    return counts


def _our_task(path: Path, i: int, row: dict[str, Any]) -> Task:
    """One row of a task file of ours as a Task, with what ``TASK_JSON_COLUMNS`` keep (module docstring)."""
    from trinity_like.common.chat import ChatFormatError, normalize_messages

    where = f"task file '{path}' row {i}"
    answer = _from_json(where, "ground_truth", row.get("ground_truth"))
    messages = _from_json(where, "messages", row.get("messages"))
    if messages is not None:
        try:
            messages = tuple(normalize_messages(messages))
        except ChatFormatError as e:
            raise ValueError(f"{where}: its messages are not a list of chat messages ({e})") from None
    extra = _from_json(where, "extra_info", row.get("extra_info")) or {}
    if not isinstance(extra, dict):
        raise ValueError(f"{where}: extra_info must be a JSON object, got {type(extra).__name__}")
    return Task(str(row["task_id"]), str(row["prompt"]), str(row["answer"]) if answer is None else answer,
                str(row.get("data_source") or ""), messages=messages, extra_info=extra)


def _from_json(where: str, column: str, value: Any) -> Any:
    """A ``TASK_JSON_COLUMNS`` value: JSON text parsed (a value that is not text, as Arrow gave it)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: its {column} is not JSON ({e})") from None


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
