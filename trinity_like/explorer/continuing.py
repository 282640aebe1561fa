"""The engine fleet as a workflow sees it under streaming rollout with ``explorer.stream.on_new_version:
resubmit``: its calls are interruptible (vLLM's async engine cuts them when a version loads and continues them on
it), and with ``chunk_tokens`` each generate (or chat) call is generated in pieces of at most that many new
tokens, so that a version loaded between two pieces makes the rest of the response on any engine (AReaL's
interruptible generation at chunk granularity: the prompt plus the tokens so far go back to an engine, which goes
on from there).

Every token carries the version of the weights that made it (``Sample.token_versions``); ``model_version`` is
the oldest. A piece continues the request's own random stream at its offset (``RolloutEngine.generate``'s
``offsets``), so on unchanged weights an ``hf`` response cut into pieces is the uncut one (up to the prefill's
rounding at each cut; its behaviour log-probs are those of the weights that made each token, which is what the
corrections need). Evaluation and the step path never come here: their samples have one version each.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from trinity_like.config import SamplingConfig
from trinity_like.explorer.engines.base import Sample


class ContinuingEngine:
    """``generate`` and ``chat`` of an ``EngineFleet``, interruptible, in pieces of ``chunk_tokens`` new tokens
    each (0: whole responses)."""

    def __init__(self, fleet: Any, chunk_tokens: int = 0, interruptible: bool = True) -> None:
        if chunk_tokens < 0:
            raise ValueError(f"chunk_tokens must be >= 0, got {chunk_tokens}")
        self.fleet, self.chunk_tokens, self.interruptible = fleet, chunk_tokens, interruptible
        self.pieces = 0
        """Engine calls made (one per piece of every request still going); above the number of generate calls
        when responses were cut."""

    def __getattr__(self, name: str) -> Any:  # version, health, ...: the fleet's own
        return getattr(self.fleet, name)

    async def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int]) -> list[Sample]:
        first = await self._piece(prompts, sampling, seeds, [[] for _ in prompts])
        return await self._go_on(prompts, sampling, seeds, first)

    async def chat(self, messages: list[dict[str, str]], sampling: SamplingConfig, seed: int) -> Sample:
        piece = self._piece_sampling(sampling, 0)
        first = await self.fleet.chat(messages, piece, seed, self.interruptible)
        self.pieces += 1
        prompt = [int(t) for t in first.prompt_ids]
        sample = (await self._go_on([prompt], sampling, [seed], [[first]]))[0]
        sample.prompt_ids = first.prompt_ids
        return sample

    def _piece_sampling(self, sampling: SamplingConfig, done: int) -> SamplingConfig:
        left = sampling.max_new_tokens - done
        return dataclasses.replace(sampling, max_new_tokens=min(self.chunk_tokens or left, left))

    async def _piece(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int],
                     so_far: list[list[Sample]]) -> list[list[Sample]]:
        """One more piece of every request (all have the same number of tokens so far)."""
        done = _length(so_far[0])
        samples = await self.fleet.generate([list(p) + _ids(s) for p, s in zip(prompts, so_far, strict=True)],
                                            self._piece_sampling(sampling, done), seeds, [done] * len(prompts),
                                            self.interruptible)
        self.pieces += 1
        return [s + [new] for s, new in zip(so_far, samples, strict=True)]

    async def _go_on(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int],
                     pieces: list[list[Sample]]) -> list[Sample]:
        """Generate the next piece of every request cut at a piece's end until each stopped or reached
        ``max_new_tokens``; join each request's pieces."""
        while True:
            going = [i for i, ps in enumerate(pieces) if _cut(ps, sampling.max_new_tokens)]
            if not going:
                return [_joined(ps) for ps in pieces]
            more = await self._piece([prompts[i] for i in going], sampling, [seeds[i] for i in going],
                                     [pieces[i] for i in going])
            for i, ps in zip(going, more, strict=True):
                pieces[i] = ps


def _ids(pieces: list[Sample]) -> list[int]:
    return [int(t) for p in pieces for t in p.response_ids]


def _length(pieces: list[Sample]) -> int:
    return sum(len(p.response_ids) for p in pieces)


def _cut(pieces: list[Sample], max_new_tokens: int) -> bool:
    """The request's last piece ended at the piece's limit, short of the response's: it goes on."""
    return pieces[-1].finish_reason == "length" and _length(pieces) < max_new_tokens


def _joined(pieces: list[Sample]) -> Sample:
    """One sample of a request's pieces: ids, log-probs and each token's version concatenated; ``model_version``
    the oldest; ``token_versions`` None when one version made them all."""
    versions = np.concatenate([np.full(len(p.response_ids), p.model_version, np.int32) if p.token_versions is None
                               else np.asarray(p.token_versions, np.int32) for p in pieces])
    last = pieces[-1]
    if len(pieces) == 1:
        return last
    one = len(set(versions.tolist())) <= 1
    return Sample(response_ids=np.concatenate([p.response_ids for p in pieces]).astype(np.int32),
                  logprobs=np.concatenate([p.logprobs for p in pieces]).astype(np.float32),
                  finish_reason=last.finish_reason, model_version=int(versions.min()),
                  token_versions=None if one else versions, time_s=sum(p.time_s for p in pieces),
                  prompt_ids=pieces[0].prompt_ids, engine_id=last.engine_id)
