"""Weight publication: one publisher per ``synchronizer.method``, behind one interface, each handing the
Synchronizer a ``WeightsInfo`` for the version it publishes.

- ``checkpoint``: every data-parallel rank writes its share of the tensors into ``state_dict/version-<k>/``
  (``weights.files``); the CheckpointMonitor completes the version once the last part is in and publishes
  it; rank 0 waits for that (bounded by ``synchronizer.timeout_s``).
- ``memory``: rank 0 puts the state dict in Ray's object store and publishes the reference.
- ``broadcast``: rank 0 snapshots the weights into a ``WeightBroadcaster``, whose thread sends them to the engines
  by collective broadcast when they come for it, while training goes on.
- ``ipc``: rank 0 packs the weights into a shared buffer on its node (``weights.shared``): in its GPU memory as
  a CUDA IPC handle when the engines share its GPU, else a shared-memory file; engines map it and copy. The
  trainer's own tensors are cast to ``trainer.weights_dtype`` as they are written into the buffer (no converted
  copy of the weights first), and the buffers and their handles are made once and refilled.

A publisher works on an engine that exposes ``train_step_num``, ``dp_rank``, ``dp_world``, ``monitor``,
``synchronizer``, ``paths``, ``cfg``, ``device``, ``weights_for_export(on_device=False)`` (the plain policy's
full tensors, collective under FSDP2), ``policy_weights(copy=False)`` and ``weights_dtype`` (the same tensors
uncast, and the dtype to publish them in: for ``ipc``, which casts into its buffer) and ``writes()`` /
``gathers()`` (which ranks write, which take part in gathering).
"""

from __future__ import annotations

import abc
import time
from pathlib import Path
from typing import Any

from trinity_like.common.registry import Registry
from trinity_like.weights.messages import WeightsInfo

PUBLISHERS: Registry = Registry("weight publication method")
"""``synchronizer.method`` -> a WeightPublisher class taking the engine."""


def _ray_get(ref):
    import ray

    return ray.get(ref)


class WeightPublisher(abc.ABC):
    writes_files: bool = False
    """Whether every data-parallel rank writes a part (their bytes add up) and the version lives in files the
    CheckpointMonitor tracks (and rolls back when the trainer resumes from an earlier step)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.last_bytes = 0
        """Bytes this rank handed over at the last publication."""

    @abc.abstractmethod
    def publish(self) -> dict[str, float]:
        """Publish the engine's current weights as version ``train_step_num``; return ``sync/*`` metrics (empty
        on ranks that have nothing to report)."""

    def close(self) -> None:  # noqa: B027 (optional: only the broadcaster holds a thread)
        """Stop what the publisher started (a broadcaster thread)."""


def keep_versions(cfg) -> int:
    """Weight versions kept on disk: an explorer only ever loads one of the newest few."""
    return cfg.synchronizer.max_staleness + 2


def write_state_dict(engine) -> tuple[Path, int]:
    """Write this rank's share of the current version into ``state_dict/version-<k>/``; with a monitor, report
    the part to it (it completes the version when the last part is in), else complete it here (a single
    writer, standalone use). Returns the version folder and the bytes written."""
    from trinity_like.weights.files import (
        STATE_DICT_DIR,
        complete_version,
        split_for_writers,
        version_dir,
        write_part,
    )

    root = engine.paths.checkpoint_dir / STATE_DICT_DIR
    version = engine.train_step_num
    sd = engine.weights_for_export()
    share = split_for_writers(sd, engine.dp_world)[engine.dp_rank]
    if engine.monitor is not None:
        _ray_get(engine.monitor.register_thread_count.remote(version, state_dict_thread_count=engine.dp_world))
    part = write_part(version_dir(root, version), engine.dp_rank, engine.dp_world, {k: sd[k] for k in share})
    if engine.monitor is not None:
        _ray_get(engine.monitor.notify_finished.remote(version, is_state_dict=True, part=part))
        return version_dir(root, version), part["bytes"]
    if engine.dp_world > 1:
        raise RuntimeError("data-parallel writers need a CheckpointMonitor to complete a version")
    return complete_version(root, version, [part], keep_versions(engine.cfg)), part["bytes"]


def upload_state_dict(engine) -> tuple[Any, int, str]:
    """An object-store reference to the current weights (None on ranks that do not write), their size and
    their fingerprint (empty on ranks that do not write)."""
    import ray

    from trinity_like.weights.fingerprint import weights_fingerprint

    if not engine.gathers():
        return None, 0, ""
    sd = engine.weights_for_export()
    size = sum(t.numel() * t.element_size() for t in sd.values())
    if not engine.writes():
        return None, size, ""
    return ray.put(sd), size, weights_fingerprint(sd)


@PUBLISHERS.register("checkpoint")
class FilePublisher(WeightPublisher):
    writes_files = True

    def publish(self) -> dict[str, float]:
        e, timeout_s = self.engine, self.engine.cfg.synchronizer.timeout_s
        start = time.perf_counter()
        _, self.last_bytes = write_state_dict(e)
        if not e.writes():
            return {"sync/bytes": float(self.last_bytes)}
        wait_start = time.perf_counter()
        if not _ray_get(e.monitor.monitor_step.remote(e.train_step_num, True, timeout_s)):
            raise TimeoutError(f"version {e.train_step_num} was not completed by every writer within {timeout_s:.0f}s")
        return {"sync/version": float(e.train_step_num), "sync/seconds": time.perf_counter() - start,
                "sync/bytes": float(self.last_bytes), "sync/wait_s": time.perf_counter() - wait_start}


@PUBLISHERS.register("memory")
class ObjectStorePublisher(WeightPublisher):
    def publish(self) -> dict[str, float]:
        e = self.engine
        start = time.perf_counter()
        ref, self.last_bytes, fingerprint = upload_state_dict(e)
        if not e.writes():
            return {}
        _ray_get(e.synchronizer.publish.remote(WeightsInfo(version=e.train_step_num, refs=[ref], bytes=self.last_bytes,
                                                           method="memory", transport="object store",
                                                           fingerprint=fingerprint)))
        return {"sync/version": float(e.train_step_num), "sync/seconds": time.perf_counter() - start,
                "sync/bytes": float(self.last_bytes)}


@PUBLISHERS.register("broadcast")
class BroadcastPublisher(WeightPublisher):
    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.broadcaster = None
        """Rank 0's WeightBroadcaster, started at the first publication."""

    def publish(self) -> dict[str, float]:
        from trinity_like.weights.broadcast import WeightBroadcaster
        from trinity_like.weights.fingerprint import weights_fingerprint

        e = self.engine
        start = time.perf_counter()
        if not e.gathers():
            return {}
        sd = e.weights_for_export()
        if not e.writes():
            return {}
        sc = e.cfg.synchronizer
        if self.broadcaster is None:
            self.broadcaster = WeightBroadcaster(e.synchronizer, sc.bucket_mb, sc.timeout_s, sc.sync_timeout_s)
        fingerprint = weights_fingerprint(sd)
        self.last_bytes = self.broadcaster.offer(e.train_step_num, sd, fingerprint)
        _ray_get(e.synchronizer.publish.remote(WeightsInfo(version=e.train_step_num, bytes=self.last_bytes,
                                                           method="broadcast", transport=self.broadcaster.backend,
                                                           fingerprint=fingerprint)))
        last = {f"sync/broadcast_{k.split('/')[1]}": v for k, v in self.broadcaster.last_round.items()}
        return {"sync/version": float(e.train_step_num), "sync/seconds": time.perf_counter() - start,
                "sync/bytes": float(self.last_bytes), **last,
                "sync/broadcast_failures": float(self.broadcaster.failures)}

    def close(self) -> None:
        if self.broadcaster is not None:
            self.broadcaster.close()


@PUBLISHERS.register("ipc")
class SharedMemoryPublisher(WeightPublisher):
    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.shared = None
        """Rank 0's SharedWeights, made at the first publication."""

    def on_gpu(self) -> bool:
        """Whether versions stay in the trainer's GPU memory (CUDA IPC): only when the engines share that GPU
        (a fraction of one each); engines on the CPU map a shared-memory file instead."""
        gpus = self.engine.cfg.explorer.gpus_per_engine
        return self.engine.device.type == "cuda" and 0 < gpus < 1

    def publish(self) -> dict[str, float]:
        import torch

        from trinity_like.runtime.paths import namespace_of
        from trinity_like.weights.shared import SharedWeights

        e = self.engine
        start = time.perf_counter()
        if not e.gathers():
            return {}
        sd = e.policy_weights(copy=False)  # the trainer's own tensors, in its dtype: cast into the buffer below
        if not e.writes():
            return {}
        if self.shared is None:
            self.shared = SharedWeights(namespace_of(e.cfg).replace("/", "_"), keep=2)
        handle = self.shared.publish(e.train_step_num, sd, fingerprint=None, dtype=getattr(torch, e.weights_dtype),
                                     device=e.device if self.on_gpu() else "cpu")
        fingerprint = handle.fingerprint  # of the published bytes, computed where they are
        self.last_bytes = handle.size
        _ray_get(e.synchronizer.publish.remote(WeightsInfo(version=e.train_step_num, shared=handle,
                                                           bytes=self.last_bytes, method="ipc",
                                                           transport="CUDA IPC" if handle.kind == "cuda"
                                                           else "shared memory", fingerprint=fingerprint)))
        return {"sync/version": float(e.train_step_num), "sync/seconds": time.perf_counter() - start,
                "sync/bytes": float(self.last_bytes)}

    def close(self) -> None:
        if self.shared is not None:
            self.shared.close()
