"""The ``tool_agent`` workflow: multi-turn episodes in which the model may call tools.

The tools come from ``explorer.tool_config_path`` (``trinity_like.explorer.tools``: verl's tool config format,
built-in tools only); the explorer passes the path in ``ctx.tool_config_path``, and each workflow
instance loads the file once.

An episode (one Experience, like ``guess_number``):

    prompt    the tool descriptions and the call format (``Toolbox.preamble``), a newline, the task's prompt
              (as the prompt limit left it: ``explorer.max_prompt_tokens`` counts the task's prompt, not the
              preamble)
    turn t    the model generates (action_mask true, its log-probs); the ``<tool_call>`` blocks of its text
              are run, each in a thread (the event loop is not blocked), and their results appended as
              ``<tool_response>...</tool_response>`` blocks (action_mask false, log-prob 0: tool output is
              context, never trained on); a turn without a tool call ends the episode
    reward    the reward manager on the final answer, the model's text after the last tool response, with the
              task's answer and data source (as ``single_turn`` scores)

Departures from verl's multi-turn rollout: the text is plain (no chat template), as the other built-in
workflows prompt, so the tiny model and a warm-up on demonstrations see the same format; tool calls of the
last allowed turn are still run and answered (every call gets its response), and the episode then has no
final answer (empty text, scored as such). ``info`` per episode: ``turns``, ``tool_calls`` and
``tool_failures`` (counts by tool name; calls to no configured tool count under ``_invalid``), which the
explorer sums into ``rollout/tool_calls/<name>`` and ``rollout/tool_failures/<name>``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from trinity_like.common.experience import Experience
from trinity_like.common.tasks import Task
from trinity_like.config.tools import INVALID
from trinity_like.explorer.tools import Toolbox, ToolResult, load_tools, parse_tool_calls
from trinity_like.explorer.workflow_base import WORKFLOWS, Workflow, WorkflowContext, greedy_context
from trinity_like.explorer.workflow_base import score_texts as _score


def episode_prompt(task_prompt: str, tools: Toolbox) -> str:
    """The text the model starts from: the tool preamble (if any tools), a newline, the task's prompt."""
    preamble = tools.preamble()
    return f"{preamble}\n{task_prompt}" if preamble else task_prompt


def tool_response_text(results: list[ToolResult]) -> str:
    """What follows a model turn that called tools: one block per call, in the order of the calls."""
    return "".join(f"\n<tool_response>{r.text}</tool_response>" for r in results) + "\n"


@dataclass
class _Episode:
    response: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    calls: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    final_text: str = ""
    truncated: bool = False

    def add(self, ids: list[int], is_model: bool, logprobs: list[float] | None = None) -> None:
        self.response += ids
        self.mask += [is_model] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


@WORKFLOWS.register("tool_agent")
class ToolAgentWorkflow(Workflow):
    """``repeat_times`` multi-turn episodes per task, the model calling the configured tools (module
    docstring); one Experience per episode."""

    def __init__(self) -> None:
        self._tools: Toolbox | None = None
        self._tools_path: str | None = None
        """The path ``_tools`` was loaded from: a context naming another one loads that one."""

    def toolbox(self, ctx: WorkflowContext) -> Toolbox:
        path = ctx.tool_config_path
        if self._tools is None or path != self._tools_path:
            self._tools, self._tools_path = (load_tools(path) if path else Toolbox()), path
        return self._tools

    async def run(self, task: Task, engine, ctx: WorkflowContext) -> list[Experience]:
        tools = self.toolbox(ctx)
        prompt_text = episode_prompt(task.prompt, tools)
        prompt = ctx.tokenizer.encode(prompt_text)
        jobs = [self._episode(prompt, tools, engine, ctx, seed) for seed in ctx.seeds]
        if ctx.greedy_baseline:  # ReMax: one greedy episode, scored with the others, not an experience
            jobs.append(self._episode(prompt, tools, engine, greedy_context(ctx), ctx.seeds[0]))
        episodes = await asyncio.gather(*jobs)
        rewards, failed = await _score(ctx, [e.final_text for e in episodes], task,
                                       [len(e.response) for e in episodes])
        baseline = {}
        if ctx.greedy_baseline:
            baseline = {"reward_baseline": rewards[-1]}
            episodes, rewards, failed = episodes[:-1], rewards[:-1], failed[:-1]
        return [Experience(
            prompt_ids=prompt, response_ids=np.asarray(e.response, np.int32), action_mask=e.mask,
            logprobs=e.logprobs, reward=r, model_version=min(e.versions), truncated=e.truncated,
            task_id=task.task_id, prompt_text=prompt_text,
            response_text=ctx.tokenizer.decode(e.response, skip_special_tokens=True),
            info={"ground_truth": task.answer, "data_source": task.data_source, "turns": len(e.versions),
                  "turn_versions": e.versions, "tool_calls": dict(e.calls), "tool_failures": dict(e.failures),
                  **baseline, **({"reward_failed": True} if f else {})},
        ) for e, r, f in zip(episodes, rewards, failed, strict=True)]

    async def _episode(self, prompt: list[int], tools: Toolbox, engine, ctx: WorkflowContext, seed: int) -> _Episode:
        tok = ctx.tokenizer
        ep = _Episode()
        for turn in range(ctx.max_turns):
            sample = (await engine.generate([prompt + ep.response], ctx.sampling, [seed * 7919 + turn]))[0]
            ids = sample.response_ids.tolist()
            ep.add(ids, True, sample.logprobs.tolist())
            ep.versions.append(sample.model_version)
            ep.truncated = sample.finish_reason == "length"
            ep.final_text = tok.decode(ids, skip_special_tokens=True)
            calls = parse_tool_calls(ep.final_text)
            if not calls:
                break
            results = await asyncio.gather(*(asyncio.to_thread(tools.call, c) for c in calls))
            for call, result in zip(calls, results, strict=True):
                name = call.name if call.name in tools else INVALID
                ep.calls[name] += 1
                ep.failures[name] += not result.ok
            ep.add(tok.encode(tool_response_text(list(results)), add_special_tokens=False), False)
            ep.final_text = ""  # nothing after the last tool response yet
        return ep
