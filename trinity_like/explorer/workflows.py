"""Workflows: how one task becomes experiences.

A workflow has ONE entry point, ``async run(task, engine, ctx) -> list[Experience]``: ``engine`` is the
explorer fleet (``generate``, ``chat``), ``ctx`` carries the sampling settings, the number of samples per
task, the per-sample seeds, the tokenizer and the reward manager. The explorer gives every returned
experience its group id, model version and engine-independent fields; a workflow that raises is retried and
then recorded as failed, without stopping the step.

Tasks arrive as the explorer loaded them, under the prompt limit (``explorer.max_prompt_tokens``, applied once at
load by ``trinity_like.common.tasks.limit_prompts``): ``prompt_ids(task, tokenizer)`` gives the ids of the prompt
as cut, and ``task.prompt`` its text, so a workflow that starts from either sees the same prompt as evaluation.

Workflows are registered by name (``@WORKFLOWS.register("name")``) or loaded from an import path
``package.module:ClassName`` or a file ``path/to/file.py:ClassName`` given as ``explorer.workflow``; see
``examples/custom_workflow.py``.

Built in:
- ``single_turn``: one generate call with ``repeat_times`` samples of the task's prompt; scored by the reward
  manager (arithmetic, math, countdown, ... by the task's data source). It also offers ``run_batch`` so the
  explorer can generate a whole step in one fixed batch per engine (same samples whatever the timing). With
  ``ctx.greedy_baseline`` (remax) one more generate call gives each task's greedy response, whose reward becomes
  the experiences' ``info["reward_baseline"]``.
- ``guess_number``: a multi-turn text environment shipped with the project. The model guesses a number; after
  every guess the environment answers "higher", "lower" or "correct". Each episode is ONE experience whose
  ``action_mask`` is true exactly on the model's tokens (the environment's tokens are false, with log-prob 0).
- ``tool_agent`` (module ``tool_workflow``).
- Trinity-RFT's names (``math_workflow``, ``math_boxed_workflow``, ``simple_workflow``, ``frozen_lake_workflow``,
  their async forms) and any Trinity workflow class, by name (``@WORKFLOWS.register_module`` in a plugin folder)
  or import path: modules ``trinity_api`` and ``trinity_envs``, docs/trinity-workflows.md. A task set whose rows
  name their own workflow (``format.workflow_key``) runs each task by it (:class:`PerTaskWorkflow`).
  :func:`check_workflow_config` checks the names and shapes when the config loads.
"""

from __future__ import annotations

import asyncio
import random
import re

import numpy as np

from trinity_like.common.experience import Experience
from trinity_like.common.registry import import_module_ref
from trinity_like.common.tasks import Task, prompt_ids
from trinity_like.explorer.workflow_base import WORKFLOWS, Workflow, WorkflowContext, greedy_context
from trinity_like.explorer.workflow_base import score_parts as _score_parts
from trinity_like.explorer.workflow_base import score_texts as _score


@WORKFLOWS.register("single_turn")
class SingleTurnWorkflow(Workflow):
    """``repeat_times`` independent answers to the task's prompt."""

    async def run(self, task: Task, engine, ctx: WorkflowContext) -> list[Experience]:
        prompt = prompt_ids(task, ctx.tokenizer)
        samples, baselines = await asyncio.gather(
            engine.generate([prompt] * ctx.repeat_times, ctx.sampling, ctx.seeds),
            self.greedy_rewards(engine.generate, [task], [prompt], [ctx]))
        return await self.to_experiences(task, prompt, samples, ctx, baselines[0])

    async def run_batch(self, tasks: list[Task], engine, ctxs: list[WorkflowContext]) -> list[list[Experience]]:
        """All tasks of a step in one call spread over the engines with a fixed assignment (and, for remax, the
        greedy responses in a second such call)."""
        prompts = [prompt_ids(t, ctx.tokenizer) for t, ctx in zip(tasks, ctxs, strict=True)]
        flat = [p for p, ctx in zip(prompts, ctxs, strict=True) for _ in range(ctx.repeat_times)]
        seeds = [s for ctx in ctxs for s in ctx.seeds]
        samples, baselines = await asyncio.gather(
            engine.generate_spread(flat, ctxs[0].sampling, seeds),
            self.greedy_rewards(engine.generate_spread, tasks, prompts, ctxs))
        groups, k = [], 0
        for task, prompt, ctx, baseline in zip(tasks, prompts, ctxs, baselines, strict=True):
            groups.append(self.to_experiences(task, prompt, samples[k:k + ctx.repeat_times], ctx, baseline))
            k += ctx.repeat_times
        return list(await asyncio.gather(*groups))

    @staticmethod
    async def greedy_rewards(generate, tasks: list[Task], prompts: list[list[int]],
                             ctxs: list[WorkflowContext]) -> list[float | None]:
        """ReMax's baseline of each task: the reward of one greedy (temperature 0) response to its prompt, scored
        by the same reward manager; None for every task without ``greedy_baseline``. ``generate`` is the
        engine's ``generate`` or ``generate_spread``: its own call, with its own sampling settings, so the
        samples' batches are the same with or without it (and a greedy response does not depend on timing)."""
        if not ctxs[0].greedy_baseline:
            return [None] * len(tasks)
        greedy = greedy_context(ctxs[0]).sampling
        # one seed per prompt is required; at temperature 0 it is not used
        samples = await generate(prompts, greedy, [ctx.seeds[0] for ctx in ctxs])
        baselines = []
        for task, ctx, s in zip(tasks, ctxs, samples, strict=True):
            text = ctx.tokenizer.decode(s.response_ids.tolist(), skip_special_tokens=True)
            rewards, _ = await _score(ctx, [text], task, [len(s.response_ids)])
            baselines.append(rewards[0])
        return baselines

    @staticmethod
    async def to_experiences(task: Task, prompt: list[int], samples, ctx: WorkflowContext,
                       reward_baseline: float | None = None) -> list[Experience]:
        texts = [ctx.tokenizer.decode(s.response_ids.tolist(), skip_special_tokens=True) for s in samples]
        rewards, failed, parts = await _score_parts(ctx, texts, task, [len(s.response_ids) for s in samples])
        baseline = {} if reward_baseline is None else {"reward_baseline": reward_baseline}
        return [Experience(
            prompt_ids=prompt, response_ids=s.response_ids, logprobs=s.logprobs, reward=r,
            model_version=s.model_version, token_versions=s.token_versions, truncated=s.finish_reason == "length", prompt_text=task.prompt,
            response_text=text, task_id=task.task_id, engine_id=s.engine_id,
            info={"ground_truth": task.answer, "data_source": task.data_source, **baseline,
                  **({"reward_failed": True} if f else {}), **({"reward_parts": p} if p else {})},
        ) for s, text, r, f, p in zip(samples, texts, rewards, failed, parts, strict=True)]


_GUESS = re.compile(r"-?\d+")


@WORKFLOWS.register("guess_number")
class GuessNumberWorkflow(Workflow):
    """Multi-turn: find a secret number in [0, 20] from "higher"/"lower" hints, within ``max_turns``.

    The secret comes from the task's answer when it is a number, else from the task id. Reward: 1.0 when a
    guess is correct, 0.1 for any turn that contained a number, else 0.0."""

    async def run(self, task: Task, engine, ctx: WorkflowContext) -> list[Experience]:
        secret = int(task.answer) if task.answer.lstrip("-").isdigit() else random.Random(task.task_id).randint(0, 20)
        exps = [await self._episode(task, secret, engine, ctx, seed) for seed in ctx.seeds]
        if ctx.greedy_baseline:  # ReMax: the reward of one greedy episode (not an experience)
            baseline = (await self._episode(task, secret, engine, greedy_context(ctx), ctx.seeds[0])).reward
            for e in exps:
                e.info["reward_baseline"] = baseline
        return exps

    async def _episode(self, task: Task, secret: int, engine, ctx: WorkflowContext, seed: int) -> Experience:
        tok = ctx.tokenizer
        prompt = tok.encode(f"Guess my number from 0 to 20. {task.prompt}".strip())
        response: list[int] = []
        mask: list[bool] = []
        logprobs: list[float] = []
        versions: list[int] = []  # each turn's
        # each response token's: its turn's (the environment's reply to a turn takes that turn's version)
        token_versions: list[int] = []
        reward, solved, truncated = 0.0, False, False
        for turn in range(ctx.max_turns):
            sample = await engine.generate([prompt + response], ctx.sampling, [seed * 7919 + turn])
            versions.append(sample[0].model_version)
            ids = sample[0].response_ids.tolist()
            response += ids
            token_versions += ([versions[-1]] * len(ids) if sample[0].token_versions is None
                               else sample[0].token_versions.tolist())
            mask += [True] * len(ids)
            logprobs += sample[0].logprobs.tolist()
            truncated = sample[0].finish_reason == "length"
            found = _GUESS.search(tok.decode(ids, skip_special_tokens=True))
            if found is None:
                feedback = " Say a number."
            else:
                reward = max(reward, 0.1)
                guess = int(found.group())
                if guess == secret:
                    reward, solved = 1.0, True
                    break
                feedback = " higher." if guess < secret else " lower."
            env = tok.encode(feedback, add_special_tokens=False)
            response += env
            mask += [False] * len(env)
            logprobs += [0.0] * len(env)
            token_versions += [versions[-1]] * len(env)
        return Experience(
            prompt_ids=prompt, response_ids=np.asarray(response, np.int32), action_mask=mask, logprobs=logprobs,
            reward=reward, model_version=min(token_versions, default=min(versions)),
            token_versions=token_versions, truncated=truncated and not solved, task_id=task.task_id,
            prompt_text=tok.decode(prompt), response_text=tok.decode(response, skip_special_tokens=True),
            info={"secret": secret, "turns": len(versions), "solved": solved, "turn_versions": versions},
        )


def _import_module(ref: str):
    """A module by import path, or from a ``.py`` file path."""
    return import_module_ref(ref, "trinity_like_workflow", "workflow file")


def _resolve(name: str):
    """What ``name`` names: a class loaded from ``module:Class`` / ``file.py:Class``, else the registry's entry."""
    if ":" in name:
        module_name, _, cls_name = name.rpartition(":")
        try:
            return getattr(_import_module(module_name), cls_name)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot load workflow {name!r}: {e}") from None
    if name in WORKFLOWS:
        return WORKFLOWS.get(name)
    from trinity_like.explorer.trinity_api import WORKFLOWS as TRINITY_WORKFLOWS

    if name in TRINITY_WORKFLOWS:
        TRINITY_WORKFLOWS.get(name)  # a Trinity name that cannot run here: LookupError saying what it needs
    trinity = [n for n in TRINITY_WORKFLOWS.names() if n in WORKFLOWS]
    ours = [n for n in WORKFLOWS.names() if n not in trinity]
    raise KeyError(f"unknown workflow {name!r}; valid names: {', '.join(ours)}; Trinity-RFT's: {', '.join(trinity)}")


def load_workflow(name: str) -> Workflow:
    """A registered workflow by name, or ``package.module:ClassName`` / ``path/to/file.py:ClassName``: one of ours,
    or a Trinity-RFT workflow class (``trinity_api``: run through ``TrinityWorkflowAdapter``). KeyError for an
    unknown name, LookupError for a Trinity name that cannot run here (saying what it needs)."""
    from trinity_like.explorer.trinity_api import TrinityWorkflowAdapter, is_trinity_workflow

    entry = _resolve(name)
    if ":" not in name:
        return entry()
    if is_trinity_workflow(entry):
        return TrinityWorkflowAdapter(entry, name)
    if not (isinstance(entry, type) and issubclass(entry, Workflow)):
        raise ValueError(f"workflow {name!r} is not a subclass of trinity_like.explorer.workflows.Workflow nor a "
                         "Trinity-RFT workflow (trinity_like.explorer.trinity_api.Workflow)")
    return entry()


def workflow_name(cfg) -> str:
    """The workflow of the run's task set: ``explorer.taskset.workflow``, else ``explorer.workflow``."""
    return cfg.explorer.taskset.workflow or cfg.explorer.workflow


class PerTaskWorkflow(Workflow):
    """Each task by its own workflow (``Task.workflow``: the column ``format.workflow_key`` names, Trinity's
    per-row workflow), else by the task set's; each workflow loaded once."""

    def __init__(self, default: str) -> None:
        self.default = default
        self._loaded: dict[str, Workflow] = {default: load_workflow(default)}

    def workflow_of(self, task: Task) -> Workflow:
        name = getattr(task, "workflow", "") or self.default
        if name not in self._loaded:
            self._loaded[name] = load_workflow(name)
        return self._loaded[name]

    async def run(self, task: Task, engine, ctx: WorkflowContext) -> list[Experience]:
        return await self.workflow_of(task).run(task, engine, ctx)


def workflow_for(cfg) -> Workflow:
    """The explorer's workflow for ``cfg``: the task set's (:func:`workflow_name`), or, when the task set names a
    column of per-row workflows (``format.workflow_key``), a :class:`PerTaskWorkflow` over it."""
    name = workflow_name(cfg)
    return PerTaskWorkflow(name) if cfg.explorer.taskset.format.workflow_key else load_workflow(name)


def check_workflow_config(cfg) -> None:
    """When the config loads, before anything starts: import the plugin folders (``explorer.plugin_dirs``,
    ``TRINITY_PLUGIN_DIRS``), then check that the workflow names resolve (a Trinity name that cannot run here
    says what it needs), that a Trinity workflow class has ``__init__(self, *, task, model,
    auxiliary_models=None)`` and the ``run``/``run_async`` its ``is_async`` asks for, and that each task set's
    ``reward_fn`` builds with its ``reward_fn_args`` and takes Trinity's call; ConfigError in one line otherwise."""
    from functools import partial

    from trinity_like.algorithms.trinity_rewards import check_reward_fn_class
    from trinity_like.common.errors import ConfigError
    from trinity_like.common.plugins import PluginError, import_plugins
    from trinity_like.explorer.trinity_api import (
        BaseSimpleWorkflow,
        MathBoxedWorkflow,
        MathWorkflow,
        TrinityWorkflowAdapter,
        is_trinity_workflow,
        trinity_workflow_problem,
    )

    ex = cfg.explorer
    try:
        import_plugins(ex.plugin_dirs)
    except PluginError as e:
        raise ConfigError(str(e)) from None
    sets = [("explorer.taskset", ex.taskset), *((f"explorer.eval_tasksets[{i}]", ev)
                                                for i, ev in enumerate(ex.eval_tasksets))]
    names = {("explorer.workflow", ex.workflow)}
    names |= {(f"{where}.workflow", ts.workflow) for where, ts in sets if getattr(ts, "workflow", "")}
    for key, name in sorted(names):
        try:
            entry = _resolve(name)
        except (KeyError, ValueError) as e:
            raise ConfigError(f"{key}: {e.args[0]}; a workflow of your own is registered by a file in a plugin "
                              "folder (explorer.plugin_dirs) or named as module:Class") from None
        except LookupError as e:
            raise ConfigError(f"{key}: {e.args[0]}") from None
        cls = entry.args[0] if isinstance(entry, partial) and entry.func is TrinityWorkflowAdapter else entry
        if is_trinity_workflow(cls):
            problem = trinity_workflow_problem(cls, name)
            if problem:
                raise ConfigError(f"{key}: {problem}")
            scored = cls.reset is not BaseSimpleWorkflow.reset or issubclass(cls, MathWorkflow | MathBoxedWorkflow)
            if issubclass(cls, BaseSimpleWorkflow) and not scored and not ex.taskset.reward_fn:
                raise ConfigError(f"{key}: workflow {name!r} scores with the task set's reward function; set "
                                  "explorer.taskset.reward_fn (e.g. math_reward, accuracy_reward)")
        elif not (isinstance(cls, type) and issubclass(cls, Workflow)) and not isinstance(entry, partial):
            raise ConfigError(f"{key}: workflow {name!r} is neither one of ours (a subclass of "
                              "trinity_like.explorer.workflows.Workflow) nor a Trinity-RFT workflow")
    for where, ts in sets:
        if getattr(ts, "reward_fn", ""):
            problem = check_reward_fn_class(ts.reward_fn, ts.reward_fn_args)
            if problem:
                raise ConfigError(f"{where}.reward_fn: {problem}")


from trinity_like.explorer import tool_workflow as _tool_workflow  # noqa: E402,F401  (registers tool_agent)
from trinity_like.explorer import trinity_envs as _trinity_envs  # noqa: E402,F401  (Trinity's names)
