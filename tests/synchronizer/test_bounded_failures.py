"""Failures that used to hide become loud and bounded: weight files say which of incomplete, unreadable or
damaged they are, and the weight broadcaster gives up on an unreachable Synchronizer after its deadline."""

import time

import pytest
import torch

from trinity_like.synchronizer.weights_files import (
    MANIFEST,
    CorruptWeightsError,
    IncompleteWeightsError,
    WeightsAccessError,
    read_weights,
    version_dir,
    write_manifest,
    write_part,
)


def _version(tmp_path, version=1):
    vdir = version_dir(tmp_path, version)
    parts = [write_part(vdir, r, 2, {f"w{r}": torch.arange(4, dtype=torch.float32) + r}) for r in range(2)]
    write_manifest(vdir, version, parts)
    return vdir, parts


def test_weight_file_errors_say_what_is_wrong(tmp_path):
    vdir, parts = _version(tmp_path)
    assert set(read_weights(vdir)[0]) == {"w0", "w1"}
    # never completed: no manifest
    (vdir / MANIFEST).rename(vdir / "manifest.away")
    with pytest.raises(IncompleteWeightsError, match="never completed"):
        read_weights(vdir)
    # unreadable (here: the manifest is a folder; in life a permission or disk error)
    (vdir / MANIFEST).mkdir()
    with pytest.raises(WeightsAccessError, match="cannot be read"):
        read_weights(vdir)
    (vdir / MANIFEST).rmdir()
    (vdir / "manifest.away").rename(vdir / MANIFEST)
    # a part gone after the manifest was written
    (vdir / parts[1]["file"]).unlink()
    with pytest.raises(IncompleteWeightsError, match="missing"):
        read_weights(vdir)
    # damaged bytes are corruption, and only they
    other, parts = _version(tmp_path, 2)
    data = bytearray((other / parts[0]["file"]).read_bytes())
    data[-1] ^= 0xFF
    (other / parts[0]["file"]).write_bytes(bytes(data))
    with pytest.raises(CorruptWeightsError, match="damaged"):
        read_weights(other)
    assert not issubclass(WeightsAccessError, CorruptWeightsError)
    assert not issubclass(IncompleteWeightsError, CorruptWeightsError)


@pytest.mark.slow
def test_broadcaster_gives_up_on_an_unreachable_synchronizer_after_its_deadline(ray_session):
    """It used to retry forever, logging a warning every second."""
    from trinity_like.synchronizer import get_synchronizer
    from trinity_like.synchronizer.collective import BroadcasterStopped, WeightBroadcaster

    sync = get_synchronizer("bounded/broadcast", run_id="run-b")
    broadcaster = WeightBroadcaster(sync, bucket_mb=1.0, timeout_s=2.0)
    try:
        ray_session.kill(sync)
        broadcaster.offer(1, {"w": torch.zeros(8)})
        deadline = time.monotonic() + 30
        while broadcaster.error is None:
            assert time.monotonic() < deadline, "the broadcaster kept retrying past its deadline"
            time.sleep(0.2)
        assert "could not reach the Synchronizer for 2s" in str(broadcaster.error)
        with pytest.raises(BroadcasterStopped, match="synchronizer.timeout_s"):
            broadcaster.offer(2, {"w": torch.ones(8)})
    finally:
        broadcaster.close()
