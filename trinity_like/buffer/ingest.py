"""Import and export: files of Experience rows or chat records in, Parquet or JSONL out.

Accepted input (JSONL, one object per line, or Parquet, one record per row):
- Experience rows: the fields of DESIGN.md (``prompt_ids`` and ``response_ids`` required; the rest optional);
- chat records: ``messages`` (OpenAI-style: ``{"role", "content"}``, assistant ``tool_calls``, ``tool``
  messages) and no token ids, tokenised with the given tokenizer (``trinity_like.common.chat``); the messages
  before the first assistant turn are the prompt, everything after is the response, and only the assistants'
  tokens (text, tool calls, closing end token) get ``action_mask`` true. Besides the Experience fields a chat
  record may carry ``tools`` (the JSON schemas offered to the model: rendered as the template or the plain
  format renders them, and kept under ``info.tools``) and ``turn_rewards`` (one number per assistant turn,
  placed in ``token_rewards`` on the last token of that turn, its end token; the trainer adds ``reward`` on
  the last response token on top);
- preference pairs: ``prompt`` (or ``messages``: a string, taken as one user turn, or a list of messages),
  ``chosen`` and ``rejected`` (each a string, one assistant message, or a list of messages starting with an
  assistant turn), optionally ``tools``, ``task_id``, ``info``, ``source``. A pair becomes two rows sharing
  one ``group_id``: the chosen one with reward 1.0, the rejected one with 0.0 (what DPO's ``preference_pairs``
  reads), ``info.preference`` "chosen"/"rejected", source ``human`` unless given. Only the completion's
  assistant tokens are masked in, so a prompt may hold earlier assistant turns as context. A pair goes in
  whole or not at all.

- SFT rows as Trinity-RFT writes them (``trinity_row_to_experiences``): ``prompt`` and ``response`` (one user and
  one assistant message; the response is what is trained), or ``message`` (Trinity's default name for a
  conversation, its last message trained); the row's other columns are left out.

Offline runs read such data, and any SFT/DPO data in Trinity-RFT's shape, directly as ``buffer.replay_sources``:
``replay_table`` tokenises it as it is read, by ``buffer.replay_format`` (nothing is written).

Every record is validated; a bad one is reported with its line number and reason (naming the field) and
written to a rejects file, the good ones go in as one atomic segment (``strict`` takes none if any is bad).
Token ids that no model can train on refuse the whole ingest instead (UserError, nothing written): a negative
id always, and an id past the vocabulary of the run's model when the buffer is a run's (``<run>/buffer`` with
``<run>/config.yaml`` naming ``model.path``); such ids mean the file was tokenised for another model, so the
other records of that file are suspect too. (With ``--tokenizer``, an id past that tokenizer's vocabulary
only rejects its record, as before.) A
record without an ``eid`` gets one derived from its content, so ingesting the same file twice adds nothing the
second time; rows whose eid is already in the buffer are skipped and counted as duplicates.

Without ``--source`` (``source`` None) rows are ``import`` and preference pairs ``human``; a record's own
``source`` field wins over both.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from trinity_like.buffer.segments import stored_eids
from trinity_like.buffer.writer import BufferWriter
from trinity_like.common.errors import UserError
from trinity_like.common.experience import SOURCES, Experience, experiences_to_table, table_row_problems
from trinity_like.common.fs import atomic_write_text
from trinity_like.common.tokenizer import model_vocab_size

_FIELDS = {f.name for f in fields(Experience)}
_ID_LISTS = ("prompt_ids", "response_ids")
_PER_TOKEN = ("action_mask", "logprobs", "token_rewards", "token_versions")
_CHAT_EXTRAS = ("tools", "turn_rewards")
"""Keys a chat record may carry besides the Experience fields."""
_PAIR_KEYS = {"prompt", "messages", "chosen", "rejected", "tools", "task_id", "info", "source"}
"""Keys of a preference pair; anything else (``reward`` included: the pair defines it) is refused."""


@dataclass
class IngestReport:
    accepted: int = 0
    duplicates: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    """``{"line": n, "reason": "..."}`` per bad record."""
    segment: str | None = None
    rejects_file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "duplicates": self.duplicates, "rejected": len(self.rejected),
                "rejects": self.rejected[:20], "segment": self.segment, "rejects_file": self.rejects_file}


def read_records(path: Path) -> list[tuple[int, Any]]:
    """(line number, record) pairs; a JSON syntax error becomes a record that fails validation."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(enumerate(pq.read_table(path).to_pylist(), start=1))
    if path.suffix not in (".jsonl", ".json"):
        raise UserError(f"cannot ingest '{path}': give .jsonl or .parquet files")
    out: list[tuple[int, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                out.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                out.append((n, _BadJson(str(e))))
    return out


@dataclass
class _BadJson:
    error: str


def content_eid(record: dict[str, Any]) -> str:
    """A stable id from a record's content (eid and created_at left out)."""
    body = {k: v for k, v in record.items() if k not in ("eid", "created_at")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:32]


class RecordError(ValueError):
    pass


def _check_ints(name: str, values: Any, vocab_size: int | None) -> list[int]:
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise RecordError(f"{name} must be a list of integers")
    if vocab_size is not None and any(not 0 <= v < vocab_size for v in values):
        bad = next(v for v in values if not 0 <= v < vocab_size)
        raise RecordError(f"{name} holds token id {bad}, outside the vocabulary (0..{vocab_size - 1})")
    return values


def chat_to_tokens(messages: Any, tokenizer, tools: list[dict] | None = None) -> tuple[list[int], list[int], list[bool]]:
    """(prompt_ids, response_ids, action_mask) of a conversation (``trinity_like.common.chat``): the policy's
    tokens are the assistants' texts and tool calls and the end token that closes each of them."""
    prompt, response, mask, _ = _chat_split(messages, tokenizer, tools)
    return prompt, response, mask


def _chat_split(messages: Any, tokenizer, tools: list[dict] | None = None, prompt_messages: int | None = None,
                field_name: str = "") -> tuple[list[int], list[int], list[bool], list[int]]:
    """``split_conversation_turns`` of raw messages; a ChatFormatError becomes a RecordError that names the
    record's field."""
    from trinity_like.common.chat import ChatFormatError, normalize_messages, split_conversation_turns

    try:
        return split_conversation_turns(normalize_messages(messages), tokenizer, tools, prompt_messages)
    except ChatFormatError as e:
        raise RecordError(f"{field_name}: {e}" if field_name else str(e)) from None


def _check_tools(tools: Any, where: str = "tools") -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RecordError(f"{where} must be a list of tool schemas (JSON objects)")
    return tools


def _turn_rewards(values: Any, turn_ends: list[int], n: int) -> list[float]:
    """Per-token rewards with ``values[k]`` on the last token of the k-th assistant turn, zero elsewhere."""
    if not isinstance(values, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        raise RecordError("turn_rewards must be a list of finite numbers, one per assistant turn")
    if len(values) != len(turn_ends):
        raise RecordError(f"turn_rewards has {len(values)} entries but the messages hold {len(turn_ends)} "
                          "assistant turn(s); give one per assistant turn")
    out = [0.0] * n
    for end, value in zip(turn_ends, values, strict=True):
        out[end] += float(value)
    return out


def record_to_experiences(record: Any, source: str | None, vocab_size: int | None,
                          tokenizer=None) -> list[Experience]:
    """Validate one record and build its rows: two for a preference pair (``chosen`` / ``rejected``), one
    otherwise; RecordError with the reason otherwise (then no row at all)."""
    if isinstance(record, dict) and ("chosen" in record or "rejected" in record):
        return preference_to_experiences(record, source or "human", vocab_size, tokenizer)
    if isinstance(record, dict) and not set(record) & {"prompt_ids", "response_ids", "messages"} and (
            {"prompt", "response"} <= set(record) or "message" in record):  # Trinity-RFT's SFT rows
        from trinity_like.config.schema import TaskFormatConfig

        if tokenizer is None:
            raise RecordError("an SFT row (prompt and response, or message) needs --tokenizer")
        shape, fmt = row_shape(TaskFormatConfig(), list(record))
        return trinity_row_to_experiences(record, shape, fmt, tokenizer, vocab_size, source=source)
    return [record_to_experience(record, source or "import", vocab_size, tokenizer)]


def _is_chat(data: dict[str, Any]) -> bool:
    return "prompt_ids" not in data and "response_ids" not in data and "messages" in data


def record_to_experience(record: Any, source: str, vocab_size: int | None, tokenizer=None) -> Experience:
    """Validate one Experience row or chat record and build its Experience; RecordError with the reason
    otherwise."""
    if isinstance(record, _BadJson):
        raise RecordError(f"not valid JSON: {record.error}")
    if not isinstance(record, dict):
        raise RecordError("a record must be a JSON object")
    record = {k: v for k, v in record.items() if v is not None or k in _FIELDS}
    extras = set(_CHAT_EXTRAS) if _is_chat(record) else set()
    unknown = sorted(set(record) - _FIELDS - extras)
    if unknown:
        hint = (f"; {', '.join(_CHAT_EXTRAS)} belong to chat records (messages without token ids)"
                if set(unknown) & set(_CHAT_EXTRAS) else "")
        raise RecordError(f"unknown field(s) {', '.join(unknown)}; put extra data under 'info'{hint}")
    data = dict(record)
    for name in ("messages", "info", "tools"):  # Parquet exports keep these as JSON text
        if isinstance(data.get(name), str):
            try:
                data[name] = json.loads(data[name])
            except json.JSONDecodeError:
                raise RecordError(f"{name} is text that is not valid JSON") from None
    if _is_chat(data):
        if tokenizer is None:
            raise RecordError("a chat record (messages without token ids) needs --tokenizer")
        tools = _check_tools(data.pop("tools", None))
        turn_rewards = data.pop("turn_rewards", None)
        if turn_rewards is not None and data.get("token_rewards") is not None:
            raise RecordError("give turn_rewards or token_rewards, not both")
        data["prompt_ids"], data["response_ids"], data["action_mask"], ends = _chat_split(
            data["messages"], tokenizer, tools, field_name="messages")
        if turn_rewards is not None:
            data["token_rewards"] = _turn_rewards(turn_rewards, ends, len(data["response_ids"]))
        if tools is not None:
            if not isinstance(data.get("info", {}), dict):
                raise RecordError("info must be an object")
            data["info"] = {**data.get("info", {}), "tools": tools}
    for name in _ID_LISTS:
        if name not in data:
            raise RecordError(f"missing required field {name}")
        _check_ints(name, data[name], vocab_size)
    n = len(data["response_ids"])
    if n == 0:
        raise RecordError("response_ids is empty")
    for name in _PER_TOKEN:
        value = data.get(name)
        if value is None:
            continue
        if not isinstance(value, list) or len(value) != n:
            raise RecordError(f"{name} must have one entry per response token ({n}), got "
                              f"{len(value) if isinstance(value, list) else type(value).__name__}")
        if name == "action_mask" and not all(isinstance(v, bool) for v in value):
            raise RecordError("action_mask must hold booleans")
        if name != "action_mask" and not all(isinstance(v, (int, float)) and math.isfinite(v) for v in value):
            raise RecordError(f"{name} must hold finite numbers")
    reward = data.get("reward")
    if reward is not None and (not isinstance(reward, (int, float)) or isinstance(reward, bool)
                               or not math.isfinite(reward)):
        raise RecordError(f"reward must be a finite number, got {reward!r}")
    if not isinstance(data.get("info", {}), dict):
        raise RecordError("info must be an object")
    data["source"] = data.get("source") or source
    if data["source"] not in SOURCES:
        raise RecordError(f"source must be one of {', '.join(SOURCES)}")
    data.setdefault("eid", content_eid(record))
    data.setdefault("group_id", data["eid"])
    data.setdefault("model_version", -1)
    try:
        return Experience.from_json_dict(data)
    except (TypeError, ValueError) as e:
        raise RecordError(str(e)) from None


def _as_messages(value: Any, name: str, role: str) -> list[Any]:
    """A pair's ``prompt`` / ``chosen`` / ``rejected`` as a list of messages: a string is one ``role`` turn,
    an object one message (an assistant one when it names no role)."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, dict):
        return [{"role": role, **value}]
    if isinstance(value, list) and value:
        return value
    raise RecordError(f"{name} must be a string, a message object or a non-empty list of messages")


def _normalized(messages: list[Any], name: str) -> list[dict[str, Any]]:
    """``normalize_messages`` with errors naming the record's field (``chosen[1]: ...``)."""
    from trinity_like.common.chat import ChatFormatError, normalize_messages

    try:
        return normalize_messages(messages)
    except ChatFormatError as e:
        msg = str(e)
        raise RecordError(name + msg[len("messages"):] if msg.startswith("messages") else f"{name}: {msg}") from None


def preference_to_experiences(record: dict[str, Any], source: str, vocab_size: int | None,
                              tokenizer) -> list[Experience]:
    """The (chosen, rejected) rows of one preference pair: one ``group_id``, rewards 1.0 and 0.0. Both rows
    share the prompt's tokens; the mask covers the completion's assistant tokens only."""
    record = {k: v for k, v in record.items() if v is not None}
    unknown = sorted(set(record) - _PAIR_KEYS)
    if unknown:
        raise RecordError(f"unknown field(s) {', '.join(unknown)} in a preference pair; it takes "
                          f"{', '.join(sorted(_PAIR_KEYS))} (rewards come from chosen/rejected: 1.0 and 0.0)")
    for name in ("chosen", "rejected"):
        if record.get(name) is None:
            raise RecordError(f"a preference pair needs both chosen and rejected; {name} is missing")
    if ("prompt" in record) == ("messages" in record):
        raise RecordError("a preference pair needs its prompt, as prompt or messages (one of the two)")
    if tokenizer is None:
        raise RecordError("a preference pair (chat text, no token ids) needs --tokenizer")
    prompt_key = "prompt" if "prompt" in record else "messages"
    tools = _check_tools(record.get("tools"))
    info = record.get("info", {})
    if not isinstance(info, dict):
        raise RecordError("info must be an object")
    group = content_eid(record)
    prompt_raw = _as_messages(record[prompt_key], prompt_key, "user")
    prompt = _normalized(prompt_raw, prompt_key)
    rows = []
    for side, reward in (("chosen", 1.0), ("rejected", 0.0)):
        completion_raw = _as_messages(record[side], side, "assistant")
        completion = _normalized(completion_raw, side)
        if completion[0]["role"] != "assistant":
            raise RecordError(f"{side}[0]: the completion must start with an assistant message, got role "
                              f"{completion[0]['role']!r}")
        prompt_ids, response_ids, mask, _ = _chat_split(prompt + completion, tokenizer, tools, len(prompt), side)
        row = {"eid": content_eid({"pair": group, "side": side}), "group_id": group, "source": source,
               "prompt_ids": prompt_ids, "response_ids": response_ids, "action_mask": mask, "reward": reward,
               "messages": prompt_raw + completion_raw,
               "info": {**info, "preference": side, **({"tools": tools} if tools else {})}}
        if "task_id" in record:
            row["task_id"] = record["task_id"]
        if "source" in record:
            row["source"] = record["source"]
        rows.append(record_to_experience(row, source, vocab_size))
    return rows


def ingest_files(paths: list[Path], buffer_dir: Path, source: str | None = None, tokenizer_path: str | None = None,
                 strict: bool = False) -> IngestReport:
    """Validate every record of ``paths`` and write the good ones as one segment. ``source`` None: ``import``
    for rows and chat records, ``human`` for preference pairs."""
    tokenizer, vocab_size = None, None
    if tokenizer_path:
        from trinity_like.common.tokenizer import hf_tokenizer

        tokenizer = hf_tokenizer(tokenizer_path)
        vocab_size = len(tokenizer)
    report = IngestReport()
    seen = stored_eids(buffer_dir)
    good: list[Experience] = []
    origin: list[str] = []
    """``file:line`` of each good row."""
    bad_lines: list[str] = []
    for path in paths:
        for line, record in read_records(path):
            try:
                exps = record_to_experiences(record, source, vocab_size, tokenizer)
            except RecordError as e:
                report.rejected.append({"file": str(path), "line": line, "reason": str(e)})
                raw = record.__dict__ if isinstance(record, _BadJson) else record
                bad_lines.append(json.dumps({"file": str(path), "line": line, "reason": str(e), "record": raw},
                                            default=str))
                continue
            for exp in exps:
                if exp.eid in seen:
                    report.duplicates += 1
                    continue
                seen.add(exp.eid)
                good.append(exp)
                origin.append(f"{path}:{line}")
    table = experiences_to_table(good) if good else None
    if table is not None:
        _refuse_bad_token_ids(table, origin, run_model(buffer_dir))
    if bad_lines:
        rejects = buffer_dir / "rejects" / f"rejects-{time.time_ns()}.jsonl"
        atomic_write_text(rejects, "\n".join(bad_lines) + "\n")
        report.rejects_file = str(rejects)
    if good and not (strict and report.rejected):
        info = BufferWriter(buffer_dir, writer_id=f"ingest-{source or 'auto'}").write_table(table)
        report.accepted, report.segment = len(good), info.name
    return report


def run_model(buffer_dir: Path) -> Path | None:
    """The model folder of the run a buffer belongs to (``<run>/buffer`` beside ``<run>/config.yaml`` with
    ``model.path``, resolved as the run resolves it), or None when the buffer is not a run's."""
    import yaml

    config = Path(buffer_dir).absolute().parent / "config.yaml"
    if Path(buffer_dir).name != "buffer" or not config.is_file():
        return None
    try:
        path = ((yaml.safe_load(config.read_text()) or {}).get("model") or {}).get("path")
    except (yaml.YAMLError, AttributeError):
        return None
    return Path(path).expanduser() if path else None


def _refuse_bad_token_ids(table, origin: list[str], model: Path | None) -> None:
    """UserError naming the first row (file:line) whose token ids no model, or not the run's ``model``, can
    train on; the record checks before this one leave token ids as the only thing that can be wrong here."""
    vocab_size = model_vocab_size(model) if model is not None else None
    problems = table_row_problems(table, vocab_size)
    if not problems:
        return
    row, problem = next(iter(problems.items()))
    more = f" (and {len(problems) - 1} more row(s))" if len(problems) > 1 else ""
    whose = f" of the run's model {model}" if vocab_size is not None else ""
    raise UserError(f"{origin[row]}: {problem}{whose}{more}; nothing was ingested. Token ids must come from the "
                    f"model's own tokenizer: re-tokenise the file with it, or ingest chat records (messages) with "
                    f"--tokenizer {model or 'MODEL_DIR'}")


def export(buffer_dir: Path, out: Path, where: str | None = None) -> int:
    """Write the rows matching ``where`` to ``out`` (.parquet or .jsonl), atomically; return the row count."""
    from trinity_like.buffer.sql import query
    from trinity_like.common.experience import EXPERIENCE_SCHEMA, table_to_experiences
    from trinity_like.common.fs import atomic_write_with

    table = query(buffer_dir, where or "TRUE").select([f.name for f in EXPERIENCE_SCHEMA])
    if out.suffix == ".parquet":
        import pyarrow.parquet as pq

        atomic_write_with(out, lambda tmp: pq.write_table(table.cast(EXPERIENCE_SCHEMA), tmp))
    elif out.suffix == ".jsonl":
        lines = [e.to_json() for e in table_to_experiences(table)]
        atomic_write_text(out, "".join(line + "\n" for line in lines))
    else:
        raise UserError(f"cannot export to '{out}': give a .parquet or .jsonl path")
    return table.num_rows


# --- SFT / DPO data as Trinity-RFT reads it ------------------------------------------------------------------------

TRINITY_SHAPES = ("messages", "plaintext", "pair")
"""What a row of SFT/DPO data is (``row_shape``): a conversation, a prompt and its response, a preference pair."""


def is_experience_source(path: Path) -> bool:
    """Whether a replay source holds Experience rows (read as they are: a buffer folder or run directory, a buffer
    segment, a Parquet or JSON Lines file whose rows carry ``prompt_ids``) rather than SFT/DPO data to tokenise
    (``replay_table``)."""
    if path.is_dir():
        return any((path / p).exists() for p in ("segments", "buffer", "config.yaml", "catalog.json"))
    if path.suffix == ".arrow":
        from trinity_like.buffer.segments import SegmentInfo

        return SegmentInfo.parse(path) is not None
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return "prompt_ids" in pq.read_schema(path).names
        except (OSError, pa.ArrowException):
            return False
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    try:
                        first = json.loads(line)
                    except json.JSONDecodeError:
                        return False
                    return isinstance(first, dict) and "prompt_ids" in first
    return False


def row_shape(fmt: Any, columns: list[str]) -> tuple[str, Any]:
    """(shape, format) of SFT/DPO rows with ``columns`` read with ``fmt`` (a ``TaskFormatConfig``, read by attribute):
    ``pair`` when ``prompt_type`` is ``chatpair`` or the chosen and rejected columns are there, else ``messages`` or
    ``plaintext`` as ``prompt_type`` says. ``fmt`` at its defaults lets the columns decide (``messages`` or
    ``message``: a conversation; ``chosen``/``rejected``: a pair; ``prompt``/``response``: plaintext); the format
    returned then names the columns found. RecordError naming the columns when they fit no shape."""
    from dataclasses import replace

    cols = set(columns)
    if fmt == type(fmt)():
        key = next((k for k in ("messages", "message") if k in cols), None)
        if {"chosen", "rejected"} <= cols and (key or "prompt" in cols):
            return "pair", replace(fmt, prompt_type="messages" if key and "prompt" not in cols else "plaintext",
                                   messages_key=key or fmt.messages_key)
        if key:
            return "messages", replace(fmt, prompt_type="messages", messages_key=key)
        if {"prompt", "response"} <= cols:
            return "plaintext", fmt
        raise RecordError(f"its columns ({', '.join(columns)}) are neither Experience rows (prompt_ids, response_ids) "
                          "nor SFT/DPO data (messages, prompt and response, chosen and rejected); name its columns "
                          "in buffer.replay_format (prompt_type, messages_key, prompt_key, response_key, chosen_key, "
                          "rejected_key)")
    if fmt.prompt_type == "chatpair" or {fmt.chosen_key, fmt.rejected_key} <= cols:
        return "pair", fmt
    return ("messages" if fmt.prompt_type == "messages" else "plaintext"), fmt


def _json_value(value: Any, column: str) -> Any:
    """A column that may hold JSON text (Trinity's files often keep messages and tools so)."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise RecordError(f"column '{column}' is text that is not valid JSON") from None
    return value


def _column(row: dict[str, Any], column: str, what: str) -> Any:
    if row.get(column) is None:
        raise RecordError(f"column '{column}' ({what}) is missing or null")
    return row[column]


def _with_text_tool_results(messages: Any) -> Any:
    """Tool messages whose content is a JSON object (Trinity's sft_with_tools data) carry it as JSON text."""
    if not isinstance(messages, list):
        return messages
    return [{**m, "content": json.dumps(m["content"], ensure_ascii=False)}
            if isinstance(m, dict) and m.get("role") == "tool" and isinstance(m.get("content"), (dict, list))
            and not (isinstance(m.get("content"), list) and all(isinstance(p, dict) and "type" in p for p in m["content"]))
            else m for m in messages]


def _prompt_of(row: dict[str, Any], fmt: Any) -> list[dict[str, Any]]:
    """A plaintext row's prompt: the system prompt (the row's ``system_prompt_key`` column where not empty, else
    ``system_prompt``) and the ``prompt_key`` text as one user message."""
    system = (str(row.get(fmt.system_prompt_key) or "") if fmt.system_prompt_key else "") or fmt.system_prompt
    prompt = _json_value(_column(row, fmt.prompt_key, "format.prompt_key"), fmt.prompt_key)
    if isinstance(prompt, list):
        return prompt
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": str(prompt)}]


def trinity_row_to_experiences(row: dict[str, Any], shape: str, fmt: Any, tokenizer, vocab_size: int | None,
                               index: int = 0, source: str | None = None) -> list[Experience]:
    """The experiences of one SFT/DPO row as Trinity-RFT's formatters read it (``SFTFormatter``, ``DPOFormatter``):

    - ``messages``: the ``messages_key`` conversation (or its JSON text), ``tools_key`` offered; its last message is
      the response and everything before it the prompt, or, with ``enable_concatenated_multi_turn``, everything
      after the first assistant turn is the response with only the assistants' tokens trained;
    - ``plaintext``: the system prompt, the ``prompt_key`` user message, the ``response_key`` assistant reply;
    - ``pair``: the prompt (``messages_key`` conversation for ``messages``, else as plaintext builds it) with the
      ``chosen_key`` and ``rejected_key`` replies: two rows of one group, rewards 1.0 and 0.0 (as ``buffer ingest``
      makes a pair).

    Each row's eid comes from its content and ``index`` (its row in the data, kept as ``info.row``), so the same data
    gives the same rows and a row written twice in a file is two samples, as Trinity reads it. RecordError with the
    reason."""
    if shape == "pair":
        if fmt.prompt_type == "messages":
            prompt = _with_text_tool_results(_json_value(_column(row, fmt.messages_key, "format.messages_key"),
                                                         fmt.messages_key))
        else:
            prompt = _prompt_of(row, fmt)
        record = {"messages": prompt,
                  "chosen": _json_value(_column(row, fmt.chosen_key, "format.chosen_key"), fmt.chosen_key),
                  "rejected": _json_value(_column(row, fmt.rejected_key, "format.rejected_key"), fmt.rejected_key),
                  "info": {"row": index}}
        return preference_to_experiences(record, source or "human", vocab_size, tokenizer)
    tools = None
    if shape == "messages":
        messages = _with_text_tool_results(_json_value(_column(row, fmt.messages_key, "format.messages_key"),
                                                       fmt.messages_key))
        tools = _check_tools(_json_value(row.get(fmt.tools_key), fmt.tools_key) or None, f"column '{fmt.tools_key}'")
    else:
        messages = _prompt_of(row, fmt) + [
            {"role": "assistant", "content": str(_column(row, fmt.response_key, "format.response_key"))}]
    if not isinstance(messages, list) or not messages:
        raise RecordError(f"column '{fmt.messages_key}' is not a list of chat messages")
    last = messages[-1].get("role") if isinstance(messages[-1], dict) else None
    if last != "assistant":
        raise RecordError(f"the conversation ends with a {last!r} message; its last message is the response "
                          "trained on and must be the assistant's")
    prompt_messages = None if getattr(fmt, "enable_concatenated_multi_turn", False) else len(messages) - 1
    prompt_ids, response_ids, mask, _ = _chat_split(messages, tokenizer, tools, prompt_messages,
                                                    field_name=fmt.messages_key if shape == "messages" else "")
    data = {"prompt_ids": prompt_ids, "response_ids": response_ids, "action_mask": mask, "messages": messages,
            "info": {"row": index, **({"tools": tools} if tools else {})}}
    data["eid"] = content_eid({"row": row, "shape": shape, "index": index})
    return [record_to_experience(data, source or "import", vocab_size)]


def replay_table(path: str | Path, tokenizer_path: str, fmt: Any, split: str = "train", subset_name: str = "",
                 vocab_size: int | None = None):
    """Experience rows of SFT/DPO data (a file, a folder laid out as Hugging Face data sets are, a hub id in the
    local cache: ``trinity_like.common.datasets``), tokenised as they are read with the tokenizer at
    ``tokenizer_path`` (``fmt.chat_template`` in place of its own when set): an offline run's ``replay_sources`` that
    are not Experience rows. Nothing is written. UserError in one line naming the file, the row, what is wrong and
    the fix."""
    from trinity_like.common.datasets import read_rows
    from trinity_like.common.tokenizer import hf_tokenizer

    data = read_rows(path, subset_name, split, key="buffer.replay_sources")
    try:
        shape, fmt = row_shape(fmt, data.columns)
    except RecordError as e:
        raise UserError(f"buffer.replay_sources: {data.origin}: {e}") from None
    tokenizer = hf_tokenizer(tokenizer_path)
    if getattr(fmt, "chat_template", ""):
        tokenizer.chat_template = fmt.chat_template
    exps: list[Experience] = []
    for i, row in enumerate(data.rows):
        try:
            exps += trinity_row_to_experiences(row, shape, fmt, tokenizer, vocab_size, index=i)
        except RecordError as e:
            raise UserError(f"buffer.replay_sources: {data.origin} row {i} (read as {shape} SFT/DPO data): {e}; fix "
                            "the row, or name its columns in buffer.replay_format") from None
    return experiences_to_table(exps)
