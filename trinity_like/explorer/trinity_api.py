"""Trinity-RFT's workflow API over this project's explorer: a Trinity workflow file runs here with only its import
lines changed::

    from trinity.common.workflows import WORKFLOWS, Task, Workflow     # Trinity
    from trinity.common.experience import Experience
    from trinity.common.rewards import REWARD_FUNCTIONS, RewardFn
    # becomes
    from trinity_like.explorer.trinity_api import (REWARD_FUNCTIONS, WORKFLOWS, Experience, RewardFn, Task,
                                                   Workflow)

What a Trinity workflow sees (upstream ``trinity/common/workflows/workflow.py``, ``models/model.py``):

- ``__init__(self, *, task, model, auxiliary_models=None)``; ``run()`` (called in a worker thread) or, with
  ``is_async = True``, ``async run_async()``; both return a list of :class:`Experience`. A class with
  ``can_repeat = True`` is built once per task, given ``set_repeat_times(repeat_times, run_id_base=0)`` and run
  once (it makes all samples, e.g. with ``n=``); any other is built and run ``repeat_times`` times, each run with
  its own model wrapper (and its own seeds), its experiences' ``eid.run`` set to the run's index, as Trinity's
  runner does. ``reset`` is never needed: every task gets new instances.
- ``task`` (:class:`Task`): ``raw_task`` (the data row), ``format_args`` (``explorer.taskset.format``),
  ``rollout_args`` (our sampling: ``temperature``, ``top_p``, ``top_k``, ``max_tokens``, ``n``),
  ``workflow_args``, ``reward_fn`` (the class ``explorer.taskset.reward_fn`` names), ``reward_fn_args``,
  ``repeat_times``, ``is_eval``, ``task_id``, ``batch_id`` (the explorer step), ``truth``, ``task_desc``.
- ``model`` (:class:`ModelWrapper`): ``chat`` / ``chat_async(messages, **rollout_args)`` and ``generate`` /
  ``generate_async(prompts, **rollout_args)`` return ``n`` experiences with tokens and behaviour log-probs from
  the explorer's engines (the workflow's engine, with the task's seeds); ``get_message_token_len``,
  ``model_version``, ``model_path``, ``model_name``, ``convert_messages_to_experience(_async)`` (the
  conversation made by this wrapper's chat calls, as one multi-turn experience), ``extract_experience_from_history``,
  and ``get_openai_client`` / ``get_openai_async_client``: an in-process OpenAI-style client whose
  ``chat.completions.create`` (and ``models.list``) runs on the same engines and records every call in the
  history (Trinity's ``enable_history``).

Departures from Trinity: the OpenAI client is in-process and minimal (``chat.completions.create`` without
streaming or tools; the response is ``openai``'s ``ChatCompletion`` type); ``logprobs(tokens)`` (recomputing
log-probs of given tokens) is not offered (the engines have no such call): a multi-turn conversation keeps the
tokens its turns generated instead of re-tokenising the whole conversation, which is also what makes
``convert_messages_to_experience`` exact; auxiliary models are not offered (``auxiliary_models`` is None).

Every Experience a Trinity workflow returns becomes one of ours (:func:`to_experience`): prompt / response split
at ``prompt_length``, the response's log-probs and action mask, the reward, ``info`` (with ``metrics`` under
``info["metrics"]``, summed into ``rollout/workflow/<name>`` means, and reward parts under
``info["reward_parts"]``, into ``rollout/reward/<part>``); the explorer sets group ids as for every workflow.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np
import torch

from trinity_like.algorithms.trinity_rewards import (  # noqa: F401  (users import them from here)
    REWARD_FUNCTIONS,
    AccuracyReward,
    CountDownRewardFn,
    FormatReward,
    MathBoxedRewardFn,
    MathDAPORewardFn,
    MathRewardFn,
    Refused,
    RewardFn,
    TrinityRegistry,
    reward_parts,
)
from trinity_like.common.chat import normalize_messages, render_prompt_ids
from trinity_like.common.errors import RunError
from trinity_like.common.experience import Experience as OurExperience
from trinity_like.common.tasks import Task as OurTask
from trinity_like.config import SamplingConfig
from trinity_like.explorer.engines.base import render_chat
from trinity_like.explorer.workflow_base import WORKFLOWS as OUR_WORKFLOWS
from trinity_like.explorer.workflow_base import Workflow as OurWorkflow
from trinity_like.explorer.workflow_base import WorkflowContext

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------- Experience


@dataclass
class EID:
    """Trinity's experience id: ``batch`` (explorer step), ``task``, ``run`` (which run of the task), ``step``
    (turn of a step-wise workflow) and a random ``suffix``."""

    batch: int | str = ""
    task: int | str = ""
    run: int = 0
    step: int = 0
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    @property
    def uid(self) -> str:
        return f"{self.batch}/{self.task}/{self.run}/{self.step}/{self.suffix}"

    @property
    def sid(self) -> str:
        return f"{self.batch}/{self.task}/{self.step}"

    @property
    def rid(self) -> str:
        return f"{self.batch}/{self.task}/{self.run}"

    @property
    def tid(self) -> str:
        return f"{self.batch}/{self.task}"

    def to_dict(self) -> dict:
        return asdict(self)


def _tensor(value: Any, dtype: torch.dtype) -> torch.Tensor | None:
    if value is None or isinstance(value, torch.Tensor):
        return value
    return torch.as_tensor(np.asarray(value), dtype=dtype)


class Experience:
    """Trinity-RFT's Experience (keyword arguments only): ``tokens`` (prompt + response), ``prompt_length``,
    ``logprobs`` / ``action_mask`` (one per response token), ``reward``, ``info``, ``metrics``, ``eid``,
    ``truncate_status``, ``prompt_text``, ``response_text``, ``messages``. Without ``action_mask`` every response
    token is the model's (Trinity's single-turn form)."""

    def __init__(self, *, tokens, eid: EID | dict | None = None, prompt_length: int = 1, logprobs=None,
                 reward: float | None = None, token_level_reward=None, truncate_status: str | None = None,
                 info: dict | None = None, metrics: dict | None = None, response_text: str | None = None,
                 prompt_text: str | None = None, action_mask=None, messages: list[dict] | None = None,
                 tools: list[dict] | None = None, **unused: Any) -> None:
        self.eid = EID(**eid) if isinstance(eid, dict) else (eid or EID())
        self.tokens = _tensor(tokens, torch.int32)
        self.prompt_length = int(prompt_length)
        self.logprobs = _tensor(logprobs, torch.float32)
        self.reward = reward
        self.token_level_reward = _tensor(token_level_reward, torch.float32)
        self.truncate_status = truncate_status
        self.info = info or {}
        self.metrics = metrics or {}
        self.response_text = response_text
        self.prompt_text = prompt_text
        self.action_mask = _tensor(action_mask, torch.bool)
        if self.action_mask is None:
            self.action_mask = torch.ones(max(len(self.tokens) - self.prompt_length, 0), dtype=torch.bool)
        self.messages = messages
        self.tools = tools
        self.sample_meta: dict[str, Any] = {}
        """What the engine said of the tokens (``model_version``, ``token_versions``, ``engine_id``); empty for
        an experience the workflow built itself (the model wrapper's record is used then)."""


# ---------------------------------------------------------------- Task


@dataclass
class FormatArgs:
    """Trinity's ``FormatConfig`` as a workflow reads it (``task.format_args``); ``system_prompt`` and
    ``reply_prefix`` are None when not set, as Trinity's workflows test."""

    prompt_type: str = "plaintext"
    prompt_key: str = "prompt"
    response_key: str = "response"
    system_prompt_key: str | None = None
    system_prompt: str | None = None
    messages_key: str = "message"
    tools_key: str = "tools"
    image_key: str | None = None
    video_key: str | None = None
    reply_prefix: str | None = None
    workflow_key: str = ""
    reward_fn_key: str = ""
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    enable_concatenated_multi_turn: bool = False
    chat_template: str | None = None
    enable_thinking: bool | None = None

    @classmethod
    def from_config(cls, fmt: Any) -> FormatArgs:
        """From ``explorer.taskset.format`` (``TaskFormatConfig``); empty strings of optional keys become None."""
        if fmt is None:
            return cls()
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in vars(fmt).items() if k in names}
        for key in ("system_prompt_key", "system_prompt", "reply_prefix", "chat_template"):
            values[key] = values.get(key) or None
        return cls(**values)


@dataclass
class RolloutArgs:
    """Trinity's ``GenerationConfig`` (``task.rollout_args``): the explorer's sampling, ``n`` = samples per task."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int = -1
    logprobs: int | None = 0
    max_tokens: int | None = None
    n: int = 1

    @classmethod
    def from_sampling(cls, s: SamplingConfig, n: int) -> RolloutArgs:
        return cls(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or -1, max_tokens=s.max_new_tokens, n=n)


@dataclass
class Task:
    """Trinity-RFT's Task as a workflow reads it."""

    workflow: type | None = None
    repeat_times: int | None = None
    format_args: FormatArgs = field(default_factory=FormatArgs)
    rollout_args: RolloutArgs = field(default_factory=RolloutArgs)
    workflow_args: dict = field(default_factory=dict)
    reward_fn_args: dict = field(default_factory=dict)
    is_eval: bool = False
    reward_fn: type | None = None
    raw_task: dict | None = None
    batch_id: int | str = ""
    task_id: int | str = ""
    index: dict = field(default_factory=dict)

    @property
    def task_desc(self) -> Any:
        """The prompt: ``raw_task[format_args.prompt_key]``."""
        return (self.raw_task or {}).get(self.format_args.prompt_key)

    @property
    def truth(self) -> Any:
        """The ground truth: ``raw_task[format_args.response_key]``."""
        return (self.raw_task or {}).get(self.format_args.response_key)

    def to_workflow(self, model: ModelWrapper, auxiliary_models: list | None = None) -> Workflow:
        return self.workflow(task=self, model=model, auxiliary_models=auxiliary_models)

    def to_dict(self) -> dict | None:
        return self.raw_task


def raw_task_of(task: OurTask, fmt: FormatArgs) -> dict:
    """The task's data row: ``task.raw_task`` when the task set kept it, else one made of the task's fields
    (``extra_info``, ``prompt`` and ``answer``, also under the format's prompt and response keys)."""
    raw = getattr(task, "raw_task", None)
    if raw:
        return dict(raw)
    row = {**task.extra_info, "task_id": task.task_id, "prompt": task.prompt, "answer": task.answer,
           "data_source": task.data_source}
    if task.messages:
        row.setdefault(fmt.messages_key, [dict(m) for m in task.messages])
    row.setdefault(fmt.prompt_key, task.prompt)
    row.setdefault(fmt.response_key, task.answer)
    return row


def trinity_task(task: OurTask, ctx: WorkflowContext, workflow: type | None = None) -> Task:
    """Our task with its context as the Trinity Task a workflow is given (``ctx.taskset``: the task set's
    config; none: Trinity's defaults)."""
    ts = ctx.taskset
    fmt = FormatArgs.from_config(getattr(ts, "format", None))
    ref = getattr(task, "reward_fn", "") or getattr(ts, "reward_fn", "")  # the row's own, else the set's
    reward_fn = REWARD_FUNCTIONS.get(ref) if ref else None
    return Task(workflow=workflow, repeat_times=ctx.repeat_times, format_args=fmt,
                rollout_args=RolloutArgs.from_sampling(ctx.sampling, ctx.repeat_times),
                workflow_args=copy.deepcopy(dict(getattr(ts, "workflow_args", None) or {})),
                reward_fn_args=copy.deepcopy(dict(getattr(ts, "reward_fn_args", None) or {})),
                is_eval=bool(ctx.info.get("is_eval", False)), reward_fn=reward_fn, raw_task=raw_task_of(task, fmt),
                batch_id=ctx.explore_step, task_id=task.task_id)


# ---------------------------------------------------------------- the model


@dataclass
class _Turn:
    """One chat call of a wrapper: the messages it was given, the prompt ids it used, the response."""

    messages: list[dict]
    prompt: list[int]
    response: list[int]
    logprobs: list[float]
    response_text: str
    versions: list[int]


class ModelWrapper:
    """Trinity's ``ModelWrapper`` over the explorer's engine (``engine.generate``) for one run of a workflow:
    samples use the run's seeds (``ctx.seeds[run_index]``, then one per call) and ``ctx.sampling`` with the
    call's ``temperature``, ``top_p``, ``top_k``, ``max_tokens`` and ``n`` laid over it. The synchronous calls
    (``chat``, ``generate``) are for ``run()``, which runs in a worker thread: they wait on the explorer's event
    loop."""

    def __init__(self, engine: Any, ctx: WorkflowContext, run_index: int = 0,
                 loop: asyncio.AbstractEventLoop | None = None, chat_template: str | None = None,
                 enable_thinking: bool | None = None) -> None:
        self.engine, self.ctx, self.run_index = engine, ctx, run_index
        self.chat_template = chat_template or None
        """A Jinja chat template used instead of the tokenizer's (``format.chat_template``, or the task's own)."""
        self.enable_thinking = enable_thinking
        """Handed to the chat template (``format.enable_thinking``, or the task's own); None = not passed."""
        self.tokenizer = ctx.tokenizer
        self.loop = loop
        self.enable_history = True
        self.history: list[Experience] = []
        self.turns: list[_Turn] = []
        self.versions: list[int] = []
        """Model version of every sample this wrapper returned (the oldest one is an experience's version)."""
        self.calls = 0
        self.openai_client: OpenAIClient | None = None
        self.openai_async_client: AsyncOpenAIClient | None = None
        self.workflow_state: dict = {}

    # ------------------------------------------------------------ sampling
    def sampling_for(self, kwargs: dict[str, Any]) -> SamplingConfig:
        """``ctx.sampling`` with Trinity's keyword arguments laid over it (None keeps ours)."""
        s = self.ctx.sampling
        over: dict[str, Any] = {}
        if kwargs.get("temperature") is not None:
            over["temperature"] = float(kwargs["temperature"])
        if kwargs.get("top_p") is not None:
            over["top_p"] = float(kwargs["top_p"])
        if kwargs.get("top_k") is not None:
            over["top_k"] = max(int(kwargs["top_k"]), 0)
        max_tokens = kwargs.get("max_tokens", kwargs.get("max_completion_tokens"))
        if max_tokens is not None:
            over["max_new_tokens"] = max(int(max_tokens), 1)
        return replace(s, **over) if over else s

    def _seeds(self, n: int) -> list[int]:
        """One seed per sample of this call: the run's seeds (sample j of a call takes seed ``run_index + j``),
        the first call with them as they are, each later call with a fixed function of them and its number."""
        base = self.ctx.seeds or [0]
        out = []
        for j in range(n):
            k = self.run_index + j
            seed = base[k % len(base)] + (k // len(base)) * 104_729
            out.append(seed if self.calls == 0 else (seed * 7919 + self.calls) % (2**62))
        self.calls += 1
        return out

    async def _sample(self, prompt: list[int], kwargs: dict[str, Any], messages: list[dict] | None = None
                      ) -> list[Experience]:
        n = int(kwargs.get("n") or 1)
        samples = await self.engine.generate([prompt] * n, self.sampling_for(kwargs), self._seeds(n))
        prompt_text = self.tokenizer.decode(prompt)
        out = []
        for s in samples:
            response = s.response_ids.tolist()
            exp = Experience(tokens=prompt + response, prompt_length=len(prompt), logprobs=s.logprobs.tolist(),
                             prompt_text=prompt_text,
                             response_text=self.tokenizer.decode(response, skip_special_tokens=True),
                             truncate_status="response_truncated" if s.finish_reason == "length" else None,
                             messages=None if messages is None else [dict(m) for m in messages])
            tv = None if s.token_versions is None else s.token_versions.tolist()
            exp.sample_meta = {"model_version": s.model_version, "token_versions": tv, "engine_id": s.engine_id}
            self.versions.append(s.model_version)
            out.append(exp)
        self.history.extend(out)
        return out

    def _wait(self, coro):
        """Run ``coro`` on the explorer's loop from ``run()``'s worker thread."""
        if self.loop is None:
            raise RunError("this ModelWrapper has no event loop to run on; a synchronous call (chat, generate) "
                           "works in a workflow's run(), not outside the explorer")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            coro.close()
            raise RunError("a workflow with is_async = True called the synchronous model.chat/generate; call "
                           "await model.chat_async(...) / generate_async(...) in run_async()")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    # ------------------------------------------------------------ Trinity's calls
    def render(self, messages: list[dict]) -> list[int]:
        """The prompt ids of ``messages`` as Trinity renders a prompt for generation: the chat template (this
        wrapper's, else the tokenizer's) with a generation prompt and ``enable_thinking``, or a last assistant
        message continued (``common.chat.render_prompt_ids``)."""
        return render_prompt_ids(normalize_messages([dict(m) for m in messages]), self.tokenizer,
                                 self.chat_template, self.enable_thinking)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        """The prompt ids of a conversation (:meth:`render`), except that a conversation that continues this wrapper's last chat
        call (its messages, then an assistant message with the text of that call's response, then more) keeps
        the tokens that call generated, so that the turns of one conversation form one token sequence."""
        msgs = [dict(m) for m in messages]
        full = self.render(msgs)
        last = self.turns[-1] if self.turns else None
        if last is None or len(msgs) <= len(last.messages) + 1 or msgs[:len(last.messages)] != last.messages:
            return full
        reply = msgs[len(last.messages)]
        if reply.get("role") != "assistant" or reply.get("content") != last.response_text:
            return full
        prev = last.prompt + last.response
        if full[:len(prev)] == prev:
            return full
        with_reply = render_chat(msgs[:len(last.messages) + 1], self.tokenizer, add_generation_prompt=False)
        empty = render_chat(last.messages + [{"role": "assistant", "content": ""}], self.tokenizer,
                            add_generation_prompt=False)
        if full[:len(with_reply)] != with_reply or empty[:len(last.prompt)] != last.prompt:
            return full  # the template renders the turns apart: the model sees them as the template has them
        closing = empty[len(last.prompt):]  # what ends an assistant turn, e.g. <|im_end|>\n
        kept = next(j for j in range(len(closing), -1, -1) if j == 0 or last.response[-j:] == closing[:j])
        return prev + closing[kept:] + full[len(with_reply):]

    async def chat_async(self, messages: list[dict], **kwargs: Any) -> list[Experience]:
        prompt = self.chat_prompt(messages)
        exps = await self._sample(prompt, kwargs, messages)
        first = exps[0]
        self.turns.append(_Turn([dict(m) for m in messages], prompt, first.tokens[len(prompt):].tolist(),
                                first.logprobs.tolist(), first.response_text or "",
                                [first.sample_meta["model_version"]]))
        return exps

    def chat(self, messages: list[dict], **kwargs: Any) -> list[Experience]:
        return self._wait(self.chat_async(messages, **kwargs))

    async def generate_async(self, prompts: list[str], **kwargs: Any) -> list[Experience]:
        out: list[Experience] = []
        for p in prompts:
            out += await self._sample(list(self.tokenizer.encode(p)), kwargs)
        return out

    def generate(self, prompts: list[str], **kwargs: Any) -> list[Experience]:
        return self._wait(self.generate_async(prompts, **kwargs))

    async def get_message_token_len(self, messages: list[dict]) -> int:
        return len(self.render(messages))

    async def convert_messages_to_experience_async(self, messages: list[dict], tools: list | None = None,
                                                   temperature: float | None = None) -> Experience:
        return self.convert_messages_to_experience(messages, tools, temperature)

    def convert_messages_to_experience(self, messages: list[dict], tools: list | None = None,
                                       temperature: float | None = None) -> Experience:
        """A conversation as one experience. When this wrapper's chat calls made it (each call's prompt continues
        the calls before it): the first call's prompt, then every call's response (action mask true, its
        log-probs) and the tokens between them (the other messages: mask false, log-prob 0). Otherwise (messages
        the workflow wrote itself): the chat template's rendering of ``messages``, the assistant messages' tokens
        masked true, the log-probs unknown (None: the trainer computes them)."""
        msgs = [dict(m) for m in messages]
        chained = self._chained()
        if chained is not None:
            seq, n_prompt, mask, logprobs = chained
        else:
            seq = render_chat(msgs, self.tokenizer, add_generation_prompt=False)
            mask_full = [False] * len(seq)
            for i, m in enumerate(msgs):
                if m.get("role") == "assistant":
                    start = len(render_chat(msgs[:i], self.tokenizer, add_generation_prompt=True)) if i else 0
                    end = len(render_chat(msgs[:i + 1], self.tokenizer, add_generation_prompt=False))
                    mask_full[start:end] = [True] * (end - start)
            n_prompt = next((i for i, v in enumerate(mask_full) if v), len(seq) - 1)
            mask, logprobs = mask_full[n_prompt:], None
        return Experience(tokens=seq, prompt_length=n_prompt, logprobs=logprobs, action_mask=mask, messages=msgs,
                          prompt_text=self.tokenizer.decode(seq[:n_prompt]),
                          response_text=self.tokenizer.decode(seq[n_prompt:], skip_special_tokens=True))

    def _chained(self) -> tuple[list[int], int, list[bool], list[float]] | None:
        """(tokens, prompt length, action mask, log-probs) of this wrapper's chat calls as one conversation; None
        when there are none or a call's prompt does not continue the calls before it."""
        if not self.turns:
            return None
        seq = list(self.turns[0].prompt)
        mask: list[bool] = []
        logprobs: list[float] = []
        for turn in self.turns:
            if turn.prompt[:len(seq)] != seq:
                return None
            between = turn.prompt[len(seq):]
            seq += between + turn.response
            mask += [False] * len(between) + [True] * len(turn.response)
            logprobs += [0.0] * len(between) + turn.logprobs
        return seq, len(self.turns[0].prompt), mask, logprobs

    def logprobs(self, tokens: list[int], temperature: float | None = None):
        raise RunError("model.logprobs (log-probs of given tokens) is not offered by this project's engines; use "
                       "the logprobs of the experiences chat/generate return")

    logprobs_async = logprobs

    def extract_experience_from_history(self, clear_history: bool = True) -> list[Experience]:
        out = list(self.history)
        if clear_history:
            self.history.clear()
        return out

    @property
    def model_version(self) -> int:
        return int(getattr(self.engine, "version", getattr(self.engine, "model_version", 0)))

    @property
    async def model_version_async(self) -> int:
        return self.model_version

    @property
    def model_path(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "") or "model")

    @property
    async def model_path_async(self) -> str:
        return self.model_path

    @property
    def model_name(self) -> str:
        return self.model_path

    @property
    def api_key(self) -> str:
        return "EMPTY"

    @property
    def generate_kwargs(self) -> dict[str, Any]:
        s = self.ctx.sampling
        return {"temperature": s.temperature, "top_p": s.top_p, "max_tokens": s.max_new_tokens}

    def get_openai_client(self) -> OpenAIClient:
        if self.openai_client is None:
            self.openai_client = OpenAIClient(self)
        return self.openai_client

    def get_openai_async_client(self) -> AsyncOpenAIClient:
        if self.openai_async_client is None:
            self.openai_async_client = AsyncOpenAIClient(self)
        return self.openai_async_client

    async def set_workflow_state(self, state: dict) -> None:
        self.workflow_state.update(state)

    async def clean_workflow_state(self) -> None:
        self.workflow_state = {}
        self.history.clear()

    async def get_workflow_state(self) -> dict:
        return dict(self.workflow_state)

    def clone_with_isolated_history(self) -> ModelWrapper:
        clone = copy.copy(self)
        clone.history, clone.turns, clone.openai_client, clone.openai_async_client = [], [], None, None
        return clone


# ---------------------------------------------------------------- the OpenAI-style client


class _Namespace:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def _completion(model: ModelWrapper, exps: list[Experience]):
    """``openai``'s ChatCompletion for the experiences of one call (one choice each, with token log-probs)."""
    from openai.types.chat import ChatCompletion

    tok = model.tokenizer
    choices = []
    for i, e in enumerate(exps):
        response = e.tokens[e.prompt_length:].tolist()
        content = [{"token": tok.decode([t]), "logprob": float(lp), "bytes": None, "top_logprobs": []}
                   for t, lp in zip(response, e.logprobs.tolist(), strict=True)]
        choices.append({"index": i, "finish_reason": "length" if e.truncate_status else "stop",
                        "message": {"role": "assistant", "content": e.response_text},
                        "logprobs": {"content": content}})
    prompt_len = exps[0].prompt_length if exps else 0
    completion_len = sum(len(e.tokens) - e.prompt_length for e in exps)
    return ChatCompletion.model_validate({
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": model.model_name, "choices": choices,
        "usage": {"prompt_tokens": prompt_len, "completion_tokens": completion_len,
                  "total_tokens": prompt_len + completion_len}})


_UNSUPPORTED = ("stream", "tools", "tool_choice", "response_format", "functions")


def _check_request(kwargs: dict[str, Any]) -> None:
    bad = [k for k in _UNSUPPORTED if kwargs.get(k)]
    if bad:
        raise RunError(f"the in-process OpenAI client does not offer {', '.join(bad)} (chat.completions.create "
                       "with messages, n, temperature, top_p, max_tokens only)")


class AsyncOpenAIClient:
    """``openai.AsyncOpenAI``'s ``chat.completions.create`` and ``models.list`` over a :class:`ModelWrapper`,
    in-process; every call is recorded in the wrapper's history (``extract_experience_from_history``)."""

    def __init__(self, model: ModelWrapper) -> None:
        self._model = model
        self.model_path = model.model_path

        async def create(*, messages: list[dict], model: str | None = None, **kwargs: Any):
            _check_request(kwargs)
            exps = await self._model.chat_async(messages, **kwargs)
            return _completion(self._model, exps)

        async def list_models():
            return _Namespace(data=[_Namespace(id=self._model.model_name, object="model")])

        self.chat = _Namespace(completions=_Namespace(create=create))
        self.models = _Namespace(list=list_models)


class OpenAIClient:
    """``openai.OpenAI``'s ``chat.completions.create`` and ``models.list`` over a :class:`ModelWrapper`,
    in-process, for ``run()`` (a worker thread); every call is recorded in the wrapper's history."""

    def __init__(self, model: ModelWrapper) -> None:
        self._model = model
        self.model_path = model.model_path

        def create(*, messages: list[dict], model: str | None = None, **kwargs: Any):
            _check_request(kwargs)
            return _completion(self._model, self._model.chat(messages, **kwargs))

        self.chat = _Namespace(completions=_Namespace(create=create))
        self.models = _Namespace(list=lambda: _Namespace(data=[_Namespace(id=self._model.model_name,
                                                                          object="model")]))


# ---------------------------------------------------------------- Trinity's workflow classes


class Workflow:
    """Trinity-RFT's workflow base: subclasses implement ``run()`` (or ``run_async()`` with ``is_async``)."""

    can_reset: bool = False
    can_repeat: bool = False
    is_async: bool = False

    def __init__(self, *, task: Task, model: ModelWrapper, auxiliary_models: list | None = None) -> None:
        self.task = task
        self.model = model
        self.auxiliary_model_wrappers = auxiliary_models
        self.auxiliary_models = None
        if auxiliary_models:
            self.auxiliary_models = [m.get_openai_async_client() if type(self).is_async else m.get_openai_client()
                                     for m in auxiliary_models]
        self.run_id_base = 0
        self.logger = logging.getLogger(type(self).__module__)

    @property
    def resettable(self) -> bool:
        return type(self).can_reset

    @property
    def repeatable(self) -> bool:
        return type(self).can_repeat

    @property
    def asynchronous(self) -> bool:
        return type(self).is_async

    def reset(self, task: Task) -> None:
        raise NotImplementedError

    def set_repeat_times(self, repeat_times: int, run_id_base: int) -> None:
        raise NotImplementedError("set_repeat_times() must be implemented for a repeatable workflow")

    def run(self) -> list[Experience]:
        raise NotImplementedError

    async def run_async(self) -> list[Experience]:
        raise NotImplementedError


class MultiTurnWorkflow(Workflow):
    """A conversation made into one experience (``process_messages_to_experience``): the model's turns are
    trained on, the rest is context."""

    def set_repeat_times(self, repeat_times: int, run_id_base: int) -> None:
        self.repeat_times, self.run_id_base = repeat_times, run_id_base

    def _finish(self, exp: Experience, reward: float, info: dict, truncate_status: str | None) -> Experience:
        exp.truncate_status = exp.truncate_status or truncate_status
        exp.reward = 0.0 if exp.truncate_status == "response_truncated" else reward
        exp.info = dict(info)
        exp.metrics = {k: float(v) for k, v in info.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return exp

    def process_messages_to_experience(self, messages: list[dict], reward: float, info: dict | None = None,
                                       truncate_status: str | None = None) -> Experience:
        return self._finish(self.model.convert_messages_to_experience(messages), reward, info or {}, truncate_status)

    async def process_messages_to_experience_async(self, messages: list[dict], reward: float,
                                                   info: dict | None = None,
                                                   truncate_status: str | None = None) -> Experience:
        exp = await self.model.convert_messages_to_experience_async(messages)
        return self._finish(exp, reward, info or {}, truncate_status)


class BaseSimpleWorkflow(Workflow):
    """One chat call per task (``n`` samples), each response scored by the task's reward function."""

    def __init__(self, *, task: Task, model: ModelWrapper, auxiliary_models: list | None = None) -> None:
        self.reset(task)
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)

    def reset(self, task: Task) -> None:
        self.format_args = task.format_args
        self.system_prompt = task.format_args.system_prompt
        self.reply_prefix = task.format_args.reply_prefix
        self.reward_fn_args = task.reward_fn_args
        self.raw_task = task.raw_task
        self.task_desc = task.task_desc
        self.truth = task.truth
        reward_fn = task.reward_fn
        if not (isinstance(reward_fn, type) and issubclass(reward_fn, RewardFn)):
            raise ValueError("`reward_fn` must be a subclass of `RewardFn` (set explorer.taskset.reward_fn)")
        self.reward_fn = reward_fn(**self.reward_fn_args)

    def set_repeat_times(self, repeat_times: int, run_id_base: int) -> None:
        self.repeat_times = repeat_times
        self.task.rollout_args.n = repeat_times
        self.run_id_base = run_id_base

    @property
    def rollout_args(self) -> dict[str, Any]:
        return asdict(self.task.rollout_args)

    def format_messages(self) -> list[dict]:
        messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": self.task_desc})
        if self.reply_prefix:
            messages.append({"role": "assistant", "content": self.reply_prefix})
        return messages

    def score(self, responses: list[Experience], **extra: Any) -> list[Experience]:
        """Each response's reward: the sum of the reward function's parts, which go to its metrics and
        ``info["reward_parts"]``; ``eid.run`` numbered from ``run_id_base``."""
        for i, response in enumerate(responses):
            parts = reward_parts(self.reward_fn, response.response_text or "", self.truth, **extra)
            response.metrics.update(parts)
            response.info["reward_parts"] = parts
            response.reward = sum(parts.values())
            response.eid.run = i + self.run_id_base
        return responses


class SimpleWorkflow(BaseSimpleWorkflow):
    """``simple_workflow``: the task's prompt (after the format's system prompt) as one chat, ``n`` samples."""

    can_reset = True
    can_repeat = True

    def run(self) -> list[Experience]:
        return self.score(self.model.chat(self.format_messages(), **self.rollout_args))


class AsyncSimpleWorkflow(BaseSimpleWorkflow):
    can_reset = True
    can_repeat = True
    is_async = True

    async def run_async(self) -> list[Experience]:
        return self.score(await self.model.chat_async(self.format_messages(), **self.rollout_args))


MATH_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
    "assistant first thinks about the reasoning process in the mind and then provides the user with the answer. "
    "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, "
    "respectively, i.e.,\n<think> reasoning process here </think>\n<answer> answer here </answer>.\n")
"""``math_workflow``'s system prompt (DeepSeek-R1's), used when the task set sets none and scores with
``math_reward``."""


class MathWorkflow(SimpleWorkflow):
    """``math_workflow``: ``simple_workflow`` with ``math_reward`` by default and, with it, DeepSeek-R1's system
    prompt (:data:`MATH_SYSTEM_PROMPT`) unless the task set gives one."""

    def reset(self, task: Task) -> None:
        if task.reward_fn is None:
            task.reward_fn = MathRewardFn
        if task.reward_fn is MathRewardFn and task.format_args.system_prompt is None:
            task.format_args.system_prompt = MATH_SYSTEM_PROMPT
        super().reset(task)


class AsyncMathWorkflow(AsyncSimpleWorkflow, MathWorkflow):
    pass


MATH_BOXED_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
MATH_BOXED_THINK_PROMPT = (
    "You are a helpful assistant that solves MATH problems. You should first thinks about the reasoning process in "
    "mind and then provides the user with the answer. You should present your reasoning process using the format: "
    "<think>\n ...your reasoning process here... </think>\n first. You should always include your final answer in "
    "\\boxed{} as closed-form results.")
"""``math_boxed_workflow``'s system prompts (``workflow_args.with_think`` false / true)."""


class MathBoxedWorkflow(SimpleWorkflow):
    """``math_boxed_workflow``: answers in ``\\boxed{}``, scored by ``math_boxed_reward`` (or the task set's);
    ``workflow_args``: ``use_base`` (a plain ``System:/User:/Assistant:`` prompt through ``generate`` instead of
    a chat), ``with_think`` (ask for ``<think>`` and penalise its absence), ``format_score_coef`` (0.1)."""

    def reset(self, task: Task) -> None:
        self.format_args = task.format_args
        self.system_prompt = task.format_args.system_prompt
        self.reply_prefix = task.format_args.reply_prefix
        self.raw_task = task.raw_task
        self.task_desc = task.task_desc
        self.truth = task.truth
        self.workflow_args = task.workflow_args
        self.reward_fn_args = task.reward_fn_args
        self.use_base = self.workflow_args.get("use_base", False)
        self.with_think = self.workflow_args.get("with_think", False)
        self.format_score_coef = self.workflow_args.get("format_score_coef", 0.1)
        if self.system_prompt is None:
            self.system_prompt = MATH_BOXED_THINK_PROMPT if self.with_think else MATH_BOXED_PROMPT
        self.reward_fn = (task.reward_fn or MathBoxedRewardFn)(**self.reward_fn_args)

    def format_prompt(self) -> str:
        head = f"System:{self.system_prompt}\n" if self.system_prompt else ""
        return f"{head}User:\n{self.task_desc}\nAssistant:\n"

    def _score(self, responses: list[Experience]) -> list[Experience]:
        for i, response in enumerate(responses):
            parts = reward_parts(self.reward_fn, response.response_text or "", self.truth,
                                 with_think=self.with_think, format_score_coef=self.format_score_coef,
                                 response_token=response.tokens[response.prompt_length:])
            response.metrics.update(parts)
            response.info["reward_parts"] = parts
            response.reward = sum(parts.values())
            response.eid.run = i + self.run_id_base
        return responses

    def run(self) -> list[Experience]:
        if self.use_base:
            return self._score(self.model.generate([self.format_prompt()], **self.rollout_args))
        return self._score(self.model.chat(self.format_messages(), **self.rollout_args))


class AsyncMathBoxedWorkflow(MathBoxedWorkflow):
    is_async = True

    async def run_async(self) -> list[Experience]:
        if self.use_base:
            return self._score(await self.model.generate_async([self.format_prompt()], **self.rollout_args))
        return self._score(await self.model.chat_async(self.format_messages(), **self.rollout_args))


# ---------------------------------------------------------------- conversion and the adapter


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it (tensors and arrays as lists, unknown objects as text)."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def to_experience(exp: Experience, task: OurTask, model: ModelWrapper, workflow_name: str) -> OurExperience:
    """One Trinity experience as ours (module docstring). ValueError naming what is wrong with it."""
    if not isinstance(exp, Experience):
        raise ValueError(f"workflow {workflow_name} returned a {type(exp).__name__}; a workflow returns a list of "
                         "Experience (trinity_like.explorer.trinity_api.Experience)")
    if exp.tokens is None:
        raise ValueError(f"workflow {workflow_name} returned an Experience without tokens")
    tokens = exp.tokens.to(torch.int64).numpy()
    n_prompt = exp.prompt_length
    if not 0 < n_prompt < len(tokens):
        raise ValueError(f"workflow {workflow_name} returned an Experience whose prompt_length {n_prompt} leaves "
                         f"no response in its {len(tokens)} tokens")
    n = len(tokens) - n_prompt
    if exp.reward is None:
        raise ValueError(f"workflow {workflow_name} returned an Experience without a reward; set exp.reward")
    logprobs = None if exp.logprobs is None else exp.logprobs.to(torch.float32).numpy()
    if logprobs is not None and len(logprobs) != n:
        raise ValueError(f"workflow {workflow_name} returned an Experience with {len(logprobs)} logprobs for {n} "
                         "response tokens; give one per response token (tokens[prompt_length:])")
    mask = None if exp.action_mask is None else exp.action_mask.to(torch.bool).numpy()
    if mask is not None and len(mask) != n:
        raise ValueError(f"workflow {workflow_name} returned an Experience with an action_mask of {len(mask)} "
                         f"entries for {n} response tokens")
    if mask is not None and mask.all():
        mask = None
    meta = exp.sample_meta
    if meta:
        version, token_versions = meta["model_version"], meta["token_versions"]
    else:  # built by the workflow: the oldest version among the model's samples of this run
        version, token_versions = min(model.versions, default=model.model_version), None
    metrics = {k: float(v) for k, v in (exp.metrics or {}).items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    info = {"ground_truth": _plain(task.answer), "data_source": task.data_source, **_plain(exp.info or {}),
            "trinity_run": exp.eid.run}
    if metrics:
        info["metrics"] = metrics
    tok = model.tokenizer
    return OurExperience(
        prompt_ids=tokens[:n_prompt], response_ids=tokens[n_prompt:], action_mask=mask, logprobs=logprobs,
        reward=float(exp.reward), model_version=version, token_versions=token_versions, engine_id=meta.get("engine_id"),
        truncated=exp.truncate_status == "response_truncated", task_id=task.task_id,
        prompt_text=exp.prompt_text if exp.prompt_text is not None else tok.decode(tokens[:n_prompt].tolist()),
        response_text=exp.response_text if exp.response_text is not None
        else tok.decode(tokens[n_prompt:].tolist(), skip_special_tokens=True),
        messages=_plain(exp.messages) if isinstance(exp.messages, list) else None, info=info)


class TrinityWorkflowAdapter(OurWorkflow):
    """One of our workflows that runs a Trinity workflow class ``cls`` on each task (module docstring)."""

    def __init__(self, cls: type, name: str = "") -> None:
        self.cls = cls
        self.name = name or cls.__name__

    async def _run(self, task: OurTask, engine, ctx: WorkflowContext, run_index: int, repeat: int
                   ) -> tuple[ModelWrapper, list[Experience]]:
        ttask = trinity_task(task, ctx, self.cls)
        fmt = ttask.format_args
        thinking = task.enable_thinking if task.enable_thinking is not None else fmt.enable_thinking
        model = ModelWrapper(engine, ctx, run_index, asyncio.get_running_loop(),
                             task.chat_template or fmt.chat_template, thinking)
        wf = self.cls(task=ttask, model=model, auxiliary_models=None)
        if getattr(self.cls, "can_repeat", False):
            wf.set_repeat_times(repeat, 0)
        is_async = getattr(wf, "asynchronous", getattr(type(wf), "is_async", False))
        exps = await wf.run_async() if is_async else await asyncio.to_thread(wf.run)
        if not isinstance(exps, list) or not exps:
            got = "an empty list" if isinstance(exps, list) else type(exps).__name__
            raise ValueError(f"workflow {self.name} returned {got}; run() returns a non-empty list of Experience")
        return model, exps

    async def run(self, task: OurTask, engine, ctx: WorkflowContext) -> list[OurExperience]:
        if getattr(self.cls, "can_repeat", False):
            runs = [await self._run(task, engine, ctx, 0, ctx.repeat_times)]
        else:
            runs = list(await asyncio.gather(*(self._run(task, engine, ctx, r, 1) for r in range(ctx.repeat_times))))
            for r, (_, exps) in enumerate(runs):
                for e in exps:
                    if isinstance(e, Experience):
                        e.eid.run = r
        return [to_experience(e, task, model, self.name) for model, exps in runs for e in exps]


# ---------------------------------------------------------------- the registry


def is_trinity_workflow(obj: Any) -> bool:
    """A class written for Trinity: a subclass of :class:`Workflow`, or one with ``run``/``run_async`` whose
    ``__init__`` takes ``task`` and ``model``."""
    if not isinstance(obj, type):
        return False
    if issubclass(obj, Workflow):
        return True
    if issubclass(obj, OurWorkflow):
        return False
    try:
        params = inspect.signature(obj.__init__).parameters
    except (TypeError, ValueError):
        return False
    return {"task", "model"} <= set(params) and (hasattr(obj, "run") or hasattr(obj, "run_async"))


def trinity_workflow_problem(cls: type, name: str) -> str | None:
    """None when ``cls`` has Trinity's workflow shape; else what is wrong, in one clause."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return None
    names = set(params)
    has_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if not has_kwargs and not {"task", "model"} <= names:
        return (f"workflow {name!r} ({cls.__module__}.{cls.__qualname__}) has __init__({', '.join(list(params)[1:])}); "
                "a Trinity workflow's is __init__(self, *, task, model, auxiliary_models=None)")
    if not has_kwargs and "auxiliary_models" not in names:
        return (f"workflow {name!r} ({cls.__qualname__}) has no auxiliary_models argument; a Trinity workflow's "
                "__init__ is (self, *, task, model, auxiliary_models=None)")
    is_async = bool(getattr(cls, "is_async", False))
    method = "run_async" if is_async else "run"
    impl = getattr(cls, method, None)
    if impl is None or impl is getattr(Workflow, method):
        return (f"workflow {name!r} ({cls.__qualname__}) has is_async = {is_async} but does not implement "
                f"{method}(); implement it (or set is_async to {not is_async})")
    if is_async and not inspect.iscoroutinefunction(impl):
        return f"workflow {name!r} ({cls.__qualname__}) has is_async = True but its run_async is not `async def`"
    if getattr(cls, "can_repeat", False) and getattr(cls, "set_repeat_times", None) is Workflow.set_repeat_times:
        return (f"workflow {name!r} ({cls.__qualname__}) has can_repeat = True but does not implement "
                "set_repeat_times(repeat_times, run_id_base)")
    return None


def _mirror(name: str, obj: Any) -> None:
    """Register a Trinity workflow (or one of ours) into the explorer's registry under ``name``; a refused name
    stays in this registry only (``load_workflow`` says why it cannot run)."""
    if isinstance(obj, Refused):
        return
    if is_trinity_workflow(obj):
        entry: Callable = functools.partial(TrinityWorkflowAdapter, obj, name)
    elif isinstance(obj, type) and issubclass(obj, OurWorkflow):
        entry = obj
    else:
        raise TypeError(f"workflow {name!r}: {obj!r} is neither a Trinity workflow class nor one of ours")
    if name in OUR_WORKFLOWS:
        OUR_WORKFLOWS._entries.pop(name)  # register_module(force=True) replaces it
    OUR_WORKFLOWS.register(name)(entry)


WORKFLOWS = TrinityRegistry("workflow", on_register=_mirror)
"""Trinity-RFT's workflow registry: ``@WORKFLOWS.register_module("name")`` makes a Trinity workflow class (or one
of ours) a workflow of the explorer under ``name`` (``explorer.workflow`` / ``explorer.taskset.workflow``)."""

for _name, _cls in {"simple_workflow": SimpleWorkflow, "async_simple_workflow": AsyncSimpleWorkflow,
                    "math_workflow": MathWorkflow, "async_math_workflow": AsyncMathWorkflow,
                    "math_boxed_workflow": MathBoxedWorkflow,
                    "async_math_boxed_workflow": AsyncMathBoxedWorkflow}.items():
    WORKFLOWS.register_module(_name, _cls)
del _name, _cls
