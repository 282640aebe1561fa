"""Buffers written by older builds stay readable: a real schema-1 segment (``data/segment-v1.arrow``, written by
the v1 writer with ``data/make_segment_v1.py``) reads everywhere as schema 2 with null ``token_versions``."""

import shutil
import zlib
from pathlib import Path

from trinity_like.buffer import BufferConsumer, BufferWriter, catalog, list_segments, query, segments
from trinity_like.buffer.maintenance import verify_buffer
from trinity_like.buffer.replay import ReplayReader
from trinity_like.buffer.segments import read_segment, schema_version
from trinity_like.common.experience import EXPERIENCE_SCHEMA, Experience

V1 = Path(__file__).parent / "data" / "segment-v1.arrow"
V1_EIDS = ["v1-a0", "v1-a1", "v1-b0", "v1-b1"]


def _v1_buffer(buffer_dir: Path) -> Path:
    """A buffer whose one segment is the committed v1 file (under a segment name carrying its checksum)."""
    data = V1.read_bytes()
    d = buffer_dir / "segments"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{0:020d}-v1fixture-000000-4-{zlib.crc32(data):08x}.arrow"
    shutil.copyfile(V1, path)
    return path


def test_a_v1_segment_reads_with_null_token_versions(tmp_path):
    buf = tmp_path / "buffer"
    path = _v1_buffer(buf)
    (info,) = list_segments(buf)
    assert schema_version(info) == "1"
    table = read_segment(info)
    assert table.schema.equals(EXPERIENCE_SCHEMA) and table.column("token_versions").null_count == 4
    assert table.column("eid").to_pylist() == V1_EIDS
    assert table.column("logprobs").to_pylist()[0] == [-0.5, -1.0, -0.25]
    segments.check_schema_versions(buf)
    catalog.check_schema_versions(buf)
    assert catalog.load(buf).entries[info.name].schema_version == "1"  # the entry keeps the stored version

    rows = query(buf, where="token_versions IS NULL")
    assert rows.column("eid").to_pylist() == V1_EIDS

    exps = BufferConsumer(buf).try_read(4, min_version=0)
    assert [e.eid for e in exps] == V1_EIDS and all(e.token_versions is None for e in exps)
    assert exps[2].action_mask.tolist() == [True, False, True, True] and exps[2].messages[0]["role"] == "user"

    for source in (buf, path):
        replay = ReplayReader([source], shuffle=False, batch_size=4)
        assert sorted(e.eid for batch in replay.epoch() for e in batch) == V1_EIDS
    assert verify_buffer(buf)["bad"] == []


def test_a_buffer_of_v1_and_v2_segments_reads_as_one(tmp_path):
    buf = tmp_path / "buffer"
    _v1_buffer(buf)
    new = Experience(prompt_ids=[8], response_ids=[20, 21], group_id="c", eid="v2-c0", model_version=1,
                     token_versions=[1, 2])
    BufferWriter(buf).write([new])
    assert [schema_version(i) for i in list_segments(buf)] == ["1", "2"]
    segments.check_schema_versions(buf)
    catalog.check_schema_versions(buf)
    rows = query(buf)
    assert rows.column("eid").to_pylist() == [*V1_EIDS, "v2-c0"]
    assert rows.column("token_versions").to_pylist() == [None] * 4 + [[1, 2]]
    exps = BufferConsumer(buf).try_read(5)
    assert exps[-1] == new and exps[0].token_versions is None


def test_a_parquet_export_of_a_v1_buffer_replays(tmp_path):
    import pyarrow.parquet as pq

    buf = tmp_path / "buffer"
    _v1_buffer(buf)
    # what `buffer export` of the v1 build wrote: the v1 columns (plus the query's own), no token_versions
    old = query(buf).drop_columns(["token_versions"])
    pq.write_table(old, tmp_path / "v1.parquet")
    replay = ReplayReader([tmp_path / "v1.parquet"], shuffle=False, batch_size=4)
    exps = [e for batch in replay.epoch() for e in batch]
    assert sorted(e.eid for e in exps) == V1_EIDS and all(e.token_versions is None for e in exps)
