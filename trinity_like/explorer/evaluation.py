"""Evaluation on held-out task sets: greedy or k samples per task, each task run by the explorer's workflow (its
tools, turns and reward model included), so a multi-turn or tool-using policy is measured as it is trained.

A sample counts as correct when its reward is at least 1.0 (full credit). Per task set:

    eval/<name>/accuracy/mean@k   mean over tasks of the fraction of its k samples that are correct
    eval/<name>/accuracy/best@k   mean over tasks of "at least one of its k samples is correct"
    eval/<name>/reward_mean       mean reward over all samples
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from trinity_like.common.tasks import Task, limit_prompts
from trinity_like.config import Config, EvalTasksetConfig, SamplingConfig
from trinity_like.explorer.workflow_base import Workflow, WorkflowContext, explorer_context
from trinity_like.explorer.workflows import SingleTurnWorkflow, load_workflow
from trinity_like.weights.messages import WeightsInfo


def apply_prompt_limit(cfg: Config, tokenizer, tasks: list[Task], source: str) -> list[Task]:
    """``tasks`` under ``explorer.max_prompt_tokens`` with ``prompt_truncation`` and ``filter_overlong_prompts``
    (``trinity_like.common.tasks.limit_prompts``): applied to every task set (training and eval) where it is
    loaded for rollouts, so training, evaluation and ``bench`` see the same prompts. ``source`` names the set."""
    ex = cfg.explorer
    return limit_prompts(tasks, tokenizer, ex.max_prompt_tokens, ex.prompt_truncation, ex.filter_overlong_prompts,
                         source)


async def evaluate(fleet, ctx: WorkflowContext, name: str, tasks: list[Task], ev: EvalTasksetConfig,
                   seed: int = 0, workflow: Workflow | None = None) -> dict[str, float]:
    """Accuracy (reward >= 1) mean@k and best@k and the mean reward of ``ev.k`` samples per task, each task run
    by ``workflow`` (the explorer's; default ``single_turn``, whose whole set is one spread call) with ``ctx``
    (the explorer's: tokenizer, reward manager and model, tools, turns, ``max_new_tokens``) at the set's
    temperature, seeded by ``seed`` and the task's position alone (no remax greedy baseline)."""
    workflow = workflow or SingleTurnWorkflow()
    sampling = SamplingConfig(temperature=ev.temperature, max_new_tokens=ctx.sampling.max_new_tokens)
    k = ev.k
    ctxs = [replace(ctx, sampling=sampling, repeat_times=k, greedy_baseline=False,
                    seeds=[seed * 1_000_003 + i * k + j for j in range(k)]) for i in range(len(tasks))]
    run_batch = getattr(workflow, "run_batch", None)
    if run_batch is not None:
        groups = await run_batch(tasks, fleet, ctxs)
    else:
        groups = await asyncio.gather(*(workflow.run(t, fleet, c) for t, c in zip(tasks, ctxs, strict=True)))
    rewards = [[e.reward for e in group] for group in groups]
    flat = [r for group in rewards for r in group]
    return {
        f"eval/{name}/accuracy/mean@{k}": sum(sum(r >= 1.0 for r in g) / len(g) for g in rewards) / len(tasks),
        f"eval/{name}/accuracy/best@{k}": sum(any(r >= 1.0 for r in g) for g in rewards) / len(tasks),
        f"eval/{name}/reward_mean": sum(flat) / len(flat),
    }


def _resolve_checkpoint(cfg: Config, checkpoint: str | None) -> tuple[Config, str | None]:
    """(config with model.path, safetensors file to load on top) for ``checkpoint``: a state-dict file, a
    trainer checkpoint folder (``checkpoints/step-N``), or a Hugging Face model folder."""
    import dataclasses

    from trinity_like.common.errors import UserError

    if checkpoint is None:
        return cfg, None
    p = Path(checkpoint)
    if p.is_file() and p.suffix == ".safetensors":
        return cfg, str(p)
    if (p / "model" / "config.json").is_file():  # a trainer checkpoint folder
        p = p / "model"
    if (p / "config.json").is_file():
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(p))), None
    raise UserError(f"checkpoint '{checkpoint}' is neither a .safetensors file, a trainer checkpoint folder nor "
                    "a Hugging Face model folder")


def bench(cfg: Config, checkpoint: str | None = None) -> list[dict]:
    """Evaluate a checkpoint on the config's eval task sets (a greedy arithmetic set when none is given)."""
    import dataclasses

    from trinity_like.algorithms.rewards import load_reward_manager
    from trinity_like.common.tokenizer import hf_tokenizer
    from trinity_like.explorer.fleet import EngineFleet
    from trinity_like.explorer.reward_model import start_reward_model
    from trinity_like.runtime.ray_cluster import init_ray
    from trinity_like.runtime.run_dir import prepare_eval_tasksets, prepare_run_dir
    cfg, weights = _resolve_checkpoint(cfg, checkpoint)
    if not cfg.explorer.eval_tasksets:
        cfg = dataclasses.replace(cfg, explorer=dataclasses.replace(cfg.explorer, eval_tasksets=[EvalTasksetConfig()]))
    prepare_run_dir(cfg, allow_existing=True)
    init_ray(cfg)
    tokenizer = hf_tokenizer(cfg.model.path)
    tasksets = {name: apply_prompt_limit(cfg, tokenizer, tasks, f"eval task set '{name}'")
                for name, tasks in prepare_eval_tasksets(cfg).items()}
    reward_manager = load_reward_manager(cfg, tokenizer)

    async def main() -> list[dict]:
        fleet = EngineFleet(cfg)
        reward_model = start_reward_model(cfg)
        try:
            await fleet.ready()
            if weights is not None:
                await fleet.update_weights(WeightsInfo(version=1, path=weights))
            rows = []
            ctx = explorer_context(cfg, tokenizer, reward_manager, reward_model)
            workflow = load_workflow(cfg.explorer.workflow)
            for ev in cfg.explorer.eval_tasksets:
                m = await evaluate(fleet, ctx, ev.name, tasksets[ev.name], ev, seed=cfg.seed, workflow=workflow)
                prefix = f"eval/{ev.name}/"
                rows.append({"taskset": ev.name, "tasks": len(tasksets[ev.name]), "k": ev.k,
                             "temperature": ev.temperature,
                             "mean@k": m[f"{prefix}accuracy/mean@{ev.k}"], "best@k": m[f"{prefix}accuracy/best@{ev.k}"],
                             "reward_mean": m[f"{prefix}reward_mean"]})
            return rows
        finally:
            fleet.kill()
            if reward_model is not None:
                reward_model.stop()

    return asyncio.run(main())
