"""What both rollout drivers (``StepRollout``, ``StreamRollout``) do to tasks, groups and rows, stated once.

``ExplorerRole.setup`` builds one ``RolloutParts`` (the fleet, the workflow, the buffer's writer, the metrics
writer, the Synchronizer) and hands it to the driver it picks (``runtime.schedule.rollout_mode``); the driver runs
steps with these functions and writes ``Progress``, which the role reads for ``role_info`` and its heartbeat:

- ``tasks_for_step``: a step's tasks, in a seeded order reshuffled each pass over the task set;
- ``context``: the workflow context of group ``position`` of a step (its seeds), the same whichever driver runs it;
- ``run_task``: the workflow on one task with ``explorer.task_timeout_s`` and ``explorer.max_retries``; a task that
  fails for good is recorded in ``failed_tasks.jsonl`` and yields no group;
- ``stamp``: group ids and explorer step on the rows of ended groups, less the groups DAPO's filter drops;
- ``check_rewards``: the run stops, before anything of a step is written, where the reward failed on too many of
  its samples, or every task of the step failed with one same error;
- ``write_rows``: one buffer segment (or one Redis batch);
- ``step_metrics``: a step record's ``rollout/*`` statistics; ``count_empty``: ``explorer.max_empty_steps``.

A task whose workflow raises or times out (``explorer.task_timeout_s``) is retried up to ``explorer.max_retries``
times, then recorded as failed (``failed_tasks.jsonl`` in the run directory and ``rollout/failed_tasks``) and the
step goes on with the others, unless every task of the step failed with one same error: then the run stops with
that error in one line (``check_task_errors``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trinity_like.common.errors import RunError
from trinity_like.common.experience import Experience
from trinity_like.common.tasks import Task
from trinity_like.config import Config
from trinity_like.explorer.evaluation import eval_setup, evaluate
from trinity_like.explorer.fleet import EngineLost
from trinity_like.explorer.tools import tool_metrics
from trinity_like.explorer.workflow_base import workflow_metrics
from trinity_like.explorer.workflows import WorkflowContext
from trinity_like.runtime.run_home import RunFiles
from trinity_like.runtime.schedule import ExplorerStalled, Schedule

logger = logging.getLogger(__name__)

Finished = tuple[int, int, Task, "list[Experience] | None"]
"""A group that ended: (explorer step, position in the step, task, its rows or None when the task failed)."""


@dataclass
class Progress:
    """Where the explorer stands: the driver writes it, the role reads it (``role_info``, the heartbeat) and
    ``request_stop`` sets ``stop``. One asyncio loop (the role's actor) touches it, so it needs no lock."""

    next_step: int = 0
    """The next step when ``ExplorerRole.step()`` is called without one (lock-step driving); ``run()`` claims
    steps instead."""
    steps_done: int = 0
    """Steps this explorer ran."""
    state: str = "running"
    """``running``, or ``require_sync`` while the next group or step waits for a version (the heartbeat's state)."""
    stop: bool = False
    """Set by ``request_stop``: the driver admits no more work and ends after what runs."""
    sync_failures: int = 0
    """Versions that failed to load (``WeightsLoadFailed``), since the explorer started."""


class RolloutParts:
    """The parts a rollout driver runs steps with, and the state the step functions keep between steps (the
    task order, the task errors by step, the count of empty steps, the engines' busy mark)."""

    def __init__(self, cfg: Config, *, files: RunFiles, workflow=None, fleet=None, tasks: Sequence[Task] = (),
                 eval_tasks: dict[str, Any] | None = None, base_ctx: WorkflowContext | None = None,
                 reward_manager=None, writer=None, sender=None, metrics=None, synchronizer=None,
                 role_id: str = "", progress: Progress | None = None) -> None:
        self.cfg, self.files, self.workflow, self.fleet = cfg, files, workflow, fleet
        self.paths = files.paths
        self.tasks, self.eval_tasks = list(tasks), eval_tasks or {}
        self.base_ctx, self.reward_manager = base_ctx, reward_manager
        self.writer, self.sender = writer, sender
        """The buffer's writer (file transport) or the Redis sender: one of them."""
        self.metrics, self.synchronizer, self.role_id = metrics, synchronizer, role_id
        self.schedule = Schedule.of(cfg)
        self.auto_staleness = cfg.synchronizer.auto_staleness.enabled
        self.progress = progress or Progress()
        self.empty_steps = 0
        """Steps in a row that wrote no rows; ``explorer.max_empty_steps`` of them stop the explorer."""
        self.task_errors: dict[int, list[str]] = {}
        """The error of every task that failed for good, by explorer step (``check_task_errors``)."""
        self.ok_steps: set[int] = set()
        """Explorer steps with a task whose workflow succeeded."""
        self._order: list[int] = []
        self._epoch = -1
        self._busy_mark = (time.perf_counter(), 0.0)

    # ------------------------------------------------------------ tasks
    def tasks_for_step(self, step: int) -> list[Task]:
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

    def context(self, step: int, position: int) -> WorkflowContext:
        """The workflow context of group ``position`` of explorer step ``step``: its ``repeat_times`` seeds."""
        repeat = self.cfg.explorer.repeat_times
        base = (self.cfg.seed * 1_000_003 + step) * 10_007 + position * repeat
        return dataclasses.replace(self.base_ctx, seeds=[base + j for j in range(repeat)], explore_step=step)

    async def run_task(self, task: Task, ctx: WorkflowContext, engine=None) -> list[Experience] | None:
        """The workflow on one task (with ``engine``, default the fleet), with timeout and retries; None when it
        failed for good."""
        error = ""
        for attempt in range(self.cfg.explorer.max_retries + 1):
            if hasattr(engine, "new_attempt"):
                engine.new_attempt()
            try:
                group = await asyncio.wait_for(self.workflow.run(task, engine or self.fleet, ctx),
                                               self.cfg.explorer.task_timeout_s)
                self.ok_steps.add(ctx.explore_step)
                return group
            except EngineLost:  # no engine to retry on: the run stops now, not after max_empty_steps
                raise
            except Exception as e:  # a workflow is user code: any failure costs this task only
                error = f"{type(e).__name__}: {e}"
                logger.warning("task %s failed (attempt %d): %s", task.task_id, attempt + 1, error)
        self.task_errors.setdefault(ctx.explore_step, []).append(error)
        self.files.append("failed_tasks.jsonl", json.dumps(
            {"task_id": task.task_id, "explore_step": ctx.explore_step, "error": error,
             "attempts": self.cfg.explorer.max_retries + 1}))
        return None

    async def run_workflows(self, tasks: list[Task], ctxs: list[WorkflowContext]) -> list[list[Experience] | None]:
        """Every task of a step: through the workflow's ``run_batch`` where it has one, else task by task."""
        run_batch = getattr(self.workflow, "run_batch", None)
        if run_batch is not None:
            try:
                return await asyncio.wait_for(run_batch(tasks, self.fleet, ctxs), self.cfg.explorer.task_timeout_s)
            except EngineLost:
                raise
            except Exception as e:  # fall back to task by task, where failures are isolated
                logger.warning("batched rollout failed (%s: %s); running the tasks one by one", type(e).__name__, e)
        return list(await asyncio.gather(*(self.run_task(t, c) for t, c in zip(tasks, ctxs, strict=True))))

    async def evaluate(self) -> dict[str, float]:
        """Every eval task set with the weights loaded now."""
        metrics: dict[str, float] = {}
        ctx = self.context(self.progress.next_step, 0)
        for ev in self.cfg.explorer.eval_tasksets:
            ev_ctx, workflow = eval_setup(self.cfg, ev, ctx, self.workflow)  # the set's own Trinity keys, if any
            metrics.update(await evaluate(self.fleet, ev_ctx, ev.name, self.eval_tasks[ev.name], ev,
                                          seed=self.cfg.seed, workflow=workflow))
        return metrics

    async def maybe_evaluate(self, step: int) -> dict[str, float]:
        """``evaluate`` on the steps of ``explorer.eval_interval``, else nothing."""
        interval = self.cfg.explorer.eval_interval
        return await self.evaluate() if interval and step % interval == 0 else {}

    # ------------------------------------------------------------ checks
    def check_rewards(self, step: int, finished: list[Finished]) -> None:
        """Stop the run, before anything of this step is written, where the reward failed on more than
        ``reward.max_failure_frac`` of the step's samples (or on all of them): those rewards are not what the
        reward function computes. Fewer failures go on the console."""
        self.check_task_errors(finished)
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

    def check_task_errors(self, finished: list[Finished]) -> None:
        """Stop the run, in one line with the error, where every task of a step (``batch_size`` of them) failed
        for good with one same error: the workflow (or its reward) fails by construction, and going on would log
        step after step of reward 0 with the error only in failed_tasks.jsonl."""
        for step in sorted({s for s, *_ in finished}):
            errors = self.task_errors.get(step, [])
            if step not in self.ok_steps and len(errors) >= self.cfg.explorer.batch_size and len(set(errors)) == 1:
                raise RunError(f"explorer step {step}: the workflow failed on all {len(errors)} tasks (each tried "
                               f"{self.cfg.explorer.max_retries + 1} times) with the same error: {errors[0]}; fix "
                               "the workflow or its reward function (failed_tasks.jsonl in the run directory lists "
                               "the tasks)")
        for old in sorted(self.task_errors)[:-64]:  # bounded: only recent steps can still end
            del self.task_errors[old]
        if len(self.ok_steps) > 64:
            self.ok_steps = set(sorted(self.ok_steps)[-64:])

    def count_empty(self, rows: int) -> None:
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

    # ------------------------------------------------------------ writing
    def stamp(self, finished: list[Finished]) -> tuple[list[Experience], int, int]:
        """The rows of ``finished`` groups with their group ids, less the groups DAPO's filter drops; and how many
        groups failed and were filtered."""
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

    async def write_rows(self, exps: list[Experience]) -> float:
        """One segment (or one Redis batch) of ``exps``; the seconds spent waiting for room in the buffer."""
        if not exps:
            return 0.0
        if self.sender is not None:
            await self.sender.send(exps)
            return 0.0
        buffer_wait_s = await asyncio.to_thread(self.writer.wait_for_room, self.cfg.synchronizer.timeout_s)
        await asyncio.to_thread(self.writer.write, exps)
        return buffer_wait_s

    # ------------------------------------------------------------ metrics
    def engine_busy_frac(self) -> float:
        """The engines' busy share (``EngineFleet.busy_s``) of the wall time since the last call (since the parts
        were built for the first)."""
        now, busy = time.perf_counter(), self.fleet.busy_s()
        last_t, last_busy = self._busy_mark
        self._busy_mark = (now, busy)
        return (busy - last_busy) / max((now - last_t) * len(self.fleet.slots), 1e-9)

    def step_metrics(self, exps: list[Experience], elapsed: float) -> dict[str, float]:
        """A step record's statistics of the rows ``exps`` it wrote in ``elapsed`` seconds."""
        rewards = np.array([e.reward or 0.0 for e in exps], dtype=np.float64)
        lengths = np.array([len(e.response_ids) for e in exps], dtype=np.float64)
        n = max(len(exps), 1)
        return {
            "rollout/reward_mean": float(rewards.mean()) if exps else 0.0,
            "rollout/reward_std": float(rewards.std()) if exps else 0.0,
            "rollout/accuracy": float(np.mean([correct(e) for e in exps])) if exps else 0.0,
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


def correct(exp: Experience) -> bool:
    """An experience counts as correct for ``rollout/accuracy`` when its reward is 1.0, or, for a reward function
    that returns parts (Trinity's ``{"accuracy": 1.0, "format_score": 0.1}``), when its ``accuracy`` part is."""
    parts = exp.info.get("reward_parts")
    if isinstance(parts, dict) and "accuracy" in parts:
        return parts["accuracy"] == 1.0
    return exp.reward == 1.0
