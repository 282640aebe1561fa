"""Pending experiences of the ``serve`` endpoint: recorded completions waiting for feedback and a commit.

A :class:`Record` is one experience in the making: the conversation of one session as the policy saw it, in
tokens. Its first turn's input is the prompt; every later turn appends the new messages (context, masked out)
and the assistant's reply (the policy's tokens, with their behaviour log-probs) to the response. Each record
lives in one JSON file, ``<run_dir>/serve/pending/<record_id>.json``, replaced atomically after every turn, so
a server killed at any moment restarts with every turn it answered and no half turn.

A session keeps extending its open record while each request's messages start with the conversation recorded
so far (what OpenAI-style clients send: the whole history each time). A request whose history differs (the
client edited or summarised it) closes the open record and starts a new one in the same session; feedback on
the session reaches all of them.

Commit moves rewarded records into the buffer as one segment with ``source: agent`` and deletes their files
afterwards. A crash between the two leaves files whose record id is already a buffer eid; they are dropped on
the next start, so a record is never committed twice (``eid`` = record id).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trinity_like.common.experience import Experience, utc_now
from trinity_like.common.fs import atomic_write_json, fsync_path

logger = logging.getLogger(__name__)


@dataclass
class Record:
    record_id: str
    session_id: str
    group_id: str
    prompt_ids: list[int]
    messages: list[dict[str, Any]]
    """The conversation as recorded: the client's messages and the replies this server returned."""
    tools: list[dict] | None = None
    response_ids: list[int] = field(default_factory=list)
    action_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """Behaviour log-prob per response token; 0.0 on context tokens (masked out)."""
    turn_ends: list[int] = field(default_factory=list)
    """Index in ``response_ids`` of each assistant turn's last token."""
    versions: list[int] = field(default_factory=list)
    """Policy version of each assistant turn."""
    completion_ids: list[str] = field(default_factory=list)
    """The id returned for each assistant turn."""
    engine_ids: list[str] = field(default_factory=list)
    truncated: bool = False
    reward: float | None = None
    turn_rewards: list[float] | None = None
    run_id: int | None = None
    """Trinity-RFT's ``run_id`` given with ``POST /feedback`` (which of a task's repeated runs this is), kept in
    ``info``."""
    closed: bool = False
    """No further turns join it (its session went on in a new record)."""
    created_at: str = field(default_factory=lambda: utc_now().isoformat())

    @property
    def rewarded(self) -> bool:
        return self.reward is not None or self.turn_rewards is not None

    def input_ids(self) -> list[int]:
        """Everything the policy has seen and said so far."""
        return self.prompt_ids + self.response_ids

    def to_experience(self) -> Experience:
        """The committed row: one experience of the whole conversation. Its ``model_version`` is the oldest
        turn's (the staleness bound then holds for every turn); ``info.turn_versions`` keeps each turn's."""
        token_rewards = None
        if self.turn_rewards is not None:
            token_rewards = np.zeros(len(self.response_ids), np.float32)
            token_rewards[self.turn_ends] = self.turn_rewards
        return Experience(
            prompt_ids=self.prompt_ids, response_ids=self.response_ids, eid=self.record_id, group_id=self.group_id,
            task_id=self.session_id, source="agent", action_mask=self.action_mask, logprobs=self.logprobs,
            reward=self.reward, token_rewards=token_rewards, model_version=min(self.versions),
            engine_id=self.engine_ids[-1] if self.engine_ids else None, truncated=self.truncated,
            messages=self.messages,
            info={"session_id": self.session_id, "turns": len(self.turn_ends), "turn_versions": self.versions,
                  "completion_ids": self.completion_ids, **({"tools": self.tools} if self.tools else {}),
                  **({"run_id": self.run_id} if self.run_id is not None else {})})


class PendingStore:
    """The pending records of one run, on disk and indexed in memory; the index changes only after the disk did
    (``save``, ``update``). Not thread-safe: the server mutates it from its event loop only (one turn of a session
    at a time, under the session's lock)."""

    def __init__(self, folder: str | Path, committed_eids: set[str] | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.records: dict[str, Record] = {}
        self.by_completion: dict[str, str] = {}
        """completion id -> record id."""
        self.open_by_session: dict[str, str] = {}
        """session id -> the record its next turn extends."""
        self._load(committed_eids or set())

    def _path(self, record_id: str) -> Path:
        return self.folder / f"{record_id}.json"

    def _load(self, committed: set[str]) -> None:
        for name in sorted(os.listdir(self.folder)):
            path = self.folder / name
            if name.startswith(".") or not name.endswith(".json"):
                if name.startswith(".") and ".tmp" in name:  # an interrupted atomic write: never a record
                    path.unlink(missing_ok=True)
                continue
            try:
                record = Record(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError) as e:
                logger.error("skipping unreadable pending record %s: %s", path, e)
                continue
            if record.record_id in committed:  # committed, then the server stopped before deleting the file
                path.unlink()
                continue
            self._index(record)

    def _index(self, record: Record) -> None:
        self.records[record.record_id] = record
        for cid in record.completion_ids:
            self.by_completion[cid] = record.record_id
        if not record.closed:
            self.open_by_session[record.session_id] = record.record_id

    def save(self, record: Record) -> None:
        """Write ``record`` (atomically) and index it. A new record of a session closes the one that was open: the
        session's next turn extends the new one. A write that fails (``DiskFullError``) indexes nothing."""
        old = self.open_by_session.get(record.session_id)
        if old is not None and old != record.record_id and not record.closed:
            self.update(self.records[old], lambda r: setattr(r, "closed", True))
        atomic_write_json(self._path(record.record_id), asdict(record))
        self._index(record)

    def update(self, record: Record, change: Callable[[Record], None]) -> None:
        """Apply ``change`` to ``record`` and save it, all or nothing: the change is made on a copy, the copy is
        saved, and only then does ``record`` (the same object, which callers may hold) take it. A save that fails
        (a full disk) leaves ``record`` as it was, in memory as on disk, so the server never goes on from a turn
        or a reward that is not stored."""
        changed = copy.deepcopy(record)
        change(changed)
        self.save(changed)  # a record's first turn comes this way too: save closes the session's open one
        vars(record).update(vars(changed))
        self._index(record)

    def new_record(self, session_id: str, group_id: str | None, prompt_ids: list[int],
                   messages: list[dict[str, Any]], tools: list[dict] | None) -> Record:
        """A record not yet saved: it is saved with its first turn, so a turn that fails (or whose client
        leaves) changes nothing."""
        record_id = uuid.uuid4().hex
        return Record(record_id=record_id, session_id=session_id, group_id=group_id or record_id,
                      prompt_ids=list(prompt_ids), messages=messages, tools=tools)

    def open_record(self, session_id: str) -> Record | None:
        rid = self.open_by_session.get(session_id)
        return self.records.get(rid) if rid is not None else None

    def of_session(self, session_id: str) -> list[Record]:
        return [r for r in self.records.values() if r.session_id == session_id]

    def of_completion(self, completion_id: str) -> Record | None:
        rid = self.by_completion.get(completion_id)
        return self.records.get(rid) if rid is not None else None

    def remove(self, records: list[Record]) -> None:
        for r in records:
            self._path(r.record_id).unlink(missing_ok=True)
            self.records.pop(r.record_id, None)
            for cid in r.completion_ids:
                self.by_completion.pop(cid, None)
            if self.open_by_session.get(r.session_id) == r.record_id:
                del self.open_by_session[r.session_id]
        fsync_path(self.folder)
