"""Weight versions are written atomically but not fsynced: they only carry weights to the engines, and the
trainer's checkpoints (fsynced) are the durable copy (issue 34, item 6). What a power loss may leave of them
(an empty pointer, a torn part or manifest) is refused by their checks or taken as no version, never loaded."""

import logging
import os

import pytest
import torch

from trinity_like.common.fs import atomic_write_json, atomic_write_text
from trinity_like.runtime.checkpoints import CheckpointPointerError, latest_checkpoint, write_pointer
from trinity_like.synchronizer.monitor import complete_version
from trinity_like.synchronizer.weights_files import CorruptWeightsError, read_weights, write_part

STATE = {"a.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b.bias": torch.ones(5)}


@pytest.fixture
def fsyncs(monkeypatch):
    """Every os.fsync made, by the path of its file descriptor (the real fsync still runs)."""
    made: list[str] = []
    real = os.fsync

    def counting(fd):
        made.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return made


def test_durable_writes_fsync_the_file_and_its_folder(tmp_path, fsyncs):
    write_pointer(tmp_path / "latest", 3)  # the trainer's checkpoint pointer: must survive a power loss
    atomic_write_json(tmp_path / "summary.json", {"x": 1})
    assert len(fsyncs) == 4 and fsyncs.count(str(tmp_path)) == 2  # each: its temp file, then the folder
    assert (tmp_path / "latest").read_text() == "3\n"


def test_a_version_is_written_and_published_without_fsync(tmp_path, fsyncs):
    parts = [write_part(tmp_path / "version-00000001", 0, 1, STATE)]
    vdir = complete_version(tmp_path, 1, parts, keep=2)
    assert fsyncs == []
    assert (tmp_path / "latest").read_text() == "1\n"
    loaded, _ = read_weights(vdir)
    assert all(torch.equal(loaded[k], STATE[k]) for k in STATE)
    assert not list(tmp_path.rglob(".*.tmp-*"))  # still temp file then rename: no partial file is ever visible
    atomic_write_text(tmp_path / "x", "y", durable=False)
    assert fsyncs == []


def test_what_a_power_loss_may_leave_of_a_version_is_never_loaded(tmp_path, caplog):
    parts = [write_part(tmp_path / "version-00000001", 0, 1, STATE)]
    vdir = complete_version(tmp_path, 1, parts, keep=2)
    # an empty pointer (renamed, its data never written back) is taken as no version, with a warning
    (tmp_path / "latest").write_text("")
    with caplog.at_level(logging.WARNING, logger="trinity_like.synchronizer.monitor"):
        complete_version(tmp_path, 2, [write_part(tmp_path / "version-00000002", 0, 1, STATE)], keep=2)
    assert "is garbled" in caplog.text and "taken as no version" in caplog.text
    assert (tmp_path / "latest").read_text() == "2\n"
    # a part or a manifest whose blocks never reached the disk is refused by its checks
    part = vdir / parts[0]["file"]
    part.write_bytes(b"\0" * part.stat().st_size)
    with pytest.raises(CorruptWeightsError):
        read_weights(vdir)
    (vdir / "manifest.json").write_text("")
    with pytest.raises(CorruptWeightsError, match="unreadable manifest"):
        read_weights(vdir)
    # the checkpoints' own pointer stays strict: its damage is the user's to see
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest").write_text("")
    with pytest.raises(CheckpointPointerError, match="garbled"):
        latest_checkpoint(tmp_path / "ckpt")
