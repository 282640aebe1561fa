"""What every workflow shares: the registry, the context a workflow gets, the base class and scoring. Its own
module so that workflows in other modules (``tool_workflow``) and ``workflows`` (which imports them to register
them) both build on it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from trinity_like.common.experience import Experience
from trinity_like.common.registry import Registry
from trinity_like.common.tasks import Task
from trinity_like.config import Config, SamplingConfig

WORKFLOWS: Registry = Registry("workflow")


@dataclass
class WorkflowContext:
    """What a workflow needs besides the task and the engine."""

    sampling: SamplingConfig
    repeat_times: int
    seeds: list[int]
    """One seed per sample of this task (``repeat_times`` of them)."""
    tokenizer: Any
    reward_manager: Any
    max_turns: int = 4
    explore_step: int = 0
    """The explorer step this task belongs to."""
    greedy_baseline: bool = False
    """Also generate one greedy (temperature 0) response per task, score it, and store its reward as
    ``info["reward_baseline"]`` in every experience of the task: ReMax's baseline (on when
    ``algorithm.adv_estimator`` is remax). The greedy response is not an experience."""
    reward_model: Any = None
    """The reward model's client (``trinity_like.explorer.reward_model.RewardModelClient``), None without one:
    :func:`score_texts` asks it for every response's score and hands them to the reward manager."""
    tool_config_path: str = ""
    """``explorer.tool_config_path``: the tools of ``tool_agent``."""
    info: dict[str, Any] = field(default_factory=dict)


def explorer_context(cfg: Config, tokenizer, reward_manager, reward_model=None) -> WorkflowContext:
    """The context every task of an explorer (and of ``bench``) starts from, as ``cfg`` sets it: sampling, samples
    per task, turns, tools, the remax baseline; the caller sets each task's ``seeds`` (none here) and step."""
    ex = cfg.explorer
    return WorkflowContext(sampling=ex.sampling, repeat_times=ex.repeat_times, seeds=[], tokenizer=tokenizer,
                           reward_manager=reward_manager, max_turns=ex.max_turns,
                           greedy_baseline=cfg.algorithm.adv_estimator == "remax",  # ReMax's baseline
                           reward_model=reward_model, tool_config_path=ex.tool_config_path)


def greedy_context(ctx: WorkflowContext) -> WorkflowContext:
    """``ctx`` sampling at temperature 0: for the greedy episode of a ReMax baseline (``greedy_baseline``)."""
    return replace(ctx, sampling=replace(ctx.sampling, temperature=0.0))


class Workflow:
    """Base class: subclasses implement ``run``."""

    async def run(self, task: Task, engine, ctx: WorkflowContext) -> list[Experience]:
        raise NotImplementedError


async def score_texts(ctx: WorkflowContext, texts: list[str], task: Task,
                      lengths: list[int]) -> tuple[list[float], list[bool]]:
    """Rewards of a task's responses and which of them the reward function failed on: the reward manager's,
    given the reward model's scores when there is one."""
    n = len(texts)
    extra = {} if ctx.reward_model is None else {"model_scores": await ctx.reward_model.score(task, texts)}
    rewards, info = ctx.reward_manager.score(texts, [task.answer] * n, [task.data_source or "math"] * n, lengths,
                                             [task.extra_info] * n, **extra)
    return rewards, info["reward_failed"]
