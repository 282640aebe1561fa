"""Segment files: the unit of storage of the experience buffer.

A segment is one Arrow IPC file (uncompressed), written once and never changed, named

    segments/<time_ns:020d>-<writer>-<seq:06d>-<rows>-<crc32:08x>.arrow

The name carries the row count (so back-pressure is a directory listing, not a scan) and the CRC-32 of the
file's bytes (so the checksum is published by the same atomic rename as the data: there is no moment when a
segment exists without its checksum). Names start with a nanosecond timestamp, so name order is write order.

Why Arrow IPC and not Parquet (bench/segment_format.py, figures in bench/RESULTS.md): IPC writes 4-6x faster
than Parquet (snappy or uncompressed) and is memory-mapped and scanned by DuckDB without a decode; Parquet's
smaller files (~0.65x) do not pay for the slower write on the explorer's hot path. ``trinity-like buffer
export`` writes Parquet for archives.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from trinity_like.common.experience import (
    EXPERIENCE_SCHEMA,
    READABLE_SCHEMA_VERSIONS,
    SCHEMA_VERSION_KEY,
    readable_versions,
    upgrade_table,
)
from trinity_like.common.fs import atomic_write_named, file_crc32

logger = logging.getLogger(__name__)

SEGMENTS = "segments"
QUARANTINE = "quarantine"
SUFFIX = ".arrow"
_NAME = re.compile(r"^(\d{20})-(.+)-(\d{6})-(\d+)-([0-9a-f]{8})\.arrow$")


class SegmentError(RuntimeError):
    """A segment that cannot be trusted: checksum mismatch, truncated, unreadable or from another schema."""


@dataclass(frozen=True)
class SegmentInfo:
    """What a segment's name says about it."""

    name: str
    folder: Path
    num_rows: int
    crc32: int

    @property
    def path(self) -> Path:
        # Built on demand: a listing of 20k segments then creates no Path objects (pathlib is slow).
        return self.folder / self.name

    @classmethod
    def parse(cls, path: Path) -> SegmentInfo | None:
        return cls.of_name(path.parent, path.name)

    @classmethod
    def of_name(cls, folder: Path, name: str) -> SegmentInfo | None:
        m = _NAME.match(name)
        if m is None:
            return None
        return cls(name, folder, int(m.group(4)), int(m.group(5), 16))


def segment_dir(buffer_dir: str | os.PathLike) -> Path:
    return Path(buffer_dir) / SEGMENTS


def list_segments(buffer_dir: str | os.PathLike) -> list[SegmentInfo]:
    """Published segments in write order (temporary files of unfinished writes are never listed)."""
    d = segment_dir(buffer_dir)
    if not d.is_dir():
        return []
    out = []
    for name in sorted(os.listdir(d)):
        if name.startswith(".") or not name.endswith(SUFFIX):
            continue
        info = SegmentInfo.of_name(d, name)
        if info is None:
            logger.error("buffer segment %s has a malformed name; ignoring it (run `buffer verify`)", d / name)
            continue
        out.append(info)
    return out


def write_segment(buffer_dir: str | os.PathLike, table: pa.Table, writer_id: str, seq: int,
                  before_publish: Callable[[str, int, pa.Table], None] | None = None) -> SegmentInfo:
    """Write ``table`` as a new segment, atomically, and return its info. ``before_publish(name, nbytes, table)``
    runs after the data is written and synced and before the rename that publishes it (``BufferWriter`` records
    the segment's catalog entry there: see ``catalog.py``)."""
    if table.num_rows == 0:
        raise ValueError("a segment needs at least one row")
    d = segment_dir(buffer_dir)
    d.mkdir(parents=True, exist_ok=True)
    if not table.schema.equals(EXPERIENCE_SCHEMA, check_metadata=True):
        table = table.cast(EXPERIENCE_SCHEMA)
    stamp = f"{time.time_ns():020d}-{writer_id}-{seq:06d}-{table.num_rows}"
    # Serialise in memory first: the checksum is then computed on the bytes, without reading the file back.
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, EXPERIENCE_SCHEMA) as writer:
        writer.write_table(table)
    data = sink.getvalue()
    crc = zlib.crc32(memoryview(data))

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            fh.write(memoryview(data))

    name = f"{stamp}-{crc:08x}{SUFFIX}"

    def name_of(_tmp: Path) -> str:
        if before_publish is not None:
            before_publish(name, len(data), table)
        return name

    # The checksum is part of the name, so data and checksum are published by the same rename.
    path = atomic_write_named(d, write, name_of, tmp_prefix=stamp)
    info = SegmentInfo.parse(path)
    assert info is not None
    return info


def read_segment(info: SegmentInfo, verify: bool = True) -> pa.Table:
    """Memory-map a segment as an Arrow table of EXPERIENCE_SCHEMA (a segment of an older readable schema version
    comes back upgraded: ``upgrade_table``); raise SegmentError if it cannot be trusted."""
    try:
        if verify:
            actual = file_crc32(info.path)
            if actual != info.crc32:
                raise SegmentError(f"segment {info.path} is corrupt or truncated: crc32 {actual:08x}, "
                                   f"name says {info.crc32:08x}")
        table = ipc.open_file(pa.memory_map(str(info.path))).read_all()
    except (OSError, pa.ArrowInvalid) as e:
        raise SegmentError(f"segment {info.path} is unreadable: {e}") from None
    version = (table.schema.metadata or {}).get(SCHEMA_VERSION_KEY)
    if version is None or version.decode() not in READABLE_SCHEMA_VERSIONS:
        raise SegmentError(f"segment {info.path} has schema version {version!r}, this build reads "
                           f"{readable_versions()}; use the trinity_like version that wrote it to export it")
    if table.num_rows != info.num_rows:
        raise SegmentError(f"segment {info.path} holds {table.num_rows} rows, its name says {info.num_rows}")
    return upgrade_table(table, version.decode())


def schema_version(info: SegmentInfo) -> str | None:
    """The schema version a segment was written with (from its footer; the rows are not read), or None if
    the file records none; raise SegmentError if it is unreadable."""
    try:
        metadata = ipc.open_file(pa.memory_map(str(info.path))).schema.metadata or {}
    except (OSError, pa.ArrowInvalid) as e:
        raise SegmentError(f"segment {info.path} is unreadable: {e}") from None
    version = metadata.get(SCHEMA_VERSION_KEY)
    return version.decode() if version is not None else None


def check_schema_versions(buffer_dir: str | os.PathLike) -> None:
    """Refuse a buffer that holds segments of a schema version this build cannot read (readers would have to skip
    them: a run
    would silently train on part of its data). Unreadable segments are left to ``buffer verify``. Reads every
    segment's footer; ``catalog.check_schema_versions`` does the same from the catalog."""
    other: dict[str | None, list[str]] = {}
    add_other_schemas(list_segments(buffer_dir), other)
    refuse_other_schemas(buffer_dir, other)


def add_other_schemas(infos: Iterable[SegmentInfo], other: dict[str | None, list[str]]) -> None:
    """Add to ``other`` (schema version -> segment names) each readable segment of ``infos`` whose footer names
    a schema version outside READABLE_SCHEMA_VERSIONS."""
    for info in infos:
        try:
            version = schema_version(info)
        except SegmentError:
            continue
        if version not in READABLE_SCHEMA_VERSIONS:
            other.setdefault(version, []).append(info.name)


def refuse_other_schemas(buffer_dir: str | os.PathLike, other: dict[str | None, list[str]]) -> None:
    """Raise UserError naming the segments of ``other`` schema versions (version -> segment names), if any."""
    from trinity_like.common.errors import UserError

    if other:
        found = "; ".join(f"{len(names)} segment(s) of schema version {v or 'none'}, e.g. {names[0]}"
                          for v, names in other.items())
        raise UserError(f"buffer '{buffer_dir}' holds {found}, and this build reads only {readable_versions()}; "
                        "export them with the trinity_like version that wrote them (`trinity-like buffer export`) "
                        "and ingest the file into a new buffer, or set buffer.path (or name) to start from an empty one")


def stored_eids(buffer_dir: str | os.PathLike) -> set[str]:
    """Every eid in the buffer's readable segments (unreadable ones are left out with a logged error)."""
    eids: set[str] = set()
    for info in list_segments(buffer_dir):
        try:
            eids.update(read_segment(info, verify=False).column("eid").to_pylist())
        except SegmentError as e:
            logger.error("leaving a segment out of the stored eids: %s", e)
    return eids


def quarantine(buffer_dir: str | os.PathLike, info: SegmentInfo) -> Path:
    """Move a bad segment out of the way, into ``buffer/quarantine/``."""
    q = Path(buffer_dir) / QUARANTINE
    q.mkdir(parents=True, exist_ok=True)
    target = q / info.name
    shutil.move(str(info.path), str(target))
    return target
