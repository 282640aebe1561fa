"""CheckpointMonitor: knows when every writer of a step has finished, and only then makes the step visible.

A named Ray actor (``checkpoint_monitor``) in the run's namespace, with the API of Trinity-RFT's monitor.
Writers (the trainer's data-parallel ranks) call ``register_thread_count`` for a step, write their files, and
call ``notify_finished``. When the last writer of a step is in:

- a weights version (``is_state_dict=True``): the monitor writes the version's ``manifest.json`` (the
  moment the version exists for readers), moves the ``state_dict/latest`` pointer, deletes old versions
  (keeping the newest ``keep_state_dicts``), and publishes the version to the Synchronizer;
- a full checkpoint: it moves the ``checkpoints/latest`` pointer.

``monitor_step`` waits for a step to complete. Pointers live on disk, so a restarted role (or monitor)
finds them. A writer that dies before ``notify_finished`` leaves its step incomplete: nothing is published,
every reader stays on the previous version, and the partial folder is deleted once a newer version completes.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import shutil
import time
from pathlib import Path

import ray

from trinity_like.runtime.checkpoints import read_pointer, write_pointer
from trinity_like.weights.files import (
    STATE_DICT_DIR,
    complete_version,
    parts_fingerprint,
    prune_versions,
    version_of,
    version_pointer_or_0,
    write_version_pointer,
)
from trinity_like.weights.messages import MONITOR_NAME, SYNCHRONIZER_NAME, WeightsInfo

logger = logging.getLogger(__name__)


def _pointer_or_0(path: Path) -> int:
    step = read_pointer(path)
    return 0 if step is None else step


class SaveStrategy(enum.StrEnum):
    """How many saves may run at once in Trinity-RFT (one thread, one process, one node, no limit). Accepted for
    the seeds' constructor; every value is served the same way here, because saves never contend: each
    data-parallel writer writes its own part file, and the monitor publishes a version or checkpoint only once
    every part is in (``register_thread_count`` / ``notify_finished``)."""

    SINGLE_THREAD = "single_thread"
    SINGLE_PROCESS = "single_process"
    SINGLE_NODE = "single_node"
    UNRESTRICTED = "unrestricted"


class CheckpointMonitor:
    """Constructed in the seeds' shape, ``CheckpointMonitor(save_strategy, default_local_dir, default_hdfs_dir)``
    (``default_local_dir`` is the run's checkpoint folder; HDFS copies are not supported: a clear error), or with
    the keywords ``checkpoint_dir``, ``keep_state_dicts`` (weight versions kept) and ``namespace`` (the run's
    Ray namespace, to publish versions to its Synchronizer)."""

    def __init__(self, save_strategy: SaveStrategy | str | None = None, default_local_dir: str | os.PathLike | None = None,
                 default_hdfs_dir: str | None = None, *, checkpoint_dir: str | os.PathLike | None = None,
                 keep_state_dicts: int = 3, namespace: str | None = None) -> None:
        from trinity_like.common.errors import UserError

        if default_hdfs_dir:
            raise UserError(f"CheckpointMonitor: default_hdfs_dir {default_hdfs_dir!r} is not supported (no HDFS "
                            "copies: checkpoints stay in default_local_dir, the run's checkpoint folder); pass None")
        if checkpoint_dir is not None and default_local_dir is not None and Path(checkpoint_dir) != Path(default_local_dir):
            raise ValueError("CheckpointMonitor: give the checkpoint folder once (default_local_dir or checkpoint_dir)")
        folder = checkpoint_dir if checkpoint_dir is not None else default_local_dir
        if folder is None:
            raise ValueError("CheckpointMonitor needs the checkpoint folder: default_local_dir (or checkpoint_dir)")
        try:
            self.save_strategy = SaveStrategy(save_strategy) if save_strategy is not None else SaveStrategy.UNRESTRICTED
        except ValueError:
            raise ValueError(f"CheckpointMonitor: unknown save_strategy {save_strategy!r}; valid: "
                             f"{', '.join(s.value for s in SaveStrategy)}") from None
        checkpoint_dir = folder
        self.dir = Path(checkpoint_dir)
        self.state_dict_root = self.dir / STATE_DICT_DIR
        self.keep_state_dicts = max(1, keep_state_dicts)
        self.namespace = namespace
        self.latest_checkpoint_step = _pointer_or_0(self.dir / "latest")
        self.latest_state_dict_step = version_pointer_or_0(self.state_dict_root)
        self._expected: dict[tuple[int, bool], int] = {}
        self._parts: dict[tuple[int, bool], list[dict]] = {}
        self._done: dict[tuple[int, bool], asyncio.Event] = {}
        self.writers: dict[str, dict] = {}
        """node_id -> {job_id, since}: the processes that announced themselves with ``notify_started``."""

    # ------------------------------------------------------------ pointers
    def update_latest_checkpoint_step(self, step: int) -> None:
        if step >= self.latest_checkpoint_step:
            write_pointer(self.dir / "latest", step)
            self.latest_checkpoint_step = step

    def update_latest_state_dict_step(self, step: int) -> None:
        if step >= self.latest_state_dict_step:
            write_version_pointer(self.state_dict_root, step)
            self.latest_state_dict_step = step
        prune_versions(self.state_dict_root, self.keep_state_dicts, self.latest_state_dict_step)

    def rollback(self, step: int) -> None:
        """A trainer resumed from checkpoint ``step``: delete the weight versions above it (written by the
        run it replaces) and move ``state_dict/latest`` back, so that its own versions take their place; move
        ``checkpoints/latest`` back too when it named a later (damaged, skipped) checkpoint, so that the
        checkpoints written from ``step`` on move it again."""
        if self.latest_checkpoint_step > step:
            write_pointer(self.dir / "latest", step)
            self.latest_checkpoint_step = step
        for d in self.state_dict_root.glob("version-*"):
            v = version_of(d)
            if v is not None and v > step:
                shutil.rmtree(d, ignore_errors=True) if d.is_dir() else d.unlink(missing_ok=True)
        if self.latest_state_dict_step > step:
            self.latest_state_dict_step = step
            if self.state_dict_root.is_dir():
                write_version_pointer(self.state_dict_root, step)
        for key in [k for k in self._expected if k[0] > step]:  # steps of the replaced run, not yet complete
            self._expected.pop(key), self._parts.pop(key, None), self._done.pop(key, None)

    # ------------------------------------------------------------ writers
    def _event(self, key: tuple[int, bool]) -> asyncio.Event:
        return self._done.setdefault(key, asyncio.Event())

    async def register_thread_count(self, step: int, *, state_dict_thread_count: int = 0,
                                    checkpoint_thread_count: int = 0) -> None:
        """How many writers a step has. Every writer may call it (the same count again is a no-op)."""
        for is_sd, count in ((True, state_dict_thread_count), (False, checkpoint_thread_count)):
            if not count:
                continue
            key = (step, is_sd)
            known = self._expected.get(key)
            if known is not None and known != count and not self._event(key).is_set():
                raise ValueError(f"step {step} was registered with {known} writers, now {count}")
            if known is None or self._event(key).is_set():  # a step written again (after a trainer restart)
                self._expected[key] = count
                self._parts[key] = []
                self._done[key] = asyncio.Event()

    async def notify_started(self, node_id: str, job_id: str) -> None:
        self.writers[node_id] = {"job_id": job_id, "since": time.time()}

    async def notify_finished(self, step: int, is_state_dict: bool = False, part: dict | None = None) -> None:
        """One writer of ``step`` is done (``part``: its manifest entry for a weights version)."""
        key = (step, is_state_dict)
        if key not in self._expected:
            raise ValueError(f"step {step} ({'weights' if is_state_dict else 'checkpoint'}) finished without "
                             "register_thread_count")
        self._parts[key].append(part or {})
        if len(self._parts[key]) < self._expected[key]:
            return
        if not is_state_dict:
            self.update_latest_checkpoint_step(step)
            self._event(key).set()
            return
        await self._complete_version(step, self._parts[key])
        self._event(key).set()
        # older versions are deleted once the new one is announced and its writers released: deleting a version's
        # files (0.08 s for 0.4 GB on the development VM) is not on the way from the trainer to the engines
        await asyncio.to_thread(prune_versions, self.state_dict_root, self.keep_state_dicts, step)

    async def _complete_version(self, step: int, parts: list[dict]) -> None:
        vdir = complete_version(self.state_dict_root, step, parts, self.keep_state_dicts, prune=False)
        self.latest_state_dict_step = max(self.latest_state_dict_step, step)
        if self.namespace is not None:
            sync = ray.get_actor(SYNCHRONIZER_NAME, namespace=self.namespace)
            await sync.publish.remote(WeightsInfo(version=step, path=str(vdir), bytes=sum(p["bytes"] for p in parts),
                                                  method="checkpoint", transport="files",
                                                  fingerprint=parts_fingerprint(parts)))

    async def monitor_step(self, step: int, is_state_dict: bool = False, timeout_s: float | None = None) -> bool:
        """Wait until every writer of ``step`` has finished; False if ``timeout_s`` passed first."""
        try:
            await asyncio.wait_for(self._event((step, is_state_dict)).wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def latest(self) -> dict[str, int]:
        return {"checkpoint": self.latest_checkpoint_step, "state_dict": self.latest_state_dict_step}

    @classmethod
    def get_actor(cls, namespace: str, save_strategy: SaveStrategy | str | None = None,
                  default_local_dir: str | None = None, default_hdfs_dir: str | None = None, *,
                  checkpoint_dir: str | None = None, keep_state_dicts: int = 3):
        """The run's monitor, created by the first caller (which must give the checkpoint folder,
        ``default_local_dir`` or ``checkpoint_dir``) on the caller's node: it reads and writes that folder, which
        only that node (the trainer's) is sure to see. The seeds' signature."""
        folder = checkpoint_dir if checkpoint_dir is not None else default_local_dir
        if folder is None:
            return ray.get_actor(MONITOR_NAME, namespace=namespace)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        return ray.remote(num_cpus=0)(cls).options(
            name=MONITOR_NAME, namespace=namespace, get_if_exists=True, lifetime="detached",
            max_concurrency=64, scheduling_strategy=here).remote(
                save_strategy, None, default_hdfs_dir, checkpoint_dir=str(folder), keep_state_dicts=keep_state_dicts,
                namespace=namespace)
