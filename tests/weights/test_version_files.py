"""Weight versions are written atomically but not fsynced: they only carry weights to the engines, and the
trainer's checkpoints (fsynced) are the durable copy (issue 34, item 6). What a power loss may leave of them
(an empty pointer, a torn part or manifest) is refused by their checks or taken as no version, never loaded."""

import logging
import os

import pytest
import torch

from trinity_like.common.fs import atomic_write_json, atomic_write_text
from trinity_like.runtime.checkpoints import CheckpointPointerError, latest_checkpoint, write_pointer
from trinity_like.weights.files import CorruptWeightsError, complete_version, read_weights, write_part

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


def test_a_reader_checks_the_tensors_it_loaded_and_names_the_damaged_one(tmp_path):
    """One pass on each side: the writer records each tensor's fingerprint, the reader checks what it loaded
    against them (not the file once more). A flipped byte inside b.bias's data is named by the tensor."""
    import json

    from safetensors import safe_open

    from trinity_like.weights.fingerprint import tensor_fingerprint

    parts = [write_part(tmp_path / "version-00000001", 0, 1, STATE)]
    assert parts[0]["fingerprints"] == {k: tensor_fingerprint(v) for k, v in STATE.items()}
    assert "crc32" not in parts[0]  # no second pass over the file after writing it
    vdir = complete_version(tmp_path, 1, parts, keep=2)
    part = vdir / parts[0]["file"]
    with safe_open(str(part), framework="pt") as f:  # where b.bias's bytes sit in the file
        header_len = int.from_bytes(part.read_bytes()[:8], "little")
        start, _ = json.loads(part.read_bytes()[8:8 + header_len])["b.bias"]["data_offsets"]
        assert f.get_tensor("b.bias").equal(STATE["b.bias"])
    data = bytearray(part.read_bytes())
    data[8 + header_len + start + 1] ^= 0x01  # one bit of b.bias's first float
    part.write_bytes(bytes(data))
    with pytest.raises(CorruptWeightsError, match=r"tensor 'b.bias' loaded as .*1 of 2 tensors differ.*damaged"):
        read_weights(vdir)


def test_a_version_an_earlier_writer_left_is_checked_by_its_chunk_crcs(tmp_path):
    """Manifests written before per-tensor fingerprints carry the CRC-32 of each 64 MiB chunk of each file; they
    are still read, and still refused when damaged."""
    import json

    from trinity_like.weights.files import file_crc32s

    parts = [write_part(tmp_path / "version-00000001", 0, 1, STATE)]
    vdir = complete_version(tmp_path, 1, parts, keep=2)
    manifest = json.loads((vdir / "manifest.json").read_text())
    for p in manifest["parts"]:
        del p["fingerprints"]
        p["crc32"] = file_crc32s(vdir / p["file"])
    manifest["fingerprint"] = ""
    (vdir / "manifest.json").write_text(json.dumps(manifest))
    loaded, _ = read_weights(vdir)
    assert all(torch.equal(loaded[k], STATE[k]) for k in STATE)
    part = vdir / parts[0]["file"]
    data = bytearray(part.read_bytes())
    data[-1] ^= 0x01
    part.write_bytes(bytes(data))
    with pytest.raises(CorruptWeightsError, match="CRC-32 of bytes 0.. .*damaged"):
        read_weights(vdir)


def test_load_version_returns_the_fingerprint_its_tensors_were_checked_against(tmp_path):
    """A receiver that compares with the published fingerprint takes this one instead of hashing the tensors
    again: the manifest's, equal to the tensors' own; "" for a single file, where nothing was checked."""
    from safetensors.torch import save_file

    from trinity_like.weights.files import load_version, read_manifest
    from trinity_like.weights.fingerprint import weights_fingerprint

    vdir = complete_version(tmp_path, 1, [write_part(tmp_path / "version-00000001", 0, 1, STATE)], keep=2)
    tensors, _, checked = load_version(vdir)
    assert checked == read_manifest(vdir)["fingerprint"] == weights_fingerprint(tensors) == weights_fingerprint(STATE)
    save_file(STATE, str(tmp_path / "one.safetensors"))
    assert load_version(tmp_path / "one.safetensors")[2] == ""


def test_a_part_is_a_safetensors_file_that_safetensors_itself_reads(tmp_path):
    """Parts are written by our own writer (it lets the fingerprints run beside the write); safetensors' reader
    takes them: every dtype a model or its buffers hold, scalars, empty and non-contiguous tensors."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from trinity_like.weights.files import write_safetensors

    g = torch.Generator().manual_seed(0)
    tensors = {f"t.{d}".removeprefix("t.torch."): (torch.randn(5, 7, generator=g) * 50).to(d)
               for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
                         torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn)}
    tensors |= {"scalar": torch.tensor(2.5), "empty": torch.empty(0, 3), "transposed": torch.randn(4, 6).t()}
    write_safetensors(tmp_path / "x.safetensors", tensors)
    back = load_file(str(tmp_path / "x.safetensors"))
    assert back.keys() == tensors.keys()
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and back[k].shape == t.shape, k
        assert torch.equal(back[k].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), k  # bit for bit
    with safe_open(str(tmp_path / "x.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == sorted(tensors)


def test_a_tensor_without_a_safetensors_dtype_is_refused_by_name_and_leaves_no_file(tmp_path):
    with pytest.raises(TypeError, match="tensor 'z': dtype torch.complex64 has no safetensors name"):
        write_part(tmp_path / "version-00000001", 0, 1, {"a": torch.ones(3), "z": torch.ones(2, dtype=torch.complex64)})
    assert list((tmp_path / "version-00000001").iterdir()) == []


def test_the_temporary_file_is_created_by_the_writer_not_made_beforehand(tmp_path):
    """A temp file made first (mkstemp) and then opened for writing is truncated, and ext4 then writes it back
    to disk when it is closed (0.1-0.5 s more per 0.4 GB version here): the writer gets a name no file has."""
    from trinity_like.common.fs import atomic_write_with

    seen = []

    def write(tmp):
        seen.append((tmp.name, tmp.exists()))
        tmp.write_bytes(b"x")

    atomic_write_with(tmp_path / "part.safetensors", write, durable=False)
    assert seen[0][0].startswith(".part.safetensors.tmp-") and seen[0][1] is False
    assert [p.name for p in tmp_path.iterdir()] == ["part.safetensors"]
