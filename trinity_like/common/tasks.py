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

Trinity-RFT's task sets (any columns, read as Hugging Face ``datasets`` reads them: ``trinity_like.common.datasets``)
become Tasks by their ``format`` (``rows_to_tasks``): each keeps its whole row as ``raw_task`` (what Trinity's
workflows and reward functions read), and the columns ``TASK_ROW_COLUMNS`` keep it and the set's rendering settings
(``chat_template``, ``enable_thinking``; a reply prefix is the conversation's final assistant message) in a task file
of ours, so such a task too loads back equal.

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
import re
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

TASK_ROW_COLUMNS = ("raw_task", "workflow", "reward_fn", "chat_template", "enable_thinking")
"""Optional columns of ours for a task read from a Trinity-RFT row (``trinity_like.common.datasets``), written when a
task carries any of them: ``raw_task`` (JSON text of the whole row), ``workflow``, ``reward_fn``, ``chat_template``
(text) and ``enable_thinking`` (JSON text: true, false or null)."""

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
    """Chat messages that form the prompt (verl's data files, Trinity-RFT's rows); None = ``prompt`` is the raw text.
    A final assistant message is a reply prefix: the model continues it (``prompt_ids``)."""
    extra_info: dict[str, Any] = field(default_factory=dict)
    """Per-task extras handed to the reward function (verl's ``extra_info``)."""
    prompt_token_ids: tuple[int, ...] | None = None
    """The prompt's token ids as the prompt limit cut them (``limit_prompts``); None = not cut, ``prompt_ids``
    renders them from ``messages`` or ``prompt``."""
    raw_task: dict[str, Any] = field(default_factory=dict)
    """The row as a Trinity-RFT task file gave it (Trinity's ``Task.raw_task``: every column, JSON values), read by
    workflows and reward functions of Trinity's shape (``raw_task[format.prompt_key]``); empty for a task not read
    through ``trinity_like.common.datasets`` (ours, verl's, generated)."""
    workflow: str = ""
    """This task's own workflow, from the column ``format.workflow_key`` names; empty = the task set's."""
    reward_fn: str = ""
    """This task's own reward function, from the column ``format.reward_fn_key`` names; empty = the task set's."""
    chat_template: str = ""
    """The Jinja chat template ``prompt_ids`` renders ``messages`` with (the task set's ``format.chat_template``);
    empty = the tokenizer's."""
    enable_thinking: bool | None = None
    """Handed to the chat template as ``enable_thinking`` (Qwen3's switch; ``format.enable_thinking``); None = not
    passed, the template's default."""


def prompt_ids(task: Task, tokenizer) -> list[int]:
    """The prompt's token ids: those the prompt limit kept (``Task.prompt_token_ids``) for a task it cut, else the
    chat messages rendered as Trinity-RFT renders a prompt (``trinity_like.common.chat.render_prompt_ids``: the
    task's chat template or the tokenizer's, a generation prompt, or the final assistant message continued when
    it is a reply prefix), or the raw prompt text encoded."""
    if task.prompt_token_ids is not None:
        return list(task.prompt_token_ids)
    if task.messages:
        from trinity_like.common.chat import render_prompt_ids

        return render_prompt_ids(list(task.messages), tokenizer, chat_template=task.chat_template or None,
                                 enable_thinking=task.enable_thinking)
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
    that is not a string as JSON), ``data_source``, ``TASK_JSON_COLUMNS`` when a task carries messages,
    ``extra_info`` or such a ground truth, and ``TASK_ROW_COLUMNS`` when a task carries a Trinity-RFT row or its
    settings. ValueError naming the task when a value is not JSON (a date, bytes)."""
    import pyarrow as pa

    cols: dict[str, list] = {"task_id": [t.task_id for t in tasks], "prompt": [t.prompt for t in tasks],
                             "answer": [t.answer if isinstance(t.answer, str) else _json(t, "answer", t.answer)
                                        for t in tasks],
                             "data_source": [t.data_source for t in tasks]}
    if any(t.messages is not None or t.extra_info or not isinstance(t.answer, str) for t in tasks):
        cols["messages"] = [None if t.messages is None else _json(t, "messages", list(t.messages)) for t in tasks]
        cols["extra_info"] = [_json(t, "extra_info", t.extra_info) for t in tasks]
        cols["ground_truth"] = [None if isinstance(t.answer, str) else cols["answer"][i] for i, t in enumerate(tasks)]
    if any(t.raw_task or t.workflow or t.reward_fn or t.chat_template or t.enable_thinking is not None for t in tasks):
        cols["raw_task"] = [_json(t, "raw_task", t.raw_task) for t in tasks]
        cols["workflow"] = [t.workflow for t in tasks]
        cols["reward_fn"] = [t.reward_fn for t in tasks]
        cols["chat_template"] = [t.chat_template for t in tasks]
        cols["enable_thinking"] = [None if t.enable_thinking is None else json.dumps(t.enable_thinking) for t in tasks]
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
                         "messages), reward_model (with ground_truth), data_source and extra_info; or name its "
                         "columns in explorer.taskset.format (prompt_key, response_key) to read it as Trinity-RFT "
                         "reads a task set")
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
    raw = _from_json(where, "raw_task", row.get("raw_task")) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: raw_task must be a JSON object, got {type(raw).__name__}")
    thinking = _from_json(where, "enable_thinking", row.get("enable_thinking"))
    if thinking is not None and not isinstance(thinking, bool):
        raise ValueError(f"{where}: enable_thinking must be true, false or null, got {thinking!r}")
    return Task(str(row["task_id"]), str(row["prompt"]), str(row["answer"]) if answer is None else answer,
                str(row.get("data_source") or ""), messages=messages, extra_info=extra, raw_task=raw,
                workflow=str(row.get("workflow") or ""), reward_fn=str(row.get("reward_fn") or ""),
                chat_template=str(row.get("chat_template") or ""), enable_thinking=thinking)


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


PROMPT_TYPES = ("plaintext", "messages", "chatpair")
"""Trinity-RFT's ``format.prompt_type`` values (``rows_to_tasks``)."""


def rows_to_tasks(rows: list[dict[str, Any]], fmt: Any, split: str = "train", origin: str = "the task set",
                  answer_optional: bool = False, fmt_key: str = "format", prompt_optional: bool = False) -> list[Task]:
    """Tasks of the rows of a Trinity-RFT task set (``trinity_like.common.datasets.read_rows``) read with ``fmt``, a
    ``TaskFormatConfig`` (read by attribute: ``common`` sits below ``config``). Each task keeps its whole row as
    ``raw_task`` (Trinity's workflows read ``raw_task[format.prompt_key]`` and ``raw_task[format.response_key]``),
    its id is ``<split>-<row>``, and its prompt is the conversation Trinity's ``SimpleWorkflow.format_messages``
    builds, rendered by ``prompt_ids`` as Trinity's model renders it:

    - ``plaintext``: ``format.system_prompt`` (or the row's ``system_prompt_key`` column when set and not empty)
      as a system message, the ``prompt_key`` column as the user message (a column of chat messages is taken as
      the conversation itself, as verl's data files hold it), then ``reply_prefix`` as an assistant message that
      the model continues; the answer is the ``response_key`` column;
    - ``messages``: the ``messages_key`` column (a list of chat messages, or its JSON text) is the conversation; a
      final assistant turn is the answer and not part of the prompt (unless the ``response_key`` column exists, which
      then is the answer); the system prompt goes first when the conversation has none; ``reply_prefix`` as above;
    - ``chatpair``: the prompt as ``plaintext`` builds it (or the ``messages_key`` conversation when the row has no
      ``prompt_key`` column), the ``chosen_key`` reply (its text) as the answer.

    Trinity itself builds every task's prompt from ``prompt_key`` whatever ``prompt_type`` says (it reads
    ``prompt_type`` for SFT and DPO data only); ``messages`` and ``chatpair`` task sets are ours to read, as above.
    A number as answer becomes its text (the scorers compare text; ``raw_task`` keeps the number). ``format.workflow_key``
    and ``reward_fn_key`` fill ``Task.workflow``/``reward_fn`` from their columns; ``chat_template`` and
    ``enable_thinking`` are kept on every task for ``prompt_ids``. A ``data_source`` text column picks the scorer as
    in our task files. ``answer_optional``: a missing ``response_key`` column (or a null in it) gives the answer ""
    (for workflows and reward functions that read ``raw_task`` themselves) instead of an error. ``prompt_optional``:
    likewise a missing ``prompt_key`` column (``plaintext``) gives a task without a prompt (text "", no messages), for
    a workflow that builds its prompt from the row (Trinity's frozen_lake_workflow reads ``seed``, ``size``, ``p``).

    ValueError, one line naming ``origin``, the row and column and the fix (the format's keys named under
    ``fmt_key``), for a missing column (naming the columns the rows have), an empty prompt or a conversation that is
    not chat messages."""
    from trinity_like.common.chat import ChatFormatError, normalize_messages

    prompt_type = getattr(fmt, "prompt_type", "plaintext") or "plaintext"
    if prompt_type not in PROMPT_TYPES:
        raise ValueError(f"{fmt_key}.prompt_type '{prompt_type}' is not one of {', '.join(PROMPT_TYPES)}")
    columns = list(dict.fromkeys(c for r in rows for c in r))

    def need(key_name: str, column: str) -> None:
        if column not in columns:
            raise ValueError(f"{origin} has no column '{column}' ({fmt_key}.{key_name}; its columns: "
                             f"{', '.join(columns) or 'none'}); set {fmt_key}.{key_name} to the column that holds it")

    p_key, r_key, m_key = fmt.prompt_key, fmt.response_key, fmt.messages_key
    no_prompt = prompt_optional and prompt_type == "plaintext" and p_key not in columns
    if (prompt_type == "plaintext" and not no_prompt) or (prompt_type == "chatpair" and m_key not in columns):
        need("prompt_key", p_key)
    if prompt_type == "messages":
        need("messages_key", m_key)
    if prompt_type == "chatpair":
        need("chosen_key", fmt.chosen_key)
    elif not answer_optional and not (prompt_type == "messages" and r_key not in columns):
        need("response_key", r_key)
    for key_name in ("system_prompt_key", "workflow_key", "reward_fn_key"):
        if getattr(fmt, key_name, ""):
            need(key_name, getattr(fmt, key_name))
    system = getattr(fmt, "system_prompt", "") or ""
    prefix = getattr(fmt, "reply_prefix", "") or ""
    label = re.sub(r"\[.*?\]", "", split or "train")
    out = []
    for i, row in enumerate(rows):
        where = f"{origin} row {i}"

        def chat(value: Any, column: str, where: str = where) -> list[dict[str, Any]]:
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    raise ValueError(f"{where}: column '{column}' is neither chat messages nor their JSON text") from None
            try:
                return normalize_messages(value)
            except ChatFormatError as e:
                raise ValueError(f"{where}: column '{column}' is not a list of chat messages ({e})") from None

        row_system = str(row.get(fmt.system_prompt_key) or "") if fmt.system_prompt_key else ""
        sys_text = row_system or system
        answer: Any = None
        if prompt_type == "messages" or (prompt_type == "chatpair" and p_key not in columns):
            conv = chat(row.get(m_key), m_key)
            if prompt_type == "messages" and conv[-1]["role"] == "assistant":
                answer = conv[-1]["content"]
                conv = conv[:-1]
            if not conv:
                raise ValueError(f"{where}: column '{m_key}' holds only an assistant turn; a prompt needs a user turn")
            if sys_text and conv[0]["role"] != "system":
                conv = [{"role": "system", "content": sys_text}, *conv]
        elif no_prompt:
            conv = []
        else:
            value = row.get(p_key)
            if isinstance(value, list):
                conv = chat(value, p_key)
                if sys_text and conv[0]["role"] != "system":
                    conv = [{"role": "system", "content": sys_text}, *conv]
            elif value is None or (isinstance(value, str) and not value.strip()):
                raise ValueError(f"{where}: column '{p_key}' ({fmt_key}.prompt_key) is empty; every task needs a prompt")
            else:
                conv = ([{"role": "system", "content": sys_text}] if sys_text else []) + \
                       [{"role": "user", "content": value if isinstance(value, str) else json.dumps(value)}]
        if prompt_type == "chatpair":
            chosen = row.get(fmt.chosen_key)
            answer = chat(chosen, fmt.chosen_key)[-1]["content"] if isinstance(chosen, list) else chosen
        elif r_key in columns and row.get(r_key) is not None:
            answer = row[r_key]
        if answer is None:
            if not answer_optional:
                raise ValueError(f"{where}: column '{r_key}' ({fmt_key}.response_key) is null; every task needs its "
                                 "ground truth")
            answer = ""
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if prefix and conv:
            conv = [*conv, {"role": "assistant", "content": prefix}]
        users = [m for m in conv if m["role"] == "user"]
        source = row.get("data_source")
        shown = (users[-1] if users else conv[-1])["content"] if conv else ""
        out.append(Task(
            task_id=f"{label}-{i}", prompt=str(shown or ""), answer=answer,
            data_source=source if isinstance(source, str) else "", messages=tuple(conv) if conv else None,
            raw_task=dict(row),
            workflow=str(row.get(fmt.workflow_key) or "") if fmt.workflow_key else "",
            reward_fn=str(row.get(fmt.reward_fn_key) or "") if fmt.reward_fn_key else "",
            chat_template=getattr(fmt, "chat_template", "") or "", enable_thinking=getattr(fmt, "enable_thinking", None)))
    if not out:
        raise ValueError(f"{origin} has no rows")
    return out


def is_task_file(path: str | Path) -> bool:
    """Whether ``path`` is a task file ``load_taskset`` reads as it is: a Parquet file with our columns or verl's, or
    meant as ours (a ``task_id`` column; a ``.parquet`` path not there yet, or that cannot be read: ``load_taskset``
    says what is wrong with it). Anything else (JSON Lines, CSV, a folder, a hub id, a Parquet file of other columns)
    is read as Trinity-RFT reads a task set (``reads_rows``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = Path(path).expanduser()
    if p.suffix != ".parquet" or p.is_dir():
        return False
    try:
        names = pq.read_schema(p).names
    except (OSError, pa.ArrowException):
        return True
    return all(c in names for c in TASK_COLUMNS) or all(c in names for c in VERL_COLUMNS) or "task_id" in names


def reads_rows(taskset: Any) -> bool:
    """Whether a task set's config (``TasksetConfig`` / ``EvalTasksetConfig``, read by attribute) names data read as
    Trinity-RFT reads it (``trinity_like.common.datasets`` and ``rows_to_tasks``), to be written as a task file of
    ours in the run directory: a ``path`` that is not a task file (``is_task_file``), or any ``subset_name`` or
    ``format`` key set."""
    if not taskset.path:
        return False
    return bool(taskset.subset_name) or taskset.format != type(taskset.format)() or not is_task_file(taskset.path)
