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
    taskset: Any = None
    """The task set's config (``explorer.taskset``: a ``TasksetConfig``), None without one: Trinity's
    ``workflow_args``, ``reward_fn``, ``reward_fn_args`` and ``format`` (``trinity_api``); a ``reward_fn`` there
    scores responses in :func:`score_texts` instead of the reward manager."""
    info: dict[str, Any] = field(default_factory=dict)


def explorer_context(cfg: Config, tokenizer, reward_manager, reward_model=None) -> WorkflowContext:
    """The context every task of an explorer (and of ``bench``) starts from, as ``cfg`` sets it: sampling, samples
    per task, turns, tools, the remax baseline; the caller sets each task's ``seeds`` (none here) and step."""
    ex = cfg.explorer
    return WorkflowContext(sampling=ex.sampling, repeat_times=ex.repeat_times, seeds=[], tokenizer=tokenizer,
                           reward_manager=reward_manager, max_turns=ex.max_turns,
                           greedy_baseline=cfg.algorithm.adv_estimator == "remax",  # ReMax's baseline
                           reward_model=reward_model, tool_config_path=ex.tool_config_path, taskset=ex.taskset)


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
    given the reward model's scores when there is one (or the task set's Trinity ``reward_fn``'s,
    :func:`score_parts`)."""
    rewards, failed, _ = await score_parts(ctx, texts, task, lengths)
    return rewards, failed


async def score_parts(ctx: WorkflowContext, texts: list[str], task: Task,
                      lengths: list[int]) -> tuple[list[float], list[bool], list[dict[str, float] | None]]:
    """:func:`score_texts` and each response's reward parts: with a Trinity ``reward_fn`` (the task's own or
    ``explorer.taskset.reward_fn``, built with ``reward_fn_args``: :func:`trinity_reward_fn`) called as Trinity calls it (``response``,
    ``truth``: the task's ``raw_task[format.response_key]`` when it has a raw row, else its answer; ``prompt``),
    the reward is the sum of the parts it returns; a response it raises on is a failed sample scored
    ``reward.failure_value``. Without one: the reward manager's rewards, no parts."""
    n = len(texts)
    reward_fn = trinity_reward_fn(ctx, task)
    if reward_fn is not None:
        from trinity_like.algorithms.trinity_rewards import reward_parts

        raw = getattr(task, "raw_task", None)
        key = ctx.taskset.format.response_key
        truth = raw[key] if isinstance(raw, dict) and key in raw else task.answer
        rewards, failed, parts = [], [], []
        for text in texts:
            try:
                p = reward_parts(reward_fn, text, truth, prompt=task.prompt)
            except Exception as e:  # a reward function is user code: this sample fails, the others go on
                ref = getattr(task, "reward_fn", "") or ctx.taskset.reward_fn
                ctx.reward_manager.last_error = f"{ref}: {type(e).__name__}: {e}"
                rewards.append(float(getattr(ctx.reward_manager, "failure_value", 0.0)))
                failed.append(True)
                parts.append(None)
                continue
            rewards.append(sum(p.values()))
            failed.append(False)
            parts.append(p)
        return rewards, failed, parts
    extra = {} if ctx.reward_model is None else {"model_scores": await ctx.reward_model.score(task, texts)}
    rewards, info = ctx.reward_manager.score(texts, [task.answer] * n, [task.data_source or "math"] * n, lengths,
                                             [task.extra_info] * n, **extra)
    return rewards, info["reward_failed"], [None] * n


_REWARD_FNS: dict[tuple[str, str], Any] = {}
"""Built Trinity reward functions by (reference, arguments as JSON): one instance per process."""


def trinity_reward_fn(ctx: WorkflowContext, task: Task | None = None):
    """The Trinity reward function of ``task`` (its own, ``Task.reward_fn`` from the column
    ``format.reward_fn_key`` names, else the task set's ``reward_fn``), built with the set's ``reward_fn_args``
    once per process; None when neither names one."""
    ts = ctx.taskset
    ref = getattr(task, "reward_fn", "") or getattr(ts, "reward_fn", "")
    if ts is None or not ref:
        return None
    import json

    key = (ref, json.dumps(ts.reward_fn_args, sort_keys=True, default=str))
    if key not in _REWARD_FNS:
        from trinity_like.algorithms.trinity_rewards import build_reward_fn

        _REWARD_FNS[key] = build_reward_fn(ref, ts.reward_fn_args)
    return _REWARD_FNS[key]


def workflow_metrics(infos) -> dict[str, float]:
    """Rollout metrics from experiences' ``info``: the mean of each reward part (``info["reward_parts"]``) as
    ``rollout/reward/<part>`` and of each workflow metric (``info["metrics"]``, Trinity's ``Experience.metrics``)
    as ``rollout/workflow/<name>``, over the experiences that have it."""
    sums: dict[str, list[float]] = {}
    for info in infos:
        for field_name, key in (("reward_parts", lambda k: f"rollout/reward/{k}"),
                                ("metrics", lambda k: f"rollout/workflow/{k}")):
            for k, v in (info.get(field_name) or {}).items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    sums.setdefault(key(k), []).append(float(v))
    return {k: sum(v) / len(v) for k, v in sums.items()}
