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

import asyncio
import dataclasses
import logging
from typing import Any

import numpy as np
import pyarrow as pa

from trinity_like.buffer.partial import PARTIAL_SCHEMA, PartialStore
from trinity_like.config import SamplingConfig
from trinity_like.explorer.engines.base import Sample

logger = logging.getLogger(__name__)


class ContinuingEngine:
    """``generate`` and ``chat`` of an ``EngineFleet``, interruptible, in pieces of ``chunk_tokens`` new tokens
    each (0: whole responses); with a ``journal`` (one group's), every piece is recorded, and a call the journal
    holds is taken up where it was."""

    def __init__(self, fleet: Any, chunk_tokens: int = 0, interruptible: bool = True,
                 journal: GroupJournal | None = None, counts: dict[str, int] | None = None) -> None:
        if chunk_tokens < 0:
            raise ValueError(f"chunk_tokens must be >= 0, got {chunk_tokens}")
        self.fleet, self.chunk_tokens, self.interruptible = fleet, chunk_tokens, interruptible
        self.journal = journal
        self.counts = counts if counts is not None else {"pieces": 0}
        """``pieces``: engine calls made (one per piece of every request still going); shared by the engines of
        one explorer's groups."""
        self._calls = 0

    @property
    def pieces(self) -> int:
        return self.counts["pieces"]

    def __getattr__(self, name: str) -> Any:  # version, health, ...: the fleet's own
        return getattr(self.fleet, name)

    async def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int]) -> list[Sample]:
        call = self._next_call()
        pieces = self.journal.resumed(call, seeds) if self.journal is not None else None
        if pieces is None:
            pieces = await self._piece(prompts, sampling, seeds, [[] for _ in prompts])
            self._record(call, seeds, pieces)
        return await self._go_on(call, prompts, sampling, seeds, pieces)

    async def chat(self, messages: list[dict[str, str]], sampling: SamplingConfig, seed: int) -> Sample:
        call = self._next_call()
        pieces = self.journal.resumed(call, [seed]) if self.journal is not None else None
        if pieces is None:
            first = await self.fleet.chat(messages, self._piece_sampling(sampling, 0), seed, self.interruptible)
            self.counts["pieces"] += 1
            pieces = [[first]]
            self._record(call, [seed], pieces)
        prompt = [int(t) for t in pieces[0][0].prompt_ids]
        sample = (await self._go_on(call, [prompt], sampling, [seed], pieces))[0]
        sample.prompt_ids = pieces[0][0].prompt_ids
        return sample

    def new_attempt(self) -> None:
        """The workflow starts (again, after a failed attempt): its calls are numbered from 0, and those the
        journal holds are taken up again."""
        self._calls = 0
        if self.journal is not None:
            self.journal.rewind()

    def _next_call(self) -> int:
        call, self._calls = self._calls, self._calls + 1
        return call

    def _record(self, call: int, seeds: list[int], pieces: list[list[Sample]]) -> None:
        if self.journal is not None:
            self.journal.record(call, seeds, [_joined(ps) for ps in pieces])

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
        self.counts["pieces"] += 1
        return [s + [new] for s, new in zip(so_far, samples, strict=True)]

    async def _go_on(self, call: int, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int],
                     pieces: list[list[Sample]]) -> list[Sample]:
        """Generate the next piece of every request cut at a piece's end until each stopped or reached
        ``max_new_tokens`` (requests with as many tokens so far share an engine call), recording each round;
        join each request's pieces."""
        while True:
            going = [i for i, ps in enumerate(pieces) if _cut(ps, sampling.max_new_tokens)]
            if not going:
                return [_joined(ps) for ps in pieces]
            by_length: dict[int, list[int]] = {}
            for i in going:
                by_length.setdefault(_length(pieces[i]), []).append(i)
            rounds = await asyncio.gather(*(
                self._piece([prompts[i] for i in idx], sampling, [seeds[i] for i in idx], [pieces[i] for i in idx])
                for idx in by_length.values()))
            for idx, more in zip(by_length.values(), rounds, strict=True):
                for i, ps in zip(idx, more, strict=True):
                    pieces[i] = ps
            self._record(call, seeds, pieces)


class GroupJournal:
    """One group's engine calls in a ``PartialStore``: what ``ContinuingEngine`` records as it goes and finds
    again after a restart. A workflow whose calls follow from its seeds and earlier results (``single_turn``,
    ``guess_number``) makes the same calls again, and each is taken up where it was; at the first call that differs
    (another seed) the rest of the journal is dropped and generated afresh."""

    def __init__(self, store: PartialStore, step: int, position: int, min_version: int) -> None:
        """A journal holding a token older than ``min_version`` (the version the group's admission needs now:
        after a long outage) is dropped: the group is generated again (``discarded``)."""
        self.store, self.step, self.position = store, step, position
        self.calls: dict[int, tuple[list[int], list[Sample]]] = {}
        """call -> (seeds, one joined sample per request): the journal's content."""
        self.resumed_tokens = 0
        """Tokens taken from the journal instead of generated."""
        self.discarded = False
        table = store.load(step, position)
        if table is not None:
            self.calls = _calls_of(table)
            oldest = min((int(v) for _, samples in self.calls.values() for s in samples
                          for v in _versions(s)), default=min_version)
            if oldest < min_version:
                self.calls, self.discarded = {}, True
                store.drop_group(step, position)
        self._stored = dict(self.calls)

    def resumed(self, call: int, seeds: list[int]) -> list[list[Sample]] | None:
        """The pieces so far of call ``call`` as the journal holds them (one sample per request), if it holds that
        call with these seeds; else None (and what it held from this call on is forgotten)."""
        stored = self._stored.pop(call, None)
        if stored is None:
            return None
        if stored[0] != list(seeds):
            logger.warning("explorer step %d group %d: call %d differs from its journal (seeds); generating it and "
                           "the rest afresh", self.step, self.position, call)
            self._stored = {}
            return None
        self.resumed_tokens += sum(len(s.response_ids) for s in stored[1])
        return [[s] for s in stored[1]]

    def rewind(self) -> None:
        """Offer every recorded call again (a workflow's next attempt makes them again)."""
        self._stored = dict(self.calls)

    def record(self, call: int, seeds: list[int], samples: list[Sample]) -> None:
        self.calls[call] = (list(seeds), samples)
        rows = [{"call": c, "request": r, "seed": seed, "prompt_ids": _list(s.prompt_ids),
                 "response_ids": _list(s.response_ids), "logprobs": _list(s.logprobs, float),
                 "token_versions": _versions(s), "finish_reason": s.finish_reason}
                for c, (seeds_, samples_) in sorted(self.calls.items())
                for r, (seed, s) in enumerate(zip(seeds_, samples_, strict=True))]
        self.store.record(self.step, self.position, pa.Table.from_pylist(rows, schema=PARTIAL_SCHEMA))


def _list(a, kind=int) -> list | None:
    return None if a is None else [kind(x) for x in a]


def _versions(s: Sample) -> list[int]:
    if s.token_versions is not None:
        return [int(v) for v in s.token_versions]
    return [int(s.model_version)] * len(s.response_ids)


def _calls_of(table: pa.Table) -> dict[int, tuple[list[int], list[Sample]]]:
    calls: dict[int, tuple[list[int], list[Sample]]] = {}
    for row in sorted(table.to_pylist(), key=lambda r: (r["call"], r["request"])):
        versions = np.asarray(row["token_versions"], np.int32)
        sample = Sample(response_ids=np.asarray(row["response_ids"], np.int32),
                        logprobs=np.asarray(row["logprobs"], np.float32), finish_reason=row["finish_reason"],
                        model_version=int(versions.min()) if len(versions) else 0,
                        token_versions=versions if len(set(versions.tolist())) > 1 else None,
                        prompt_ids=None if row["prompt_ids"] is None else np.asarray(row["prompt_ids"], np.int32))
        seeds, samples = calls.setdefault(row["call"], ([], []))
        seeds.append(int(row["seed"]))
        samples.append(sample)
    return calls


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
