"""Import and export: files of Experience rows or chat records in, Parquet or JSONL out.

Accepted input (JSONL, one object per line, or Parquet, one record per row):
- Experience rows: the fields of DESIGN.md (``prompt_ids`` and ``response_ids`` required; the rest optional);
- chat records: ``messages`` (a list of ``{"role", "content"}``) and no token ids, tokenised with the given
  tokenizer; the messages before the first assistant turn are the prompt, everything after is the response,
  and only the assistant's content tokens get ``action_mask`` true.

Every record is validated; a bad one is reported with its line number and reason and written to a rejects
file, the good ones go in as one atomic segment (``strict`` takes none if any is bad). A record without an
``eid`` gets one derived from its content, so ingesting the same file twice adds nothing the second time;
rows whose eid is already in the buffer are skipped and counted as duplicates.
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
from trinity_like.common.experience import SOURCES, Experience
from trinity_like.common.fs import atomic_write_text

_FIELDS = {f.name for f in fields(Experience)}
_ID_LISTS = ("prompt_ids", "response_ids")
_PER_TOKEN = ("action_mask", "logprobs", "token_rewards")


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
    from trinity_like.common.chat import ChatFormatError, normalize_messages, split_conversation

    try:
        return split_conversation(normalize_messages(messages), tokenizer, tools)
    except ChatFormatError as e:
        raise RecordError(str(e)) from None


def record_to_experience(record: Any, source: str, vocab_size: int | None, tokenizer=None) -> Experience:
    """Validate one record and build its Experience; RecordError with the reason otherwise."""
    if isinstance(record, _BadJson):
        raise RecordError(f"not valid JSON: {record.error}")
    if not isinstance(record, dict):
        raise RecordError("a record must be a JSON object")
    record = {k: v for k, v in record.items() if v is not None or k in _FIELDS}
    unknown = sorted(set(record) - _FIELDS)
    if unknown:
        raise RecordError(f"unknown field(s) {', '.join(unknown)}; put extra data under 'info'")
    data = dict(record)
    for name in ("messages", "info"):  # Parquet exports keep these as JSON text
        if isinstance(data.get(name), str):
            try:
                data[name] = json.loads(data[name])
            except json.JSONDecodeError:
                raise RecordError(f"{name} is text that is not valid JSON") from None
    if "prompt_ids" not in data and "response_ids" not in data and "messages" in data:
        if tokenizer is None:
            raise RecordError("a chat record (messages without token ids) needs --tokenizer")
        data["prompt_ids"], data["response_ids"], data["action_mask"] = chat_to_tokens(data["messages"], tokenizer)
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


def ingest_files(paths: list[Path], buffer_dir: Path, source: str = "import", tokenizer_path: str | None = None,
                 strict: bool = False) -> IngestReport:
    """Validate every record of ``paths`` and write the good ones as one segment."""
    tokenizer, vocab_size = None, None
    if tokenizer_path:
        from trinity_like.common.tokenizer import hf_tokenizer

        tokenizer = hf_tokenizer(tokenizer_path)
        vocab_size = len(tokenizer)
    report = IngestReport()
    seen = stored_eids(buffer_dir)
    good: list[Experience] = []
    bad_lines: list[str] = []
    for path in paths:
        for line, record in read_records(path):
            try:
                exp = record_to_experience(record, source, vocab_size, tokenizer)
            except RecordError as e:
                report.rejected.append({"file": str(path), "line": line, "reason": str(e)})
                raw = record.__dict__ if isinstance(record, _BadJson) else record
                bad_lines.append(json.dumps({"file": str(path), "line": line, "reason": str(e), "record": raw},
                                            default=str))
                continue
            if exp.eid in seen:
                report.duplicates += 1
                continue
            seen.add(exp.eid)
            good.append(exp)
    if bad_lines:
        rejects = buffer_dir / "rejects" / f"rejects-{time.time_ns()}.jsonl"
        atomic_write_text(rejects, "\n".join(bad_lines) + "\n")
        report.rejects_file = str(rejects)
    if good and not (strict and report.rejected):
        info = BufferWriter(buffer_dir, writer_id=f"ingest-{source}").write(good)
        report.accepted, report.segment = len(good), info.name
    return report


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
