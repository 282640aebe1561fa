"""Redis transport: explorers on hosts that share no filesystem with the trainer send experiences through a
Redis Stream; an ingester beside the trainer persists them as buffer segments.

    explorer --XADD (Arrow IPC bytes, sender, seq)--> stream <--XREADGROUP/XAUTOCLAIM-- ingester
    ingester --segment (fsync, rename)--> buffer, then XACK + SADD <stream>:stored:<sender> seq
    explorer <--SMISMEMBER <stream>:stored:<sender>-- (drops a batch only once it is stored)

Delivery: every row reaches the buffer exactly once, whether or not Redis persists its data.
- Redis is a relay, not the store of record. A sender keeps each batch in memory until the ingester reports
  it durable (the ingester adds the batch's ``seq`` to the set ``<stream>:stored:<sender>`` after its segment is
  fsynced and renamed). A batch Redis may have lost is sent again: the sender remembers the server's
  ``run_id`` and, when it changes (Redis restarted, with or without AOF/RDB), re-sends every batch not yet
  reported stored, in order. A background task does this every ``poll_s`` while batches are unconfirmed, so an
  idle explorer (waiting for weights that wait for these rows) still re-sends.
- The ingester drops rows whose eid is already in the buffer, so a re-sent batch, or one re-delivered because
  the ingester died between its segment and XACK, is stored once. When a restart without persistence took the
  consumer group with it (NOGROUP), the ingester creates it again and reads the re-sent entries.
- Entries left pending by a dead ingester are re-claimed with XAUTOCLAIM after ``claim_idle_ms``.
- Every command is retried with exponential backoff (capped at 2 s) for ``timeout_s`` (``buffer.redis_timeout_s``,
  the name ``TIMEOUT_SETTING`` gives); past it ``RedisUnavailable`` says, in one line, the address, how long it
  waited and that setting. The run is resumable: segments already written stay; a sender that raised keeps its
  unconfirmed batches and re-sends them on its next ``send``/``flush``; a run started again redoes the explorer
  steps the buffer does not hold, and eids already stored are dropped.
- What is promised and what is not: a batch is safe once ``send`` returned *and* its process lives until the
  batch is confirmed (``flush`` waits for that; ``close`` warns about what is still unconfirmed). If the
  explorer process and a non-persistent Redis both die before the ingester stored a batch, that batch is gone
  from the transport, and a resumed run generates its explorer step again. Run Redis with ``appendonly yes``
  to make that window nothing but the explorer's own death.
- Memory: unconfirmed batches stay in the sender. Explorers run at most ``synchronizer.max_staleness`` steps ahead
  of the trainer, which bounds them; an ingester that stores nothing for ``timeout_s`` stops ``flush``.

We use redis-py's asyncio client (``redis.asyncio``), maintained with redis-py itself; the separate
``asyncio-redis`` package has had no release since 2020 and lacks the stream commands used here. Its own
retries are turned off (``Retry(NoBackoff(), 0)``): ``_retry`` is the one retry policy, so the wait is bounded
by ``timeout_s`` plus at most one command's socket timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.ipc as ipc

from trinity_like.buffer.segments import stored_eids
from trinity_like.buffer.writer import BufferWriter
from trinity_like.common.errors import RunError
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
TIMEOUT_SETTING = "buffer.redis_timeout_s"
"""The setting that bounds every wait of this transport (named in ``RedisUnavailable``)."""


class RedisUnavailable(RunError):
    """Redis did not answer within ``timeout_s``; the message names the address, the wait and the setting."""


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


def address_of(url: str) -> str:
    """``host:port`` of a Redis URL, without the password it may carry."""
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 6379}"


def stored_key(stream: str, sender: str) -> str:
    """The set of a sender's batch numbers (``seq``) that the ingester has stored durably."""
    return f"{stream}:stored:{sender}"


async def _retry(what: str, fn: Callable[[], Awaitable[T]], timeout_s: float, url: str,
                 base_delay_s: float = 0.05) -> T:
    """Run ``fn`` until it succeeds, backing off exponentially (capped at 2 s) on connection errors; past
    ``timeout_s`` raise ``RedisUnavailable``."""
    from redis.exceptions import BusyLoadingError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    start = time.monotonic()
    delay = base_delay_s
    while True:
        try:
            return await fn()
        except (RedisConnectionError, RedisTimeoutError, BusyLoadingError, OSError) as e:
            waited = time.monotonic() - start
            if waited >= timeout_s:
                cause = " ".join(str(e).split()).rstrip(".")
                raise RedisUnavailable(
                    f"Redis at {address_of(url)} did not answer for {waited:.1f}s ({what}: {cause}), and "
                    f"{TIMEOUT_SETTING}={timeout_s:g} bounds the wait; start Redis there (or fix buffer.redis_url) "
                    f"and run again: rows already stored stay and the rest are delivered once") from None
            logger.warning("redis %s at %s failed (%s); retrying in %.2fs", what, address_of(url), e, delay)
            await asyncio.sleep(min(delay, timeout_s - waited))
            delay = min(delay * 2, 2.0)


def _client(url: str):
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    # redis-py retries 3 times with up to 10 s of backoff by default; ``_retry`` is the one policy here
    return aioredis.from_url(url, socket_connect_timeout=1.0, socket_timeout=5.0, retry=Retry(NoBackoff(), 0))


class RedisSender:
    """Explorer side: one XADD per batch of experiences (a group is never split across entries); each batch is
    kept until the ingester reports it stored, and sent again when Redis restarted before that."""

    def __init__(self, url: str, stream: str, timeout_s: float = 600.0, poll_s: float = 1.0) -> None:
        """``poll_s``: how often, while batches are unconfirmed, the sender asks which are stored and whether Redis
        restarted (re-sending then)."""
        self.url, self.stream, self.timeout_s, self.poll_s = url, stream, timeout_s, poll_s
        self.sender_id = uuid.uuid4().hex
        self._redis = _client(url)
        self._unconfirmed: dict[int, dict[str, Any]] = {}
        """seq -> the entry's fields, for every batch sent and not yet reported stored (insertion = seq order)."""
        self._seq = 0
        self._server_id: str | None = None
        """run_id of the Redis server the unconfirmed batches were last sent to; another one (or None after a
        failed XADD) means they are sent again."""
        self._lock = asyncio.Lock()
        """Serialises re-sends, new sends and confirmations, so entries reach the stream in seq order."""
        self._watcher: asyncio.Task | None = None
        self.stats = {"sent": 0, "resent": 0, "confirmed": 0}

    @property
    def unconfirmed(self) -> int:
        """Batches sent and not yet reported stored by the ingester."""
        return len(self._unconfirmed)

    async def send(self, exps: list[Experience]) -> str:
        """XADD one batch; return its entry id. After ``timeout_s`` without Redis raise ``RedisUnavailable``; the
        batch is kept all the same, and sent (with every other unconfirmed one) once Redis answers again."""
        if not exps:
            raise ValueError("RedisSender.send needs at least one experience")
        async with self._lock:
            self._seq += 1
            fields = {"data": to_bytes(exps), "rows": str(len(exps)), "sender": self.sender_id, "seq": str(self._seq)}
            try:
                await self._sync()
                entry_id = await self._xadd(fields)
            except RedisUnavailable:
                self._server_id = None  # whether it landed is unknown: the next sync sends all unconfirmed again
                raise
            finally:
                self._unconfirmed[self._seq] = fields  # kept even when send raised: sent again once Redis answers
                self._start_watcher()
            self.stats["sent"] += 1
        return entry_id.decode() if isinstance(entry_id, bytes) else entry_id

    async def flush(self, timeout_s: float | None = None) -> None:
        """Wait until the ingester has stored every batch sent (re-sending after a Redis restart); raise
        TimeoutError after ``timeout_s`` (default: the sender's) if it has not."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            async with self._lock:
                await self._sync()
            if not self._unconfirmed:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{len(self._unconfirmed)} batches sent to Redis stream {self.stream!r} at "
                                   f"{address_of(self.url)} were not reported stored within {timeout_s:g}s "
                                   f"({TIMEOUT_SETTING}): is the trainer's ingester running?")
            await asyncio.sleep(min(self.poll_s, max(deadline - time.monotonic(), 0.0)))

    async def close(self) -> None:
        """Stop the watcher and the connection; batches still unconfirmed are named in a warning (they are lost
        if Redis loses them before the ingester reads them)."""
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None
        if self._unconfirmed:
            try:
                async with self._lock:
                    await self._sync(timeout_s=0.0)
            except RedisUnavailable as e:
                logger.warning("%s", e)
        if self._unconfirmed:
            rows = sum(int(f["rows"]) for f in self._unconfirmed.values())
            logger.warning("closing the redis sender with %d batches (%d rows) in stream %r not yet reported "
                           "stored: if Redis loses them before the ingester reads them, a resumed run generates "
                           "their explorer steps again", len(self._unconfirmed), rows, self.stream)
        await self._redis.aclose()

    async def _xadd(self, fields: dict[str, Any], timeout_s: float | None = None) -> Any:
        return await _retry("XADD", lambda: self._redis.xadd(self.stream, fields),
                            self.timeout_s if timeout_s is None else timeout_s, self.url)

    async def _sync(self, timeout_s: float | None = None) -> None:
        """Re-send every unconfirmed batch if Redis restarted since they were sent, then forget those stored.
        Called under ``_lock``."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        info = await _retry("INFO", lambda: self._redis.info("server"), timeout_s, self.url)
        server_id = info["run_id"]
        if self._unconfirmed and server_id != self._server_id:
            logger.warning("Redis at %s restarted (or an XADD failed); sending again the %d batches not yet "
                           "reported stored", address_of(self.url), len(self._unconfirmed))
            for fields in self._unconfirmed.values():
                await self._xadd(fields, timeout_s)
                self.stats["resent"] += 1
        self._server_id = server_id
        if not self._unconfirmed:
            return
        key = stored_key(self.stream, self.sender_id)
        seqs = list(self._unconfirmed)
        flags = await _retry("SMISMEMBER", lambda: self._redis.smismember(key, seqs), timeout_s, self.url)
        done = [seq for seq, stored in zip(seqs, flags, strict=True) if stored]
        if done:
            for seq in done:
                del self._unconfirmed[seq]
            self.stats["confirmed"] += len(done)
            await _retry("SREM", lambda: self._redis.srem(key, *done), timeout_s, self.url)

    def _start_watcher(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """While batches are unconfirmed: every ``poll_s``, one try to confirm and re-send after a restart. It
        never waits on a dead Redis itself (so it holds ``_lock`` for one command at most): ``send``, ``flush``
        and the ingester report an outage after ``timeout_s``."""
        while self._unconfirmed:
            await asyncio.sleep(self.poll_s)
            try:
                async with self._lock:
                    await self._sync(timeout_s=0.0)
            except RedisUnavailable:
                pass  # Redis is down: tried again after poll_s


class RedisIngester:
    """Trainer side: moves stream entries into buffer segments, then acknowledges them (XACK) and reports them
    stored to their sender (SADD), only once the segment is durable."""

    def __init__(self, url: str, stream: str, buffer_dir: str | Path, name: str = "ingester-0",
                 claim_idle_ms: int = 30_000, timeout_s: float = 600.0, batch: int = 16) -> None:
        self.url, self.stream, self.name = url, stream, name
        self.buffer_dir = Path(buffer_dir)
        self.claim_idle_ms, self.timeout_s, self.batch = claim_idle_ms, timeout_s, batch
        self.writer = BufferWriter(self.buffer_dir, writer_id=f"redis-{name}")
        self._seen = stored_eids(self.buffer_dir)
        """eids already in the buffer: re-delivered and re-sent entries are dropped by eid."""
        self._redis = _client(url)
        self.stats = {"entries": 0, "rows": 0, "duplicates": 0, "group_recreated": 0}

    async def _ensure_group(self) -> None:
        from redis.exceptions import ResponseError

        async def create() -> None:
            try:
                await self._redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
            except ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise

        await _retry("XGROUP CREATE", create, self.timeout_s, self.url)

    def _persist(self, entries: list[tuple[Any, dict]]) -> tuple[list[Any], dict[str, list[str]]]:
        """Write the new rows of ``entries`` as one segment; return the entry ids to acknowledge and the batch
        numbers to report stored, per sender."""
        tables, ids, stored = [], [], {}
        for entry_id, fields in entries:
            ids.append(entry_id)
            if b"sender" in fields:
                stored.setdefault(fields[b"sender"].decode(), []).append(fields[b"seq"].decode())
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
        return ids, stored

    async def _read(self, block_ms: int) -> list[tuple[Any, dict]]:
        """Idle pending entries of others, then our own pending ones (after our own restart), then new ones."""
        claimed = await _retry("XAUTOCLAIM", lambda: self._redis.xautoclaim(
            self.stream, GROUP, self.name, self.claim_idle_ms, start_id="0-0", count=self.batch),
            self.timeout_s, self.url)
        entries = [e for e in claimed[1] if e and e[1]]
        if entries:
            return entries
        for start in ("0", ">"):
            got = await _retry("XREADGROUP", lambda s=start: self._redis.xreadgroup(
                GROUP, self.name, {self.stream: s}, count=self.batch, block=block_ms if s == ">" else None),
                self.timeout_s, self.url)
            entries = [e for _, items in (got or []) for e in items if e[1]]
            if entries:
                return entries
        return []

    async def step(self, block_ms: int = 200) -> int:
        """Claim idle pending entries, read new ones, persist, acknowledge; return entries handled."""
        from redis.exceptions import ResponseError

        try:
            entries = await self._read(block_ms)
        except ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            # Redis came back without its data: the senders re-send what was not reported stored
            logger.warning("redis stream %r lost its consumer group (Redis restarted without persistence?); "
                           "creating it again", self.stream)
            self.stats["group_recreated"] += 1
            await self._ensure_group()
            return 0
        if not entries:
            return 0
        ids, stored = await asyncio.to_thread(self._persist, entries)

        async def acknowledge() -> None:
            pipe = self._redis.pipeline(transaction=False)
            pipe.xack(self.stream, GROUP, *ids)
            for sender, seqs in stored.items():
                pipe.sadd(stored_key(self.stream, sender), *seqs)
            await pipe.execute()

        await _retry("XACK", acknowledge, self.timeout_s, self.url)
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
