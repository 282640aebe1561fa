"""The explorer role: setup -> run -> shutdown. Each step runs the workflow on ``batch_size`` tasks x
``repeat_times`` samples over the engine fleet, stamps the policy version and writes one buffer segment.

Admission (AReaL's rule, on rows actually written: ``trinity_like.runtime.schedule``): an explorer step feeds
trainer step ``c = rows_written_before // train_batch_size``; it may start only once the published version is
>= ``c - max_staleness``, so no row it writes can be staler than the bound when trained. Weights are swapped only at a step boundary, so one step's
samples all come from one version.

Several explorers (in one job or in independent Ray jobs) share one run: each claims the next step of the
run's global step sequence from the Synchronizer, so step j's tasks, seeds and admission rule are the same
whichever explorer runs it, and the steps of an explorer that dies are redone by another.

A task whose workflow raises or times out (``explorer.task_timeout_s``) is retried up to
``explorer.max_retries`` times, then recorded as failed (``failed_tasks.jsonl`` in the run directory and
``rollout/failed_tasks``) and the step goes on with the others, unless every task of the step failed with one
same error: then the run stops with that error in one line (``_check_task_errors``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import random
import socket
import sys
import time
from functools import partial

import numpy as np

from trinity_like.algorithms.rewards import load_reward_manager
from trinity_like.buffer import BufferWriter
from trinity_like.buffer.partial import PartialStore
from trinity_like.common.errors import RunError
from trinity_like.common.experience import Experience
from trinity_like.common.offline import set_offline_env
from trinity_like.common.plugins import import_plugins
from trinity_like.common.tasks import Task, load_taskset
from trinity_like.config import Config
from trinity_like.explorer.evaluation import apply_prompt_limit, eval_setup, evaluate
from trinity_like.explorer.fleet import EngineLost, WeightsLoadFailed
from trinity_like.explorer.reward_model import start_reward_model
from trinity_like.explorer.stream import GroupStream
from trinity_like.explorer.tools import tool_metrics
from trinity_like.explorer.workflow_base import explorer_context, workflow_metrics
from trinity_like.explorer.workflows import WorkflowContext, workflow_for
from trinity_like.runtime.metrics import open_metrics_writer
from trinity_like.runtime.paths import RunPaths, namespace_of, read_run_id, redis_stream, redis_url
from trinity_like.runtime.run_dir import explorer_needs_run_dir, prepare_eval_tasksets
from trinity_like.runtime.run_home import RunFiles, join_run_home, written_explore_steps
from trinity_like.runtime.schedule import ExplorerStalled, Schedule
from trinity_like.synchronizer.synchronizer import Heartbeat

logger = logging.getLogger(__name__)


class StepAbandoned(Exception):
    """A step given up before it generated anything (a stop request came while it waited for weights)."""


class ExplorerRole:
    """Runs as an async Ray actor; the engines are actors of their own (``EngineFleet``)."""

    def __init__(self, cfg: Config) -> None:
        set_offline_env()
        self.cfg = cfg
        self.paths = RunPaths.of(cfg)
        self.explore_step_num = 0
        """The next step when ``step()`` is called without one (lock-step driving); ``run()`` claims steps."""
        self.steps_done = 0
        """Steps this explorer ran."""
        self.schedule = Schedule.of(cfg)
        self.empty_steps = 0
        """Steps in a row that wrote no rows; ``explorer.max_empty_steps`` of them stop the explorer."""
        self._stop = False
        """Set by ``request_stop``: ``run()`` ends after the step in progress."""
        self._task_errors: dict[int, list[str]] = {}
        """The error of every task that failed for good, by explorer step (``_check_task_errors``)."""
        self._ok_steps: set[int] = set()
        """Explorer steps with a task whose workflow succeeded."""
        self.files = RunFiles(self.paths)
        """Appends to run-directory files; ``setup`` makes it relay them when the run directory is the trainer's
        on another node."""

    async def setup(self) -> None:
        import ray

        from trinity_like.common.tokenizer import hf_tokenizer
        from trinity_like.explorer.fleet import EngineFleet
        from trinity_like.synchronizer import get_synchronizer

        sc = self.cfg.synchronizer
        shared = explorer_needs_run_dir(self.cfg)  # else the run comes from the trainer, through the Synchronizer
        local_id = read_run_id(self.paths)
        self.synchronizer = get_synchronizer(namespace_of(self.cfg), sc.heartbeat_timeout_s,
                                             run_id=local_id if shared else None, run_dir=str(self.paths.run_dir))
        self.role_id = f"explorer-{socket.gethostname()}-{os.getpid()}"
        await self.synchronizer.register.remote("explorer", self.role_id, {
            "engines": self.cfg.explorer.num_engines, "run_dir": str(self.paths.run_dir),
            "node": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id()})
        self.auto_staleness = sc.auto_staleness.enabled  # only in mode async (validation)
        if self.auto_staleness:
            await self.synchronizer.configure_staleness.remote(dataclasses.asdict(sc.auto_staleness))
        self.home = None if shared else await join_run_home(self.cfg, self.synchronizer, sc.timeout_s)
        # the trainer's run directory is this one (shared, or the same node): write there; else relay to it
        self.files = RunFiles(self.paths, self.synchronizer, relay=self.home is not None and self.home.run_id != local_id)
        written = await asyncio.to_thread(written_explore_steps, self.paths) if shared else {}
        # steps cut off mid-way by a crash (streaming rollout) are taken up again, whatever the buffer holds of them
        running = PartialStore(self.paths.buffer_dir).steps() if shared and self.cfg.buffer.transport == "file" else []
        await self.synchronizer.init_explore_steps.remote(written, running)  # off the filesystem: the trainer did
        self.explore_step_num = max(written) + 1 if written else 0  # lock-step driving resumes after them
        self._sync_state = "running"
        self.sync_failures = 0
        self.fleet = None
        # heartbeats from now on: starting the engines may take longer than the heartbeat timeout
        self.heartbeat = Heartbeat(self.synchronizer, self.role_id, lambda: {
            "version": self.fleet.version if self.fleet is not None else 0, "state": self._sync_state,
            "engines": self.fleet.engine_versions() if self.fleet is not None else None,
            "groups_in_flight": self.stream.in_flight if getattr(self, "stream", None) is not None else None}).start()
        self.tokenizer = hf_tokenizer(self.cfg.model.path)
        # the task sets before the engines start: a prompt over explorer.max_prompt_tokens stops the explorer
        # here, in one line, rather than failing its task at every step
        tasks = self.home.tasks if self.home else load_taskset(self.paths.taskset)
        eval_tasks = self.home.eval_tasks if self.home else prepare_eval_tasksets(self.cfg)
        self.tasks = apply_prompt_limit(self.cfg, self.tokenizer, tasks, "the training task set")
        self.eval_tasks = {name: apply_prompt_limit(self.cfg, self.tokenizer, ts, f"eval task set '{name}'")
                           for name, ts in eval_tasks.items()}
        self.fleet = EngineFleet(self.cfg)
        self.reward_model = start_reward_model(self.cfg)  # loads while the engines do
        await self.fleet.ready()
        if self.reward_model is not None:
            await self.reward_model.ready()
        import_plugins(self.cfg.explorer.plugin_dirs)  # users' workflows and reward functions register on import
        self.workflow = workflow_for(self.cfg)  # the task set's, or each row's (format.workflow_key)
        self.reward_manager = load_reward_manager(self.cfg, self.tokenizer)
        self.base_ctx = explorer_context(self.cfg, self.tokenizer, self.reward_manager, self.reward_model)
        self.writer = self.sender = None
        if self.cfg.buffer.transport == "redis":
            from trinity_like.buffer.redis_transport import RedisSender

            self.sender = RedisSender(redis_url(self.cfg), redis_stream(self.cfg), timeout_s=self.cfg.buffer.redis_timeout_s)
        else:
            self.writer = BufferWriter(self.paths.buffer_dir, writer_id="explorer", capacity=self.cfg.buffer.capacity)
        self.metrics = open_metrics_writer(self.cfg, self.paths, role="explorer",
                                           relay=partial(self.files.relay_only, "metrics.jsonl"))
        self._order: list[int] = []
        self._epoch = -1
        self._stragglers: list[asyncio.Task] = []
        """Tasks of earlier steps still running (over-rollout); each yields (step, position, task, group)."""
        self.streaming = (self.cfg.explorer.rollout == "stream" and self.cfg.mode == "async"
                          and self.cfg.synchronizer.max_staleness > 0)  # with auto: its max
        """``explorer.rollout: stream`` with a bound to stream within (``GroupStream``); at bound 0 the
        admissible window is one trainer batch, nothing overlaps, and the step path keeps async(0) == sync."""
        if self.cfg.explorer.rollout == "stream" and not self.streaming:
            logger.info("explorer.rollout=stream at staleness bound 0 (or mode %s) runs as rollout=step: there "
                        "is nothing to overlap", self.cfg.mode)
        self.stream = GroupStream(self) if self.streaming else None
        self._busy_mark = (time.perf_counter(), 0.0)

    # ------------------------------------------------------------ admission and weights
    async def _admit_and_sync(self, step: int) -> dict[str, float]:
        """Wait until this step is within the staleness bound; load the newest weights when the schedule says
        so (or the bound needs them); return ``sync/*`` metrics. A version that fails to load (damaged file)
        is logged and retried; the previous version keeps serving while the bound allows."""
        sc = self.cfg.synchronizer
        start = time.perf_counter()

        async def version_needed() -> int:  # earlier steps still running count their planned rows until written
            rows = await self.synchronizer.rows_before.remote(step, self.schedule.rows_per_step)
            bound = await self.synchronizer.staleness_bound.remote() if self.auto_staleness else None
            return self.schedule.version_needed(rows, bound)

        need = await version_needed()
        if self.fleet.version < need:
            self._sync_state = "require_sync"
        info = None
        while info is None:  # in short waits, so that a stop request ends a long one
            if self._stop:
                raise StepAbandoned(f"stop requested while step {step} waited for version {need}")
            if (await self.synchronizer.ended.remote()).get("trainer") == "finished":
                raise StepAbandoned(f"the trainer finished while step {step} waited for version {need}")
            if time.perf_counter() - start > sc.timeout_s:
                raise TimeoutError(f"no policy version >= {need} was published within {sc.timeout_s:.0f}s: is the "
                                   "trainer running?")
            info = await self.synchronizer.wait_for_version.remote(need, 1.0, False)
            if info is None:
                need = await version_needed()
        metrics = {"sync/wait_s": time.perf_counter() - start}
        if self.auto_staleness:
            metrics["sync/staleness_bound"] = float(await self.synchronizer.report_explore.remote(metrics["sync/wait_s"]))
        due = (self.cfg.mode == "sync" or sc.style == "trainer_driven" or self.steps_done == 0  # a (re)started explorer
               or self.schedule.sync_due(step))
        load_start = time.perf_counter()
        while info.version > self.fleet.version and (due or self.fleet.version < need):
            try:
                metrics["sync/bytes"] = float(await self.fleet.update_weights(info))
                metrics["sync/seconds"] = time.perf_counter() - load_start
                metrics["sync/cuda_ipc"] = float(info.transport == "CUDA IPC")  # what bench/e2e_gpu.py checks
                await self.synchronizer.heartbeat.remote(self.role_id, version=info.version, state="running")
            except WeightsLoadFailed:
                self.sync_failures += 1
                if self.fleet.version >= need:
                    break  # the version in use is still within the bound: go on, retry at the next boundary
                if time.perf_counter() - start > sc.timeout_s:
                    raise
                await asyncio.sleep(1.0)
                info = await self.synchronizer.latest.remote()
        self._sync_state = "running"
        metrics.update({"sync/version": float(self.fleet.version), "sync/failures": float(self.sync_failures),
                        "sync/fingerprint_mismatches": float(self.fleet.fingerprint_mismatches)})
        return metrics

    # ------------------------------------------------------------ tasks
    def _tasks_for_step(self, step: int) -> list[Task]:
        """Tasks in a seeded random order, reshuffled each pass over the task set."""
        n, bs = len(self.tasks), self.cfg.explorer.batch_size
        out = []
        for k in range(step * bs, (step + 1) * bs):
            epoch, pos = divmod(k, n)
            if epoch != self._epoch:
                self._order = list(range(n))
                random.Random(self.cfg.seed * 1_000_003 + epoch).shuffle(self._order)
                self._epoch = epoch
            out.append(self.tasks[self._order[pos]])
        return out

    def _context(self, step: int, position: int) -> WorkflowContext:
        repeat = self.cfg.explorer.repeat_times
        base = (self.cfg.seed * 1_000_003 + step) * 10_007 + position * repeat
        return dataclasses.replace(self.base_ctx, seeds=[base + j for j in range(repeat)], explore_step=step)

    async def _run_task(self, task: Task, ctx: WorkflowContext, engine=None) -> list[Experience] | None:
        """The workflow on one task (with ``engine``, default the fleet), with timeout and retries; None when it
        failed for good."""
        error = ""
        for attempt in range(self.cfg.explorer.max_retries + 1):
            if hasattr(engine, "new_attempt"):
                engine.new_attempt()
            try:
                group = await asyncio.wait_for(self.workflow.run(task, engine or self.fleet, ctx),
                                               self.cfg.explorer.task_timeout_s)
                self._ok_steps.add(ctx.explore_step)
                return group
            except EngineLost:  # no engine to retry on: the run stops now, not after max_empty_steps
                raise
            except Exception as e:  # a workflow is user code: any failure costs this task only
                error = f"{type(e).__name__}: {e}"
                logger.warning("task %s failed (attempt %d): %s", task.task_id, attempt + 1, error)
        self._task_errors.setdefault(ctx.explore_step, []).append(error)
        self.files.append("failed_tasks.jsonl", json.dumps(
            {"task_id": task.task_id, "explore_step": ctx.explore_step, "error": error,
             "attempts": self.cfg.explorer.max_retries + 1}))
        return None

    async def _run_workflows(self, tasks: list[Task], ctxs: list[WorkflowContext]) -> list[list[Experience] | None]:
        run_batch = getattr(self.workflow, "run_batch", None)
        if run_batch is not None:
            try:
                return await asyncio.wait_for(run_batch(tasks, self.fleet, ctxs), self.cfg.explorer.task_timeout_s)
            except EngineLost:
                raise
            except Exception as e:  # fall back to task by task, where failures are isolated
                logger.warning("batched rollout failed (%s: %s); running the tasks one by one", type(e).__name__, e)
        return list(await asyncio.gather(*(self._run_task(t, c) for t, c in zip(tasks, ctxs, strict=True))))

    # ------------------------------------------------------------ the step
    async def evaluate(self) -> dict[str, float]:
        """Every eval task set with the weights loaded now."""
        metrics: dict[str, float] = {}
        ctx = self._context(self.explore_step_num, 0)
        for ev in self.cfg.explorer.eval_tasksets:
            ev_ctx, workflow = eval_setup(self.cfg, ev, ctx, self.workflow)  # the set's own Trinity keys, if any
            metrics.update(await evaluate(self.fleet, ev_ctx, ev.name, self.eval_tasks[ev.name], ev,
                                          seed=self.cfg.seed, workflow=workflow))
        return metrics

    async def _rollout(self, step: int, tasks: list[Task]) -> list[tuple[int, int, Task, list[Experience] | None]]:
        """(step, position, task, group) of every task finished now: this step's, and stragglers of earlier
        steps. With ``over_rollout_frac < 1`` the step returns once that fraction of its tasks is done."""
        ctxs = [self._context(step, i) for i in range(len(tasks))]
        frac = self.cfg.explorer.over_rollout_frac
        if frac >= 1.0 and not self._stragglers:
            results = await self._run_workflows(tasks, ctxs)
            return [(step, i, t, g) for i, (t, g) in enumerate(zip(tasks, results, strict=True))]

        async def one(i: int) -> tuple[int, int, Task, list[Experience] | None]:
            return step, i, tasks[i], await self._run_task(tasks[i], ctxs[i])

        running = [asyncio.ensure_future(one(i)) for i in range(len(tasks))]
        need = math.ceil(frac * len(running))
        done: list = []
        pending = set(running)
        while len([d for d in done if d in running]) < need:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            done.extend(finished)
        late = [t for t in self._stragglers if t.done()]
        self._stragglers = [t for t in self._stragglers if not t.done()] + list(pending)
        return [t.result() for t in late + done]

    async def step(self, step: int | None = None) -> dict[str, float]:
        """Run explorer step ``step`` (default: the next one of this explorer) and write its experiences."""
        if step is None:
            step = self.explore_step_num
        # wall-clock phase starts (unix s) for the timeline of `trinity-like plot`; the record's `time` is the end
        timeline = {"timeline/start_unix_s": time.time()}
        sync_metrics = await self._admit_and_sync(step)
        interval = self.cfg.explorer.eval_interval
        timeline["timeline/eval_start_unix_s"] = time.time()
        eval_metrics = await self.evaluate() if interval and step % interval == 0 else {}
        timeline["timeline/rollout_start_unix_s"] = time.time()
        start = time.perf_counter()
        finished = await self._rollout(step, self._tasks_for_step(step))
        metrics = await self._write(step, finished, start)
        await self.synchronizer.finish_explore_step.remote(step, len(self._last_written))
        self._count_empty(len(self._last_written))
        metrics.update({"rollout/admission_wait_s": sync_metrics["sync/wait_s"], **sync_metrics, **eval_metrics,
                        **timeline})
        self.metrics.write(step + 1, metrics)
        return metrics

    def _check_rewards(self, step: int, finished) -> None:
        """Stop the run, before anything of this step is written, where the reward failed on more than
        ``reward.max_failure_frac`` of the step's samples (or on all of them): those rewards are not what the
        reward function computes. Fewer failures go on the console."""
        self._check_task_errors(finished)
        samples = [e for *_, group in finished for e in group or ()]  # a failed task has no group
        failed = sum(bool(e.info.get("reward_failed")) for e in samples)
        if not failed:
            return
        rc = self.cfg.reward
        reason = getattr(self.reward_manager, "last_error", None) or "see the explorer's log"
        where = f"reward.function_path {rc.function_path}:{rc.function_name}" if rc.function_path else \
            "the built-in scorer of each task's data source"
        share = failed / len(samples)
        if failed == len(samples) or share > rc.max_failure_frac:
            raise RunError(f"explorer step {step}: the reward failed on {failed} of {len(samples)} samples "
                           f"({reason}); {where} cannot score these tasks, and training on {rc.failure_value} "
                           f"instead would be training on nothing (reward.max_failure_frac: {rc.max_failure_frac})")
        print(f"warning: explorer step {step}: the reward failed on {failed} of {len(samples)} samples, trained "
              f"with {rc.failure_value} ({reason})", file=sys.stderr, flush=True)

    def _check_task_errors(self, finished) -> None:
        """Stop the run, in one line with the error, where every task of a step (``batch_size`` of them) failed
        for good with one same error: the workflow (or its reward) fails by construction, and going on would log
        step after step of reward 0 with the error only in failed_tasks.jsonl."""
        for step in sorted({s for s, *_ in finished}):
            errors = self._task_errors.get(step, [])
            if step not in self._ok_steps and len(errors) >= self.cfg.explorer.batch_size and len(set(errors)) == 1:
                raise RunError(f"explorer step {step}: the workflow failed on all {len(errors)} tasks (each tried "
                               f"{self.cfg.explorer.max_retries + 1} times) with the same error: {errors[0]}; fix "
                               "the workflow or its reward function (failed_tasks.jsonl in the run directory lists "
                               "the tasks)")
        for old in sorted(self._task_errors)[:-64]:  # bounded: only recent steps can still end
            del self._task_errors[old]
        if len(self._ok_steps) > 64:
            self._ok_steps = set(sorted(self._ok_steps)[-64:])

    async def _write(self, step: int, finished, start: float) -> dict[str, float]:
        """Group ids, the DAPO filter, one write; the step's metrics."""
        self._check_rewards(step, finished)
        exps, failed, filtered = self._stamp(finished)
        self._last_written = exps
        buffer_wait_s = await self._write_rows(exps)
        elapsed = time.perf_counter() - start - buffer_wait_s
        self.explore_step_num = step + 1
        self.steps_done += 1
        metrics = self._metrics(exps, elapsed)
        metrics.update({"rollout/failed_tasks": float(failed), "rollout/filtered_groups": float(filtered),
                        "rollout/engine_busy_frac": self.engine_busy_frac(),
                        "rollout/engine_restarts": float(self.fleet.restarts),
                        "rollout/stragglers": float(len(self._stragglers)),
                        "rollout/late_groups": float(sum(s != step for s, *_ in finished)),
                        "time/wait_buffer_s": buffer_wait_s})
        return metrics

    def engine_busy_frac(self) -> float:
        """The engines' busy share (``EngineFleet.busy_s``) of the wall time since the last call (since ``setup``
        for the first)."""
        now, busy = time.perf_counter(), self.fleet.busy_s()
        last_t, last_busy = self._busy_mark
        self._busy_mark = (now, busy)
        return (busy - last_busy) / max((now - last_t) * len(self.fleet.slots), 1e-9)

    def _stamp(self, finished) -> tuple[list[Experience], int, int]:
        """The rows of ``finished`` groups ((step, position, task, group or None)) with their group ids, less the
        groups DAPO's filter drops; and how many groups failed and were filtered."""
        exps: list[Experience] = []
        failed = filtered = 0
        for task_step, position, task, group in finished:
            if not group:
                failed += 1
                continue
            if self.cfg.explorer.dynamic_sampling and len(group) > 1 and len({e.reward for e in group}) == 1:
                filtered += 1  # DAPO: a group with one reward for all has no advantage signal
                continue
            for e in group:
                e.group_id = f"s{task_step}-{task.task_id}-{position}"
                e.task_id = task.task_id
                e.info["explore_step"] = task_step
                e.info["explore_position"] = position
            exps.extend(group)
        return exps, failed, filtered

    async def _write_rows(self, exps: list[Experience]) -> float:
        """One segment (or one Redis batch) of ``exps``; the seconds spent waiting for room in the buffer."""
        if not exps:
            return 0.0
        if self.sender is not None:
            await self.sender.send(exps)
            return 0.0
        buffer_wait_s = await asyncio.to_thread(self.writer.wait_for_room, self.cfg.synchronizer.timeout_s)
        await asyncio.to_thread(self.writer.write, exps)
        return buffer_wait_s

    async def drain(self) -> dict[str, float] | None:
        """Write what the stragglers still produce (called when exploring ends)."""
        if not self._stragglers:
            return None
        results = await asyncio.gather(*self._stragglers)
        self._stragglers = []
        metrics = await self._write(self.explore_step_num, list(results), time.perf_counter())
        self.metrics.write(self.explore_step_num, metrics)
        return metrics

    def _metrics(self, exps: list[Experience], elapsed: float) -> dict[str, float]:
        rewards = np.array([e.reward or 0.0 for e in exps], dtype=np.float64)
        lengths = np.array([len(e.response_ids) for e in exps], dtype=np.float64)
        n = max(len(exps), 1)
        return {
            "rollout/reward_mean": float(rewards.mean()) if exps else 0.0,
            "rollout/reward_std": float(rewards.std()) if exps else 0.0,
            "rollout/accuracy": float(np.mean([_correct(e) for e in exps])) if exps else 0.0,
            "rollout/response_length_mean": float(lengths.mean()) if exps else 0.0,
            "rollout/response_length_max": float(lengths.max()) if exps else 0.0,
            "rollout/truncated_frac": sum(e.truncated for e in exps) / n,
            "rollout/reward_failed": float(sum(bool(e.info.get("reward_failed")) for e in exps)),
            "rollout/model_version": float(self.fleet.version),
            "rollout/experiences": float(len(exps)),
            "rollout/tokens_per_s": float(lengths.sum()) / max(elapsed, 1e-9),
            "time/explore_step_s": elapsed,
            **tool_metrics(e.info for e in exps),  # rollout/tool_calls/<name>, rollout/tool_failures/<name>
            **workflow_metrics(e.info for e in exps),  # rollout/reward/<part>, rollout/workflow/<name>
        }

    async def run(self, num_steps: int | None = None) -> int:
        """Claim and run steps of the run's sequence until the rows written cover what the trainer needs (and
        no live trainer asks for more), the trainer finishes, or ``request_stop``; return the steps this
        explorer ran."""
        try:
            if self.streaming:
                await self.stream.run(num_steps)
            while not self.streaming and not self._stop:
                if (await self.synchronizer.ended.remote()).get("trainer") == "finished":
                    break
                step = await self.synchronizer.claim_explore_step.remote(self.role_id, self.schedule, num_steps)
                if step is None:
                    if num_steps is None and await self.synchronizer.alive.remote("trainer"):
                        await asyncio.sleep(1.0)  # covered for now; the trainer may still drop rows (stale,
                        continue                  # quarantined), which are then explored again
                    break
                try:
                    await self.step(step)
                except StepAbandoned:
                    break  # the claim goes back to the run's sequence when this role ends as stopped
            await self.drain()
        except BaseException as e:
            await self.synchronizer.mark_ended.remote("explorer", f"failed: {type(e).__name__}: {e}", self.role_id)
            raise
        await self.synchronizer.mark_ended.remote("explorer", "stopped" if self._stop else "finished", self.role_id)
        return self.steps_done

    def _count_empty(self, rows: int) -> None:
        """A step may write nothing (every group filtered, every task failed) and is made up by more steps;
        ``explorer.max_empty_steps`` such steps in a row mean it never will, and say so rather than loop."""
        self.empty_steps = 0 if rows else self.empty_steps + 1
        limit = self.cfg.explorer.max_empty_steps
        if limit and self.empty_steps >= limit:
            raise ExplorerStalled(
                f"the explorer wrote no experiences in {self.empty_steps} steps in a row (explorer.max_empty_steps); "
                "every group was filtered (explorer.dynamic_sampling drops groups whose rewards are all equal) or "
                "every task failed (see failed_tasks.jsonl in the run directory): check the reward function and "
                "the task set, or turn dynamic_sampling off")

    async def request_stop(self) -> None:
        """Finish the step in progress, write it, and end ``run()`` (SIGINT / SIGTERM of the job)."""
        self._stop = True

    async def role_info(self) -> dict:
        return {"role_id": self.role_id, "state": self._sync_state, "version": self.fleet.version,
                "next_step": self.explore_step_num}

    async def shutdown(self) -> None:
        if getattr(self, "heartbeat", None) is not None:
            self.heartbeat.stop()
        if getattr(self, "fleet", None) is not None:
            self.fleet.kill()
        if getattr(self, "reward_model", None) is not None:
            self.reward_model.stop()
        if getattr(self, "sender", None) is not None:
            await self.sender.close()
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()


def _correct(exp: Experience) -> bool:
    """An experience counts as correct for ``rollout/accuracy`` when its reward is 1.0, or, for a reward function
    that returns parts (Trinity's ``{"accuracy": 1.0, "format_score": 0.1}``), when its ``accuracy`` part is."""
    parts = exp.info.get("reward_parts")
    if isinstance(parts, dict) and "accuracy" in parts:
        return parts["accuracy"] == 1.0
    return exp.reward == 1.0

