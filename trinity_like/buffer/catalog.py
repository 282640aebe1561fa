"""The buffer catalog: what each segment holds, kept beside the segments, so that ``buffer stats``, ``status``,
an explorer's start and filtered reads touch only the segments they need.

    catalog/snapshot-<time_ns:020d>-<entries>.json    every entry, rolled up (the newest snapshot counts)
    catalog/<time_ns:020d>-<pid>-<n>.json              loose entries: the one a writer publishes with its segment,
                                                       or a batch a reader healed or CRC-checked
    catalog/lock                                      flock held while rolling up

An entry (``Entry``) gives a segment's rows, bytes, schema version, rows per ``model_version``, per ``source`` and
per ``info.explore_step`` (as ``CAST(json_extract(info, '$.explore_step') AS BIGINT)`` reads it), and when the
CRC-32 of its bytes was last checked (``verified_at``; None: not since it was written).

The listing of ``segments/`` stays the truth; the catalog only says what the listed segments hold:
- a listed segment without an entry (written before the catalog existed, or a crash between the entry's and the
  segment's rename) is read once, CRC-checked, and its entry written (healing);
- an entry whose segment is not listed (quarantined, deleted, or a writer between its two renames) is ignored,
  and dropped by the next roll-up (a loose one, once it is ``ORPHAN_GRACE_S`` old or its segment is in
  ``quarantine/``).

Concurrency (any number of processes: explorers, the Redis ingester, ``buffer ingest``, readers):
- Loose files have unique names (time, pid, a per-process counter) and are never rewritten: a writer publishes
  its segment's entry (temp file, fsync, rename, fsync of the folder) before the segment itself
  (``segments.write_segment``); a heal or a CRC check adds another loose file, merged on load (``verified_at``:
  the latest). No two processes ever write the same file, so no update is lost.
- A roll-up holds an exclusive ``flock`` on ``catalog/lock`` (the kernel drops it if the holder dies): it reads the
  newest snapshot and the loose files, publishes a new snapshot atomically, then deletes exactly the loose files it
  folded in (files written meanwhile have other names and stay) and the older snapshots. Whoever sees
  ``rollup_threshold`` loose files rolls up (a writer every 16th segment, a reader after a load); a process that
  finds the lock held skips its turn.
- A SIGKILL at any point leaves the old or the new snapshot (renames are atomic), loose files that the next
  roll-up folds in, and at worst a stray ``.*.tmp-*`` file that no reader lists. A reader that finds a listed file
  gone (a roll-up deleted it after folding it into a newer snapshot) lists again.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import logging
import math
import os
import re
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trinity_like.buffer.ledger import Ledger
from trinity_like.buffer.segments import (
    QUARANTINE,
    SegmentError,
    SegmentInfo,
    add_other_schemas,
    list_segments,
    read_segment,
    refuse_other_schemas,
)
from trinity_like.common.experience import READABLE_SCHEMA_VERSIONS, stored_schema_version
from trinity_like.common.fs import atomic_write_with

logger = logging.getLogger(__name__)

CATALOG = "catalog"
FORMAT = 1
"""Version of the entry and snapshot layout; a snapshot of another format is ignored (its segments heal)."""
ROLLUP_MIN = 64
"""Loose entry files that make a roll-up due (or 1/32 of the snapshot's entries, whichever is more)."""
ROLLUP_BATCH = 1024
"""``save`` of this many entries at once (a heal, a first full read of an old buffer) rolls up right away: the
batch is folded into the snapshot once instead of being parsed beside it at every load."""
ORPHAN_GRACE_S = 600.0
"""An entry whose segment is not listed is dropped only this long after it was written: a writer publishes the
entry first and the segment a moment later."""
LOAD_ATTEMPTS = 20
_SNAPSHOT = re.compile(r"^snapshot-(\d{20})-(\d+)\.json$")
_LOOSE = re.compile(r"^(\d{20})-(\d+)-(\d+)\.json$")


@dataclass(frozen=True)
class Entry:
    """What one segment holds."""

    segment: str
    rows: int
    bytes: int
    schema_version: str | None
    versions: dict[int, int]
    """model_version -> rows."""
    sources: dict[str, int]
    """source -> rows."""
    explore_steps: dict[int, int]
    """info.explore_step -> rows (rows without one are not counted)."""
    verified_at: float | None = None
    """Unix time at which the CRC-32 of the segment's bytes was checked against its name; None: not yet."""
    written_at: float = field(default=0.0, compare=False)
    """When this entry was written (an orphan's age)."""

    @property
    def max_version(self) -> int:
        return max(self.versions, default=-1)

    @property
    def min_version(self) -> int:
        """Smallest model_version >= 0 (this run's policies); -1 if every row has -1."""
        return min((v for v in self.versions if v >= 0), default=-1)

    def to_json(self) -> dict:
        return {"segment": self.segment, "rows": self.rows, "bytes": self.bytes, "schema_version": self.schema_version,
                "versions": sorted(self.versions.items()), "sources": sorted(self.sources.items()),
                "explore_steps": sorted(self.explore_steps.items()), "verified_at": self.verified_at,
                "written_at": self.written_at}

    @classmethod
    def from_json(cls, d: dict) -> Entry:
        return cls(d["segment"], d["rows"], d["bytes"], d["schema_version"], {int(k): v for k, v in d["versions"]},
                   dict(d["sources"]), {int(k): v for k, v in d["explore_steps"]}, d["verified_at"],
                   d.get("written_at", 0.0))


def _counts(column: pa.ChunkedArray | pa.Array) -> dict:
    vc = pc.value_counts(column)
    return dict(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist(), strict=True))


def step_value(value: object) -> int | None:
    """An ``info["explore_step"]`` value as ``CAST(json_extract(info, '$.explore_step') AS BIGINT)`` reads it from
    the JSON: integers, booleans (0/1), floats rounded half to even, integer strings; anything else is no step."""
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, float) and math.isfinite(value):
        return round(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value):
        return int(value)
    return None


def _explore_step(info: str) -> int | None:
    obj = json.loads(info)
    return step_value(obj.get("explore_step")) if isinstance(obj, dict) else None


def _explore_steps(info: pa.ChunkedArray) -> Counter:
    """info.explore_step -> rows. Flat objects holding the key once with an integer value (what explorers write)
    are read by a vectorised regex: with a single ``{`` nothing is nested, and an unescaped ``"explore_step"`` right
    after ``{`` or ``,`` and before ``:`` is a key; every other row that mentions the key is parsed as JSON."""
    steps: Counter = Counter()
    info = info.combine_chunks() if isinstance(info, pa.ChunkedArray) else info
    mentions = pc.count_substring(info, '"explore_step"')
    if not pc.any(pc.greater(mentions, 0)).as_py():
        return steps
    found = pc.extract_regex(info, r'[{,]\s*"explore_step"\s*:\s*(?P<s>-?\d{1,18})\s*[,}]')
    fast = pc.and_(pc.and_(pc.equal(mentions, 1), pc.equal(pc.count_substring(info, "{"), 1)), pc.is_valid(found))
    fast = pc.fill_null(fast, False)
    steps.update(_counts(pc.cast(pc.filter(found, fast).field("s"), pa.int64())))
    slow = pc.and_(pc.greater(mentions, 0), pc.invert(fast))
    steps.update(s for s in map(_explore_step, pc.filter(info, slow).to_pylist()) if s is not None)
    return steps


def entry_of(table: pa.Table, name: str, nbytes: int, verified_at: float | None = None,
             explore_steps: dict[int, int] | None = None) -> Entry:
    """The entry of a segment named ``name`` holding ``table`` (EXPERIENCE_SCHEMA) in ``nbytes`` bytes;
    ``explore_steps``: its info.explore_step -> rows when the caller has them (from the Experience objects, without
    reading the JSON back), else they are read from the ``info`` column."""
    steps = _explore_steps(table.column("info")) if explore_steps is None else explore_steps
    return Entry(name, table.num_rows, nbytes, stored_schema_version(table.schema),
                 _counts(table.column("model_version")), _counts(table.column("source")), dict(steps), verified_at,
                 time.time())


# ------------------------------------------------------------------ files
def catalog_dir(buffer_dir: str | os.PathLike) -> Path:
    return Path(buffer_dir) / CATALOG


_sequence = itertools.count()
"""Numbers this process's loose files: with the time and the pid, no two files ever share a name."""


def record(buffer_dir: str | os.PathLike, entries: list[Entry]) -> Path:
    """Publish ``entries`` as one new loose file (atomic: temp file, fsync, rename, fsync of the folder)."""
    d = catalog_dir(buffer_dir)
    d.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"format": FORMAT, "entries": [e.to_json() for e in entries]}).encode()
    return atomic_write_with(d / f"{time.time_ns():020d}-{os.getpid()}-{next(_sequence)}.json",
                             lambda tmp: tmp.write_bytes(data))


def save(buffer_dir: str | os.PathLike, entries: list[Entry]) -> None:
    """``record`` where the catalog is an optimisation: nothing to record, or a folder that is not writable
    (a read-only buffer is still readable; the entries are just not kept), is no error."""
    if not entries:
        return
    try:
        record(buffer_dir, entries)
        if len(entries) >= ROLLUP_BATCH:
            roll_up(buffer_dir)
    except OSError as e:
        logger.debug("could not record %d buffer catalog entries: %s", len(entries), e)


def _listing(d: Path) -> tuple[str | None, list[str]]:
    """(newest snapshot file, loose entry files) of the catalog folder."""
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return None, []
    snapshots = [n for n in names if _SNAPSHOT.match(n)]
    return (snapshots[-1] if snapshots else None), [n for n in names if _LOOSE.match(n)]


def _merge(entries: dict[str, Entry], entry: Entry) -> None:
    old = entries.get(entry.segment)
    if old is not None and (entry.verified_at is None or (old.verified_at or 0) > entry.verified_at):
        entry = replace(entry, verified_at=old.verified_at)
    entries[entry.segment] = entry


def _read_file(path: Path) -> list[Entry]:
    """The entries of a snapshot or loose file; none if it is of another format or damaged (its segments heal);
    FileNotFoundError if it is gone."""
    try:
        d = json.loads(path.read_bytes())
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            return []
        return [Entry.from_json(e) for e in d["entries"]]
    except (ValueError, KeyError, TypeError) as e:  # only a disk fault damages a renamed, fsynced file
        logger.warning("ignoring damaged buffer catalog file %s: %s", path, e)
        return []


def _read_files(d: Path, snapshot: str | None, loose: Iterable[str]) -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    for name in ([snapshot] if snapshot is not None else []) + list(loose):
        for entry in _read_file(d / name):
            _merge(entries, entry)
    return entries


def read_entries(buffer_dir: str | os.PathLike) -> tuple[dict[str, Entry], int]:
    """Every entry on disk, listed or not (snapshot + loose files, merged), and the number of loose files."""
    d = catalog_dir(buffer_dir)
    for _ in range(LOAD_ATTEMPTS):
        snapshot, loose = _listing(d)
        try:
            return _read_files(d, snapshot, loose), len(loose)
        except FileNotFoundError:  # a roll-up folded a file into a newer snapshot meanwhile: list again
            continue
    raise RuntimeError(f"buffer catalog '{d}' kept changing under {LOAD_ATTEMPTS} reads")


class EntryCache:
    """The entries on disk, kept by a long-running reader and refreshed incrementally: ``refresh`` reads only the
    files it has not read yet (a consumer looks up each new segment as it appears)."""

    def __init__(self, buffer_dir: str | os.PathLike) -> None:
        self.dir = catalog_dir(buffer_dir)
        self.entries: dict[str, Entry] = {}
        self._snapshot: str | None = None
        self._seen: set[str] = set()
        """Loose files already merged (forgotten once a roll-up has folded them away)."""

    def refresh(self, snapshot: bool = True) -> None:
        """Read the loose files not read yet and, with ``snapshot``, a new snapshot (every entry: worth it for
        many new segments at once, not for the one or two a running reader sees per call; an entry it misses
        costs that reader a CRC check it would have skipped)."""
        for _ in range(LOAD_ATTEMPTS):
            newest, loose = _listing(self.dir)
            try:
                fresh = [n for n in loose if n not in self._seen]
                read_snapshot = newest if snapshot and newest != self._snapshot else None
                for entry in _read_files(self.dir, read_snapshot, fresh).values():
                    _merge(self.entries, entry)
            except FileNotFoundError:  # a roll-up folded a file into a newer snapshot meanwhile: list again
                continue
            self._seen = set(loose)
            if read_snapshot is not None:
                self._snapshot = read_snapshot
            return

    def get(self, segment: str) -> Entry | None:
        return self.entries.get(segment)


def rollup_threshold(snapshot: str | None) -> int:
    m = _SNAPSHOT.match(snapshot or "")
    return max(ROLLUP_MIN, int(m.group(2)) // 32 if m else 0)


def roll_up(buffer_dir: str | os.PathLike, block: bool = False) -> bool:
    """Fold the loose files into a new snapshot of the listed segments' entries; return False if another process
    holds the roll-up lock (``block=False``) or the folder is not writable. A loose file holding the entry of a
    segment not listed yet (a writer between its two renames: younger than ``ORPHAN_GRACE_S`` and not in
    ``quarantine/``) is kept for the next roll-up."""
    d = catalog_dir(buffer_dir)
    try:
        fd = os.open(d / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        snapshot, loose = _listing(d)  # under the lock: no other roll-up deletes these meanwhile
        listed = {s.name for s in list_segments(buffer_dir)}
        q = Path(buffer_dir) / QUARANTINE
        quarantined = set(os.listdir(q)) if q.is_dir() else set()
        now = time.time()
        entries: dict[str, Entry] = {}
        for entry in _read_file(d / snapshot) if snapshot is not None else []:
            _merge(entries, entry)
        done = []
        for name in loose:
            pending = False
            for entry in _read_file(d / name):
                _merge(entries, entry)
                pending |= (entry.segment not in listed and entry.segment not in quarantined
                            and now - entry.written_at < ORPHAN_GRACE_S)
            if not pending:
                done.append(name)
        keep = [e.to_json() for n, e in entries.items() if n in listed]
        name = f"snapshot-{time.time_ns():020d}-{len(keep)}.json"
        data = json.dumps({"format": FORMAT, "entries": keep}).encode()
        atomic_write_with(d / name, lambda tmp: tmp.write_bytes(data))
        for n in done:
            (d / n).unlink(missing_ok=True)
        for n in os.listdir(d):
            if _SNAPSHOT.match(n) and n < name:
                (d / n).unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)


def maybe_roll_up(buffer_dir: str | os.PathLike) -> None:
    """Roll up if enough loose files have gathered (a directory listing when not)."""
    snapshot, loose = _listing(catalog_dir(buffer_dir))
    if len(loose) >= rollup_threshold(snapshot):
        try:
            roll_up(buffer_dir)
        except OSError as e:
            logger.debug("buffer catalog roll-up skipped: %s", e)


# ------------------------------------------------------------------ the catalog of the listed segments
@dataclass
class Catalog:
    """The listed segments (write order) with their entries; ``unreadable``: listed segments that could not be
    read to heal their entry (corrupt, truncated, another schema: ``buffer verify`` quarantines them)."""

    segments: list[SegmentInfo]
    entries: dict[str, Entry]
    unreadable: list[SegmentInfo]
    healed: int = 0
    """Entries written by this load for segments that had none."""

    def listed(self) -> Iterable[tuple[SegmentInfo, Entry]]:
        """(segment, entry) of every readable listed segment, in write order."""
        for info in self.segments:
            entry = self.entries.get(info.name)
            if entry is not None:
                yield info, entry


def heal(info: SegmentInfo) -> Entry:
    """The entry of a segment that has none, from a read of it (its CRC checked: the bytes are read anyway);
    SegmentError if it cannot be trusted. The caller records it (``save``)."""
    table = read_segment(info, verify=True)
    return entry_of(table, info.name, info.path.stat().st_size, verified_at=time.time())


def load(buffer_dir: str | os.PathLike, heal_missing: bool = True) -> Catalog:
    """The catalog of the segments listed now: entries from disk, missing ones healed (unless ``heal_missing``
    is False: then they are left out of ``entries`` and ``unreadable``)."""
    segments = list_segments(buffer_dir)
    if not segments:
        return Catalog([], {}, [])
    entries, loose = read_entries(buffer_dir)
    out: dict[str, Entry] = {}
    unreadable, healed = [], []
    for info in segments:
        entry = entries.get(info.name)
        if entry is None and heal_missing:
            try:
                entry = heal(info)
            except SegmentError as e:
                logger.error("buffer segment left out of the catalog: %s", e)
                unreadable.append(info)
                continue
            healed.append(entry)
        if entry is not None:
            out[info.name] = entry
    if healed:
        save(buffer_dir, healed)
    if loose >= ROLLUP_MIN:
        maybe_roll_up(buffer_dir)
    return Catalog(segments, out, unreadable, len(healed))


def read_verified_once(info: SegmentInfo, entry: Entry | None) -> tuple[pa.Table, Entry | None]:
    """Open a segment, CRC-checking its bytes only if the catalog has no check on record; return the table and,
    when the check (or a missing entry) was done now, the new entry for the caller to ``save`` (else None).
    SegmentError if it cannot be trusted."""
    if entry is not None and entry.verified_at is not None:
        return read_segment(info, verify=False), None
    table = read_segment(info, verify=True)
    now = time.time()
    if entry is None:
        return table, entry_of(table, info.name, info.path.stat().st_size, verified_at=now)
    return table, replace(entry, verified_at=now, written_at=now)


# ------------------------------------------------------------------ what the catalog answers
def explore_step_rows(buffer_dir: str | os.PathLike) -> dict[int, int]:
    """info.explore_step -> rows over the buffer's readable segments (an explorer's start: the steps already
    written, and their rows). Equals ``SELECT CAST(json_extract(info, '$.explore_step') AS BIGINT), count(*) ...
    GROUP BY 1`` over ``experiences`` for integer steps, without reading a segment that has an entry."""
    total: Counter = Counter()
    for _, entry in load(buffer_dir).listed():
        total.update(entry.explore_steps)
    return dict(sorted(total.items()))


def explore_group_rows(buffer_dir: str | os.PathLike, step: int) -> dict[int, int]:
    """info.explore_position -> rows of explorer step ``step``'s groups already in the buffer (streaming rollout
    writes a step group by group; an explorer that takes over a step whose explorer died runs only the others).
    Opens only the segments whose catalog entry counts rows of that step."""
    out: Counter = Counter()
    for info, entry in load(buffer_dir).listed():
        if step not in entry.explore_steps:
            continue
        try:
            texts = read_segment(info, verify=False).column("info").to_pylist()
        except SegmentError:  # never trained: its groups are explored again
            continue
        for text in texts:
            obj = json.loads(text)
            if step_value(obj.get("explore_step")) == step and step_value(obj.get("explore_position")) is not None:
                out[step_value(obj["explore_position"])] += 1
    return dict(sorted(out.items()))


_CONJUNCT = re.compile(r"\s+AND\s+", re.IGNORECASE)
_VERSION_CMP = re.compile(r"^\(?\s*model_version\s*(>=|<=|<>|!=|==|=|>|<)\s*(-?\d+)\s*\)?$", re.IGNORECASE)
_SOURCE_EQ = re.compile(r"^\(?\s*source\s*=\s*'([^']*)'\s*\)?$", re.IGNORECASE)
_SOURCE_IN = re.compile(r"^\(?\s*source\s+IN\s*\(\s*('[^']*'(?:\s*,\s*'[^']*')*)\s*\)\s*\)?$", re.IGNORECASE)
_UNSAFE = re.compile(r"\b(OR|NOT|BETWEEN|CASE|SELECT|EXISTS)\b|--|/\*|;|[()']", re.IGNORECASE)
_OPS = {">=": int.__ge__, "<=": int.__le__, ">": int.__gt__, "<": int.__lt__, "=": int.__eq__, "==": int.__eq__,
        "<>": int.__ne__, "!=": int.__ne__}


@dataclass(frozen=True)
class Prune:
    """Conditions that every row matching a SQL filter must meet, read from the filter's top-level conjuncts
    (``model_version <op> N``, ``source = 'x'``, ``source IN ('x', ...)``); a segment whose entry has no row that
    meets them holds no matching row and need not be opened. An empty Prune keeps every segment."""

    version_tests: tuple[tuple[str, int], ...] = ()
    sources: frozenset[str] | None = None

    @classmethod
    def of(cls, where: str | None, min_version: int | None = None) -> Prune:
        """From a SQL ``where`` (anything it cannot read soundly adds no condition) and a reader's ``min_version``
        (rows with -1 pass it: ``model_version >= min_version OR model_version = -1``)."""
        tests: list[tuple[str, int]] = []
        sources: frozenset[str] | None = None
        for part in _CONJUNCT.split(where.strip()) if where else ():
            if m := _VERSION_CMP.match(part.strip()):
                tests.append((m.group(1), int(m.group(2))))
            elif m := _SOURCE_EQ.match(part.strip()):
                sources = frozenset({m.group(1)}) & sources if sources is not None else frozenset({m.group(1)})
            elif m := _SOURCE_IN.match(part.strip()):
                found = frozenset(re.findall(r"'([^']*)'", m.group(1)))
                sources = found & sources if sources is not None else found
            elif _UNSAFE.search(part):
                # Parentheses, quotes, OR/NOT...: the split at AND may not be the filter's top level.
                return cls.of(None, min_version)
        if min_version is not None:
            tests.append(("min_version", min_version))
        return cls(tuple(tests), sources)

    def _version_ok(self, v: int) -> bool:
        return all((v >= n or v == -1) if op == "min_version" else _OPS[op](v, n) for op, n in self.version_tests)

    def may_match(self, entry: Entry) -> bool:
        if self.sources is not None and not self.sources & entry.sources.keys():
            return False
        return not self.version_tests or any(self._version_ok(v) for v in entry.versions)

    def __bool__(self) -> bool:
        return bool(self.version_tests) or self.sources is not None


def _mark(flags: np.ndarray, table: pa.Table, start: dict[str, int], rows: dict[str, int]) -> None:
    """Set ``flags[start[segment] + row]`` for every ``(segment, row)`` record of ``table`` (a ledger's) whose
    segment is listed; segment names are hashed once per record batch, not once per row."""
    for batch in table.to_batches():
        enc = pc.dictionary_encode(batch.column(batch.schema.get_field_index("segment")))
        names = enc.dictionary.to_pylist()
        base = np.array([start.get(n, -1) for n in names], np.int64)[enc.indices.to_numpy()]
        limit = np.array([rows.get(n, 0) for n in names], np.int64)[enc.indices.to_numpy()]
        row = batch.column(batch.schema.get_field_index("row")).to_numpy()
        ok = (base >= 0) & (row >= 0) & (row < limit)
        flags[base[ok] + row[ok]] = True


@dataclass
class Untrained:
    """What a consumer has not taken yet, per source (``consumer_summary``)."""

    by_source: dict[str, dict[str, int]]
    """source -> {rows, unconsumed (never handed out, not quarantined), quarantined}."""
    versions: tuple[int, int] | None
    """(min, max) model_version >= 0 of the unconsumed rows; None if there is none."""
    segments_read: int
    """Segments whose columns had to be read (partly consumed, mixed sources or versions)."""


def consumer_summary(buffer_dir: str | os.PathLike, consumer: str = "trainer") -> Untrained:
    """Rows per source that ``consumer`` has not taken (committed or pending, by the ledger's ``(segment, row)``
    records) nor quarantined, and the versions of those rows: from the catalog and the consumer's ledger. A
    segment is read only when part of it is taken and it mixes sources or versions."""
    cat = load(buffer_dir)
    listed = list(cat.listed())
    sizes = np.array([e.rows for _, e in listed], np.int64)
    starts = np.zeros(len(listed) + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    start = {info.name: int(s) for (info, _), s in zip(listed, starts[:-1], strict=True)}
    rows_of = {info.name: e.rows for info, e in listed}
    taken = np.zeros(int(starts[-1]), np.bool_)
    quarantined = np.zeros(int(starts[-1]), np.bool_)
    ledger = Ledger(buffer_dir, consumer, create=False)
    _mark(taken, ledger.committed(), start, rows_of)
    _mark(taken, ledger.pending(), start, rows_of)
    _mark(quarantined, ledger.quarantined(), start, rows_of)
    flagged = taken | quarantined
    by_source: dict[str, dict[str, int]] = {}
    lo, hi, read = None, None, 0

    def add(source: str, rows: int, unconsumed: int, quar: int) -> None:
        c = by_source.setdefault(source, {"rows": 0, "unconsumed": 0, "quarantined": 0})
        c["rows"] += rows
        c["unconsumed"] += unconsumed
        c["quarantined"] += quar

    for k, (info, entry) in enumerate(listed):
        span = slice(int(starts[k]), int(starts[k + 1]))
        untrained = ~flagged[span]
        n_untrained, n_quar = int(untrained.sum()), int(quarantined[span].sum())
        mixed_sources, mixed_versions = len(entry.sources) > 1, len(entry.versions) > 1
        table = None
        if n_untrained not in (0, entry.rows) and (mixed_sources or mixed_versions) or (
                mixed_sources and n_quar):
            table = read_segment(info, verify=False)
            read += 1
        if not mixed_sources:
            add(next(iter(entry.sources)), entry.rows, n_untrained, n_quar)
        elif n_untrained == entry.rows:
            for source, n in entry.sources.items():
                add(source, n, n, 0)
        else:
            sources = np.asarray(table.column("source").to_pylist(), dtype=object)
            for source, n in entry.sources.items():
                mine = sources == source
                add(source, n, int((mine & untrained).sum()), int((mine & quarantined[span]).sum()))
        if n_untrained == 0:
            continue
        if n_untrained == entry.rows or not mixed_versions:
            mine = [v for v in entry.versions if v >= 0]
        else:
            versions = table.column("model_version").to_numpy()[untrained]
            mine = versions[versions >= 0].tolist()
        if mine:
            lo = min(mine) if lo is None else min(lo, min(mine))
            hi = max(mine) if hi is None else max(hi, max(mine))
    return Untrained(dict(sorted(by_source.items())), None if lo is None else (lo, hi), read)


def check_schema_versions(buffer_dir: str | os.PathLike) -> None:
    """``segments.check_schema_versions`` from the catalog: footers are read only of the segments without an entry
    that could not be healed (a schema version outside READABLE_SCHEMA_VERSIONS cannot be read by this build)."""
    other: dict[str | None, list[str]] = {}
    cat = load(buffer_dir)
    for _, entry in cat.listed():
        if entry.schema_version not in READABLE_SCHEMA_VERSIONS:
            other.setdefault(entry.schema_version, []).append(entry.segment)
    add_other_schemas(cat.unreadable, other)
    refuse_other_schemas(buffer_dir, other)
