"""EMULATION, not an engine: the time a continuous-batching GPU engine (vLLM) would take, on a virtual clock, for
measuring the scheduler and the control plane at a scale this machine cannot hold (issue 51; docs/design.md,
"Measuring at scale on one machine"). It never generates a token of a model and never stands in for a real engine
in a test of the engine.

``BatchServer`` is one engine's server: ``max_seqs`` slots; requests wait in arrival order for a slot; one decode
iteration advances every active request by one token and costs ``iter_floor_s + active x iter_per_seq_s``, plus,
in the iteration a request joins, the prefill of what it brings (its prompt, and the tokens it had generated before
when it is resubmitted after an abort or a weight load emptied the cache: ``prefill_s_per_token`` each). A weight
load takes ``load_s``, during which nothing decodes, and empties the cache: every request still active pays its
prefill again when decoding resumes (``keep``-style continuation; ``abort`` returns the tokens so far for a
``resubmit``).

Event-driven: ``advance_to(t)`` jumps from event to event (a request finishing, a request joining) in whole runs of
identical iterations, so the CPU it costs grows with the events, not with the tokens (``events`` counts them).
Lengths are given per request by the caller (seeded there, so two rollout modes draw the same ones).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CostCurve:
    """What one emulated engine's work costs, in seconds."""

    name: str
    iter_floor_s: float
    """One decode iteration at any batch size (reading the weights once)."""
    iter_per_seq_s: float
    """Each active sequence's share of an iteration (its matmuls and KV-cache reads)."""
    prefill_s_per_token: float
    """Prefill of one token of a request joining the batch."""
    load_s: float
    """A weight load (nothing decodes meanwhile)."""
    max_seqs: int
    """Slots: requests decoded at once (vLLM's ``max_num_seqs``)."""

    def iteration_s(self, active: int, prefill_tokens: int = 0) -> float:
        return self.iter_floor_s + active * self.iter_per_seq_s + prefill_tokens * self.prefill_s_per_token


CURVES = {
    "7b_h100": CostCurve("7b_h100", iter_floor_s=5.9e-3, iter_per_seq_s=87e-6, prefill_s_per_token=2.57e-5,
                         load_s=0.67, max_seqs=256),
}
"""Named curves. ``7b_h100``: bench/simulate.py's projection for Qwen2.5-7B's shape on one H100 SXM (decode floor =
15.2 GB of bf16 weights / (3.35 TB/s x 0.77); 87 us per sequence; prefill 2 x 7.62e9 FLOP per token at 60% of 989
TFLOP/s = 25.7 us, 13 ms for a 512-token prompt; a 15.2 GB broadcast load 0.67 s; vLLM's 256 slots)."""


@dataclass
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

    def load(self) -> None:
        """A weight load: ``load_s`` with nothing decoding, then an empty cache (every request prefills again)."""
        self.now += self.curve.load_s
        self.busy_s += self.curve.load_s
        for req in (*self.active, *self.waiting):
            req.needs_prefill = True

    def next_event_s(self) -> float:
        """When the next request would finish with no new submissions (inf: nothing to do)."""
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
                k = min(k, 1 + int((t - self.now - first) // step))  # as many as end by t
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
