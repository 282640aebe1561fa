"""A full disk (ENOSPC) at each write site of a run, on a real size-limited tmpfs: the writer raises
``DiskFullError`` naming the path and what it is, leaves no temporary file, keeps what was stored before intact,
and writes again once space is freed. (The checkpoint site: tests/trainer; serve records: tests/serve; a whole
run that fills its disk and resumes: tests/e2e/test_disk_full_run.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from trinity_like.common.errors import DiskFullError, StorageError
from trinity_like.common.experience import Experience
from trinity_like.common.fs import append_line, describe


def _exps(n: int, group: str, tokens: int = 8) -> list[Experience]:
    return [Experience(prompt_ids=np.arange(4), response_ids=np.arange(tokens) % 50, logprobs=np.zeros(tokens),
                       group_id=group, reward=float(i), model_version=0) for i in range(n)]


def _temporaries(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".tmp-" in p.name)


def _refused(excinfo, path_part: str, what: str) -> None:
    message = str(excinfo.value)
    assert "no space left" in message and what in message and path_part in message and "--resume" in message, message
    assert "\n" not in message


def test_each_file_of_a_run_is_named_by_what_it_is():
    assert describe("/r/buffer/segments/0001-w-000000-4-abcd.arrow") == "a buffer segment"
    assert describe("/r/buffer/consumers/trainer/commit-00000001-x-8.arrow") == "the consumption ledger"
    assert describe("/r/buffer/catalog/123.json") == "the buffer catalog"
    assert describe("/r/buffer/rejects/rejects-1.jsonl") == "the rejected rows"
    assert describe("/r/buffer/partial/s3/g.arrow") == "a partial-rollout journal"
    assert describe("/r/checkpoints/state_dict/version-00000003/part-0.safetensors") == "a weights version"
    assert describe("/r/checkpoints/step_3") == "a checkpoint"
    assert describe("/r/checkpoints/latest") == "a checkpoint pointer"
    assert describe("/r/metrics.jsonl") == "the metrics log"
    assert describe("/r/serve/pending/x.json") == "serve records"
    assert describe("/elsewhere/notes.txt") == "a file"


def test_a_buffer_segment_on_a_full_disk_is_refused_whole_and_written_once_space_is_freed(small_disk):
    from trinity_like.buffer import BufferWriter, query

    buffer = small_disk.path / "buffer"
    writer = BufferWriter(buffer)
    writer.write(_exps(4, "before"))
    small_disk.fill(leave=0)
    with pytest.raises(DiskFullError) as excinfo:
        writer.write(_exps(64, "lost", tokens=512))
    _refused(excinfo, str(buffer), "a buffer segment")
    assert _temporaries(buffer) == []
    assert query(buffer).column("group_id").to_pylist() == ["before"] * 4  # what was stored is intact
    small_disk.free()
    writer.write(_exps(4, "after"))
    assert sorted(set(query(buffer).column("group_id").to_pylist())) == ["after", "before"]


def test_the_ledger_on_a_full_disk_keeps_its_pending_records_and_commits_once_space_is_freed(small_disk):
    from trinity_like.buffer.ledger import Ledger

    buffer = small_disk.path / "buffer"
    ledger = Ledger(buffer, "trainer")
    ledger.add_pending(1, [(f"e{i}", 1, "seg", i) for i in range(8)])
    small_disk.fill(leave=0)
    with pytest.raises(DiskFullError) as excinfo:
        ledger.commit(1)
    _refused(excinfo, "consumers", "the consumption ledger")
    assert _temporaries(buffer) == []
    assert ledger.pending().num_rows == 8 and ledger.committed().num_rows == 0  # not committed, nothing lost
    small_disk.free()
    assert ledger.commit(1) == 8
    assert ledger.pending().num_rows == 0 and sorted(ledger.committed().column("eid").to_pylist()) == \
        sorted(f"e{i}" for i in range(8))


def test_the_catalog_on_a_full_disk_is_refused_and_the_segment_is_not_published(small_disk):
    from trinity_like.buffer import catalog, list_segments

    buffer = small_disk.path / "buffer"
    small_disk.fill(leave=0)
    with pytest.raises(DiskFullError) as excinfo:
        catalog.record(buffer, [])
    _refused(excinfo, "catalog", "the buffer catalog")
    assert _temporaries(buffer) == [] and list_segments(buffer) == []


def test_a_weights_version_on_a_full_disk_is_refused_and_leaves_no_part(small_disk):
    import torch

    from trinity_like.weights.files import version_dir, write_part

    root = small_disk.path / "checkpoints" / "state_dict"
    write_part(version_dir(root, 1), 0, 1, {"w": torch.ones(16)})
    small_disk.fill(leave=0)
    with pytest.raises(DiskFullError) as excinfo:
        write_part(version_dir(root, 2), 0, 1, {"w": torch.ones(1 << 18)})
    _refused(excinfo, "version-00000002", "a weights version")
    assert _temporaries(root) == [] and [p.name for p in version_dir(root, 2).iterdir()] == []
    assert [p.name for p in version_dir(root, 1).iterdir()] == ["part-00000-of-00001.safetensors"]


def test_a_metrics_line_on_a_full_disk_is_refused_whole(small_disk):
    from trinity_like.common.metrics import MetricsWriter, read_metrics

    path = small_disk.path / "metrics.jsonl"
    writer = MetricsWriter(path, "trainer")
    writer.write(1, {"x": 1.0})
    before = path.read_bytes()
    small_disk.fill(leave=0)
    # a line longer than what is left in the file's last block: the disk takes part of it, which is cut off again
    with pytest.raises(DiskFullError) as excinfo:
        writer.write(2, {"note": "y" * 20000})
    _refused(excinfo, str(path), "the metrics log")
    assert path.read_bytes() == before
    small_disk.free()
    writer.write(3, {"x": 3.0})
    assert [r["step"] for r in read_metrics(path)[0]] == [1, 3]


def test_a_torn_append_is_cut_off_even_when_the_disk_takes_part_of_the_line(small_disk):
    path = small_disk.path / "log.jsonl"
    append_line(path, json.dumps({"a": 1}))
    small_disk.fill(leave=0)
    # the file's last block has room left: a long line goes in partly, then the disk is full
    with pytest.raises(DiskFullError):
        append_line(path, json.dumps({"b": "z" * 9000}))
    assert path.read_text() == '{"a": 1}\n'


def test_rejected_rows_on_a_full_disk_are_refused_and_nothing_is_ingested(small_disk, tmp_path):
    from trinity_like.buffer import list_segments
    from trinity_like.buffer.ingest import ingest_files

    source = tmp_path / "rows.jsonl"
    good = {"prompt_ids": [1, 2], "response_ids": [3, 4], "reward": 1.0}
    source.write_text("\n".join([json.dumps(good), "{not json" + "x" * 20000]) + "\n")
    buffer = small_disk.path / "buffer"
    buffer.mkdir()
    small_disk.fill(leave=0)
    with pytest.raises(DiskFullError) as excinfo:
        ingest_files([source], buffer)
    _refused(excinfo, "rejects", "the rejected rows")
    assert _temporaries(buffer) == [] and list_segments(buffer) == []
    small_disk.free()
    report = ingest_files([source], buffer)
    assert report.accepted == 1 and len(report.rejected) == 1 and len(list_segments(buffer)) == 1


def test_a_read_only_file_system_is_named_as_such(small_disk):
    from trinity_like.buffer import BufferWriter

    buffer = small_disk.path / "buffer"
    BufferWriter(buffer).write(_exps(2, "before"))
    small_disk.remount("ro")
    with pytest.raises(StorageError) as excinfo:
        BufferWriter(buffer).write(_exps(2, "lost"))
    assert "read-only" in str(excinfo.value) and "a buffer segment" in str(excinfo.value)
    assert not isinstance(excinfo.value, DiskFullError)
