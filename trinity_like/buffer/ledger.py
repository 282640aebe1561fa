"""The consumption ledger of a named consumer: which experience was trained at which step.

    consumers/<name>/pending-<step:08d>-<time_ns:020d>-<rows>.arrow    handed out, not yet committed
    consumers/<name>/commit-<step:08d>-<time_ns:020d>-<rows>.arrow     committed: durable consumption

Each file holds rows ``(eid, step, segment, row)`` and is written atomically. ``commit(step)`` turns every
pending record of steps <= ``step`` into one commit file, then deletes those pending files; the trainer calls
it right before it writes the checkpoint of ``step``. Resuming from checkpoint step k deletes commit files of
later steps and every pending file, so exactly what was consumed after step k is delivered again. Across
crashes each experience therefore ends up in exactly one committed step (or, with the replay policy, in one
committed step per use).

    consumers/<name>/quarantine-<time_ns:020d>-<rows>.arrow            rows found untrainable, never handed out

A quarantine file holds rows ``(eid, segment, row, problem)``: rows the reader found untrainable (see
``table_row_problems``). They are kept in their segments, never handed out, and a resume keeps these files,
so a poison row is named once and never retried.

Row counts are in the names so that a writer's back-pressure check is a directory listing (a quarantined row
counts as consumed: it will never be).
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
QUARANTINE_SCHEMA = pa.schema([("eid", pa.string()), ("segment", pa.string()), ("row", pa.int64()),
                               ("problem", pa.string())])
_QUARANTINE = re.compile(r"^quarantine-(\d{20})-(\d+)\.arrow$")
_COMMIT = re.compile(r"^commit-(\d{8})-(\d{20})-(\d+)\.arrow$")
_PENDING = re.compile(r"^pending-(\d{8})-(\d{20})-(\d+)\.arrow$")


def ledger_dir(buffer_dir: str | os.PathLike, consumer: str) -> Path:
    return Path(buffer_dir) / CONSUMERS / consumer


def consumer_names(buffer_dir: str | os.PathLike) -> list[str]:
    d = Path(buffer_dir) / CONSUMERS
    return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []


def _write(path: Path, table: pa.Table) -> None:
    def write(tmp: Path) -> None:
        with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
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

    def _quarantine_files(self) -> list[tuple[int, Path]]:
        """(rows, path) of each quarantine file, oldest first."""
        names = sorted(os.listdir(self.dir)) if self.dir.is_dir() else []
        return [(int(m.group(2)), self.dir / n) for n in names if (m := _QUARANTINE.match(n))]

    def consumed_rows(self) -> int:
        """Rows committed, pending or quarantined (a listing, no reads)."""
        commits, pending = self.files()
        return (sum(rows for _, rows, _ in commits) + sum(rows for _, rows, _ in pending)
                + self.quarantined_rows())

    def quarantined_rows(self) -> int:
        return sum(rows for rows, _ in self._quarantine_files())

    def quarantined(self) -> pa.Table:
        tables = [_read(p) for _, p in self._quarantine_files()]
        return pa.concat_tables(tables) if tables else QUARANTINE_SCHEMA.empty_table()

    def add_quarantined(self, records: list[tuple[str, str, int, str]]) -> None:
        """Record ``(eid, segment, row, problem)`` rows as untrainable, in one atomic file."""
        if records:
            eids, segments, rows, problems = zip(*records, strict=True)
            table = pa.table({"eid": list(eids), "segment": list(segments), "row": list(rows),
                              "problem": list(problems)}, schema=QUARANTINE_SCHEMA)
            _write(self.dir / f"quarantine-{time.time_ns():020d}-{len(records)}.arrow", table)

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
