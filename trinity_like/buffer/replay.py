"""Offline replay: read-only iteration, by epochs, over stored experiences under a SQL filter.

Sources may be buffer folders (or run directories), single segment files (``.arrow``), Parquet files of
Experience rows (``buffer export`` writes them), or JSONL files of Experience rows; or SFT/DPO data as Trinity-RFT
reads it, tokenised as it is read (``trinity_like.buffer.ingest.replay_table``). Nothing is written: the
sources may belong to a finished run or to one that is still writing (the rows present at ``load`` count).

Untrainable rows (``table_row_problems``) are left out when the sources are loaded, named once in the log,
counted in ``quarantined`` and, given a ledger (the replaying run's own), recorded there: the sources stay
untouched.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from trinity_like.buffer.ledger import Ledger
from trinity_like.buffer.segments import SegmentInfo, read_segment
from trinity_like.buffer.sql import experiences_table
from trinity_like.common.errors import UserError
from trinity_like.common.experience import (
    EXPERIENCE_SCHEMA,
    Experience,
    experiences_to_table,
    table_row_problems,
    table_to_experiences,
    upgrade_table,
)

logger = logging.getLogger(__name__)


def _load_source(path: Path, where: str | None = None, data: dict | None = None) -> pa.Table:
    """A source's rows; a buffer folder's segments that its catalog rules out for ``where`` are not read (the
    caller applies ``where`` to what comes back). SFT/DPO data (not Experience rows) is tokenised as it is read,
    with ``data`` (``replay_table``'s tokenizer_path, fmt, split, subset_name, vocab_size)."""
    from trinity_like.buffer.ingest import is_experience_source, replay_table

    if not is_experience_source(path):
        if not data or not data.get("tokenizer_path"):
            raise UserError(f"replay source '{path}' holds no Experience rows (no prompt_ids): SFT/DPO data is "
                            "tokenised with the run's model as it is read; replay it in an offline run")
        return replay_table(path, **data)
    if path.is_dir():
        buffer_dir = path / "buffer" if (path / "buffer" / "segments").is_dir() else path
        return experiences_table(buffer_dir, where=where).select([f.name for f in EXPERIENCE_SCHEMA])
    if path.suffix == ".arrow":
        info = SegmentInfo.parse(path)
        if info is None:
            raise UserError(f"'{path}' is not a buffer segment file")
        return read_segment(info)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        if "token_versions" not in table.column_names:  # exported from a schema-1 buffer
            table = upgrade_table(table, "1")
        return table.select([f.name for f in EXPERIENCE_SCHEMA]).cast(EXPERIENCE_SCHEMA)
    if path.suffix == ".jsonl":
        exps = []
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, start=1):
                if line.strip():
                    try:
                        exps.append(Experience.from_json(line))
                    except (ValueError, TypeError) as e:
                        raise UserError(f"replay source '{path}' line {n} is not an Experience row ({e})") from None
        return experiences_to_table(exps)
    raise UserError(f"cannot replay '{path}': give a buffer folder, .arrow, .parquet or .jsonl")


class ReplayReader:
    """Batches of whole groups from stored experiences, epoch after epoch."""

    def __init__(self, sources: list[str | Path], where: str | None = None, batch_size: int = 32,
                 shuffle: bool = True, seed: int = 0, vocab_size: int | None = None,
                 quarantine: Ledger | None = None, data: dict | None = None) -> None:
        """``vocab_size``: the trained model's (token ids past it are untrainable; None: only negative ids);
        ``quarantine``: the ledger that records the untrainable rows; ``data``: how sources of SFT/DPO data are
        read (``trinity_like.buffer.ingest.replay_table``'s tokenizer_path, fmt, split, subset_name)."""
        from trinity_like.common.datasets import is_hub_id

        for s in sources:
            if not Path(s).exists() and not is_hub_id(str(s)):  # a hub id: read from the local cache, or refused
                raise UserError(f"replay source '{s}' does not exist")
        self.sources = [Path(s) for s in sources]
        self.data = {**(data or {}), "vocab_size": vocab_size} if data else None
        self.where, self.batch_size, self.shuffle, self.seed = where, batch_size, shuffle, seed
        self.vocab_size, self.quarantine = vocab_size, quarantine
        self.quarantined = 0
        """Rows of the sources left out as untrainable."""
        self.table = self._load()

    def _load(self) -> pa.Table:
        import duckdb

        tables = [self._trainable(s, _load_source(s, self.where, self.data)) for s in self.sources]
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

    def _trainable(self, source: Path, table: pa.Table) -> pa.Table:
        """``table`` without its untrainable rows; those are counted, and logged and recorded the first time."""
        problems = table_row_problems(table, self.vocab_size)
        if not problems:
            return table
        self.quarantined += len(problems)
        eids = table.column("eid").to_pylist()
        known = set() if self.quarantine is None else set(self.quarantine.quarantined().column("eid").to_pylist())
        new = [(eids[row], str(source), row, problem) for row, problem in problems.items() if eids[row] not in known]
        for eid, _, row, problem in new:
            logger.error("quarantined replay row %s (%s, row %d): %s; it is never trained", eid, source, row, problem)
        if self.quarantine is not None:
            self.quarantine.add_quarantined(new)
        keep = [i for i in range(table.num_rows) if i not in problems]
        return table.take(pa.array(keep, pa.int64()))

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


def replay_data(cfg) -> dict:
    """How an offline run of ``cfg`` reads replay sources of SFT/DPO data (``ReplayReader``'s ``data``): its model's
    tokenizer and ``buffer.replay_format``, ``replay_split``, ``replay_subset_name``."""
    b = cfg.buffer
    return {"tokenizer_path": cfg.model.path, "fmt": b.replay_format, "split": b.replay_split,
            "subset_name": b.replay_subset_name}
