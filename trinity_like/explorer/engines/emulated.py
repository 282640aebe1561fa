"""EMULATION, not an engine: the time a continuous-batching GPU engine (vLLM) would take, on a virtual clock, for
measuring the scheduler and the control plane at a scale this machine cannot hold (issue 51; docs/design.md,
"Measuring at scale on one machine"). It never generates a token of a model and never stands in for a real engine
in a test of the engine.

``BatchServer`` is one engine's server: ``max_seqs`` slots; requests wait in arrival order for a slot; one decode
iteration advances every active request by one token and costs ``iter_floor_s + active x iter_per_seq_s``, plus,
in the iteration a request joins, the prefill of what it brings (its prompt, and the tokens it had generated before
when it is resubmitted after an abort or a weight load emptied the cache: ``prefill_s_per_token`` each). A weight
load takes ``load_s``, during which nothing decodes, and empties the cache: every request still active pays its
prefill again when decoding resumes (``abort`` returns the tokens so far for a ``resubmit``); a ``keep`` load
leaves the cache as it was, and the requests go on without prefill.

Event-driven: ``advance_to(t)`` jumps from event to event (a request finishing, a request joining) in whole runs of
identical iterations, so the CPU it costs grows with the events, not with the tokens (``events`` counts them).
Lengths are given per request by the caller (seeded there, so two rollout modes draw the same ones).

``EmulatedEngine`` puts one ``BatchServer`` behind the async engine interface, on real time (virtual time =
``time.monotonic()`` since the engine started; one asyncio task per engine sleeps to the next event). A request's
response is drawn from its seed alone (``EmulatedVocabulary.response``): a geometric length of mean
``explorer.emulated.mean_response_tokens`` capped at ``max_response_tokens`` and at the call's ``max_new_tokens``,
ids of the model's vocabulary (``stop`` ends on its EOS), every log-prob ``EMULATED_LOGPROB``. Prefill is charged
for ``explorer.emulated.prompt_tokens``, not for the prompt ids sent. Weights are read and checked through the real
path (``read_weights``, the published fingerprint); a load takes the curve's ``load_s`` under
``explorer.stream.on_new_version``: ``finish`` drains first, ``resubmit`` cuts and re-prefills, ``keep`` pauses
and goes on. ``EmulatedEngineHost`` hosts many engines in one Ray actor; ``HostedEngine`` is the fleet's handle of
one of them, so ``EngineFleet`` sees each as an engine of its own.

Usage (a run or a benchmark of the control plane; refused for ``serve``, ``bench`` and evaluation)::

    explorer.engine: emulated
    explorer.num_engines: 64
    explorer.emulated: {curve: 7b_h100, engines_per_actor: 16, prompt_tokens: 51, mean_response_tokens: 200,
                        max_response_tokens: 819}
    explorer.rollout: stream            # and explorer.stream.on_new_version: finish | resubmit | keep
    model.path: <the tiny model>        # its tokenizer and vocabulary only: no weights are loaded
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trinity_like.common.emulated_curves import CURVES, CostCurve
from trinity_like.config import SamplingConfig
from trinity_like.explorer.engines.base import ChatByGenerate, LoadGate, Sample, check_fingerprint
from trinity_like.runtime.schedule import on_new_version
from trinity_like.weights.fingerprint import received_fingerprint, weights_fingerprint
from trinity_like.weights.messages import WeightsInfo
from trinity_like.weights.receive import read_weights

logger = logging.getLogger(__name__)


@dataclass(eq=False)  # one request is itself: list.remove by identity, not by comparing every field
class Request:
    rid: str
    prompt_len: int
    target_len: int
    """Tokens it generates before it finishes (the caller's seeded draw)."""
    generated: int = 0
    arrived_at: float = 0.0
    """It joins the first iteration that starts at or after this time."""
    needs_prefill: bool = True
    """Its context is not in the cache: it pays prefill of prompt + generated when it next joins an iteration."""
    finished_at: float | None = None


@dataclass
class BatchServer:
    """One emulated engine on a virtual clock (``now``, seconds); see the module docstring."""

    curve: CostCurve
    now: float = 0.0
    busy_s: float = 0.0
    """Seconds spent decoding, prefilling or loading (the engine's busy share is busy_s / now)."""
    events: int = 0
    """Runs of identical iterations processed: the emulation's CPU cost grows with these, not with tokens."""
    waiting: deque[Request] = field(default_factory=deque)
    active: list[Request] = field(default_factory=list)

    def submit(self, rid: str, prompt_len: int, target_len: int, generated: int = 0, at: float | None = None) -> None:
        """Queue a request arriving at ``at`` (default ``now``); ``generated`` tokens it brings from before (a
        resubmitted request: prefilled again)."""
        if target_len < 1 or generated >= target_len:
            raise ValueError(f"request {rid}: target_len {target_len} must exceed the {generated} tokens it brings")
        self.waiting.append(Request(rid, prompt_len, target_len, generated, self.now if at is None else at))

    def abort(self, rid: str) -> int:
        """Take a request out, waiting or active; the tokens it had generated (for a resubmit)."""
        for queue in (self.active, self.waiting):
            for req in list(queue):
                if req.rid == rid:
                    queue.remove(req)
                    return req.generated
        raise KeyError(rid)

    def load(self, keep: bool = False, at: float | None = None) -> None:
        """A weight load starting at ``at`` (default ``now``): ``load_s`` with nothing decoding. Without ``keep``
        (``finish``, ``resubmit``) the cache is empty after it: every request still here prefills its prompt and
        tokens so far again. With ``keep`` (vLLM's ``pause_generation(mode="keep")``, PipelineRL's continuation on
        the old KV cache) the requests go on where they were, with no prefill. An ``at`` after ``now`` (a load
        arriving during an iteration) drops that iteration's partial work: it runs again after the load."""
        self.now = max(self.now, self.now if at is None else at) + self.curve.load_s
        self.busy_s += self.curve.load_s
        if not keep:
            for req in (*self.active, *self.waiting):
                req.needs_prefill = True

    def next_event_s(self) -> float:
        """When the next request would finish with no new submissions (inf: nothing to do)."""
        batch, prefill = self._batch()
        taken = {id(r) for r in batch}
        if batch and not (len(batch) < self.curve.max_seqs and any(id(r) not in taken for r in self.waiting)):
            # nobody joins before the first finish (what advance_to runs): the common case, without a probe
            step = self.curve.iteration_s(len(batch))
            k = min(r.target_len - r.generated for r in batch)
            return self.now + step + prefill * self.curve.prefill_s_per_token + (k - 1) * step
        probe = BatchServer(self.curve, self.now)
        probe.active = [Request(r.rid, r.prompt_len, r.target_len, r.generated, r.arrived_at, r.needs_prefill)
                        for r in self.active]
        probe.waiting = deque(Request(r.rid, r.prompt_len, r.target_len, r.generated, r.arrived_at, r.needs_prefill)
                              for r in self.waiting)
        while probe.active or probe.waiting:
            if probe.advance_to(math.inf, stop_at_finish=True):
                return probe.now
        return math.inf

    def advance_to(self, t: float, stop_at_finish: bool = False) -> list[Request]:
        """Run whole iterations that end by ``t``; the requests finished, in order. ``now`` ends at the end of the
        last iteration run, or at ``t`` when the server has nothing to do before it. ``stop_at_finish``: return at
        the first iteration a request finishes in."""
        done: list[Request] = []
        while self.active or self.waiting:
            batch, prefill = self._batch()
            if not batch:  # idle until the next arrival
                arrival = min(r.arrived_at for r in self.waiting)
                if arrival > t:
                    break
                self.now = arrival
                continue
            step = self.curve.iteration_s(len(batch))
            first = step + prefill * self.curve.prefill_s_per_token
            if self.now + first > t:
                return done
            k = min(r.target_len - r.generated for r in batch)  # iterations until the next finish
            if math.isfinite(t):
                k = min(k, max(1, 1 + int((t - self.now - first) // step)))  # as many as end by t (>= 1: the
                # first ends by t, though t - now - first may round below 0 where now + first <= t did not)
            taken = {id(r) for r in batch}
            later = [r.arrived_at for r in self.waiting if id(r) not in taken]
            if later and len(batch) < self.curve.max_seqs:  # a free slot: stop at the boundary the next one joins
                k = min(k, max(1, 1 + math.ceil((min(later) - self.now - first) / step)))
            self.events += 1
            self.active = batch
            for r in batch:
                r.needs_prefill = False
                r.generated += k
            self.waiting = deque(r for r in self.waiting if id(r) not in taken)
            elapsed = first + (k - 1) * step
            self.now += elapsed
            self.busy_s += elapsed
            finished = [r for r in batch if r.generated >= r.target_len]
            for r in finished:
                r.finished_at = self.now
                self.active.remove(r)
                done.append(r)
            if stop_at_finish and finished:
                return done
        if math.isfinite(t):
            self.now = max(self.now, t)
        return done

    def _batch(self) -> tuple[list[Request], int]:
        """The requests of the next iteration (the active ones, then waiting ones in order into free slots) and the
        prefill tokens it pays."""
        batch = list(self.active)
        for req in self.waiting:
            if len(batch) >= self.curve.max_seqs:
                break
            if req.arrived_at <= self.now:
                batch.append(req)
        prefill = sum(r.prompt_len + r.generated for r in batch if r.needs_prefill)
        return batch, prefill


# ---------------------------------------------------------------------- the engine on real time

EMULATED_LOGPROB = -1.0
"""The behaviour log-prob of every emulated token (no model scored it)."""


def response_length(seed: int, mean_tokens: float, max_tokens: int) -> tuple[int, bool]:
    """The response length request ``seed`` draws: geometric on 1, 2, ... with mean ``mean_tokens``, capped at
    ``max_tokens``; and whether the response ended by itself (``stop``) rather than at the cap. A function of the
    seed alone, so every rollout mode (and every engine) draws the same length for the same task and repeat."""
    rng = np.random.default_rng(seed % 2**64)
    length = int(rng.geometric(1.0 / mean_tokens)) if mean_tokens > 1 else 1
    return (length, True) if length < max_tokens else (max_tokens, False)


class EmulatedVocabulary:
    """What emulated responses are made of: ids of the model's vocabulary (``config.json``'s ``vocab_size``) other
    than its stop ids, and the stop id a response that ends by itself ends with (the model's first EOS)."""

    def __init__(self, size: int, stop_ids: tuple[int, ...]) -> None:
        self.size, self.stop_ids = size, stop_ids
        self.allowed = np.setdiff1d(np.arange(size), np.asarray(stop_ids)).astype(np.int32)
        """Ids a response draws from (every id but the stop ids)."""

    @classmethod
    def of(cls, model_path: str) -> EmulatedVocabulary:
        import json
        from pathlib import Path

        from trinity_like.common.tokenizer import eos_token_ids

        config = json.loads((Path(model_path) / "config.json").read_text())
        size = int(config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size"))
        return cls(size, tuple(eos_token_ids(model_path)) or (size - 1,))

    def response(self, seed: int, offset: int, max_new_tokens: int, mean_tokens: float,
                 max_tokens: int) -> tuple[np.ndarray, str]:
        """Tokens ``offset`` to ``offset + n`` of request ``seed``'s emulated response (``n``: what is left of its
        drawn length, at most ``max_new_tokens``) and the finish reason: ``stop`` (the response ends here, on the
        stop id) or ``length`` (cut by ``max_new_tokens`` or the cap)."""
        length, ends = response_length(seed, mean_tokens, max_tokens)
        rng = np.random.default_rng([seed % 2**64, 1])
        full = self.allowed[rng.integers(0, len(self.allowed), max(length, offset + 1))]
        left = max(1, length - offset)  # a continuation past the end: one last token
        n = min(left, max_new_tokens)
        ids = full[offset:offset + n].copy()
        if n == left and ends:
            ids[-1] = self.stop_ids[0]
            return ids, "stop"
        return ids, "length"


@dataclass
class _Running:
    """One request in an engine's server: its future resolves with (tokens generated, whether it was cut)."""

    future: asyncio.Future
    segments: list[tuple[int, int]]
    """(first token, version) of each stretch of the response made by one version (a ``keep`` load adds one)."""
    live: bool
    """A ``resubmit`` load may cut it (an interruptible call)."""


class EmulatedEngine(ChatByGenerate, LoadGate):
    """EMULATION of a continuous-batching GPU engine behind the async engine interface (``agenerate``, ``achat``,
    ``aupdate_weights``, ``health``, ``weights_fingerprint``; as ``AsyncVLLMEngine``): requests join one
    ``BatchServer`` whose virtual clock is real time since the engine started (``time.monotonic()`` - origin), and
    a call returns when its requests finish there. No model runs: see the module docstring for what a sample holds.

    The prompt ids a call sends are not what it is charged for: every request pays prefill of
    ``explorer.emulated.prompt_tokens`` (the emulated layout's prompt; a workflow's task prompts are short), plus
    its ``offset`` (a continuation's response tokens so far, sent back with the prompt)."""

    def __init__(self, cfg, engine_id: str, vocabulary: EmulatedVocabulary | None = None,
                 curve: CostCurve | None = None) -> None:
        """``curve``: in place of ``explorer.emulated.curve``'s (tests' small curves)."""
        em = cfg.explorer.emulated
        self.curve = curve or CURVES[em.curve]
        self.engine_id = engine_id
        self.model_path = cfg.model.path
        self.vocabulary = vocabulary or EmulatedVocabulary.of(cfg.model.path)
        self.prompt_tokens, self.mean_response_tokens = em.prompt_tokens, em.mean_response_tokens
        self.max_response_tokens = em.max_response_tokens
        self.on_new_version = on_new_version(cfg)
        """``finish``: a load closes the gate and waits for the running requests; ``resubmit``: it cuts the
        interruptible ones, which continue after it (prefill of prompt + tokens so far); ``keep``: it pauses
        decoding for ``load_s`` under the running requests, which go on where they were."""
        self.server = BatchServer(self.curve)
        self.origin = time.monotonic()
        """Real time of the server's virtual time 0."""
        self.model_version = 0
        self.fingerprint = ""
        self.weights: dict[str, Any] = {}
        """The version's state dict as read (the emulated trainer publishes a small one)."""
        self.last_load_bytes = 0
        self.served = self.cuts = self.loads = self.finished = 0
        self.late_s_max = self.late_s_sum = 0.0
        """How late requests were resolved after the virtual time they finished at (the process kept up when both
        stay within milliseconds: a busy host answers late, and the emulation is void)."""
        self._running: dict[str, _Running] = {}
        """Requests in the server now, by request id: what ``_advance`` resolves and a load cuts or re-stamps."""
        self._next_rid = 0
        self._gate_init()
        self._wake: asyncio.Event | None = None
        """Wakes the serving loop before its next event: a request joined or left."""
        self._loop: asyncio.Task | None = None
        self._load_lock: asyncio.Lock | None = None
        """One load at a time (the fleet sends one anyway)."""

    # ------------------------------------------------------------ the clock
    def _vnow(self) -> float:
        return time.monotonic() - self.origin

    def _advance(self) -> None:
        """Run the server up to now; resolve the requests that finished."""
        now = self._vnow()
        for req in self.server.advance_to(now + 1e-9):
            late = max(0.0, now - req.finished_at)
            self.late_s_max, self.late_s_sum, self.finished = max(self.late_s_max, late), self.late_s_sum + late, \
                self.finished + 1
            run = self._running.pop(req.rid, None)
            if run is not None and not run.future.done():
                run.future.set_result((req.generated, False))

    async def _serve(self) -> None:
        """Sleep until the server's next event (or a request joins or leaves), advance, resolve: the CPU cost grows
        with the events, not with the tokens."""
        try:
            while True:
                self._advance()
                delay = self.server.next_event_s() - self._vnow()
                self._wake.clear()
                if delay <= 0:
                    await asyncio.sleep(0)
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), None if math.isinf(delay) else delay)
        except Exception as e:  # noqa: BLE001 - every waiting request fails with it, loudly
            logger.exception("emulated engine %s: its serving loop failed", self.engine_id)
            for run in self._running.values():
                if not run.future.done():
                    run.future.set_exception(e)
            self._running.clear()
            raise

    def _started(self) -> None:
        if self._loop is None or self._loop.done():
            self._wake = self._wake or asyncio.Event()
            self._loop = asyncio.ensure_future(self._serve())

    # ------------------------------------------------------------ the gate (LoadGate)
    async def _cut_running(self) -> None:
        if self.on_new_version == "resubmit":  # the interruptible ones, with their tokens so far
            self._cut_live()

    def _cut_live(self) -> None:
        self._advance()
        for rid, run in list(self._running.items()):
            if run.live:
                generated = self.server.abort(rid)
                del self._running[rid]
                run.future.set_result((generated, True))
        if self._wake is not None:
            self._wake.set()

    # ------------------------------------------------------------ generation
    async def _request(self, prompt_len: int, n: int, live: bool) -> list[tuple[int, int]]:
        """One request of ``n`` tokens through the server, continued after every cut; its version segments."""
        generated, segments = 0, []
        while True:
            await self._enter()
            try:
                self._started()
                self._advance()
                rid = f"{self.engine_id}-{self._next_rid}"
                self._next_rid += 1
                segments.append((generated, self.model_version))
                run = _Running(asyncio.get_running_loop().create_future(), segments, live)
                self._running[rid] = run
                self.server.submit(rid, prompt_len, n, generated, at=self._vnow())
                self._wake.set()
                try:
                    generated, cut = await run.future
                except asyncio.CancelledError:  # its caller went away (a timeout): out of the batch, as vLLM does
                    if self._running.pop(rid, None) is not None:
                        self.server.abort(rid)
                        self._wake.set()
                    raise
            finally:
                self._leave()
            if not cut:
                return segments
            self.cuts += 1

    async def agenerate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int],
                        offsets: list[int] | None = None, interruptible: bool = False) -> list[Sample]:
        """One emulated response per prompt (``EmulatedVocabulary.response``: length and ids by the seed), when
        the server says it would have finished. ``interruptible`` under ``resubmit``: a load may cut the requests,
        which go on after it (their later tokens stamped with the new version in ``token_versions``)."""
        if not prompts or len(seeds) != len(prompts):
            raise ValueError(f"generate needs non-empty prompts and one seed each, got {len(prompts)} prompts and "
                             f"{len(seeds)} seeds")
        start = time.perf_counter()
        offsets = offsets or [0] * len(prompts)
        drawn = [self.vocabulary.response(seed, k, sampling.max_new_tokens, self.mean_response_tokens,
                                          self.max_response_tokens) for seed, k in zip(seeds, offsets, strict=True)]
        live = interruptible and self.on_new_version == "resubmit"
        segments = await asyncio.gather(*(self._request(self.prompt_tokens + k, len(ids), live)
                                          for (ids, _), k in zip(drawn, offsets, strict=True)))
        elapsed = time.perf_counter() - start
        self.served += len(prompts)
        samples = []
        for (ids, reason), parts in zip(drawn, segments, strict=True):
            versions = np.empty(len(ids), np.int32)
            for first, version in parts:
                versions[first:] = version
            mixed = len(set(versions.tolist())) > 1
            samples.append(Sample(response_ids=ids, logprobs=np.full(len(ids), EMULATED_LOGPROB, np.float32),
                                  finish_reason=reason, model_version=int(versions.min()),
                                  token_versions=versions if mixed else None, time_s=elapsed,
                                  engine_id=self.engine_id))
        return samples

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        self._tokenizer = self._tokenizer or _tokenizer(self.model_path)
        return super().chat_prompt(messages)

    # ------------------------------------------------------------ weights
    async def aupdate_weights(self, update: WeightsInfo) -> None:
        """Read the version through the real path (``read_weights``: files, object store or shared buffer) and check
        it against the published fingerprint (``WeightsMismatch``: refused, the previous version serves), then load
        it as ``on_new_version`` says; the load takes the curve's ``load_s``."""
        received = await asyncio.to_thread(read_weights, update)
        got = received_fingerprint(received.state_dict, update.fingerprint, received.checked)
        check_fingerprint(got, update, self.engine_id, self.model_version, "received")
        self._load_lock = self._load_lock or asyncio.Lock()
        async with self._load_lock:
            if self.on_new_version == "keep":
                self._advance()
                made = {r.rid: r.generated for r in (*self.server.active, *self.server.waiting)}
                for rid, run in self._running.items():
                    run.segments.append((made[rid], update.version))
                self.server.load(keep=True, at=self._vnow())
                self._take(update, received, got)  # requests joining during the pause run on it
                if self._wake is not None:
                    self._wake.set()
                await asyncio.sleep(max(0.0, self.server.now - self._vnow()))
            else:
                async with self._exclusive():
                    self._advance()
                    self.server.load(at=self._vnow())
                    await asyncio.sleep(max(0.0, self.server.now - self._vnow()))
                    self._take(update, received, got)
        self.loads += 1

    def _take(self, update: WeightsInfo, received, got: str) -> None:
        self.weights, self.last_load_bytes = received.state_dict, received.bytes
        self.model_version, self.fingerprint = update.version, update.fingerprint or got

    def weights_fingerprint(self) -> str:
        return weights_fingerprint(self.weights)

    def health(self) -> dict[str, Any]:
        return {"engine_id": self.engine_id, "model_version": self.model_version, "served": self.served,
                "busy": bool(self._in_flight or self._updating), "in_flight": self._in_flight,
                "fingerprint": self.fingerprint, "verified": True, "backend": "emulated", "emulated": True,
                "curve": self.curve.name, "cuts": self.cuts, "loads": self.loads,
                "emulated_busy_s": self.server.busy_s, "emulated_events": self.server.events,
                "emulated_now_s": self._vnow(), "emulated_late_s_max": self.late_s_max,
                "emulated_late_s_mean": self.late_s_sum / max(1, self.finished)}


@functools.lru_cache(maxsize=4)
def _tokenizer(model_path: str):
    """One tokenizer per process for the chat template (a host actor's engines share it)."""
    from trinity_like.common.tokenizer import hf_tokenizer

    return hf_tokenizer(model_path)


# ---------------------------------------------------------------------- many engines per process

class EmulatedEngineHost:
    """EMULATION: one Ray actor (an async actor: every call runs concurrently on its event loop) hosting ``count``
    ``EmulatedEngine``s, engines ``first`` to ``first + count - 1`` of the fleet. Every method takes the engine's
    index in this host first; the fleet calls them through ``HostedEngine``, its handle of one engine."""

    def __init__(self, cfg, first: int, count: int) -> None:
        from trinity_like.common.offline import set_offline_env

        set_offline_env()
        vocabulary = EmulatedVocabulary.of(cfg.model.path)
        self.engines = [EmulatedEngine(cfg, f"emulated-{first + k}", vocabulary) for k in range(count)]
        import torch

        weights_fingerprint({"warm": torch.zeros(1)})  # its first call is slow: not in the first load's time

    async def generate(self, k: int, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int],
                       offsets: list[int] | None = None, interruptible: bool = False) -> list[Sample]:
        return await self.engines[k].agenerate(prompts, sampling, seeds, offsets, interruptible)

    async def chat(self, k: int, messages: list[dict[str, str]], sampling: SamplingConfig, seed: int,
                   interruptible: bool = False) -> Sample:
        return await self.engines[k].achat(messages, sampling, seed, interruptible)

    async def update_weights(self, k: int, info: WeightsInfo) -> dict[str, Any]:
        engine = self.engines[k]
        await engine.aupdate_weights(info)
        return {"version": engine.model_version, "bytes": engine.last_load_bytes, "fingerprint": engine.fingerprint}

    async def health(self, k: int) -> dict[str, Any]:
        return self.engines[k].health()

    async def weights_fingerprint(self, k: int) -> str:
        return self.engines[k].weights_fingerprint()

    async def pid(self, k: int = 0) -> int:
        return os.getpid()


class HostedEngine:
    """The fleet's handle of engine ``index`` of an ``EmulatedEngineHost`` actor: ``engine.generate.remote(*args)``
    is ``host.generate.remote(index, *args)``, so the fleet calls it as it calls an engine actor."""

    def __init__(self, host: Any, index: int) -> None:
        self.host, self.index = host, index

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return _HostedMethod(getattr(self.host, name), self.index)


@dataclass(frozen=True)
class _HostedMethod:
    method: Any
    index: int

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.method.remote(self.index, *args, **kwargs)


def hosted_engines(cfg) -> list[HostedEngine]:
    """``explorer.num_engines`` emulated engines in ``ceil(num_engines / explorer.emulated.engines_per_actor)``
    host actors (the last may hold fewer), one handle each. The actors ask Ray for no CPU and no GPU (an idle
    emulated engine costs nothing; a busy one one event at a time), and may run many calls at once."""
    import ray

    from trinity_like.common.placement import actor_options

    per = cfg.explorer.emulated.engines_per_actor
    host_cls = ray.remote(num_cpus=0, num_gpus=0, max_restarts=-1, max_task_retries=0,
                          max_concurrency=100_000)(EmulatedEngineHost)
    engines: list[HostedEngine] = []
    for first in range(0, cfg.explorer.num_engines, per):
        count = min(per, cfg.explorer.num_engines - first)
        host = host_cls.options(**actor_options(cfg.explorer.node)).remote(cfg, first, count)
        engines += [HostedEngine(host, k) for k in range(count)]
    return engines
