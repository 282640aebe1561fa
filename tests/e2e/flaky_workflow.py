"""Workflows for the end-to-end tests (loaded by path, as users load theirs): explorer steps that write fewer
rows than they plan (tests/e2e/test_short_steps.py), and slow ones (tests/e2e/test_jobs.py)."""

from __future__ import annotations

import zlib

from trinity_like.common.experience import Experience
from trinity_like.explorer.workflows import Workflow


class FlakyWorkflow(Workflow):
    """By a hash of the task id: a quarter of the tasks fail; a quarter give every sample one reward (dynamic
    sampling drops those groups); the rest give rewards 1, 0, 1, 0, ... (kept)."""

    async def run(self, task, engine, ctx):
        kind = zlib.crc32(task.task_id.encode()) % 4
        if kind == 0:
            raise RuntimeError(f"task {task.task_id} fails (on purpose)")
        prompt = ctx.tokenizer.encode(task.prompt)
        samples = await engine.generate([prompt] * ctx.repeat_times, ctx.sampling, ctx.seeds)
        return [Experience(prompt_ids=prompt, response_ids=s.response_ids, logprobs=s.logprobs,
                           reward=1.0 if kind == 1 else float(i % 2 == 0), model_version=s.model_version,
                           engine_id=s.engine_id)
                for i, s in enumerate(samples)]


class SameRewardWorkflow(Workflow):
    """Every sample gets reward 0: with dynamic sampling, every group is dropped and no step writes a row."""

    async def run(self, task, engine, ctx):
        prompt = ctx.tokenizer.encode(task.prompt)
        samples = await engine.generate([prompt] * ctx.repeat_times, ctx.sampling, ctx.seeds)
        return [Experience(prompt_ids=prompt, response_ids=s.response_ids, logprobs=s.logprobs, reward=0.0,
                           model_version=s.model_version, engine_id=s.engine_id) for s in samples]


class SlowWorkflow(Workflow):
    """The single-turn workflow that takes a second longer per task (a slow environment or a long generation):
    generation slower than training, for tests of the self-setting staleness bound."""

    async def run(self, task, engine, ctx):
        import asyncio

        from trinity_like.explorer.workflows import SingleTurnWorkflow

        await asyncio.sleep(1.0)
        return await SingleTurnWorkflow().run(task, engine, ctx)
