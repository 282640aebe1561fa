"""`status`'s buffer summary on a real buffer with rows of several sources (no Ray needed)."""

from trinity_like.buffer import BufferConsumer, BufferWriter
from trinity_like.common.experience import Experience
from trinity_like.status import buffer_status, format_status


def _rows(n, source, version, group):
    return [Experience(prompt_ids=[1, 2], response_ids=[3], source=source, model_version=version, group_id=group)
            for _ in range(n)]


def test_buffer_status_counts_sources_and_leaves_imported_rows_out_of_staleness(tmp_path):
    writer = BufferWriter(tmp_path)
    writer.write(_rows(4, "explorer", 0, "a"))
    writer.write(_rows(4, "explorer", 1, "b"))
    writer.write(_rows(2, "human", -1, "h"))
    consumer = BufferConsumer(tmp_path)
    assert len(consumer.read(4, step=1)) == 4  # the version-0 group, fifo
    consumer.commit(1)
    st = buffer_status(tmp_path, trainer_version=3)
    assert st["rows"] == 10 and st["unconsumed"] == 6
    assert st["by_source"] == {"explorer": {"rows": 8, "unconsumed": 4}, "human": {"rows": 2, "unconsumed": 2}}
    # untrained explorer rows are all version 1: staleness 2 at version 3; the human rows (-1) do not count
    assert st["unconsumed_versions"] == [1, 1] and st["unconsumed_staleness"] == [2, 2]
    text = format_status({"namespace": "p/n", "cluster": "connected", "synchronizer": True, "roles": [], "buffer": st,
                          "trainer_version": 3})
    assert "buffer: 10 rows, 6 not yet trained (explorer 8/4, human 2/2: rows/untrained)" in text
    assert buffer_status(tmp_path / "empty", None) == {"rows": 0, "unconsumed": 0, "by_source": {}}
