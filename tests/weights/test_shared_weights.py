"""Weights through shared memory (``synchronizer.method: ipc``): on the CPU a shared-memory file the trainer writes
once and engines map; on a GPU a CUDA IPC handle (``pytest -m gpu``). Real files in /dev/shm, real processes (Ray
actors) mapping them."""

import dataclasses
import os

import pytest
import ray
import torch

from trinity_like.weights.fingerprint import weights_fingerprint
from trinity_like.weights.messages import CudaIpcHandle
from trinity_like.weights.shared import SharedWeights, SharedWeightsUnreachable, open_shared


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(7, 5, generator=g), "b.bias": torch.randn(3, generator=g).to(torch.bfloat16),
            "c.ids": torch.arange(11, dtype=torch.int64) * seed, "d.scale": torch.tensor(float(seed))}


@ray.remote(num_cpus=0)
def _open_elsewhere(handle):
    """In another process: map the version, return its fingerprint and a copy of one tensor."""
    import os

    from trinity_like.weights.fingerprint import weights_fingerprint
    from trinity_like.weights.shared import open_shared

    sd = open_shared(handle)
    return os.getpid(), weights_fingerprint(sd), sd["a.weight"].clone()


def test_a_version_in_shared_memory_is_read_intact_by_another_process(tmp_path, ray_session):
    shared = SharedWeights("test-intact", root=tmp_path)
    try:
        sd = _weights(1)
        handle = shared.publish(1, sd, weights_fingerprint(sd))
        assert handle.kind == "shm" and handle.version == 1 and handle.fingerprint == weights_fingerprint(sd)
        # written whole under a temporary name, then renamed: only the finished buffer is there
        assert [p.name for p in shared.folder.iterdir()] == ["version-00000001"]
        assert os.path.getsize(handle.path) == handle.size == shared.last_bytes
        pid, fingerprint, a = ray.get(_open_elsewhere.remote(handle))
        assert pid != os.getpid()
        assert fingerprint == weights_fingerprint(sd)  # every dtype, shape and byte, in the other process
        assert torch.equal(a, sd["a.weight"])
        mapped = open_shared(handle)
        assert {k: (t.dtype, tuple(t.shape)) for k, t in mapped.items()} == {
            k: (t.dtype, tuple(t.shape)) for k, t in sd.items()}
    finally:
        shared.close()
    assert not shared.folder.exists()


def test_the_newest_versions_are_kept_and_a_taken_back_one_is_refused_clearly(tmp_path):
    shared = SharedWeights("test-keep", keep=2, root=tmp_path)
    try:
        h1 = shared.publish(1, _weights(1))
        inode_v1 = os.stat(h1.path).st_ino
        mapped_v1 = open_shared(h1)  # an engine still reading version 1 ...
        h2 = shared.publish(2, _weights(2))
        # ... reads it intact while the next version is published
        assert weights_fingerprint(mapped_v1) == weights_fingerprint(_weights(1))
        h3 = shared.publish(3, _weights(3))  # into version 1's buffer, taken back (no new pages)
        assert sorted(p.name for p in shared.folder.iterdir()) == ["version-00000002", "version-00000003"]
        assert os.stat(h3.path).st_ino == inode_v1
        with pytest.raises(SharedWeightsUnreachable, match="version 1 .* is gone.*load the newest"):
            open_shared(h1)
        # a reader that held on to version 1 past that sees other bytes: its fingerprint check refuses them
        assert weights_fingerprint(mapped_v1) != weights_fingerprint(_weights(1))
        assert weights_fingerprint(open_shared(h2)) == weights_fingerprint(_weights(2))
        assert weights_fingerprint(open_shared(h3)) == weights_fingerprint(_weights(3))
        with pytest.raises(ValueError, match="no weights"):
            shared.publish(4, {})
    finally:
        shared.close()


def test_a_handle_from_another_host_or_gpu_is_refused_naming_the_method_to_use(tmp_path):
    shared = SharedWeights("test-elsewhere", root=tmp_path)
    try:
        handle = shared.publish(1, _weights(1))
        # fakes of what this machine lacks: a second host, a GPU buffer
        with pytest.raises(SharedWeightsUnreachable, match="not on this engine's node.*broadcast or memory"):
            open_shared(dataclasses.replace(handle, node="another-host:fake-boot-id"))
        fake_ipc = CudaIpcHandle(size=[handle.size], stride=[1], tensor_offset=0, dtype="uint8", storage_device=0,
                                 storage_handle=b"\0" * 64, storage_size_bytes=handle.size, storage_offset_bytes=0,
                                 requires_grad=False, ref_counter_handle=b"/none", ref_counter_offset=0,
                                 event_handle=b"\0" * 64, event_sync_required=False, device_uuid="GPU-fake")
        cuda = dataclasses.replace(handle, kind="cuda", path=None, cuda=fake_ipc)
        with pytest.raises(SharedWeightsUnreachable, match="broadcast"):
            open_shared(cuda)
    finally:
        shared.close()


def _cuda_ipc_args_of_a_gpu_buffer() -> tuple:
    """What torch's ``reduce_tensor`` returns for a 1 KiB uint8 buffer on GPU 0, field by field as
    torch/multiprocessing/reductions.py builds it: a stand-in, since this machine has no GPU (the real one ran on
    the lent H100 in test_cuda_ipc_between_two_actors_on_one_gpu)."""
    return (torch.Tensor, torch.Size([1024]), (1,), 0, torch.storage.TypedStorage, torch.uint8, 0, b"\x01" * 64, 1024,
            0, False, b"/torch_4242_1234567", 0, b"\x02" * 64, True)


def test_a_cuda_ipc_handle_crosses_as_plain_data_and_rebuilds_the_same_arguments():
    """msgpack (vLLM's encoder is msgpack) refuses torch's handle as it is: it holds two classes and a dtype.
    The plain form packs, and gives back the arguments torch's rebuild_cuda_tensor takes, for this process's
    index of the GPU."""
    import msgpack

    from trinity_like.weights.shared import cuda_handle_from_plain, cuda_handle_to_plain

    args = _cuda_ipc_args_of_a_gpu_buffer()
    with pytest.raises(TypeError):
        msgpack.packb(list(args), use_bin_type=True)
    plain = cuda_handle_to_plain(args)
    assert msgpack.unpackb(msgpack.packb(plain, use_bin_type=True), raw=False) == plain
    assert plain["dtype"] == "uint8" and plain["size"] == [1024] and plain["storage_handle"] == b"\x01" * 64
    assert cuda_handle_from_plain(plain, 0) == args
    assert cuda_handle_from_plain(plain, 3)[6] == 3  # the GPU as this process numbers it
    with pytest.raises(RuntimeError, match="does not know this torch"):
        cuda_handle_to_plain(args[:-1])


def test_buffers_a_killed_trainer_left_are_removed_by_the_next_one(tmp_path):
    folder = tmp_path / "trinity_like-test-stale"
    folder.mkdir()
    (folder / "version-00000007").write_bytes(b"x" * 64)
    (folder / "version-00000008.tmp").write_bytes(b"y" * 8)  # cut off mid-write
    shared = SharedWeights("test-stale", root=tmp_path)
    try:
        assert list(shared.folder.iterdir()) == []
        with pytest.raises(ValueError, match="keep must be at least 1"):
            SharedWeights("test-stale-2", keep=0, root=tmp_path)
    finally:
        shared.close()


@pytest.mark.gpu
def test_cuda_ipc_between_two_actors_on_one_gpu(ray_session):
    """Trainer side and engine side in two processes sharing the one GPU (half of it each): the engine maps the
    trainer's buffer by its CUDA IPC handle and gets every byte, on the GPU."""

    # The actor and the task import what they use and take the weights as arguments: a Ray worker cannot import
    # this test module (pytest puts tests/synchronizer on the driver's path only), as the lent H100 showed.
    @ray.remote(num_gpus=0.5, num_cpus=0)
    class Publisher:
        def __init__(self):
            from trinity_like.weights.shared import SharedWeights

            self.shared = SharedWeights("test-cuda")

        def publish(self, version, weights):
            from trinity_like.weights.fingerprint import weights_fingerprint

            sd = {k: v.cuda() for k, v in weights.items()}
            return self.shared.publish(version, sd, weights_fingerprint(sd))

        def close(self):
            self.shared.close()

    @ray.remote(num_gpus=0.5, num_cpus=0)
    def receive(handle):
        from trinity_like.weights.fingerprint import weights_fingerprint
        from trinity_like.weights.shared import open_shared

        sd = open_shared(handle)
        assert all(t.device.type == "cuda" for t in sd.values())
        own = {k: t.clone() for k, t in sd.items()}  # the engine's copy, device to device
        return weights_fingerprint(own)

    pub = Publisher.remote()
    try:
        for version in (1, 2, 3):
            handle = ray.get(pub.publish.remote(version, _weights(version)))
            assert handle.kind == "cuda"
            assert ray.get(receive.remote(handle)) == handle.fingerprint == weights_fingerprint(_weights(version))
    finally:
        ray.get(pub.close.remote())
        ray.kill(pub)
