"""The buffer catalog on real files: entries match the segments, concurrent writer processes lose no entry, a
SIGKILL leaves a readable catalog, missing entries heal, entries of removed segments go, and what stats, status,
the explorer's start and filtered reads get from it equals a full scan while fewer segments are opened."""

import json
import multiprocessing as mp
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

import trinity_like.buffer.catalog as catalog
import trinity_like.buffer.reader as reader
import trinity_like.buffer.segments as segments
import trinity_like.buffer.sql as sql
from trinity_like.buffer import BufferConsumer, BufferWriter, list_segments, query, read_only_sql
from trinity_like.buffer.catalog import Prune, explore_step_rows
from trinity_like.buffer.maintenance import buffer_stats, verify_buffer
from trinity_like.common.experience import Experience
from trinity_like.status import buffer_status


def _rows(n: int, gid: str, version: int = 0, source: str = "explorer", step: int | None = None,
          info: dict | None = None) -> list[Experience]:
    info = info if info is not None else ({} if step is None else {"explore_step": step, "accuracy": 0.5})
    return [Experience(prompt_ids=[1, 2], response_ids=[3, i], group_id=gid, model_version=version, source=source,
                       info=dict(info), eid=f"{gid}-{i}") for i in range(n)]


def _fill(buf: Path) -> None:
    """Six segments: two explorers' steps at versions 0-3, a human import (-1), and one segment mixing sources,
    versions and odd explore_step values."""
    a, b = BufferWriter(buf, writer_id="explorer"), BufferWriter(buf, writer_id="explorer")
    a.write(_rows(4, "s0", version=0, step=0))
    b.write(_rows(4, "s1", version=1, step=1))
    BufferWriter(buf, writer_id="ingest-human").write(_rows(3, "h", version=-1, source="human"))
    a.write(_rows(4, "s2", version=2, step=2))
    b.write(_rows(4, "s3", version=3, step=3))
    a.write(_rows(2, "m1", version=3, step=4) + _rows(2, "m2", version=-1, source="agent", step=4)
            + _rows(1, "m3", version=2, info={"explore_step": 4.0}) + _rows(1, "m4", version=2, info={"x": {"explore_step": 9}}))


def _full_scan(buf: Path) -> tuple[Counter, Counter, int]:
    by_source, by_version, size = Counter(), Counter(), 0
    for info in list_segments(buf):
        t = segments.read_segment(info)
        by_source.update(t.column("source").to_pylist())
        by_version.update(t.column("model_version").to_pylist())
        size += info.path.stat().st_size
    return by_source, by_version, size


def _count_reads(monkeypatch) -> list[str]:
    """Names of the segments opened from now on (by any buffer module)."""
    opened: list[str] = []
    real = segments.read_segment

    def counting(info, verify=True):
        opened.append(info.name)
        return real(info, verify)

    for module in (catalog, sql, reader):
        monkeypatch.setattr(module, "read_segment", counting)
    return opened


# ---------------------------------------------------------------- entries


def test_entries_match_the_segments_and_answer_stats_and_the_explorers_start(tmp_path, monkeypatch):
    _fill(tmp_path)
    entries, loose = catalog.read_entries(tmp_path)
    assert loose == 6 and set(entries) == {s.name for s in list_segments(tmp_path)}  # written by the writers
    for info in list_segments(tmp_path):
        expected = catalog.entry_of(segments.read_segment(info), info.name, info.path.stat().st_size)
        assert entries[info.name] == expected and entries[info.name].verified_at is None
    by_source, by_version, size = _full_scan(tmp_path)
    opened = _count_reads(monkeypatch)
    stats = buffer_stats(tmp_path)
    steps = explore_step_rows(tmp_path)
    assert opened == []  # neither opens a segment
    assert stats["by_source"] == dict(sorted(by_source.items())) and stats["rows"] == 25 and stats["bytes"] == size
    assert stats["by_model_version"] == {str(k): v for k, v in sorted(by_version.items())}
    old = read_only_sql(tmp_path, "SELECT CAST(json_extract(info, '$.explore_step') AS BIGINT) AS s, count(*) AS n "
                                  "FROM experiences WHERE s IS NOT NULL GROUP BY s")  # the explorer's query before
    assert steps == dict(zip(old.column("s").to_pylist(), old.column("n").to_pylist(), strict=True))
    assert steps == {0: 4, 1: 4, 2: 4, 3: 4, 4: 5}


def test_explore_steps_are_read_as_duckdb_casts_them():
    infos = ['{"explore_step": 3}', '{"a": {"explore_step": 9}, "explore_step": 4}', '{"explore_step": 5.5}',
             '{"explore_step": 4.5}', '{"x": "\\"explore_step\\": 7,"}', '{"explore_step": null}', '{}',
             '{"explore_step": "8"}', '{"explore_step":-2,"y":1}', '{"explore_step": true}', '{"explore_step": 1e1}',
             '{"a\\"explore_step": 6}', '{"z": 1,"explore_step" : 11 }']  # a key named a"explore_step; spaces
    import duckdb

    con = duckdb.connect()
    con.register("t", pa.table({"info": infos}))
    expected = dict(con.sql("SELECT CAST(json_extract(info, '$.explore_step') AS BIGINT) s, count(*) FROM t "
                            "WHERE s IS NOT NULL GROUP BY s").fetchall())
    assert dict(catalog._explore_steps(pa.chunked_array([infos]))) == expected
    # the writer's path reads the same values from the Experience objects, without the JSON
    values = [json.loads(i).get("explore_step") for i in infos]
    assert dict(Counter(v for v in map(catalog.step_value, values) if v is not None)) == expected


# ---------------------------------------------------------------- concurrency and crashes


def _write_segments(buf: str, tag: str, n: int, rollup_min: int) -> None:
    catalog.ROLLUP_MIN = rollup_min  # roll-ups while the other process writes
    w = BufferWriter(buf, writer_id=tag)
    for i in range(n):
        w.write(_rows(2, f"{tag}{i}", version=i, step=i))


def test_two_writer_processes_at_once_lose_no_entry(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_write_segments, args=(str(tmp_path), tag, 60, 4)) for tag in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    entries, _ = catalog.read_entries(tmp_path)
    names = {s.name for s in list_segments(tmp_path)}
    assert len(names) == 120 and set(entries) == names  # every segment has its entry, none healed
    assert any(n.startswith("snapshot-") for n in os.listdir(tmp_path / "catalog"))
    assert explore_step_rows(tmp_path) == {i: 4 for i in range(60)}


def _write_forever(buf: str, started) -> None:
    catalog.ROLLUP_MIN = 2  # a roll-up every other write: the kill often lands inside one
    w = BufferWriter(buf, writer_id="k")
    i = 0
    while True:
        w.write(_rows(2, f"k{i}", version=i, step=i))
        started.set()
        i += 1


def test_a_process_killed_mid_update_leaves_a_readable_catalog(tmp_path):
    ctx = mp.get_context("spawn")
    for delay in (0.05, 0.13, 0.21, 0.3):
        started = ctx.Event()
        p = ctx.Process(target=_write_forever, args=(str(tmp_path), started))
        p.start()
        assert started.wait(30)
        time.sleep(delay)
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        cat = catalog.load(tmp_path, heal_missing=False)
        assert set(cat.entries) == {s.name for s in cat.segments}  # entry before segment: nothing to heal
        assert catalog.roll_up(tmp_path)  # the dead holder's lock is gone
    full: Counter = Counter()
    for info in list_segments(tmp_path):
        full.update(json.loads(x)["explore_step"] for x in segments.read_segment(info).column("info").to_pylist())
    assert explore_step_rows(tmp_path) == dict(full) and len(full) >= 4


# ---------------------------------------------------------------- healing and removal


def test_a_segment_without_entry_is_read_once_and_healed(tmp_path, monkeypatch):
    _fill(tmp_path)
    import shutil

    shutil.rmtree(tmp_path / "catalog")  # as an older version left the buffer
    expected = _full_scan(tmp_path)
    opened = _count_reads(monkeypatch)
    stats = buffer_stats(tmp_path)
    assert len(opened) == 6 and stats["by_source"] == dict(sorted(expected[0].items()))
    opened.clear()
    cat = catalog.load(tmp_path)
    assert opened == [] and cat.healed == 0 and all(e.verified_at for e in cat.entries.values())
    # an entry lost from the snapshot: only that segment is read again
    catalog.roll_up(tmp_path, block=True)
    snap = next(n for n in os.listdir(tmp_path / "catalog") if n.startswith("snapshot-"))
    data = json.loads((tmp_path / "catalog" / snap).read_text())
    victim = list_segments(tmp_path)[4].name
    data["entries"] = [e for e in data["entries"] if e["segment"] != victim]
    (tmp_path / "catalog" / snap).write_text(json.dumps(data))
    assert catalog.load(tmp_path).healed == 1 and opened == [victim]


def test_entries_of_quarantined_and_deleted_segments_go(tmp_path, monkeypatch):
    _fill(tmp_path)
    bad, gone = list_segments(tmp_path)[1], list_segments(tmp_path)[3]
    with open(bad.path, "r+b") as fh:  # a flipped byte: the CRC no longer matches the name
        fh.seek(100)
        byte = fh.read(1)
        fh.seek(100)
        fh.write(bytes([byte[0] ^ 0xFF]))
    report = verify_buffer(tmp_path)
    assert [b["segment"] for b in report["bad"]] == [bad.name]
    entries, _ = catalog.read_entries(tmp_path)
    assert bad.name not in entries and all(e.verified_at for e in entries.values())
    gone.path.unlink()
    assert gone.name not in catalog.load(tmp_path).entries  # ignored at once...
    catalog.roll_up(tmp_path, block=True)
    assert gone.name not in catalog.read_entries(tmp_path)[0]  # ...and dropped by the next roll-up
    # a young entry without a segment (a writer between its two renames) stays until its grace is over
    catalog.record(tmp_path, [catalog.entry_of(segments.read_segment(list_segments(tmp_path)[0]), "x-0.arrow", 1)])
    catalog.roll_up(tmp_path, block=True)
    assert "x-0.arrow" in catalog.read_entries(tmp_path)[0]
    monkeypatch.setattr(catalog, "ORPHAN_GRACE_S", 0.0)
    catalog.roll_up(tmp_path, block=True)
    assert "x-0.arrow" not in catalog.read_entries(tmp_path)[0]
    assert buffer_stats(tmp_path)["rows"] == sum(s.num_rows for s in list_segments(tmp_path))


# ---------------------------------------------------------------- reads


@pytest.mark.parametrize("where, opens", [("model_version >= 3", 2), ("source = 'human'", 1),
                                          ("source IN ('agent', 'human') AND model_version = -1", 2),
                                          ("model_version >= 3 OR source = 'human'", 6), ("reward > 0", 6)])
def test_filtered_reads_return_the_same_rows_and_open_fewer_segments(tmp_path, monkeypatch, where, opens):
    _fill(tmp_path)
    full = read_only_sql(tmp_path, f"SELECT * FROM experiences WHERE {where} ORDER BY _segment, _row")  # no pruning
    opened = _count_reads(monkeypatch)
    assert query(tmp_path, where).equals(full)
    assert len(opened) == opens


def test_the_crc_is_checked_once_and_consumers_prune_by_where(tmp_path, monkeypatch):
    _fill(tmp_path)
    crcs: list[str] = []
    real = segments.file_crc32
    monkeypatch.setattr(segments, "file_crc32", lambda p: crcs.append(p.name) or real(p))
    first = BufferConsumer(tmp_path, name="first")
    first.stats()
    assert len(crcs) == 6  # first sight: every segment checked...
    first.commit(0)  # ...and the checks recorded (in batches, and at each commit)
    crcs.clear()
    second = BufferConsumer(tmp_path, name="second", where="source = 'human'")
    second.stats()
    assert crcs == []
    opened = _count_reads(monkeypatch)
    got = second.read(3, step=1, timeout_s=5)
    assert [e.eid for e in got] == ["h-0", "h-1", "h-2"]
    assert opened == [list_segments(tmp_path)[2].name] * 2  # the human segment: the SQL scan, then the hand-out


def test_status_from_the_catalog_equals_the_full_scan(tmp_path):
    _fill(tmp_path)
    c = BufferConsumer(tmp_path, vocab_size=100)
    c.read(4, step=1, timeout_s=5)
    c.commit(1)
    assert len(c.read(2, step=2, timeout_s=5, where="source = 'agent'")) == 2  # part of the mixed segment
    assert len(c.read(2, step=3, timeout_s=5, where="group_id = 'm1'")) == 2  # pending, not committed
    old = read_only_sql(tmp_path, """
        WITH flagged AS (
            SELECT source, model_version,
                   eid IN (SELECT eid FROM quarantine WHERE consumer = 'trainer') AS quarantined,
                   eid IN (SELECT eid FROM consumption WHERE consumer = 'trainer') AS consumed
            FROM experiences),
        tagged AS (SELECT *, NOT consumed AND NOT quarantined AS untrained FROM flagged)
        SELECT source, count(*) AS rows, count(*) FILTER (WHERE untrained) AS unconsumed,
               count(*) FILTER (WHERE quarantined) AS quarantined,
               min(model_version) FILTER (WHERE untrained AND model_version >= 0) AS min_version,
               max(model_version) FILTER (WHERE untrained AND model_version >= 0) AS max_version
        FROM tagged GROUP BY source ORDER BY source""").to_pylist()  # status's query before the catalog
    st = buffer_status(tmp_path, trainer_version=5)
    assert st["by_source"] == {r["source"]: {"rows": r["rows"], "unconsumed": r["unconsumed"]} for r in old}
    assert st["unconsumed"] == sum(r["unconsumed"] for r in old) and st["rows"] == 25
    versions = [v for r in old for v in (r["min_version"], r["max_version"]) if v is not None]
    assert st["unconsumed_versions"] == [min(versions), max(versions)]
    assert catalog.consumer_summary(tmp_path).segments_read <= 1  # only the partly taken mixed segment


def test_prune_reads_only_what_it_can_read_soundly():
    assert Prune.of("model_version >= 3 AND source = 'a'") == Prune(((">=", 3),), frozenset({"a"}))
    assert Prune.of("MODEL_VERSION < 2 and reward > 0") == Prune((("<", 2),), None)
    for unsound in ("model_version >= 3 OR source = 'a'", "(model_version >= 3 AND x) OR y",
                    "source = 'a AND model_version > 9'", "NOT model_version >= 3 AND source = 'a'",
                    "model_version BETWEEN 1 AND 5"):
        assert not Prune.of(unsound), unsound
    entry = catalog.Entry("s", 3, 1, "1", {-1: 1, 2: 2}, {"explorer": 3}, {})
    assert Prune.of(None, min_version=5).may_match(entry)  # -1 rows are never stale
    assert not Prune.of("model_version >= 5").may_match(entry)
    assert not Prune.of("source IN ('human')").may_match(entry)
