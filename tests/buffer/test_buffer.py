"""The experience buffer on real files, with real writer and reader processes (some killed with SIGKILL)."""

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from trinity_like.buffer import BufferConsumer, BufferWriter, count_rows, list_segments, query, read_only_sql
from trinity_like.buffer.segments import read_segment
from trinity_like.buffer.sql import consumption_table
from trinity_like.common.experience import Experience


def _group(gid: str, n: int, version: int = 0, reward: float = 0.0) -> list[Experience]:
    return [Experience(prompt_ids=[1, 2], response_ids=[3, i], group_id=gid, model_version=version,
                       reward=reward + i) for i in range(n)]


# ---------------------------------------------------------------- storage


def test_segments_are_published_whole_with_their_checksum(tmp_path):
    w = BufferWriter(tmp_path, writer_id="ex")
    info = w.write(_group("g0", 4))
    assert info.path.parent.name == "segments" and info.num_rows == 4
    assert read_segment(info).num_rows == 4
    assert not [n for n in os.listdir(info.path.parent) if n.startswith(".")]  # no temp files left
    with pytest.raises(ValueError):
        w.write([])


def test_reads_in_write_order_with_min_version_and_stale_count(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("old", 2, version=0))
    w.write(_group("new", 2, version=3))
    c = BufferConsumer(tmp_path)
    assert [e.group_id for e in c.try_read(2, min_version=2)] == ["new", "new"]
    assert c.stats()["buffer/skipped_stale"] == 2  # counted, not silently dropped
    assert c.try_read(2, min_version=2) is None
    assert c.stats()["buffer/skipped_stale"] == 2  # counted once
    assert [e.group_id for e in c.try_read(2)] == ["old", "old"]


def test_under_a_staleness_bound_the_oldest_policy_goes_first_whatever_the_write_order(tmp_path):
    # two explorers: the one holding the newer step's rows (version 2) publishes first
    BufferWriter(tmp_path, writer_id="e2").write(_group("v2", 2, version=2))
    BufferWriter(tmp_path, writer_id="human").write(_group("demo", 2, version=-1))  # never stale
    BufferWriter(tmp_path, writer_id="e1").write(_group("v1", 2, version=1))
    c = BufferConsumer(tmp_path)
    # trainer step at min_version 1: the version-1 rows go first, so nothing goes stale at the next step; the
    # demonstrations keep their place after the segment written before them
    assert [e.group_id for e in c.try_read(2, min_version=1)] == ["v1", "v1"]
    assert [e.group_id for e in c.try_read(2, min_version=2)] == ["v2", "v2"]
    assert [e.group_id for e in c.try_read(2, min_version=2)] == ["demo", "demo"]
    assert c.stats()["buffer/skipped_stale"] == 0
    # without a bound, write order stands
    assert [e.group_id for e in BufferConsumer(tmp_path, name="other").try_read(2)] == ["v2", "v2"]


def test_groups_are_never_split(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("a", 3) + _group("b", 3))
    w.write(_group("c", 2))
    c = BufferConsumer(tmp_path)
    first = c.try_read(4)  # a (3) fits, b (3) would overflow: the batch closes with a whole group
    assert [e.group_id for e in first] == ["a"] * 3
    assert [e.group_id for e in c.try_read(5)] == ["b"] * 3 + ["c"] * 2
    assert c.try_read(1) is None


def test_same_group_id_in_two_writes_is_two_groups(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("g", 2))
    w.write(_group("g", 2))
    c = BufferConsumer(tmp_path)
    assert len(c.try_read(2)) == 2 and len(c.try_read(2)) == 2


def test_policies_newest_priority_where(tmp_path):
    w = BufferWriter(tmp_path)
    for k in range(3):
        w.write(_group(f"g{k}", 2, version=k, reward=10.0 * k))
    newest = BufferConsumer(tmp_path, name="n", policy="newest")
    assert [e.group_id for e in newest.try_read(2)] == ["g2", "g2"]
    prio = BufferConsumer(tmp_path, name="p", policy="priority", priority="-reward")
    assert [e.group_id for e in prio.try_read(2)] == ["g0", "g0"]  # lowest reward first via -reward
    var = BufferConsumer(tmp_path, name="v", policy="priority",
                         priority="var_samp(reward) OVER (PARTITION BY _seg, group_id) + model_version")
    assert [e.group_id for e in var.try_read(2)] == ["g2", "g2"]
    filt = BufferConsumer(tmp_path, name="f", where="reward >= 10 AND model_version < 2")
    assert [e.group_id for e in filt.try_read(2)] == ["g1", "g1"]
    assert filt.try_read(2) is None
    with pytest.raises(ValueError, match="SQL failed"):
        BufferConsumer(tmp_path, name="bad", where="no_such_column > 1").try_read(2)


def test_replay_reuses_rows_after_cooldown(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("a", 2))
    c = BufferConsumer(tmp_path, policy="replay", max_uses=2, cooldown_steps=2)
    first = c.try_read(2, step=1)
    assert c.try_read(2, step=2) is None  # cooling down
    again = c.try_read(2, step=3)
    assert [e.eid for e in again] == [e.eid for e in first]
    assert c.try_read(2, step=10) is None  # used max_uses times
    c.commit(3)
    rows = consumption_table(tmp_path).to_pylist()
    assert sorted(r["step"] for r in rows) == [1, 1, 3, 3]


def test_capacity_back_pressure(tmp_path):
    w = BufferWriter(tmp_path, capacity=4)
    w.write(_group("a", 4))
    assert w.pressure() == 1.0
    with pytest.raises(TimeoutError, match="stayed at capacity"):
        w.wait_for_room(timeout_s=0.1)
    c = BufferConsumer(tmp_path)
    c.try_read(4, step=1)  # pending consumption already makes room
    assert w.unconsumed() == 0 and w.wait_for_room(timeout_s=0.1) < 0.1


def test_commit_and_resume_redeliver_exactly_the_uncommitted(tmp_path):
    w = BufferWriter(tmp_path)
    for g in range(4):
        w.write(_group(f"g{g}", 2))
    c = BufferConsumer(tmp_path)
    step1 = c.read(2, timeout_s=1, step=1)
    step2 = c.read(2, timeout_s=1, step=2)
    c.commit(2)  # the checkpoint of step 2
    step3 = c.read(2, timeout_s=1, step=3)  # consumed, never committed: lost with a crash
    assert {r["committed"] for r in consumption_table(tmp_path).to_pylist() if r["step"] == 3} == {False}
    del c
    resumed = BufferConsumer(tmp_path, resume_step=2)
    again = resumed.read(2, timeout_s=1, step=3)
    assert [e.eid for e in again] == [e.eid for e in step3]
    # resuming from an older checkpoint (step 1) forgets the commit of step 2 as well
    resumed.commit(3)
    older = BufferConsumer(tmp_path, resume_step=1)
    assert older.committed_steps() == []  # commit files are named by the step they were made at (2 and 3)
    got = {e.eid for e in older.read(6, timeout_s=1, step=2)}
    assert got == {e.eid for e in step1 + step2 + step3}


def test_read_times_out_with_a_clear_message(tmp_path):
    with pytest.raises(TimeoutError, match="fewer than 2 unconsumed"):
        BufferConsumer(tmp_path).read(2, timeout_s=0.1)


def test_sql_views_and_read_only_queries(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("a", 2, version=1))
    w.write(_group("b", 3, version=2))
    c = BufferConsumer(tmp_path)
    c.try_read(2, step=1)
    c.commit(1)
    out = read_only_sql(tmp_path, "SELECT model_version, count(*) AS n FROM experiences GROUP BY 1 ORDER BY 1")
    assert out.to_pylist() == [{"model_version": 1, "n": 2}, {"model_version": 2, "n": 3}]
    joined = read_only_sql(tmp_path, "SELECT e.group_id FROM experiences e JOIN consumption c USING (eid) "
                                     "WHERE c.committed")
    assert sorted(joined.column("group_id").to_pylist()) == ["a", "a"]
    for bad in ("DELETE FROM experiences", "COPY experiences TO 'x.csv'", "CREATE TABLE t AS SELECT 1",
                "SELECT 1; SELECT 2"):
        with pytest.raises(ValueError):
            read_only_sql(tmp_path, bad)
    assert query(tmp_path, "reward > 0.5").num_rows == 3 and count_rows(tmp_path) == 5


# ---------------------------------------------------------------- corruption


def test_truncated_segment_is_skipped_by_readers(tmp_path, caplog):
    w = BufferWriter(tmp_path)
    bad = w.write(_group("bad", 2))
    w.write(_group("good", 2))
    with open(bad.path, "r+b") as fh:
        fh.truncate(bad.path.stat().st_size // 2)
    c = BufferConsumer(tmp_path)
    assert [e.group_id for e in c.try_read(2)] == ["good", "good"]
    assert c.stats()["buffer/bad_segments"] == 1
    assert "corrupt or truncated" in caplog.text
    assert query(tmp_path).column("group_id").to_pylist() == ["good", "good"]


# ---------------------------------------------------------------- real processes

WRITER = textwrap.dedent("""
    import sys, time
    from trinity_like.buffer import BufferWriter
    from trinity_like.common.experience import Experience
    buffer_dir, tag, n, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    w = BufferWriter(buffer_dir, writer_id=tag)
    for k in range(n):
        rows = [Experience(prompt_ids=[1], response_ids=list(range(tokens)), group_id=f"{tag}-{k}")
                for _ in range(4)]
        w.write(rows)
        print("wrote", k, flush=True)
""")


def _spawn(code: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE, text=True)


def test_two_writer_processes_and_a_reader_process(tmp_path):
    writers = [_spawn(WRITER, tmp_path, tag, 10, 16) for tag in ("w1", "w2")]
    reader = _spawn(textwrap.dedent("""
        import sys
        from trinity_like.buffer import BufferConsumer
        c = BufferConsumer(sys.argv[1])
        seen = []
        for step in range(1, 11):
            seen += [e.eid for e in c.read(8, timeout_s=120, step=step)]
        c.commit(10)
        print(len(seen), len(set(seen)))
    """), tmp_path)
    for p in writers:
        assert p.wait(timeout=120) == 0
    out, _ = reader.communicate(timeout=120)
    assert reader.returncode == 0 and out.split() == ["80", "80"]
    assert count_rows(tmp_path) == 80


def test_writer_killed_mid_write_leaves_no_partial_rows(tmp_path):
    # big segments so that the kill lands inside a write
    p = _spawn(WRITER, tmp_path, "victim", 1000, 200000)
    line = p.stdout.readline()
    assert line.startswith("wrote")
    time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    segments = list_segments(tmp_path)
    assert segments
    for info in segments:  # every published segment is whole and matches its checksum
        assert read_segment(info).num_rows == 4
    c = BufferConsumer(tmp_path)
    got = c.try_read(4 * len(segments))
    assert got is not None and len(got) == 4 * len(segments)
    assert all(len(e.response_ids) == 200000 for e in got)
    assert c.stats()["buffer/bad_segments"] == 0


def _read_uncommitted(buffer_dir, ready):
    c = BufferConsumer(buffer_dir)
    c.read(4, timeout_s=30, step=1)
    c.commit(1)
    c.read(4, timeout_s=30, step=2)  # never committed
    ready.set()
    time.sleep(60)


def test_reader_killed_after_uncommitted_reads_gets_them_again(tmp_path):
    w = BufferWriter(tmp_path)
    for g in range(3):
        w.write(_group(f"g{g}", 4))
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_read_uncommitted, args=(tmp_path, ready))
    proc.start()
    assert ready.wait(60)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    resumed = BufferConsumer(tmp_path, resume_step=1)
    again = resumed.read(4, timeout_s=5, step=2)
    assert {e.group_id for e in again} == {"g1"}  # step 2's rows, delivered again
    last = resumed.read(4, timeout_s=5, step=3)
    resumed.commit(3)
    ledger = consumption_table(tmp_path).to_pylist()
    eids = [r["eid"] for r in ledger]
    assert all(r["committed"] for r in ledger)
    assert len(eids) == len(set(eids)) == 12  # every experience committed exactly once
    assert {e.group_id for e in last} == {"g2"}
