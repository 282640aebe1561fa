"""The consumption ledger of a named consumer: which experience was trained at which step.

    consumers/<name>/pending-<step:08d>-<time_ns:020d>-<rows>.arrow    handed out, not yet committed
    consumers/<name>/commit-<step:08d>-<time_ns:020d>-<rows>.arrow     committed: durable consumption

Each file holds rows ``(eid, step, segment, row)`` and is written atomically. ``commit(step)`` turns every
pending record of steps <= ``step`` into one commit file, then deletes those pending files; the trainer calls
it right before it writes the checkpoint of ``step``. Resuming from checkpoint step k deletes commit files of
later steps and every pending file, so exactly what was consumed after step k is delivered again. Across
crashes each experience therefore ends up in exactly one committed step (or, with the replay policy, in one
committed step per use).

Row counts are in the names so that a writer's back-pressure check is a directory listing.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from trinity_like.common.fs import atomic_write_with, fsync_path

CONSUMERS = "consumers"
LEDGER_SCHEMA = pa.schema([("eid", pa.string()), ("step", pa.int64()), ("segment", pa.string()),
                           ("row", pa.int64())])
_COMMIT = re.compile(r"^commit-(\d{8})-(\d{20})-(\d+)\.arrow$")
_PENDING = re.compile(r"^pending-(\d{8})-(\d{20})-(\d+)\.arrow$")


def ledger_dir(buffer_dir: str | os.PathLike, consumer: str) -> Path:
    return Path(buffer_dir) / CONSUMERS / consumer


def consumer_names(buffer_dir: str | os.PathLike) -> list[str]:
    d = Path(buffer_dir) / CONSUMERS
    return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []


def _write(path: Path, table: pa.Table) -> None:
    def write(tmp: Path) -> None:
        with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, LEDGER_SCHEMA) as writer:
            writer.write_table(table)

    atomic_write_with(path, write)


def _read(path: Path) -> pa.Table:
    return ipc.open_file(pa.memory_map(str(path))).read_all()


def records_table(records: list[tuple[str, int, str, int]]) -> pa.Table:
    eids, steps, segments, rows = zip(*records, strict=True) if records else ((), (), (), ())
    return pa.table({"eid": list(eids), "step": list(steps), "segment": list(segments), "row": list(rows)},
                    schema=LEDGER_SCHEMA)


class Ledger:
    """Reads and writes one consumer's ledger files. Not shared between processes: one process per named
    consumer (other processes only read it, e.g. ``buffer stats``)."""

    def __init__(self, buffer_dir: str | os.PathLike, consumer: str, create: bool = True) -> None:
        """``create=False`` for readers of someone else's ledger: a missing folder reads as empty."""
        self.dir = ledger_dir(buffer_dir, consumer)
        if create:
            self.dir.mkdir(parents=True, exist_ok=True)

    def files(self) -> tuple[list[tuple[int, int, Path]], list[tuple[int, int, Path]]]:
        """(commit files, pending files) as (step, rows, path), in step order."""
        commits, pending = [], []
        for name in sorted(os.listdir(self.dir)) if self.dir.is_dir() else []:
            if m := _COMMIT.match(name):
                commits.append((int(m.group(1)), int(m.group(3)), self.dir / name))
            elif m := _PENDING.match(name):
                pending.append((int(m.group(1)), int(m.group(3)), self.dir / name))
        return commits, pending

    def consumed_rows(self) -> int:
        """Rows committed or pending (a listing, no reads)."""
        commits, pending = self.files()
        return sum(rows for _, rows, _ in commits) + sum(rows for _, rows, _ in pending)

    def resume(self, resume_step: int | None) -> None:
        """Forget consumption after ``resume_step`` (None: keep every commit) and every pending record."""
        commits, pending = self.files()
        for step, _, path in commits:
            if resume_step is not None and step > resume_step:
                path.unlink()
        for _, _, path in pending:
            path.unlink()
        fsync_path(self.dir)

    def committed(self) -> pa.Table:
        commits, _ = self.files()
        tables = [_read(p) for _, _, p in commits]
        return pa.concat_tables(tables) if tables else LEDGER_SCHEMA.empty_table()

    def pending(self) -> pa.Table:
        _, pending = self.files()
        tables = [_read(p) for _, _, p in pending]
        return pa.concat_tables(tables) if tables else LEDGER_SCHEMA.empty_table()

    def add_pending(self, step: int, records: list[tuple[str, int, str, int]]) -> None:
        if records:
            _write(self.dir / f"pending-{step:08d}-{time.time_ns():020d}-{len(records)}.arrow",
                   records_table(records))

    def commit(self, step: int) -> int:
        """Commit every pending record of steps <= ``step``; return how many rows were committed."""
        _, pending = self.files()
        due = [(s, p) for s, _, p in pending if s <= step]
        if not due:
            return 0
        table = pa.concat_tables([_read(p) for _, p in due])
        _write(self.dir / f"commit-{step:08d}-{time.time_ns():020d}-{table.num_rows}.arrow", table)
        for _, p in due:
            p.unlink()
        fsync_path(self.dir)
        return table.num_rows
