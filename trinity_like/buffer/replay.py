"""Offline replay: read-only iteration, by epochs, over stored experiences under a SQL filter.

Sources may be buffer folders (or run directories), single segment files (``.arrow``), Parquet files of
Experience rows (``buffer export`` writes them), or JSONL files of Experience rows. Nothing is written: the
sources may belong to a finished run or to one that is still writing (the rows present at ``load`` count).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from trinity_like.buffer.segments import SegmentInfo, read_segment
from trinity_like.buffer.sql import experiences_table
from trinity_like.common.errors import UserError
from trinity_like.common.experience import (
    EXPERIENCE_SCHEMA,
    Experience,
    experiences_to_table,
    table_to_experiences,
)


def _load_source(path: Path) -> pa.Table:
    if path.is_dir():
        buffer_dir = path / "buffer" if (path / "buffer" / "segments").is_dir() else path
        return experiences_table(buffer_dir).select([f.name for f in EXPERIENCE_SCHEMA])
    if path.suffix == ".arrow":
        info = SegmentInfo.parse(path)
        if info is None:
            raise UserError(f"'{path}' is not a buffer segment file")
        return read_segment(info)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).select([f.name for f in EXPERIENCE_SCHEMA]).cast(EXPERIENCE_SCHEMA)
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as fh:
            return experiences_to_table([Experience.from_json(line) for line in fh if line.strip()])
    raise UserError(f"cannot replay '{path}': give a buffer folder, .arrow, .parquet or .jsonl")


class ReplayReader:
    """Batches of whole groups from stored experiences, epoch after epoch."""

    def __init__(self, sources: list[str | Path], where: str | None = None, batch_size: int = 32,
                 shuffle: bool = True, seed: int = 0) -> None:
        for s in sources:
            if not Path(s).exists():
                raise UserError(f"replay source '{s}' does not exist")
        self.sources = [Path(s) for s in sources]
        self.where, self.batch_size, self.shuffle, self.seed = where, batch_size, shuffle, seed
        self.table = self._load()

    def _load(self) -> pa.Table:
        import duckdb

        tables = [_load_source(s) for s in self.sources]
        rows = pa.concat_tables(tables) if tables else EXPERIENCE_SCHEMA.empty_table()
        con = duckdb.connect(":memory:")
        try:
            con.register("experiences", rows)
            sql = f"SELECT * FROM experiences WHERE {self.where or 'TRUE'}"
            try:
                out = con.sql(sql).to_arrow_table()
            except duckdb.Error as e:
                raise UserError(f"replay filter failed: {str(e).splitlines()[0]}") from None
        finally:
            con.close()
        # The same eid in two sources (a buffer and its export) counts once.
        seen: set[str] = set()
        keep = [i for i, eid in enumerate(out.column("eid").to_pylist()) if not (eid in seen or seen.add(eid))]
        return out.take(pa.array(keep, pa.int64())).cast(EXPERIENCE_SCHEMA)

    def __len__(self) -> int:
        return self.table.num_rows

    def epoch(self, k: int = 0) -> Iterator[list[Experience]]:
        """The batches of epoch ``k``: whole groups, shuffled by group with seed (seed, k) when asked."""
        groups: dict[str, list[int]] = {}
        for i, g in enumerate(self.table.column("group_id").to_pylist()):
            groups.setdefault(g, []).append(i)
        order = list(groups.values())
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + k).shuffle(order)
        batch: list[int] = []
        for rows in order:
            if batch and len(batch) + len(rows) > self.batch_size:
                yield table_to_experiences(self.table.take(pa.array(batch)))
                batch = []
            batch.extend(rows)
        if batch:
            yield table_to_experiences(self.table.take(pa.array(batch)))
