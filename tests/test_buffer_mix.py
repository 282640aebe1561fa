"""Reading a mix of sources (explorer, agent, human) from a real buffer on disk, and the staleness rule for rows
that this run's policy did not generate (``model_version -1``)."""

from trinity_like.buffer import BufferConsumer, BufferWriter
from trinity_like.buffer.sql import consumption_table
from trinity_like.common.experience import Experience


def _group(gid: str, n: int, source: str = "explorer", version: int = 0) -> list[Experience]:
    return [Experience(prompt_ids=[1, 2], response_ids=[3, i], group_id=gid, source=source, model_version=version,
                       reward=float(i)) for i in range(n)]


# ---------------------------------------------------------------- staleness of rows from outside the run


def test_rows_of_version_minus_one_are_never_stale(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("demo", 2, source="human", version=-1))  # a segment holding only -1 rows
    w.write(_group("old", 2, version=0) + _group("imp", 2, source="import", version=-1))  # mixed segment
    c = BufferConsumer(tmp_path)
    got = c.try_read(4, min_version=5)  # an async trainer long past max_staleness
    assert [e.group_id for e in got] == ["demo", "demo", "imp", "imp"]
    assert c.stats()["buffer/skipped_stale"] == 2  # only the explorer rows of version 0
    assert c.try_read(2, min_version=5) is None


def test_a_segment_of_only_minus_one_rows_is_not_skipped_as_stale_later(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("g0", 2, version=0))
    w.write(_group("demo", 2, source="human", version=-1))
    c = BufferConsumer(tmp_path)
    assert [e.group_id for e in c.try_read(2, min_version=0, step=1)] == ["g0", "g0"]
    for step in range(2, 5):  # min_version rises past every explorer version; the demo segment stays live
        assert c.try_read(4, min_version=step, step=step) is None
    assert [e.group_id for e in c.try_read(2, min_version=10, step=5)] == ["demo", "demo"]
    c.commit(5)
    assert sorted(r["step"] for r in consumption_table(tmp_path).to_pylist()) == [1, 1, 5, 5]
