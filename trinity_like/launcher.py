"""Modes and roles: prepare the run directory, start Ray and the parts, drive or wait, shut down cleanly.

- ``sync``: lock-step. Explorer steps run until the buffer holds trainer step k's batch, then trainer step k;
  with ``synchronizer.interval: 1`` explorer step k uses version k (strict on-policy).
- ``async``: explorer and trainer loop concurrently in their own actors; the explorer's admission rule keeps
  every trained row within ``synchronizer.max_staleness`` versions.
- ``offline``: no explorer; the trainer replays ``buffer.replay_sources`` for ``trainer.total_steps`` steps.

While the roles work, the launcher tails ``metrics.jsonl`` and prints one progress line per step.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from trinity_like.buffer.segments import list_segments
from trinity_like.common.errors import UserError
from trinity_like.common.fs import atomic_write_json, atomic_write_text
from trinity_like.common.metrics import read_metrics
from trinity_like.common.modeling import set_offline_env
from trinity_like.config import Config, RunPaths, namespace_of, to_yaml
from trinity_like.synchronizer.monitor import MONITOR_NAME


class RunError(UserError):
    """A run that could not start or finish for a reason the user can fix; the message says which."""


def prepare_run_dir(cfg: Config, allow_existing: bool = False) -> RunPaths:
    """Create the run directory, save the resolved config, build the tiny model and the task set if asked.
    ``allow_existing`` lets read-only users (``bench``) open a directory that already holds a run."""
    from trinity_like.common.tasks import generate_arithmetic, load_taskset, write_taskset
    from trinity_like.common.tiny_model import ensure_tiny_model

    paths = RunPaths.of(cfg)
    if not allow_existing and (paths.summary.exists() or list_segments(paths.buffer_dir)):
        raise RunError(f"run directory '{paths.run_dir}' already holds a run; pick another name (name=...) or "
                       "delete that folder")
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    if not allow_existing:
        atomic_write_text(paths.config, to_yaml(cfg))
    if not os.path.isfile(os.path.join(cfg.model.path, "config.json")):
        if not cfg.model.build_tiny_if_missing:
            raise RunError(f"model.path '{cfg.model.path}' has no model; point it at a Hugging Face model folder, "
                           "build one with `trinity-like make-tiny-model DIR`, or set model.build_tiny_if_missing=true")
        print(f"building the tiny model into {cfg.model.path} ...", flush=True)
        ensure_tiny_model(cfg.model.path, seed=cfg.seed)
    if cfg.mode != "offline" and not paths.taskset.is_file():
        if cfg.explorer.taskset.path:
            raise RunError(f"explorer.taskset.path '{cfg.explorer.taskset.path}' does not exist")
        ts = cfg.explorer.taskset
        write_taskset(paths.taskset, generate_arithmetic(ts.size, ts.max_operand, cfg.seed))
    if cfg.mode != "offline":
        try:
            load_taskset(paths.taskset)  # fail here, in one line, rather than inside an explorer actor
        except (OSError, ValueError) as e:
            raise RunError(str(e)) from None
    return paths


def init_ray(cfg: Config) -> None:
    """Join a running Ray instance (tests share one), or start a local one."""
    import ray

    if ray.is_initialized():
        return
    ray.init(namespace=namespace_of(cfg), include_dashboard=False, log_to_driver=False,
             configure_logging=False)


@dataclass
class _Roles:
    synchronizer: Any
    explorer: Any
    trainer: Any


def _start_roles(cfg: Config) -> _Roles:
    import ray

    from trinity_like.explorer.role import ExplorerRole
    from trinity_like.synchronizer import get_synchronizer
    from trinity_like.trainer.role import TrainerRole

    ns = namespace_of(cfg)
    sync = get_synchronizer(ns)
    explorer = None
    if cfg.mode != "offline":
        explorer = ray.remote(num_cpus=0, max_concurrency=4)(ExplorerRole).options(
            name="explorer", namespace=ns).remote(cfg)
    trainer = ray.remote(num_cpus=0, max_concurrency=2)(TrainerRole).options(
        name="trainer", namespace=ns).remote(cfg)
    ray.get([role.setup.remote() for role in (explorer, trainer) if role is not None])
    return _Roles(sync, explorer, trainer)


class _Progress:
    """Prints one line per step record that appears in metrics.jsonl."""

    def __init__(self, paths: RunPaths, total_steps: int, stream=sys.stdout) -> None:
        self.paths = paths
        self.total_steps = total_steps
        self.offset = paths.metrics.stat().st_size if paths.metrics.is_file() else 0
        self.stream = stream
        self.records: list[dict[str, Any]] = []

    def poll(self) -> None:
        new, self.offset = read_metrics(self.paths.metrics, self.offset)
        for r in new:
            self.records.append(r)
            print(self.format(r), file=self.stream, flush=True)

    def format(self, r: dict[str, Any]) -> str:
        if r["role"] == "trainer":
            return (f"trainer  step {r['step']:>4}/{self.total_steps}  reward {r['train/reward_mean']:.3f}  "
                    f"staleness {r['train/staleness_mean']:.2f}  pg_loss {r['actor/pg_loss']:+.4f}  "
                    f"{r['time/train_step_s']:.2f}s")
        return (f"explorer step {r['step']:>4}       reward {r['rollout/reward_mean']:.3f}  "
                f"version {int(r['rollout/model_version'])}  {r['time/explore_step_s']:.2f}s")


def _run_sync(cfg: Config, roles: _Roles, progress: _Progress) -> None:
    import ray

    rows_per_step = cfg.explorer.batch_size * cfg.explorer.repeat_times
    explored = 0
    for k in range(cfg.trainer.total_steps):
        while explored * rows_per_step < (k + 1) * cfg.train_batch_size:
            ray.get(roles.explorer.step.remote())
            explored += 1
            progress.poll()
        ray.get(roles.trainer.step.remote())
        progress.poll()


def _run_async(roles: _Roles, progress: _Progress) -> None:
    """Both roles loop on their own (offline: the trainer alone) until they finish or one fails."""
    import ray

    pending = [role.run.remote() for role in (roles.trainer, roles.explorer) if role is not None]
    while pending:
        done, pending = ray.wait(pending, timeout=0.2)
        for ref in done:
            ray.get(ref)  # re-raises a role's failure here
        progress.poll()


def run(cfg: Config) -> dict[str, Any]:
    """Run a whole job: with ``warmup.sft_steps`` an SFT warm-up stage first (``trinity_like.warmup``)."""
    if cfg.warmup.sft_steps > 0:
        from trinity_like.warmup import run_with_warmup

        return run_with_warmup(cfg, _run_stage)
    return _run_stage(cfg)


def _run_stage(cfg: Config) -> dict[str, Any]:
    """Run one stage in ``cfg.mode`` on a local (or already joined) Ray instance; return the summary."""
    import ray

    set_offline_env()
    paths = prepare_run_dir(cfg)
    start = time.time()
    init_ray(cfg)
    progress = _Progress(paths, cfg.trainer.total_steps)
    print(f"run directory: {paths.run_dir}  mode: {cfg.mode}", flush=True)
    roles = None
    exit_reason = "completed"
    try:
        roles = _start_roles(cfg)
        if cfg.mode == "sync":
            _run_sync(cfg, roles, progress)
        else:
            _run_async(roles, progress)
    except KeyboardInterrupt:
        exit_reason = "interrupted"
        raise
    except BaseException as e:
        exit_reason = f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        raise
    finally:
        progress.poll()
        if roles is not None:
            actors = [a for a in (roles.explorer, roles.trainer) if a is not None]
            try:
                ray.get([a.shutdown.remote() for a in actors], timeout=60)
            except Exception as e:  # a role that died cannot shut down; killing it below is all there is
                print(f"warning: a role did not shut down cleanly: {type(e).__name__}", file=sys.stderr)
            for actor in (*actors, roles.synchronizer):
                ray.kill(actor)
            _kill_named(MONITOR_NAME, namespace_of(cfg))
        summary = _summary(cfg, progress.records, time.time() - start, exit_reason)
        atomic_write_json(paths.summary, summary)
    print("summary: " + json.dumps(summary), flush=True)
    return summary


def _kill_named(name: str, namespace: str) -> None:
    """Kill a detached helper actor of the run, if it exists."""
    import ray

    try:
        ray.kill(ray.get_actor(name, namespace=namespace))
    except ValueError:
        pass


def _summary(cfg: Config, records: list[dict[str, Any]], wall_s: float, exit_reason: str) -> dict[str, Any]:
    trainer = [r for r in records if r["role"] == "trainer"]
    explorer = [r for r in records if r["role"] == "explorer"]
    return {
        "mode": cfg.mode,
        "trainer_steps": len(trainer),
        "explorer_steps": len(explorer),
        "final_version": int(trainer[-1]["trainer/version"]) if trainer else 0,
        "reward_first": trainer[0]["train/reward_mean"] if trainer else None,
        "reward_last": trainer[-1]["train/reward_mean"] if trainer else None,
        "reward_mean_first_10": _mean(r["train/reward_mean"] for r in trainer[:10]),
        "reward_mean_last_10": _mean(r["train/reward_mean"] for r in trainer[-10:]),
        "staleness_max": max((r["train/staleness_max"] for r in trainer), default=None),
        "wall_time_s": round(wall_s, 2),
        "exit_reason": exit_reason,
    }


def _mean(values) -> float | None:
    values = list(values)
    return round(sum(values) / len(values), 4) if values else None
