"""Redis transport: explorers on hosts that share no filesystem with the trainer send experiences through a
Redis Stream; an ingester beside the trainer persists them as buffer segments.

    explorer --XADD (Arrow IPC bytes)--> stream <--XREADGROUP/XAUTOCLAIM-- ingester --segment--> buffer --XACK

Delivery guarantees:
- the ingester XACKs an entry only after its segment is durable (fsynced and renamed), so a crash between
  the two re-delivers the entry, and rows whose eid is already in the buffer are dropped: nothing is lost and
  nothing is stored twice;
- entries left pending by a dead ingester are re-claimed with XAUTOCLAIM after ``claim_idle_ms``;
- a Redis restart is survived: every command is retried with exponential backoff until ``timeout_s``; the
  sender keeps its batch until XADD succeeds. For entries to survive a restart of Redis itself, run it with
  ``appendonly yes`` (the test fixture does, with ``appendfsync always``).

We use redis-py's asyncio client (``redis.asyncio``), maintained with redis-py itself; the separate
``asyncio-redis`` package has had no release since 2020 and lacks the stream commands used here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.ipc as ipc

from trinity_like.buffer.segments import stored_eids
from trinity_like.buffer.writer import BufferWriter
from trinity_like.common.experience import (
    EXPERIENCE_SCHEMA,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    Experience,
    experiences_to_table,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")
GROUP = "ingesters"


def to_bytes(exps: list[Experience]) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, EXPERIENCE_SCHEMA) as writer:
        writer.write_table(experiences_to_table(exps))
    return sink.getvalue().to_pybytes()


def from_bytes(data: bytes) -> pa.Table:
    """The rows of one stream entry. Unlike stored segments, entries of older schema versions are refused (ValueError):
    a stream lives only as long as a run, and its explorers and ingester run one build."""
    table = ipc.open_stream(pa.py_buffer(data)).read_all()
    version = (table.schema.metadata or {}).get(SCHEMA_VERSION_KEY)
    if version != str(SCHEMA_VERSION).encode():
        found = "none" if version is None else version.decode()
        raise ValueError(f"a redis stream entry has schema version {found} and this ingester reads only version "
                         f"{SCHEMA_VERSION}; run the explorers and the ingester from the same trinity_like version")
    return table


async def _retry(what: str, fn: Callable[[], Awaitable[T]], timeout_s: float, base_delay_s: float = 0.05) -> T:
    """Run ``fn`` until it succeeds, backing off exponentially (capped at 2 s) on connection errors."""
    from redis.exceptions import BusyLoadingError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    deadline = time.monotonic() + timeout_s
    delay = base_delay_s
    while True:
        try:
            return await fn()
        except (RedisConnectionError, RedisTimeoutError, BusyLoadingError, OSError) as e:
            if time.monotonic() + delay > deadline:
                raise TimeoutError(f"redis {what} kept failing for {timeout_s:.0f}s: {e}") from None
            logger.warning("redis %s failed (%s); retrying in %.2fs", what, e, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


def _client(url: str):
    import redis.asyncio as aioredis

    return aioredis.from_url(url, socket_connect_timeout=1.0, socket_timeout=5.0)


class RedisSender:
    """Explorer side: one XADD per batch of experiences (a group is never split across entries)."""

    def __init__(self, url: str, stream: str, timeout_s: float = 600.0) -> None:
        self.url, self.stream, self.timeout_s = url, stream, timeout_s
        self._redis = _client(url)

    async def send(self, exps: list[Experience]) -> str:
        if not exps:
            raise ValueError("RedisSender.send needs at least one experience")
        payload = {"data": to_bytes(exps), "rows": str(len(exps))}
        entry_id = await _retry("XADD", lambda: self._redis.xadd(self.stream, payload), self.timeout_s)
        return entry_id.decode() if isinstance(entry_id, bytes) else entry_id


    async def close(self) -> None:
        await self._redis.aclose()


class RedisIngester:
    """Trainer side: moves stream entries into buffer segments, acknowledging only durable ones."""

    def __init__(self, url: str, stream: str, buffer_dir: str | Path, name: str = "ingester-0",
                 claim_idle_ms: int = 30_000, timeout_s: float = 600.0, batch: int = 16) -> None:
        self.url, self.stream, self.name = url, stream, name
        self.buffer_dir = Path(buffer_dir)
        self.claim_idle_ms, self.timeout_s, self.batch = claim_idle_ms, timeout_s, batch
        self.writer = BufferWriter(self.buffer_dir, writer_id=f"redis-{name}")
        self._seen = stored_eids(self.buffer_dir)
        """eids already in the buffer: re-delivered entries are dropped by eid."""
        self._redis = _client(url)
        self.stats = {"entries": 0, "rows": 0, "duplicates": 0}

    async def _ensure_group(self) -> None:
        from redis.exceptions import ResponseError

        async def create() -> None:
            try:
                await self._redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
            except ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise

        await _retry("XGROUP CREATE", create, self.timeout_s)

    def _persist(self, entries: list[tuple[Any, dict]]) -> list[Any]:
        """Write the new rows of ``entries`` as one segment; return the entry ids to acknowledge."""
        tables, ids = [], []
        for entry_id, fields in entries:
            ids.append(entry_id)
            table = from_bytes(fields[b"data"])
            keep = [i for i, eid in enumerate(table.column("eid").to_pylist()) if eid not in self._seen]
            self.stats["duplicates"] += table.num_rows - len(keep)
            if keep:
                table = table.take(pa.array(keep))
                tables.append(table)
                self._seen.update(table.column("eid").to_pylist())
        if tables:
            merged = pa.concat_tables(tables)
            self.writer.write_table(merged)
            self.stats["rows"] += merged.num_rows
        self.stats["entries"] += len(ids)
        return ids

    async def step(self, block_ms: int = 200) -> int:
        """Claim idle pending entries, read new ones, persist, acknowledge; return entries handled."""
        claimed = await _retry("XAUTOCLAIM", lambda: self._redis.xautoclaim(
            self.stream, GROUP, self.name, self.claim_idle_ms, start_id="0-0", count=self.batch), self.timeout_s)
        entries = [e for e in claimed[1] if e and e[1]]
        if not entries:
            # our own pending entries first (after our own restart), then new ones
            for start in ("0", ">"):
                got = await _retry("XREADGROUP", lambda s=start: self._redis.xreadgroup(
                    GROUP, self.name, {self.stream: s}, count=self.batch, block=block_ms if s == ">" else None),
                    self.timeout_s)
                entries = [e for _, items in (got or []) for e in items if e[1]]
                if entries:
                    break
        if not entries:
            return 0
        ids = await asyncio.to_thread(self._persist, entries)
        await _retry("XACK", lambda: self._redis.xack(self.stream, GROUP, *ids), self.timeout_s)
        return len(ids)

    async def run(self, stop: asyncio.Event | Callable[[], bool]) -> None:
        """Ingest until ``stop`` is set (or returns True) and nothing is left to read."""
        await self._ensure_group()
        should_stop = stop.is_set if isinstance(stop, asyncio.Event) else stop
        while True:
            handled = await self.step()
            if handled == 0 and should_stop():
                return

    async def close(self) -> None:
        await self._redis.aclose()


class IngesterThread:
    """Runs a RedisIngester on its own thread and event loop beside a synchronous trainer."""

    def __init__(self, ingester: RedisIngester) -> None:
        import threading

        self.ingester = ingester
        self.error: BaseException | None = None
        """Set when the ingester stopped on an error; the trainer checks it instead of waiting forever."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="redis-ingester", daemon=True)

    def _main(self) -> None:
        async def go() -> None:
            try:
                await self.ingester.run(self._stop.is_set)
            finally:
                await self.ingester.close()

        try:
            asyncio.run(go())
        except BaseException as e:  # reported to the trainer through .error
            logger.error("redis ingester stopped: %s", e)
            self.error = e

    def start(self) -> IngesterThread:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
