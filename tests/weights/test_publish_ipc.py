"""Method ``ipc``'s publishing side: the trainer's weights are cast into the shared buffer as they are written (no
converted copy of the state dict first, which on a GPU is a second copy of the model's published size), and the
buffers, their files and their handles are made once and refilled, however many versions go out.

Memory is measured, not inferred: ``torch.profiler`` with ``profile_memory=True`` reports every allocation and free
of torch's allocators with the running total of bytes they hold (counted from the start of profiling), so the
peak of that total is the most memory the code under it held at once (allocations made by the calling thread,
which is where the cast happens; the fingerprint's worker threads allocate a few sums)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from trinity_like.weights.fingerprint import weights_fingerprint
from trinity_like.weights.shared import SharedWeights, open_shared


def peak_bytes_allocated(fn, device: str = "cpu") -> tuple[object, int]:
    """``fn()``'s result, and the most bytes torch's allocator for ``device`` held at once while it ran, beyond
    what it held before."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, profile_memory=True) as prof:
        result = fn()

    def walk(nodes):
        for node in nodes:
            yield node
            yield from walk(node.children)

    totals = [node.extra_fields.total_allocated for node in walk(prof.profiler.kineto_results.experimental_event_tree())
              if node.tag == _EventType.Allocation and node.extra_fields.device.type == device]
    return result, max(totals, default=0)


def _fp32_weights(seed: int, rows: int = 256) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(rows, 512, generator=g), "layer.weight": torch.randn(512, 512, generator=g),
            "layer.bias": torch.randn(512, generator=g), "positions": torch.arange(64, dtype=torch.int64) * seed}


def test_the_counter_sees_a_transient_copy_and_not_a_copy_into_an_existing_buffer():
    """The measure itself: a converted copy of 1 MiB of float32 is 0.5 MiB held; a cast into a buffer, none."""
    t = torch.randn(512, 512)
    _, copied = peak_bytes_allocated(lambda: t.to(torch.bfloat16).sum())
    assert copied >= t.numel() * 2
    out = torch.empty(512, 512, dtype=torch.bfloat16)
    _, in_place = peak_bytes_allocated(lambda: out.copy_(t))
    assert in_place == 0


def test_weights_are_cast_straight_into_the_buffer_and_fingerprinted_as_published(tmp_path):
    shared = SharedWeights("test-cast", keep=2, root=tmp_path)
    try:
        sd = _fp32_weights(1)
        expected = {k: t.to(torch.bfloat16) if t.is_floating_point() else t for k, t in sd.items()}
        shared.publish(1, _fp32_weights(0), fingerprint=None, dtype=torch.bfloat16)
        shared.publish(2, _fp32_weights(0), fingerprint=None, dtype=torch.bfloat16)
        handle, peak = peak_bytes_allocated(lambda: shared.publish(3, sd, fingerprint=None, dtype=torch.bfloat16))
        # into version 1's buffer: a bf16 copy of these weights would be handle.size bytes held at once
        assert peak < handle.size // 8, f"publish held {peak} bytes for a {handle.size}-byte version"
        published = open_shared(handle)
        assert {k: t.dtype for k, t in published.items()} == {k: t.dtype for k, t in expected.items()}
        assert all(torch.equal(published[k], expected[k]) for k in expected)  # the cast's very values
        assert handle.fingerprint == weights_fingerprint(expected)
        with pytest.raises(ValueError, match="cast as they are published: pass fingerprint=None"):
            shared.publish(4, sd, weights_fingerprint(sd), dtype=torch.bfloat16)
    finally:
        shared.close()


def _shm_maps(folder: Path) -> int:
    """This process's memory mappings of files in ``folder`` (unlinked ones included)."""
    with open("/proc/self/maps") as f:
        return sum(str(folder) in line for line in f)


def _open_fds_in(folder: Path) -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with __import__("contextlib").suppress(OSError):
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(str(folder))
    return n


def test_twenty_publications_hold_as_many_buffers_files_mappings_and_handles_as_two(tmp_path):
    """What grows with each publication when handles are made per version: buffers, their files, their mappings,
    the export bookkeeping (on a GPU one torch CudaIPCSentData, a counter slot and a CUDA event per export; the same
    code path makes a buffer and its one handle on either device). All flat from the second version on."""
    shared = SharedWeights("test-flat", keep=2, root=tmp_path)
    try:
        seen = []
        for version in range(1, 21):
            handle = shared.publish(version, _fp32_weights(version, rows=8), fingerprint=None, dtype=torch.bfloat16)
            files = sorted(p.name for p in shared.folder.iterdir())
            seen.append((shared.buffers_made, shared.live_buffers(), len(files), _shm_maps(shared.folder),
                         _open_fds_in(shared.folder)))
            assert files[-1] == f"version-{version:08d}" and handle.path.endswith(files[-1])
        assert seen[0] == (1, 1, 1, 1, 0)
        assert set(seen[1:]) == {(2, 2, 2, 2, 0)}, seen
        # weights of another size: the oldest buffer is dropped (file and mapping) and one made in its place
        shared.publish(21, _fp32_weights(21, rows=16), fingerprint=None, dtype=torch.bfloat16)
        assert (shared.buffers_made, shared.live_buffers(), len(list(shared.folder.iterdir())),
                _shm_maps(shared.folder)) == (3, 2, 2, 2)
    finally:
        shared.close()
    assert not shared.folder.exists() and _shm_maps(shared.folder) == 0


def test_the_ipc_publisher_casts_the_trainers_weights_into_its_buffer_without_a_converted_copy(
        tmp_path, tiny_model_path, ray_session):
    """The trainer (float32 on the CPU) publishes bfloat16 by method ipc: the engines get the cast weights with
    their fingerprint, and publishing holds no converted copy of the model (it did: ``weights_for_export`` made
    one, then packed it into the buffer)."""
    from trinity_like.config import load_config
    from trinity_like.runtime.paths import namespace_of
    from trinity_like.synchronizer import get_synchronizer
    from trinity_like.trainer.ppo import PPOTrainer

    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}", "trainer.device=cpu",
                             "name=ipc-cast", "synchronizer.method=ipc", "trainer.weights_dtype=bfloat16"])
    sync = get_synchronizer(namespace_of(cfg))
    trainer = PPOTrainer(cfg, sync)
    trainer.prepare()
    try:
        trainer.sync_weight()
        trainer.sync_weight()  # both buffers made: what follows refills one
        metrics, peak = peak_bytes_allocated(trainer.sync_weight)
        size = int(metrics["sync/bytes"])
        assert peak < size // 8, f"publishing held {peak} bytes for a {size}-byte version"
        info = ray_session.get(sync.latest.remote())
        published = trainer.policy_state_dict()  # the bf16 weights, made here for the comparison
        assert info.method == "ipc" and info.transport == "shared memory"
        assert info.fingerprint == weights_fingerprint(published) == info.shared.fingerprint
        mapped = open_shared(info.shared)
        assert all(torch.equal(mapped[k], published[k]) for k in published)
        assert trainer.publisher.shared.buffers_made == 2
    finally:
        trainer.shutdown()


_OPEN_AND_FINGERPRINT = """
import pickle, sys
from trinity_like.weights.fingerprint import weights_fingerprint
from trinity_like.weights.shared import open_shared
print(weights_fingerprint(open_shared(pickle.load(sys.stdin.buffer))))
"""


def _fingerprint_in_another_process(handle: dict) -> str:
    """An engine's view of a handle: another process (a fresh one, as CUDA IPC needs) maps the buffer on the GPU
    and fingerprints what it reads there."""
    import pickle
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", _OPEN_AND_FINGERPRINT], input=pickle.dumps(handle), env=env,
                         capture_output=True, timeout=120, check=True)
    return out.stdout.decode().strip().splitlines()[-1]


@pytest.mark.gpu
def test_on_a_gpu_twenty_publications_export_two_handles_cast_in_place_and_close_frees_all(tmp_path):
    """The CUDA path: each buffer's IPC handle is exported once (torch's bookkeeping of exports, a counter slot
    per ``reduce_tensor``, shows two slots over twenty versions, not twenty); a refill holds no bf16 copy of the
    float32 weights; a refilled buffer read through its reused handle in other processes gives the new version;
    and closing gives every byte back, also of a buffer mapped by several readers (torch counts one reader per
    export and, past zero, would keep the memory in its limbo of sent blocks until the process ends)."""
    sd = {k: t.cuda() for k, t in _fp32_weights(0, rows=2048).items()}
    base = torch.cuda.memory_allocated()
    shared = SharedWeights("test-cuda-flat", keep=2, root=tmp_path)
    slots = set()
    try:
        for version in range(1, 21):
            sd["layer.bias"].fill_(float(version))  # every version's bytes differ
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            handle = shared.publish(version, sd, fingerprint=None, dtype=torch.bfloat16)
            assert handle.kind == "cuda"
            if version > 2:  # a refill: the bf16 copy of the weights would be handle.size bytes
                assert torch.cuda.max_memory_allocated() - before < handle.size // 8
            slots |= shared.torch_counters()
            if version in (1, 3, 20):  # 3 and 20 are refills, read through the handle made for 1 or 2
                assert handle.fingerprint == weights_fingerprint(sd, {k: torch.bfloat16 for k in sd
                                                                         if sd[k].is_floating_point()})
                assert _fingerprint_in_another_process(handle) == handle.fingerprint
        assert len(slots) == 2 and shared.buffers_made == 2, slots
    finally:
        shared.close()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base
