"""SQL over a buffer folder with an in-process DuckDB: the views ``experiences``, ``consumption`` and
``quarantine`` (rows a consumer found untrainable).

Segments are memory-mapped Arrow tables registered with DuckDB (no copy, no ``.duckdb`` file, so any
number of processes can query while writers write). Corrupt segments are left out with a logged error. The
catalog (``catalog.py``) lists what each segment holds: ``query`` opens only the segments that can match its
filter, and a segment's CRC is checked the first time it is opened, not at every query.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pyarrow as pa

import trinity_like.buffer.catalog as catalog
from trinity_like.buffer.ledger import QUARANTINE_SCHEMA, Ledger, consumer_names
from trinity_like.buffer.segments import SegmentError, list_segments, read_segment
from trinity_like.common.errors import UserError
from trinity_like.common.experience import EXPERIENCE_SCHEMA

logger = logging.getLogger(__name__)

READ_ONLY_STATEMENTS = ("SELECT", "EXPLAIN")


def experiences_table(buffer_dir: str | Path, verify: bool = True, where: str | None = None) -> pa.Table:
    """Every row of every readable segment, with ``_segment`` and ``_row`` columns, as one Arrow table.

    ``verify``: CRC-check each segment whose check is not on record in the catalog yet (and record it).
    ``where``: a SQL filter the caller applies to the result; segments that the catalog shows cannot hold a
    matching row (``catalog.Prune``) are left out without being opened."""
    cat = catalog.load(buffer_dir)
    prune = catalog.Prune.of(where)
    parts, updated = [], []
    for info, entry in cat.listed():
        if prune and not prune.may_match(entry):
            continue
        try:
            if verify:
                t, new = catalog.read_verified_once(info, entry)
                updated.extend([new] if new is not None else [])
            else:
                t = read_segment(info, verify=False)
        except SegmentError as e:
            logger.error("leaving a segment out of the query: %s", e)
            continue
        parts.append(t.append_column("_segment", pa.repeat(info.name, t.num_rows))
                     .append_column("_row", pa.array(range(t.num_rows), pa.int64())))
    catalog.save(buffer_dir, updated)
    if not parts:
        empty = EXPERIENCE_SCHEMA.empty_table()
        return empty.append_column("_segment", pa.array([], pa.string())).append_column("_row", pa.array([], pa.int64()))
    return pa.concat_tables(parts)


def consumption_table(buffer_dir: str | Path) -> pa.Table:
    """``(consumer, eid, step, committed)`` for every consumer's ledger."""
    parts = []
    for name in consumer_names(buffer_dir):
        ledger = Ledger(buffer_dir, name, create=False)
        for table, committed in ((ledger.committed(), True), (ledger.pending(), False)):
            n = table.num_rows
            parts.append(pa.table({"consumer": pa.repeat(name, n), "eid": table.column("eid"),
                                   "step": table.column("step"), "committed": pa.repeat(committed, n)}))
    schema = pa.schema([("consumer", pa.string()), ("eid", pa.string()), ("step", pa.int64()),
                        ("committed", pa.bool_())])
    return pa.concat_tables([p.cast(schema) for p in parts]) if parts else schema.empty_table()


def quarantine_table(buffer_dir: str | Path) -> pa.Table:
    """``(consumer, eid, segment, row, problem)`` for every row a consumer quarantined."""
    parts = []
    for name in consumer_names(buffer_dir):
        table = Ledger(buffer_dir, name, create=False).quarantined()
        parts.append(table.add_column(0, "consumer", pa.array([name] * table.num_rows, pa.string())))
    return pa.concat_tables(parts) if parts else QUARANTINE_SCHEMA.insert(0, pa.field("consumer", pa.string())
                                                                           ).empty_table()


def connect(buffer_dir: str | Path, where: str | None = None, sql: str | None = None):
    """An in-memory DuckDB connection with the views ``experiences``, ``consumption`` and ``quarantine``;
    ``experiences`` leaves out the segments that cannot match ``where`` (see ``experiences_table``). Given the
    ``sql`` text that will run, a ledger view it does not name is not built (they read every ledger file)."""
    import duckdb

    con = duckdb.connect(":memory:")
    con.execute("SET threads TO 1")
    con.register("experiences", experiences_table(buffer_dir, where=where))
    for view, build in (("consumption", consumption_table), ("quarantine", quarantine_table)):
        if sql is None or re.search(rf"\b{view}\b", sql, re.IGNORECASE):
            con.register(view, build(buffer_dir))
    return con


def query(buffer_dir: str | Path, where: str = "TRUE", order_by: str = "_segment, _row") -> pa.Table:
    """Rows of ``experiences`` matching ``where`` (segments the catalog rules out are not opened)."""
    con = connect(buffer_dir, where, sql=where)
    try:
        return con.sql(f"SELECT * FROM experiences WHERE {where} ORDER BY {order_by}").to_arrow_table()
    finally:
        con.close()


def read_only_sql(buffer_dir: str | Path, sql: str) -> pa.Table:
    """Run one read-only statement (SELECT/EXPLAIN, also WITH ... SELECT); refuse anything that writes."""
    import duckdb

    con = connect(buffer_dir, sql=sql)
    try:
        statements = con.extract_statements(sql)
        if len(statements) != 1:
            raise UserError(f"give exactly one SQL statement, got {len(statements)}")
        kind = statements[0].type.name
        if kind not in READ_ONLY_STATEMENTS:
            raise UserError(f"refusing a {kind} statement: buffer query is read-only (SELECT only)")
        try:
            return con.sql(sql).to_arrow_table()
        except duckdb.Error as e:
            raise UserError(f"SQL error: {str(e).splitlines()[0]}") from None
    finally:
        con.close()


def count_rows(buffer_dir: str | Path) -> int:
    return sum(s.num_rows for s in list_segments(buffer_dir))





GROUP_CONSUMPTION_SQL = """
WITH kept AS (
    SELECT group_id, eid FROM experiences
    WHERE source = 'explorer' AND regexp_matches(group_id, '^s\\d+-.*-\\d+$')
      AND eid NOT IN (SELECT eid FROM quarantine WHERE consumer = $consumer)),
sizes AS (SELECT group_id, count(*) AS rows FROM kept GROUP BY group_id),
per_step AS (
    SELECT kept.group_id, c.step, count(*) AS trained
    FROM kept JOIN consumption c ON c.eid = kept.eid AND c.consumer = $consumer AND c.committed
    GROUP BY kept.group_id, c.step)
SELECT group_id, rows, step, trained FROM per_step JOIN sizes USING (group_id)
WHERE trained <> rows
ORDER BY group_id, step
"""


def group_consumption(buffer_dir: str | Path, consumer: str = "trainer") -> list[dict]:
    """(group_id, rows, step, trained) for each committed step of ``consumer`` that trained only part of an
    explorer group (its id as the explorer stamps it, ``reader.EXPLORER_GROUP``): a group split over steps, or partly trained. Empty when every step that trained a group
    trained all of it (exactly once with ``max_uses`` 1, whole at each use with replay). Rows the consumer
    quarantined (a group written twice keeps its first copy) do not count."""
    con = connect(buffer_dir, sql=GROUP_CONSUMPTION_SQL)
    try:
        cursor = con.execute(GROUP_CONSUMPTION_SQL, {"consumer": consumer})
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    finally:
        con.close()
