import multiprocessing as mp
import os

import pyarrow.parquet as pq
import pytest

from trinity_like.buffer import BufferConsumer, BufferWriter, count_rows, query, segment_files
from trinity_like.common.experience import Experience


def _group(gid: str, n: int, version: int) -> list[Experience]:
    return [Experience(prompt_ids=[1, 2], response_ids=[3, i], group_id=gid, model_version=version,
                       reward=float(i)) for i in range(n)]


def test_segments_are_published_whole(tmp_path):
    w = BufferWriter(tmp_path)
    p = w.write(_group("g0", 4, 0))
    assert p.parent.name == "segments" and p.suffix == ".parquet"
    assert pq.read_table(p).num_rows == 4
    assert not [n for n in os.listdir(p.parent) if n.startswith(".")]  # no temp files left behind
    with pytest.raises(ValueError):
        w.write([])


def test_min_version_filter_and_fifo(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("old", 2, 0))
    w.write(_group("new", 2, 3))
    c = BufferConsumer(tmp_path)
    got = c.try_read(2, min_version=2)
    assert [e.group_id for e in got] == ["new", "new"]
    assert c.try_read(2, min_version=2) is None  # nothing new enough left
    assert [e.group_id for e in c.try_read(2)] == ["old", "old"]


def test_each_experience_handed_out_once_and_groups_whole(tmp_path):
    w = BufferWriter(tmp_path)
    for g in range(3):
        w.write(_group(f"g{g}", 4, 0))
    c2 = BufferConsumer(tmp_path, name="other")
    first = c2.try_read(8)
    assert first is not None and len(first) == 8
    assert len({e.group_id for e in first}) == 2
    second = c2.try_read(8)
    assert second is None  # only one group of 4 left
    rest = c2.try_read(4)
    assert {e.eid for e in rest}.isdisjoint({e.eid for e in first})


def test_group_never_split(tmp_path):
    BufferWriter(tmp_path).write(_group("a", 3, 0) + _group("b", 3, 0))
    c = BufferConsumer(tmp_path)
    assert c.try_read(4) is None  # would need to split a group of 3
    got = c.try_read(3)
    assert [e.group_id for e in got] == ["a"] * 3


def test_commit_and_redelivery_after_restart(tmp_path):
    w = BufferWriter(tmp_path)
    for g in range(3):
        w.write(_group(f"g{g}", 2, 0))
    c = BufferConsumer(tmp_path)
    step1 = c.read(2, timeout_s=1)
    c.commit(1)
    step2 = c.read(2, timeout_s=1)  # consumed but never committed: the "crash" happens here
    del c
    resumed = BufferConsumer(tmp_path)
    assert resumed.committed_steps() == [1]
    again = resumed.read(2, timeout_s=1)
    assert [e.eid for e in again] == [e.eid for e in step2]  # exactly what was lost is re-delivered
    assert {e.eid for e in again}.isdisjoint({e.eid for e in step1})


def test_read_times_out_with_a_clear_message(tmp_path):
    c = BufferConsumer(tmp_path)
    with pytest.raises(TimeoutError, match="fewer than 2 unconsumed"):
        c.read(2, timeout_s=0.2)


def _write_many(path, k):
    w = BufferWriter(path, writer_id=f"p{k}")
    for i in range(5):
        w.write(_group(f"p{k}-{i}", 2, 0))


def test_concurrent_writer_processes(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(tmp_path, k)) for k in range(2)]
    for p in procs:
        p.start()
    c = BufferConsumer(tmp_path)
    got = []
    while len(got) < 20:
        got += c.read(2, timeout_s=60)
    for p in procs:
        p.join()
    assert len({e.eid for e in got}) == 20
    assert len(segment_files(tmp_path)) == 10
    assert count_rows(tmp_path) == 20
    assert query(tmp_path, "reward > 0.5").num_rows == 10
