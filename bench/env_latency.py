"""A workload where the staleness bound buys speed (``bench/learning.py --real ... --explorers 2``): the demo's
single-turn arithmetic workflow behind an environment that takes time to answer, as a tool call, a sandbox or a
remote judge does. Each task first waits a latency drawn from a log-normal (median ``MEDIAN_S``, sigma
``SIGMA``, capped at ``CAP_S``), seeded by the task and the explorer step so that a run is repeatable; an
explorer step lasts as long as its slowest task (a long tail). The wait takes no CPU, so on this 2-core machine
two explorers can overlap their steps while the trainer trains.

Loaded by path as users load theirs: ``explorer.workflow=bench/env_latency.py:EnvLatencyWorkflow``.
"""

from __future__ import annotations

import asyncio
import math
import random
import zlib

from trinity_like.explorer.workflows import SingleTurnWorkflow, Workflow

MEDIAN_S = 0.4
SIGMA = 0.6
CAP_S = 3.0


def latency_s(task_id: str, explore_step: int) -> float:
    """The environment's latency for one task in one explorer step (seconds)."""
    rng = random.Random(zlib.crc32(f"{task_id}/{explore_step}".encode()))
    return min(CAP_S, MEDIAN_S * math.exp(SIGMA * rng.gauss(0.0, 1.0)))


class EnvLatencyWorkflow(Workflow):
    """The single-turn workflow after the environment's latency (see the module)."""

    async def run(self, task, engine, ctx):
        await asyncio.sleep(latency_s(task.task_id, ctx.explore_step))
        return await SingleTurnWorkflow().run(task, engine, ctx)
