"""Modes and roles: prepare the run directory, start Ray and the parts, drive or wait, shut down cleanly.

Modes (``mode`` in the config):
- ``sync``: lock-step. Explorer steps run until the buffer holds trainer step k's batch, then trainer step k;
  with ``synchronizer.interval: 1`` explorer step k uses version k (strict on-policy).
- ``async``: explorer and trainer loop concurrently in their own actors; the explorer's admission rule keeps
  every trained row within ``synchronizer.max_staleness`` versions.
- ``offline``: no explorer; the trainer replays ``buffer.replay_sources`` for ``trainer.total_steps`` steps.

Roles (``--role``): ``all`` runs every part in this job; ``trainer`` and ``explorer`` run one part each, so that
they can be independent Ray jobs (``ray job submit -- trinity-like run CFG --role trainer``) that start in
either order, meet through the run directory and the named actors of the namespace ``<project>/<name>``, and
restart on their own. Several explorer jobs may join one trainer. With separate roles ``sync`` runs as the
same lock-step schedule enforced by the explorer's admission rule (each explorer step waits for the version it
must use).

A job's SIGINT / SIGTERM asks its roles to stop after the step in progress: the trainer commits the ledger and
writes a checkpoint, explorers write what they generated; the job then exits with status 0 and
``exit_reason: stopped``. A second signal abandons the step.

While the roles work, the launcher tails ``metrics.jsonl`` and shows progress (``progress.py``: a live bar on a
terminal, one line per step otherwise); a role that waits for the other role while none is running says so
once.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from trinity_like.common.errors import RunError
from trinity_like.common.fs import atomic_write_json
from trinity_like.common.offline import set_offline_env
from trinity_like.common.placement import actor_options, check_placeable
from trinity_like.config import Config
from trinity_like.progress import RunProgress
from trinity_like.runtime.paths import RunPaths, namespace_of
from trinity_like.runtime.ray_cluster import check_ray_address, init_ray, role_status
from trinity_like.runtime.run_dir import explorer_needs_run_dir, prepare_run_dir
from trinity_like.runtime.schedule import Schedule
from trinity_like.weights.messages import MONITOR_NAME

TRAINER_NAME = "trainer"
"""The trainer role's actor name in the run's namespace (one trainer per run)."""


@dataclass
class _Roles:
    synchronizer: Any
    explorer: Any = None
    trainer: Any = None
    infos: dict[str, dict] = field(default_factory=dict)
    """role kind -> the role's ``role_info()`` as it joined (role id, version, device)."""

    @property
    def ids(self) -> dict[str, str]:
        """role kind -> role id registered with the Synchronizer."""
        return {kind: info["role_id"] for kind, info in self.infos.items()}

    @property
    def actors(self) -> list[Any]:
        return [a for a in (self.trainer, self.explorer) if a is not None]


def _check_gpus(wanted: float, what: str) -> None:
    """Refuse at once what the Ray cluster cannot place (an actor asking for more GPUs than exist would wait
    forever)."""
    import ray

    have = ray.cluster_resources().get("GPU", 0.0)
    if wanted > have:
        raise RunError(f"{what} asks Ray for {wanted:g} GPUs but the cluster has {have:g}; lower them (0 runs on "
                       "the CPU), or start Ray where the GPUs are (`ray start --num-gpus N` if Ray does not see them)")


def setup_order(cfg: Config, explores: bool, trains: bool) -> list[tuple[str, ...]]:
    """Which roles set up together, in order. Where engines and the trainer share GPUs (both ask for GPUs and
    one of them for a fraction), the explorer's engines come first: vLLM sizes its KV cache from the device's free
    memory in a profile run, and anything the trainer allocated meanwhile would count against it (vLLM's own
    colocation example asks for exclusive use while it starts). That order needs an explorer that reads the run
    directory (else it waits for the trainer to publish the run); otherwise ``explorer.vllm.kv_cache_memory_gb``
    gives the engines a fixed cache that does not depend on what the trainer holds."""
    kinds = tuple(k for k, wanted in (("explorer", explores), ("trainer", trains)) if wanted)
    tr, ex = cfg.trainer, cfg.explorer
    shared_gpus = tr.gpus_per_worker > 0 and ex.gpus_per_engine > 0 and min(tr.gpus_per_worker, ex.gpus_per_engine) < 1
    if len(kinds) == 2 and shared_gpus and explorer_needs_run_dir(cfg):
        return [("explorer",), ("trainer",)]
    return [kinds] if kinds else []


def start_up_checks(cfg: Config, role: str, total_bytes: float | None = None) -> list[str]:
    """Before anything starts: refuse (ConfigError) engines that would set up beside a trainer allocating on their
    GPU without a fixed KV cache (``config.validation.kv_cache_start_up``: which start-ups ``setup_order`` orders
    depends on the roles of this job), and return the warning lines to print: that rule's for ordered start-ups,
    and the GPU memory plan's when parts that share a GPU plan more than 90% of it (``runtime.gpu_memory``;
    ``total_bytes`` is one GPU's memory, by default as ``nvidia-smi`` reports it here; no GPU here, no plan)."""
    from trinity_like.config.validation import kv_cache_start_up

    explores, trains = role in ("all", "explorer") and cfg.mode != "offline", role in ("all", "trainer")
    lines = []
    if explores:
        from trinity_like.explorer.engines.external import refuse_outside_bench
        from trinity_like.explorer.workflows import check_workflow_config

        refuse_outside_bench(cfg, "run")  # explorer.engine external: bench only
        check_workflow_config(cfg)  # names resolve, shapes fit: one line
        unordered = None
        if not trains:
            unordered = "this explorer job (--role explorer) sets its engines up whenever it starts, beside a trainer job"
        elif setup_order(cfg, explores, trains) != [("explorer",), ("trainer",)]:
            unordered = (f"with buffer.transport {cfg.buffer.transport} and synchronizer.method "
                         f"{cfg.synchronizer.method} the explorer takes the run from the trainer, so both set up at once")
        lines.append(kv_cache_start_up(cfg, unordered))
    lines.append(gpu_memory_warning(cfg, gpu_total_bytes() if total_bytes is None else total_bytes))
    return [line for line in lines if line]


def gpu_memory_warning(cfg: Config, total_bytes: float | None) -> str | None:
    """The memory plan's warning line for ``cfg`` on GPUs of ``total_bytes`` (None: no GPU, or no model config
    to plan from yet)."""
    from pathlib import Path

    from trinity_like.runtime.gpu_memory import gpu_memory_plan

    config = Path(cfg.model.path) / "config.json"
    if not total_bytes or not config.is_file():
        return None
    try:
        model_config = json.loads(config.read_text())
        return gpu_memory_plan(cfg, model_config, total_bytes).warning()
    except (ValueError, KeyError, TypeError):  # not a decoder config the plan knows: no plan, nothing to warn
        return None


def gpu_total_bytes() -> float | None:
    """Memory of this node's first GPU as ``nvidia-smi`` reports it (no CUDA is initialised here); None without
    one."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=20, check=True).stdout.split()
        return float(out[0]) * 2**20 if out else None  # MiB
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def _start_roles(cfg: Config, role: str, resume: bool) -> _Roles:
    import ray

    from trinity_like.explorer.role import ExplorerRole
    from trinity_like.runtime.paths import read_run_id
    from trinity_like.synchronizer import get_synchronizer
    from trinity_like.trainer.role import TrainerRole

    ns = namespace_of(cfg)
    if role == "explorer" and cfg.mode == "offline":
        raise RunError("mode 'offline' has no explorer; run the trainer (--role trainer or all)")
    if role in ("all", "trainer") and _actor_exists(TRAINER_NAME, ns):
        raise RunError(f"a trainer is already running in namespace '{ns}'; a run has one trainer")
    tr, ex = cfg.trainer, cfg.explorer
    explores = role in ("all", "explorer") and cfg.mode != "offline"
    trains = role in ("all", "trainer")
    for what, node, wanted in (("synchronizer.node", cfg.synchronizer.node, True),
                               ("explorer.node", ex.node, explores), ("trainer.node", tr.node, trains)):
        if wanted:
            check_placeable(node, what)
    paths = RunPaths.of(cfg)
    # an explorer that needs no run directory takes the run's id from the trainer (runtime.run_home)
    run_id = read_run_id(paths) if role != "explorer" or explorer_needs_run_dir(cfg) else None
    roles = _Roles(get_synchronizer(ns, cfg.synchronizer.heartbeat_timeout_s, run_id=run_id,
                                    options=actor_options(cfg.synchronizer.node), run_dir=str(paths.run_dir)))
    gpus = {"trainer.gpus_per_worker x trainer.num_workers": tr.gpus_per_worker * tr.num_workers if trains else 0.0,
            "explorer.gpus_per_engine x explorer.num_engines": ex.gpus_per_engine * ex.num_engines if explores else 0.0}
    asked = {what: n for what, n in gpus.items() if n}
    if asked:
        _check_gpus(sum(asked.values()), " + ".join(asked))
    if explores:
        roles.explorer = ray.remote(num_cpus=0, max_concurrency=4)(ExplorerRole).options(
            name=f"explorer-{uuid.uuid4().hex[:8]}", namespace=ns, **actor_options(ex.node)).remote(cfg)
    if trains:
        # one worker: the role trains in its own process and holds the GPU; more: each TrainWorker holds one
        gpus = tr.gpus_per_worker if tr.num_workers == 1 else 0
        roles.trainer = ray.remote(num_cpus=0, num_gpus=gpus, max_concurrency=2)(TrainerRole).options(
            name=TRAINER_NAME, namespace=ns, **actor_options(tr.node)).remote(cfg, resume)
    for kinds in setup_order(cfg, explores, trains):
        ray.get([getattr(roles, kind).setup.remote() for kind in kinds])
    for kind, actor in (("explorer", roles.explorer), ("trainer", roles.trainer)):
        if actor is not None:
            info = roles.infos[kind] = ray.get(actor.role_info.remote())
            where = f" (trains on {info['device']})" if kind == "trainer" else ""
            print(f"{kind} {info['role_id']} joined namespace '{ns}'{where}", flush=True)
    return roles


class _WaitNotes:
    """Says once, each time it starts, that a role of this job waits for the other kind while none runs. A
    wait seen on two polls in a row counts: at a run's end the trainer reads the last rows a moment after the
    explorers have ended, which is no wait worth a note."""

    OTHER = {"explorer": "trainer", "trainer": "explorer"}
    WAITING = {"explorer": "require_sync", "trainer": "waiting_data"}
    POLL_S = 1.0

    def __init__(self, cfg: Config, roles: _Roles) -> None:
        self.cfg, self.roles = cfg, roles
        self.noted: set[str] = set()
        self.seen: set[str] = set()
        """Roles seen waiting at the previous poll."""
        self.last = 0.0

    def poll(self) -> None:
        import ray

        if time.monotonic() - self.last < self.POLL_S or len(self.roles.ids) != 1:
            return  # with both roles in this job, neither waits for an absent one
        self.last = time.monotonic()
        try:
            status = ray.get(self.roles.synchronizer.status.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - a note is best effort; the roles report real failures
            return
        for kind, rid in self.roles.ids.items():
            other = self.OTHER[kind]
            waiting = status["roles"].get(rid, {}).get("state") == self.WAITING[kind]
            alive = {r["kind"] for r in status["roles"].values() if r["state"] not in ("stopped", "dead")}
            if waiting and other not in alive and kind not in self.seen:
                self.seen.add(kind)
            elif waiting and other not in alive and kind not in self.noted:
                self.noted.add(kind)
                ns, limit = namespace_of(self.cfg), f"giving up after {self.cfg.synchronizer.timeout_s:.0f}s"
                if kind == "trainer" and "server" in alive:  # agent rows come when the agent commits them
                    print(f"trainer: waiting for experiences: no explorer is running in namespace '{ns}'; a "
                          f"server records agent conversations, which arrive as the agent commits them "
                          f"(POST /v1/commit); {limit}", flush=True)
                    continue
                what = "new weights" if kind == "explorer" else "experiences"
                shows = role_status(RunPaths.of(self.cfg).run_dir, other, ray.get_runtime_context().gcs_address)
                print(f"{kind}: waiting for {what}: no {other} is running in namespace '{ns}'; the run directory "
                      f"shows {shows}; start one (--role {other}); {limit}", flush=True)
            elif not waiting:
                self.noted.discard(kind)
                self.seen.discard(kind)


class _StopSignals:
    """SIGINT / SIGTERM set ``requested`` (the roles then stop after their step); a second one raises
    KeyboardInterrupt. Handlers are installed only in the main thread and restored on exit."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        print(f"{self.requested}: stopping after the step in progress (checkpoint and commit); signal again "
              "to abandon it", flush=True)

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _run_sync(cfg: Config, roles: _Roles, progress: RunProgress, stop: _StopSignals) -> None:
    """Lock-step: before each trainer step, explorer steps until the buffer holds that step's batch. Driven
    by the rows actually written, so steps that write fewer rows than planned (dynamic sampling, failed
    tasks) are made up by more steps instead of leaving the trainer waiting."""
    import ray

    for _ in range(roles.infos["trainer"]["version"], cfg.trainer.total_steps):
        while not stop.requested and not ray.get(roles.trainer.batch_ready.remote()):
            ray.get(roles.explorer.step.remote())  # ExplorerStalled after explorer.max_empty_steps empty steps
            progress.poll()
        if stop.requested:
            break
        ray.get(roles.trainer.step.remote())
        progress.poll()
    if stop.requested:
        ray.get(roles.trainer.request_stop.remote())
        ray.get(roles.trainer.run.remote())  # ends at once: saves the step reached and marks itself stopped


def _run_loops(roles: _Roles, progress: RunProgress, stop: _StopSignals, notes: _WaitNotes) -> None:
    """Each role of this job loops on its own until it finishes, fails, or is asked to stop."""
    import ray

    pending = [role.run.remote() for role in roles.actors]
    asked = False
    while pending:
        done, pending = ray.wait(pending, timeout=0.2)
        for ref in done:
            ray.get(ref)  # re-raises a role's failure here
        if stop.requested and not asked:
            ray.get([a.request_stop.remote() for a in roles.actors])
            asked = True
        progress.poll()
        notes.poll()


def run(cfg: Config, role: str = "all", resume: bool = False, address: str | None = None) -> dict[str, Any]:
    """Run ``role`` of the job in ``cfg.mode`` on a local Ray instance or the cluster at ``address``; return
    the summary (also written to ``summary.json`` by a job that runs the trainer). With ``warmup.sft_steps``
    an SFT warm-up stage comes first (``trinity_like.warmup``; role ``all`` only)."""
    if cfg.warmup.sft_steps > 0:
        if role != "all":
            raise RunError("warmup.sft_steps runs with --role all; for independent jobs run the warm-up as its own "
                           "offline run first and point model.path at its checkpoint (or set warmup.sft_steps=0)")
        from trinity_like.warmup import run_with_warmup

        return run_with_warmup(cfg, lambda stage, resume_stage=False: _run_stage(stage, "all", resume_stage, address),
                               resume=resume)
    return _run_stage(cfg, role, resume, address)


def _run_stage(cfg: Config, role: str, resume: bool, address: str | None) -> dict[str, Any]:
    """One stage: ``role`` of the job in ``cfg.mode``."""
    set_offline_env()
    check_ray_address(address or os.environ.get("RAY_ADDRESS"))  # before anything slow or written
    for line in start_up_checks(cfg, role):
        print(line, file=sys.stderr, flush=True)
    paths = prepare_run_dir(cfg, role=role, resume=resume)
    start = time.time()
    record = init_ray(cfg, address, role=role)  # refused when the run's live roles are in another Ray cluster
    kinds = ("trainer", "explorer") if role == "all" else (role,)
    totals = {"trainer": cfg.trainer.total_steps, "explorer": Schedule.of(cfg).planned_explore_steps}
    progress = RunProgress(paths.metrics, totals, kinds)
    print(f"run directory: {paths.run_dir}  mode: {cfg.mode}  role: {role}  namespace: {namespace_of(cfg)}",
          flush=True)
    roles = None
    exit_reason = "completed"
    trainer_info: dict[str, Any] = {}
    with _StopSignals() as stop:
        try:
            roles = _start_roles(cfg, role, resume)
            trainer_info = roles.infos.get("trainer", {})
            if cfg.mode == "sync" and role == "all":
                _run_sync(cfg, roles, progress, stop)
            else:
                _run_loops(roles, progress, stop, _WaitNotes(cfg, roles))
            if stop.requested:
                exit_reason = "stopped"
        except KeyboardInterrupt:
            exit_reason = "interrupted"
            raise
        except BaseException as e:
            exit_reason = f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            raise
        finally:
            progress.poll()
            progress.close()
            if roles is not None:
                _shutdown(cfg, roles, role)
            record.close(exit_reason)
            summary = _summary(cfg, role, progress.records, time.time() - start, exit_reason, trainer_info)
            if role != "explorer":
                atomic_write_json(paths.summary, summary)
    print("summary: " + json.dumps(summary), flush=True)
    return summary


def _shutdown(cfg: Config, roles: _Roles, role: str) -> None:
    """Stop this job's roles. A job that runs every role also ends the run's detached helpers; a job of one
    role leaves them to the others (the Synchronizer exits on its own once no role is left)."""
    import ray

    try:
        ray.get([a.shutdown.remote() for a in roles.actors], timeout=60)
    except Exception as e:  # a role that died cannot shut down; killing it below is all there is
        cause = getattr(e, "cause", None) or e  # a Ray error wraps the role's own exception
        first = str(cause).strip().splitlines()[0][:200] if str(cause).strip() else ""
        print(f"warning: a role did not shut down cleanly: {type(cause).__name__}{': ' + first if first else ''}",
              file=sys.stderr)
    for actor in roles.actors:
        ray.kill(actor)
    if role == "all":
        ray.kill(roles.synchronizer)
        _kill_named(MONITOR_NAME, namespace_of(cfg))


def _actor_exists(name: str, namespace: str) -> bool:
    import ray

    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return True


def _kill_named(name: str, namespace: str) -> None:
    """Kill a detached helper actor of the run, if it exists."""
    import ray

    try:
        ray.kill(ray.get_actor(name, namespace=namespace))
    except ValueError:
        pass


def _summary(cfg: Config, role: str, records: list[dict[str, Any]], wall_s: float, exit_reason: str,
             trainer_info: dict[str, Any]) -> dict[str, Any]:
    """The run's outcome; ``trainer_info`` is the trainer role's ``role_info`` (empty in an explorer job)."""
    trainer = [r for r in records if r["role"] == "trainer"]
    explorer = [r for r in records if r["role"] == "explorer"]
    resumed_from = trainer_info.get("resumed_from")
    return {
        "mode": cfg.mode,
        "role": role,
        "resumed_from": resumed_from,
        "trainer_steps": len(trainer),
        "explorer_steps": len(explorer),
        "final_version": int(trainer[-1]["trainer/version"]) if trainer else (resumed_from or 0),
        "reward_first": trainer[0]["train/reward_mean"] if trainer else None,
        "reward_last": trainer[-1]["train/reward_mean"] if trainer else None,
        "reward_mean_first_10": _mean(r["train/reward_mean"] for r in trainer[:10]),
        "reward_mean_last_10": _mean(r["train/reward_mean"] for r in trainer[-10:]),
        "staleness_max": max((r["train/staleness_max"] for r in trainer), default=None),
        "wall_time_s": round(wall_s, 2),
        "exit_reason": exit_reason,
        "trainer_device": trainer_info.get("device"),
        "trainer_gpus": trainer_info.get("gpus"),
    }


def _mean(values) -> float | None:
    values = list(values)
    return round(sum(values) / len(values), 4) if values else None
