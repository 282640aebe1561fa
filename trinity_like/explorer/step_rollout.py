"""Step rollout (``explorer.rollout: step``, and ``stream`` where it runs as step: ``runtime.schedule.rollout_mode``):
each step runs the workflow on ``batch_size`` tasks x ``repeat_times`` samples over the engine fleet, stamps the
policy version and writes one buffer segment.

Admission (AReaL's rule, on rows actually written: ``trinity_like.runtime.schedule``): an explorer step feeds
trainer step ``c = rows_written_before // train_batch_size``; it may start only once the published version is
>= ``c - max_staleness``, so no row it writes can be staler than the bound when trained. Weights are swapped only
at a step boundary, so one step's samples all come from one version.

Several explorers (in one job or in independent Ray jobs) share one run: each claims the next step of the
run's global step sequence from the Synchronizer, so step j's tasks, seeds and admission rule are the same
whichever explorer runs it, and the steps of an explorer that dies are redone by another.

With ``explorer.over_rollout_frac < 1`` a step returns once that fraction of its tasks is done; the others run on
(stragglers) and are written with a later step, or by ``drain`` when exploring ends.
"""

from __future__ import annotations

import asyncio
import math
import time

from trinity_like.common.experience import Experience
from trinity_like.common.tasks import Task
from trinity_like.explorer.fleet import WeightsLoadFailed
from trinity_like.explorer.rollout import Finished, RolloutParts


class StepAbandoned(Exception):
    """A step given up before it generated anything (a stop request came while it waited for weights)."""


class StepRollout:
    """Claims steps of the run's sequence and runs each whole: admission and weights, evaluation, the groups,
    one write, one metrics record (see the module docstring)."""

    def __init__(self, parts: RolloutParts) -> None:
        self.parts = parts
        self.progress = parts.progress
        self.stragglers: list[asyncio.Task] = []
        """Tasks of earlier steps still running (over-rollout); each yields (step, position, task, group)."""
        self.last_written: list[Experience] = []
        """The rows the last ``write`` wrote."""

    @property
    def in_flight(self) -> int | None:
        """Groups generating now: not counted by steps (the heartbeat reports None)."""
        return None

    async def run(self, num_steps: int | None = None) -> None:
        """Claim and run steps of the run's sequence until the rows written cover what the trainer needs (and
        no live trainer asks for more), the trainer finishes, or a stop request; then write the stragglers."""
        parts, sync = self.parts, self.parts.synchronizer
        while not self.progress.stop:
            if (await sync.ended.remote()).get("trainer") == "finished":
                break
            step = await sync.claim_explore_step.remote(parts.role_id, parts.schedule, num_steps)
            if step is None:
                if num_steps is None and await sync.alive.remote("trainer"):
                    await asyncio.sleep(1.0)  # covered for now; the trainer may still drop rows (stale,
                    continue                  # quarantined), which are then explored again
                break
            try:
                await self.step(step)
            except StepAbandoned:
                break  # the claim goes back to the run's sequence when this role ends as stopped
        await self.drain()

    async def step(self, step: int | None = None) -> dict[str, float]:
        """Run explorer step ``step`` (default: the next one of this explorer) and write its experiences."""
        parts = self.parts
        if step is None:
            step = self.progress.next_step
        # wall-clock phase starts (unix s) for the timeline of `trinity-like plot`; the record's `time` is the end
        timeline = {"timeline/start_unix_s": time.time()}
        sync_metrics = await self.admit_and_sync(step)
        timeline["timeline/eval_start_unix_s"] = time.time()
        eval_metrics = await parts.maybe_evaluate(step)
        timeline["timeline/rollout_start_unix_s"] = time.time()
        start = time.perf_counter()
        finished = await self.rollout(step, parts.tasks_for_step(step))
        metrics = await self.write(step, finished, start)
        await parts.synchronizer.finish_explore_step.remote(step, len(self.last_written))
        parts.count_empty(len(self.last_written))
        metrics.update({"rollout/admission_wait_s": sync_metrics["sync/wait_s"], **sync_metrics, **eval_metrics,
                        **timeline})
        parts.metrics.write(step + 1, metrics)
        return metrics

    # ------------------------------------------------------------ admission and weights
    async def admit_and_sync(self, step: int) -> dict[str, float]:
        """Wait until this step is within the staleness bound; load the newest weights when the schedule says
        so (or the bound needs them); return ``sync/*`` metrics. A version that fails to load (damaged file)
        is logged and retried; the previous version keeps serving while the bound allows."""
        parts, progress = self.parts, self.progress
        sync, fleet, schedule = parts.synchronizer, parts.fleet, parts.schedule
        sc = parts.cfg.synchronizer
        start = time.perf_counter()

        async def version_needed() -> int:  # earlier steps still running count their planned rows until written
            rows = await sync.rows_before.remote(step, schedule.rows_per_step)
            bound = await sync.staleness_bound.remote() if parts.auto_staleness else None
            return schedule.version_needed(rows, bound)

        need = await version_needed()
        if fleet.version < need:
            progress.state = "require_sync"
        info = None
        while info is None:  # in short waits, so that a stop request ends a long one
            if progress.stop:
                raise StepAbandoned(f"stop requested while step {step} waited for version {need}")
            if (await sync.ended.remote()).get("trainer") == "finished":
                raise StepAbandoned(f"the trainer finished while step {step} waited for version {need}")
            if time.perf_counter() - start > sc.timeout_s:
                raise TimeoutError(f"no policy version >= {need} was published within {sc.timeout_s:.0f}s: is the "
                                   "trainer running?")
            info = await sync.wait_for_version.remote(need, 1.0, False)
            if info is None:
                need = await version_needed()
        metrics = {"sync/wait_s": time.perf_counter() - start}
        if parts.auto_staleness:
            metrics["sync/staleness_bound"] = float(await sync.report_explore.remote(metrics["sync/wait_s"]))
        due = (parts.cfg.mode == "sync" or sc.style == "trainer_driven" or progress.steps_done == 0  # a (re)started
               or schedule.sync_due(step))                                                         # explorer
        load_start = time.perf_counter()
        while info.version > fleet.version and (due or fleet.version < need):
            try:
                metrics["sync/bytes"] = float(await fleet.update_weights(info))
                metrics["sync/seconds"] = time.perf_counter() - load_start
                metrics["sync/cuda_ipc"] = float(info.transport == "CUDA IPC")  # what bench/e2e_gpu.py checks
                await sync.heartbeat.remote(parts.role_id, version=info.version, state="running")
            except WeightsLoadFailed:
                progress.sync_failures += 1
                if fleet.version >= need:
                    break  # the version in use is still within the bound: go on, retry at the next boundary
                if time.perf_counter() - start > sc.timeout_s:
                    raise
                await asyncio.sleep(1.0)
                info = await sync.latest.remote()
        progress.state = "running"
        metrics.update({"sync/version": float(fleet.version), "sync/failures": float(progress.sync_failures),
                        "sync/fingerprint_mismatches": float(fleet.fingerprint_mismatches)})
        return metrics

    # ------------------------------------------------------------ the groups
    async def rollout(self, step: int, tasks: list[Task]) -> list[Finished]:
        """(step, position, task, group) of every task finished now: this step's, and stragglers of earlier
        steps. With ``over_rollout_frac < 1`` the step returns once that fraction of its tasks is done."""
        parts = self.parts
        ctxs = [parts.context(step, i) for i in range(len(tasks))]
        frac = parts.cfg.explorer.over_rollout_frac
        if frac >= 1.0 and not self.stragglers:
            results = await parts.run_workflows(tasks, ctxs)
            return [(step, i, t, g) for i, (t, g) in enumerate(zip(tasks, results, strict=True))]

        async def one(i: int) -> Finished:
            return step, i, tasks[i], await parts.run_task(tasks[i], ctxs[i])

        running = [asyncio.ensure_future(one(i)) for i in range(len(tasks))]
        need = math.ceil(frac * len(running))
        done: list = []
        pending = set(running)
        while len([d for d in done if d in running]) < need:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            done.extend(finished)
        late = [t for t in self.stragglers if t.done()]
        self.stragglers = [t for t in self.stragglers if not t.done()] + list(pending)
        return [t.result() for t in late + done]

    async def write(self, step: int, finished: list[Finished], start: float) -> dict[str, float]:
        """Group ids, the DAPO filter, one write; the step's metrics."""
        parts, fleet = self.parts, self.parts.fleet
        parts.check_rewards(step, finished)
        exps, failed, filtered = parts.stamp(finished)
        self.last_written = exps
        buffer_wait_s = await parts.write_rows(exps)
        elapsed = time.perf_counter() - start - buffer_wait_s
        self.progress.next_step = step + 1
        self.progress.steps_done += 1
        metrics = parts.step_metrics(exps, elapsed)
        metrics.update({"rollout/failed_tasks": float(failed), "rollout/filtered_groups": float(filtered),
                        "rollout/engine_busy_frac": parts.engine_busy_frac(),
                        "rollout/engine_restarts": float(fleet.restarts),
                        "rollout/stragglers": float(len(self.stragglers)),
                        "rollout/late_groups": float(sum(s != step for s, *_ in finished)),
                        "time/wait_buffer_s": buffer_wait_s})
        return metrics

    async def drain(self) -> dict[str, float] | None:
        """Write what the stragglers still produce (called when exploring ends)."""
        if not self.stragglers:
            return None
        results = await asyncio.gather(*self.stragglers)
        self.stragglers = []
        metrics = await self.write(self.progress.next_step, list(results), time.perf_counter())
        self.parts.metrics.write(self.progress.next_step, metrics)  # the step after the last one (write moved it)
        return metrics
