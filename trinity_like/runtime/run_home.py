"""The run's home is the trainer's run directory; how an explorer on a node without it takes part.

An explorer needs the run directory itself when it writes the file buffer (``buffer.transport: file``) or loads
weights from checkpoint files (``synchronizer.method: checkpoint``): every explorer node then mounts the
trainer's run directory at the same path (a shared filesystem), and an explorer that sees another one stops at
start, saying what to mount (``get_synchronizer`` compares the run ids).

Otherwise (``redis`` experiences, ``broadcast`` or ``memory`` weights) it needs none. The trainer publishes what an
explorer would read from the run directory (its id, the config, the task sets) to the Synchronizer
(``publish_run_home``); the explorer takes it from there (``join_run_home``) and checks that it runs the same
config. The lines it appends to run-directory files (``metrics.jsonl``, ``failed_tasks.jsonl``) go to its own
run directory on its node and, when that is not the trainer's, through the Synchronizer to the trainer, which
appends them to its files (``RelayDrain``), so ``status``, ``plot`` and the trainer job's progress see every
role.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trinity_like.common.errors import RunError
from trinity_like.common.fs import append_line
from trinity_like.runtime.paths import RunPaths, read_run_id
from trinity_like.runtime.run_dir import PER_JOB_KEYS, config_differences, prepare_eval_tasksets

if TYPE_CHECKING:
    from trinity_like.common.tasks import Task
    from trinity_like.config import Config

logger = logging.getLogger(__name__)

RELAYED_FILES = ("metrics.jsonl", "failed_tasks.jsonl")
"""Run-directory files an explorer off the run's filesystem appends to through the trainer."""
NODE_LOCAL_KEYS = ("checkpoint_root_dir", "run_dir", "buffer.path", "explorer.taskset.path",
                   "explorer.taskset.files")
"""Settings that may differ on an explorer that takes the run from the Synchronizer: where its node keeps its
own run directory (the task set comes from the trainer)."""


def written_explore_steps(paths: RunPaths) -> dict[int, int]:
    """The explorer steps whose experiences the buffer holds, with their row counts (an explorer's restart
    continues after them, and the schedule counts their rows). Read from the buffer's catalog: no segment is
    opened unless it lacks an entry."""
    from trinity_like.buffer import explore_step_rows

    return explore_step_rows(paths.buffer_dir)


@dataclass
class RunHome:
    """What an explorer would read from the trainer's run directory."""

    run_id: str
    run_dir: str
    """The trainer's run directory, on the trainer's node."""
    node_ip: str
    config: Config
    tasks: list[Task]
    eval_tasks: dict[str, list[Task]] = field(default_factory=dict)


def publish_run_home(cfg: Config, paths: RunPaths, synchronizer) -> None:
    """The trainer's side: publish the run's id, config and task sets (mode offline has no explorer)."""
    import ray

    from trinity_like.common.tasks import load_taskset

    if cfg.mode == "offline":
        return
    home = RunHome(run_id=read_run_id(paths) or "", run_dir=str(paths.run_dir),
                   node_ip=ray.util.get_node_ip_address(), config=cfg, tasks=load_taskset(paths.taskset),
                   eval_tasks=prepare_eval_tasksets(cfg))
    ray.get(synchronizer.publish_run.remote(home))


async def join_run_home(cfg: Config, synchronizer, timeout_s: float) -> RunHome:
    """The explorer's side: wait for the trainer to publish the run, check that this explorer runs its
    config, and return it."""
    home = await synchronizer.run_home.remote(timeout_s)
    if home is None:
        raise RunError(f"no trainer published the run within {timeout_s:.0f}s (synchronizer.timeout_s): an explorer "
                       "off the run's filesystem takes the config and task set from it; start the trainer "
                       "(--role trainer)")
    diff = [k for k in config_differences(home.config, cfg)
            if not any(k == p or k.startswith(p + ".") for p in NODE_LOCAL_KEYS + PER_JOB_KEYS)]
    if diff:
        raise RunError(f"the run's trainer (run directory {home.run_dir} on {home.node_ip}) runs another config "
                       f"(differs in {', '.join(diff[:6])}{' ...' if len(diff) > 6 else ''}); start this explorer "
                       "with the run's config.yaml")
    return home


class RunFiles:
    """An explorer's appends to run-directory files: to its own run directory, and relayed to the trainer's
    when that is another (``relay``)."""

    def __init__(self, paths: RunPaths, synchronizer=None, relay: bool = False) -> None:
        self.paths, self.synchronizer, self.relay = paths, synchronizer, relay

    def append(self, name: str, line: str) -> None:
        append_line(self.paths.run_dir / name, line)
        self.relay_only(name, line)

    def relay_only(self, name: str, line: str) -> None:
        """Relay a line already appended to this node's copy (e.g. by ``MetricsWriter``)."""
        if self.relay:
            self.synchronizer.relay.remote(name, [line])  # in order: one caller's calls run in submission order


class RelayDrain:
    """The trainer's side of ``RunFiles``: a daemon thread that appends relayed lines to the run directory's
    files every ``interval_s`` (and once more at ``stop``)."""

    def __init__(self, synchronizer, run_dir, interval_s: float = 1.0) -> None:
        self.synchronizer, self.run_dir, self.interval_s = synchronizer, run_dir, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="relay-drain", daemon=True)

    def start(self) -> RelayDrain:
        self._thread.start()
        return self

    def drain(self) -> int:
        """Append what waits; return the lines written."""
        import ray

        taken: dict[str, Any] = ray.get(self.synchronizer.take_relayed.remote(), timeout=30)
        written = 0
        for name, lines in taken.items():
            if name not in RELAYED_FILES:  # never a path from elsewhere
                logger.warning("relayed lines for unknown file %r dropped", name)
                continue
            for line in lines:
                append_line(self.run_dir / name, line)
            written += len(lines)
        return written

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.drain()
            except Exception as e:  # the Synchronizer restarting: the lines wait there, try again
                logger.debug("relay drain failed: %s", e)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.drain()
        except Exception as e:  # noqa: BLE001 - at shutdown the Synchronizer may be gone already
            logger.warning("relayed lines not written at shutdown: %s", type(e).__name__)
