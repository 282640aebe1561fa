"""The experience buffer: append-only Parquet segments on disk, queried with an in-process DuckDB.

Layout of a buffer folder::

    segments/<time_ns>-<writer>-<seq>.parquet   one segment per write, published atomically
    consumers/<name>/step-<k>.parquet           ledger: the eids a consumer trained at step k (committed)

Several writer processes and several reader processes share a folder without a server: a segment becomes
visible only by an atomic rename, and nobody holds a ``.duckdb`` file (DuckDB runs in memory per reader and
scans the segment files). Segment names start with a nanosecond timestamp, so name order is write order.

Exactly-once consumption: a :class:`BufferConsumer` never hands out an eid twice while it runs (the
``_delivered`` set), and ``commit(step)`` writes the eids handed out for that step as one ledger file. A new
consumer of the same name starts from the committed ledgers, so whatever was delivered but not committed
before a crash is delivered again.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from trinity_like.common.experience import (
    EXPERIENCE_SCHEMA,
    Experience,
    experiences_to_table,
    table_to_experiences,
)
from trinity_like.common.fs import atomic_write_with

SEGMENTS = "segments"
CONSUMERS = "consumers"
POLL_INTERVAL_S = 0.05


def segment_files(buffer_dir: Path) -> list[str]:
    """Published segment files, in write order."""
    d = buffer_dir / SEGMENTS
    if not d.is_dir():
        return []
    return sorted(str(d / n) for n in os.listdir(d) if n.endswith(".parquet") and not n.startswith("."))


class BufferWriter:
    """Appends experiences as segment files. One writer per process and role; ``writer_id`` names it."""

    def __init__(self, buffer_dir: str | Path, writer_id: str = "") -> None:
        self.dir = Path(buffer_dir) / SEGMENTS
        self.dir.mkdir(parents=True, exist_ok=True)
        self.writer_id = (writer_id or "w") + "-" + uuid.uuid4().hex[:8]
        self._seq = itertools.count()

    def write(self, exps: list[Experience]) -> Path:
        """Write ``exps`` as one new segment (atomically) and return its path."""
        if not exps:
            raise ValueError("BufferWriter.write needs at least one experience")
        table = experiences_to_table(exps)
        name = f"{time.time_ns():020d}-{self.writer_id}-{next(self._seq):06d}.parquet"
        return atomic_write_with(self.dir / name, lambda tmp: pq.write_table(table, tmp))


def _connect():
    import duckdb

    con = duckdb.connect(":memory:")
    con.execute("SET threads TO 1")
    return con


def query(buffer_dir: str | Path, sql_where: str = "TRUE", order_by: str = "filename, file_row_number",
          params: list | None = None) -> pa.Table:
    """All rows of the buffer matching ``sql_where``, as an Arrow table (plus ``filename`` and
    ``file_row_number`` columns)."""
    files = segment_files(Path(buffer_dir))
    if not files:
        return EXPERIENCE_SCHEMA.empty_table()
    con = _connect()
    try:
        return con.sql(
            "SELECT * FROM read_parquet($files, filename = true, file_row_number = true) "
            f"WHERE {sql_where} ORDER BY {order_by}",
            params={"files": files, **({f"p{i}": v for i, v in enumerate(params or [])})},
        ).to_arrow_table()
    finally:
        con.close()


def count_rows(buffer_dir: str | Path) -> int:
    files = segment_files(Path(buffer_dir))
    if not files:
        return 0
    con = _connect()
    try:
        return con.execute("SELECT count(*) FROM read_parquet($files)", {"files": files}).fetchone()[0]
    finally:
        con.close()


class BufferConsumer:
    """A named reader that hands each experience out once, in write order, whole groups at a time."""

    def __init__(self, buffer_dir: str | Path, name: str = "trainer") -> None:
        self.buffer_dir = Path(buffer_dir)
        self.name = name
        self.ledger_dir = self.buffer_dir / CONSUMERS / name
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        """Guards ``_delivered`` and ``_pending``: an eid is in ``_delivered`` from the moment it is handed
        out, so concurrent reads never return it twice."""
        self._delivered: set[str] = self._load_committed()
        self._pending: list[str] = []
        """eids handed out since the last commit; the next ``commit(step)`` records them."""

    def _load_committed(self) -> set[str]:
        committed: set[str] = set()
        for f in sorted(self.ledger_dir.glob("step-*.parquet")):
            committed.update(pq.read_table(f, columns=["eid"]).column("eid").to_pylist())
        return committed

    def committed_steps(self) -> list[int]:
        return sorted(int(p.stem.split("-")[1]) for p in self.ledger_dir.glob("step-*.parquet"))

    def try_read(self, n: int, min_version: int | None = None) -> list[Experience] | None:
        """Return ``n`` undelivered experiences (whole groups, write order) with ``model_version >=
        min_version``, or None if fewer are available now."""
        where = "TRUE" if min_version is None else f"model_version >= {int(min_version)}"
        table = query(self.buffer_dir, where)
        if table.num_rows == 0:
            return None
        eids = table.column("eid").to_pylist()
        groups = table.column("group_id").to_pylist()
        with self._lock:
            order: list[str] = []
            rows_of: dict[str, list[int]] = {}
            for i, (eid, g) in enumerate(zip(eids, groups, strict=True)):
                if eid in self._delivered:
                    continue
                if g not in rows_of:
                    rows_of[g] = []
                    order.append(g)
                rows_of[g].append(i)
            chosen: list[int] = []
            for g in order:
                if len(chosen) + len(rows_of[g]) > n:
                    break
                chosen.extend(rows_of[g])
            if len(chosen) < n:
                return None
            picked = table.take(pa.array(chosen))
            picked_eids = [eids[i] for i in chosen]
            self._delivered.update(picked_eids)
            self._pending.extend(picked_eids)
        return table_to_experiences(picked)

    def read(self, n: int, min_version: int | None = None, timeout_s: float = 600.0,
             should_stop=None) -> list[Experience]:
        """Block until ``try_read`` succeeds; raise TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.try_read(n, min_version)
            if got is not None:
                return got
            if should_stop is not None and should_stop():
                raise InterruptedError("buffer read stopped: no producer left")
            if time.monotonic() > deadline:
                raise TimeoutError(f"buffer '{self.buffer_dir}' had fewer than {n} unconsumed experiences with "
                                   f"model_version >= {min_version} after {timeout_s:.0f}s")
            time.sleep(POLL_INTERVAL_S)

    async def aread(self, n: int, min_version: int | None = None, timeout_s: float = 600.0) -> list[Experience]:
        return await asyncio.to_thread(self.read, n, min_version, timeout_s)

    def commit(self, step: int) -> Path | None:
        """Make the consumption since the last commit durable as train step ``step``."""
        with self._lock:
            eids, self._pending = self._pending, []
        if not eids:
            return None
        table = pa.table({"eid": eids, "step": pa.array([step] * len(eids), pa.int64())})
        return atomic_write_with(self.ledger_dir / f"step-{step:08d}.parquet", lambda tmp: pq.write_table(table, tmp))
