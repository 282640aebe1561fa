"""bench/simulate.py: the cost model's parts against closed forms and hand-worked values, and the event simulation
against loop times worked by hand for layouts simple enough to reason about (every response one token long)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "simulate.py"
sys.path.insert(0, str(_PATH.parent))  # the scripts import bench/benchlib.py as their neighbour
_spec = importlib.util.spec_from_file_location("bench_simulate", _PATH)
sim = importlib.util.module_from_spec(_spec)
sys.modules["bench_simulate"] = sim  # dataclasses resolve their module by name
_spec.loader.exec_module(sim)


# ---------------------------------------------------------------------------------------------------------------
# Lengths
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p,max_len", [(0.1, 50), (0.02, 128), (0.5, 4)])
def test_lengths_mean_is_the_truncated_geometric_mean(p: float, max_len: int) -> None:
    # E[min(G, m)] for G ~ Geometric(p) on {1, 2, ...} = sum_{i=0}^{m-1} (1-p)^i = (1 - (1-p)^m) / p
    lengths = sim.Lengths(p, max_len, prompt_len=0)
    assert lengths.mean() == pytest.approx((1 - (1 - p) ** max_len) / p, rel=1e-12)


def test_lengths_from_mean_inverts_mean_and_rejects_impossible_means() -> None:
    lengths = sim.Lengths.from_mean(37.8, 128, prompt_len=16)
    assert lengths.mean() == pytest.approx(37.8, rel=1e-9)
    with pytest.raises(ValueError, match="max_len=128"):
        sim.Lengths.from_mean(128.0, 128, prompt_len=16)


def test_lengths_quantile_and_truncation_by_hand() -> None:
    # p = 0.5, max 4: P(L=1) = 1/2, P(L=2) = 1/4, P(L=3) = 1/8, P(L=4) = 1/8 (truncated)
    lengths = sim.Lengths(0.5, 4, prompt_len=0)
    assert lengths.quantile(0.4) == 1
    assert lengths.quantile(0.6) == 2
    assert lengths.quantile(0.8) == 3
    assert lengths.quantile(0.9) == 4
    # E[L (L+1) / 2] / E[L] = (1/2 * 1 + 1/4 * 3 + 1/8 * 6 + 1/8 * 10) / (1/2 + 2/4 + 3/8 + 4/8) = 3.25 / 1.875
    assert lengths.token_weighted_mean_position() == pytest.approx(3.25 / 1.875)


def test_lengths_expected_max_matches_sampling() -> None:
    lengths = sim.Lengths.from_mean(37.8, 128, prompt_len=16)
    draws = lengths.sample(np.random.default_rng(0), 64 * 4000).reshape(4000, 64)
    assert draws.max() <= 128 and draws.min() >= 1
    assert lengths.expected_max(64) == pytest.approx(draws.max(axis=1).mean(), rel=0.01)
    assert lengths.expected_max(1) == pytest.approx(lengths.mean())


# ---------------------------------------------------------------------------------------------------------------
# Engine and trainer costs
# ---------------------------------------------------------------------------------------------------------------


def _engine(padded: bool, max_seqs: int, prefill: float = 0.0) -> sim.EngineCost:
    return sim.EngineCost(iter_floor_s=1.0, iter_per_seq_s=0.1, prefill_s_per_prompt=prefill, padded=padded,
                          max_seqs=max_seqs)


def test_engine_continuous_batching_closed_form_by_hand() -> None:
    # lengths 3, 1, 2 all in the batch: 3 iterations of 1 s, 6 sequence-iterations of 0.1 s, 2 prompts of 0.5 s
    assert _engine(False, 8, prefill=0.5).step_s(np.array([3, 1, 2]), prompts=2) == pytest.approx(3 + 0.6 + 1.0)


def test_engine_queued_sequences_take_freed_slots_by_hand() -> None:
    # 2 slots, lengths 3, 1, 2: iteration 0-1 has 2 active (1.2 s each); the third sequence takes the slot freed at
    # 1 and ends at 3; iterations 1-3 have 2 active: 2 x 1.2 s. Total 3.6 s.
    assert _engine(False, 2).step_s(np.array([3, 1, 2]), prompts=0) == pytest.approx(3.6)
    # with as many slots as sequences the queue and the closed form agree
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 50, 40)
    engine = _engine(False, 40)
    assert engine._queued_s(lengths) == pytest.approx(engine.step_s(lengths, prompts=0))


def test_engine_padded_batch_decodes_to_its_longest_by_hand() -> None:
    # 2 slots, 3 sequences: 2 waves, each 3 iterations (the longest) with 2 active: 2 x 3 x 1.2 s
    assert _engine(True, 2).step_s(np.array([3, 1, 2]), prompts=0) == pytest.approx(7.2)
    assert _engine(True, 2).step_s(np.array([], dtype=int), prompts=0) == 0.0


def test_trainer_cost_padded_and_packed_by_hand() -> None:
    lengths = np.array([1, 5, 2, 2])
    # micro-batches of 2: (5 + 5) padded to 5 plus a prompt of 3 each -> 2 x 8 + 2 x 5 = 26 tokens
    padded = sim.TrainerCost(s_per_token=0.5, allreduce_s=7.0, micro_batch=2)
    assert padded.step_s(lengths, prompt_len=3, num_workers=1) == pytest.approx(13.0)
    # packed: 10 response + 12 prompt tokens over 2 workers, plus the all-reduce
    packed = sim.TrainerCost(s_per_token=0.5, allreduce_s=7.0, micro_batch=0)
    assert packed.step_s(lengths, prompt_len=3, num_workers=2) == pytest.approx(22 / 2 * 0.5 + 7.0)


# ---------------------------------------------------------------------------------------------------------------
# The event simulation
# ---------------------------------------------------------------------------------------------------------------


def _layout(gen_s: float, train_s: float, *, load_s: float = 0.0, publish_s: float = 0.0, poll_s: float = 1e-6,
            lockstep_s: float = 0.0, engines: int = 1) -> sim.Layout:
    """Every response one token (p = 1), 4 prompts x 2 samples: a step generates in ``gen_s`` and trains in
    ``train_s``; no buffer or Synchronizer cost unless given."""
    rows = 8
    return sim.Layout(
        num_engines=engines, num_workers=1, prompts_per_step=4, samples_per_prompt=2,
        lengths=sim.Lengths(1.0, 16, prompt_len=0),
        engine=sim.EngineCost(iter_floor_s=gen_s, iter_per_seq_s=0.0, prefill_s_per_prompt=0.0, padded=True,
                              max_seqs=rows),
        trainer=sim.TrainerCost(s_per_token=train_s / rows, allreduce_s=0.0, micro_batch=0),
        sync=sim.SyncCost(publish_s=publish_s, load_s=load_s, gather_window_s=0.0, call_s=0.0,
                          explorer_calls_per_step=3),
        buffer=sim.BufferCost(write_s_per_row=0.0, read_s_per_row=0.0, read_fixed_s=0.0, poll_s=poll_s),
        lockstep_s=lockstep_s)


def test_sync_mode_alternates_the_phases() -> None:
    # per step: generate 2, train 1, publish 0.1, driver 0.05, then the engine loads 0.2 before every step but the
    # first (it starts at version 0): 10 x 3.15 + 9 x 0.2
    result = sim.simulate(_layout(2.0, 1.0, load_s=0.2, publish_s=0.1, lockstep_s=0.05), steps=10, max_staleness=None)
    assert result.loop_s == pytest.approx(10 * 3.15 + 9 * 0.2)
    assert result.staleness_mean == 0.0
    assert result.samples_per_s == pytest.approx(80 / result.loop_s)


def test_async_explorer_bound_pipeline_by_hand() -> None:
    # generation 2 s, training 1 s, bound 1: the explorer never waits (step k needs version k-1, done at 2k + 1 <
    # 2k), so the loop is 10 generations plus the last training: 21 s; sync takes 30 s.
    layout = _layout(2.0, 1.0)
    asynchronous = sim.simulate(layout, steps=10, max_staleness=1)
    assert asynchronous.loop_s == pytest.approx(21.0, abs=1e-4)
    assert asynchronous.waits_s["admission"] == pytest.approx(0.0)
    assert asynchronous.busy["engines"] == pytest.approx(20 / 21, abs=1e-4)
    assert sim.simulate(layout, steps=10, max_staleness=None).loop_s == pytest.approx(30.0)


def test_async_trainer_bound_holds_the_staleness_bound() -> None:
    # generation 1 s, training 2 s: the trainer is busy from t = 1 on (10 x 2 s + the first generation = 21 s) and
    # the explorer is held by admission: step k starts when version k - bound exists.
    for bound in (1, 2, 4):
        result = sim.simulate(_layout(1.0, 2.0), steps=10, max_staleness=bound)
        assert result.loop_s == pytest.approx(21.0, abs=1e-4)
        assert result.staleness_mean <= bound
        assert result.waits_s["admission"] > 0
    # a wider bound lets the explorer run further ahead: staleness grows with it
    stale = [sim.simulate(_layout(1.0, 2.0), steps=10, max_staleness=b).staleness_mean for b in (1, 2, 4)]
    assert stale[0] < stale[1] < stale[2]


def test_async_reader_sees_rows_at_its_next_poll() -> None:
    # the trainer starts waiting at 0 and polls every 0.3 s: the first rows (written at 1.0) are seen at 1.2; it
    # trains the 2 steps back to back after that (2 s each, the second generation ends at 2.0): 1.2 + 4 = 5.2
    result = sim.simulate(_layout(1.0, 2.0, poll_s=0.3), steps=2, max_staleness=1)
    assert result.loop_s == pytest.approx(5.2)
    assert result.waits_s["data"] == pytest.approx(1.2)


def test_weight_loads_are_taken_between_steps_only_when_a_newer_version_exists() -> None:
    # async, generation 2 s, training 1 s, loads 0.5 s: version j is published at 2j + 1 or later (its rows are
    # written at 2j, training takes 1 s); steps 0 and 1 (from 0 and 2) run on version 0, every later step finds
    # a newer version than its engine's and loads first: 10 - 2 = 8 loads
    result = sim.simulate(_layout(2.0, 1.0, load_s=0.5), steps=10, max_staleness=1)
    assert result.busy["weight_sync"] * result.loop_s == pytest.approx(8 * 0.5)


def test_fleet_step_is_set_by_its_slowest_engine() -> None:
    # 4 prompts on 3 engines: 2, 1, 1 prompts; a padded engine costs the same whatever its batch here, so the
    # fleet's step equals one engine's and the engines' mean busy share equals the fleet's
    layout = _layout(2.0, 1.0, engines=3)
    parts = sim.explore_steps(layout, 3, 0)
    assert all(fleet == pytest.approx(2.0) and mean == pytest.approx(2.0) for fleet, mean, _ in parts)


def test_calibration_reproduces_the_measured_sync_loop() -> None:
    # the calibration layout is built from the sync run's phases: simulating that sync run gives back its loop
    # time (a bookkeeping check), and the async prediction is a speed-up between 1 and the ideal of the phases
    run = sim.RUN_C
    layout = sim.calibration_layout(run)
    sync = sim.mean_result(layout, run.steps, None, range(5))
    assert sync.loop_s == pytest.approx(run.loop_s, rel=0.02)
    asynchronous = sim.mean_result(layout, run.steps, 1, range(5))
    ideal = (run.gen_s + run.train_s) / max(run.gen_s, run.train_s)
    assert 1.0 < sync.loop_s / asynchronous.loop_s < ideal
    assert math.isfinite(asynchronous.staleness_mean) and 0 < asynchronous.staleness_mean <= 1


def test_shared_cpu_processor_sharing_by_hand() -> None:
    # one free core: job A (2 s of work) starts at 0, job B (0.5 s) at 1. A runs alone until 1 (1 s left), then
    # both at half a core: B ends at 2 (A has 0.5 s left), then A alone ends at 2.5
    clock = sim.Sim(cpu_cores=1.0)
    ends: dict[str, float] = {}

    def job(name: str, start_s: float, work_s: float):
        yield start_s
        yield sim.Work(work_s)
        ends[name] = clock.now

    clock.start(job("a", 0.0, 2.0))
    clock.start(job("b", 1.0, 0.5))
    clock.run()
    assert ends == pytest.approx({"a": 2.5, "b": 2.0})


def test_shared_cpu_gives_a_lone_job_one_core_and_shares_what_the_rest_leaves() -> None:
    # 2 cores, the rest of the system on 0.5: two 1-second jobs together run at 0.75 of a core each -> 4/3 s;
    # one alone runs at full speed (it wants one core)
    for jobs, end in ((2, 4 / 3), (1, 1.0)):
        clock = sim.Sim(cpu_cores=2.0, other_cores=0.5)
        ends: list[float] = []

        def job(clock: sim.Sim = clock, ends: list[float] = ends):
            yield sim.Work(1.0)
            ends.append(clock.now)

        for _ in range(jobs):
            clock.start(job())
        clock.run()
        assert ends == pytest.approx([end] * jobs)
    with pytest.raises(ValueError, match="other_cores"):
        sim.Sim(cpu_cores=2.0, other_cores=2.0)


def test_async_on_one_shared_core_gains_nothing_over_sync() -> None:
    # with a single core for both roles the work (10 x (2 + 1) s) cannot overlap: async is no faster than sync,
    # and each role's compute is stretched while the other one computes
    from dataclasses import replace

    layout = replace(_layout(2.0, 1.0), cpu_cores=1.0)
    asynchronous = sim.simulate(layout, steps=10, max_staleness=1)
    assert asynchronous.loop_s >= 30.0 - 1e-6
    assert asynchronous.stretch["engines"] > 1.0 and asynchronous.stretch["trainer"] > 1.0
    # with two free cores nothing is stretched and the pipeline of the own-core case comes back
    roomy = sim.simulate(replace(layout, cpu_cores=2.0), steps=10, max_staleness=1)
    assert roomy.loop_s == pytest.approx(21.0, abs=1e-4)
    assert roomy.stretch == pytest.approx({"engines": 1.0, "trainer": 1.0})


# ---------------------------------------------------------------------------------------------------------------
# Streaming rollout
# ---------------------------------------------------------------------------------------------------------------


def _constant_layout(gen_s: float, train_s: float, *, padded: bool, length: int = 16) -> sim.Layout:
    """Every response ``length`` tokens (p ~ 0: every draw truncated), 4 prompts x 2 samples, an iteration costs
    ``gen_s / length`` whatever the batch (``iter_per_seq_s`` 0), room for every admitted sequence; no sync,
    buffer or Synchronizer cost."""
    rows = 8
    return sim.Layout(
        num_engines=1, num_workers=1, prompts_per_step=4, samples_per_prompt=2,
        lengths=sim.Lengths(1e-12, length, prompt_len=0),
        engine=sim.EngineCost(iter_floor_s=gen_s / length, iter_per_seq_s=0.0, prefill_s_per_prompt=0.0,
                              padded=padded, max_seqs=64),
        trainer=sim.TrainerCost(s_per_token=train_s / (rows * length), allreduce_s=0.0, micro_batch=0),
        sync=sim.SyncCost(publish_s=0.0, load_s=0.0, gather_window_s=0.0, call_s=0.0, explorer_calls_per_step=3),
        buffer=sim.BufferCost(write_s_per_row=0.0, read_s_per_row=0.0, read_fixed_s=0.0, poll_s=1e-6),
        lockstep_s=0.0)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("on_new_version", ["finish", "resubmit"])
def test_stream_equals_step_async_when_the_trainer_bounds_and_iterations_cost_the_same(
        padded: bool, on_new_version: str) -> None:
    """Constant lengths, an iteration that costs the same whatever it holds (generation G = 1 s for any number of
    groups), training T = 2 s, S = 1. Step-async: the trainer is busy from G on, 1 + 10 x 2 = 21 s. Stream: steps 0
    and 1 are admitted at t = 0 (r < (0 + 1 + 1) x 8) and end together at 1; trainer step 0 runs 1-3, version 1
    loads at 3 and admits step 2, done at 4 < 5 when trainer step 1 ends; each later step k is admitted at
    version k - 1 (at 2k - 1) and done at 2k, before the trainer reaches it at 2k + 1: the trainer never waits,
    1 + 10 x 2 = 21 s again. The equality is exact in this model (continuous batching and a pooled padded call
    alike, both load rules: nothing runs when a version is published); it is not with ``iter_per_seq_s`` > 0,
    where stream's first batch holds two steps and ends later, nor when generation bounds (below)."""
    layout = _constant_layout(1.0, 2.0, padded=padded)
    options = sim.StreamOptions(on_new_version)
    step = sim.simulate(layout, steps=10, max_staleness=1)
    stream = sim.simulate(layout, steps=10, max_staleness=1, rollout="stream", stream=options)
    assert step.loop_s == pytest.approx(21.0, abs=1e-4)
    assert stream.samples_per_s == pytest.approx(step.samples_per_s, rel=1e-4)
    assert stream.stale_dropped == 0 and stream.staleness_max <= 1


def test_stream_with_free_concurrency_beats_step_async_when_generation_bounds() -> None:
    # G = 2, T = 1, S = 1, iterations that cost the same for any batch: step-async generates one step at a time
    # (10 x 2 + 1 = 21 s); stream runs steps 0 and 1 as one batch (both end at 2), so its loop is shorter
    layout = _constant_layout(2.0, 1.0, padded=True)
    step = sim.simulate(layout, steps=10, max_staleness=1)
    stream = sim.simulate(layout, steps=10, max_staleness=1, rollout="stream")
    assert step.loop_s == pytest.approx(21.0, abs=1e-4)
    assert stream.loop_s < step.loop_s - 0.5


def _long_tail_layout(floor_s: float, per_seq_s: float, *, padded: bool = False) -> sim.Layout:
    """A long tail (mean 20, max 200 tokens), 8 prompts x 4 samples, room for every sequence, a cheap trainer
    (0.02 s a step) and loads: generation bounds."""
    rows = 32
    return sim.Layout(
        num_engines=1, num_workers=1, prompts_per_step=8, samples_per_prompt=4,
        lengths=sim.Lengths.from_mean(20.0, 200, prompt_len=0),
        engine=sim.EngineCost(iter_floor_s=floor_s, iter_per_seq_s=per_seq_s, prefill_s_per_prompt=0.0,
                              padded=padded, max_seqs=256),
        trainer=sim.TrainerCost(s_per_token=0.02 / (rows * 20), allreduce_s=0.0, micro_batch=0),
        sync=sim.SyncCost(publish_s=0.01, load_s=0.01, gather_window_s=0.0, call_s=0.0, explorer_calls_per_step=3),
        buffer=sim.BufferCost(write_s_per_row=0.0, read_s_per_row=0.0, read_fixed_s=0.0, poll_s=0.01),
        lockstep_s=0.0)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("bound", [1, 2, 4])
@pytest.mark.parametrize("on_new_version", ["finish", "resubmit"])
def test_stream_capacity_keeps_every_trained_row_within_the_bound(padded: bool, bound: int,
                                                                  on_new_version: str) -> None:
    # every group starts on a version the capacity rule admits (v >= r // rows - S), and no trained row is staler
    # than S: the trainer takes rows of version >= c - S only, oldest first, as the reader does
    layout = _long_tail_layout(1e-3, 1e-4, padded=padded)
    for seed in range(3):
        result = sim.simulate(layout, steps=12, max_staleness=bound, seed=seed, rollout="stream",
                              stream=sim.StreamOptions(on_new_version, chunk_tokens=16 if padded else 0))
        assert result.capacity_held
        assert 0 <= result.staleness_mean <= result.staleness_max <= bound
        assert result.samples_per_s > 0


def test_stream_gains_over_step_async_with_a_large_floor_and_less_with_a_tiny_one() -> None:
    # generation-bound long tail on a continuous-batching engine: with a large per-iteration floor a step's tail
    # (few sequences, each iteration at full floor cost) is what stream removes by keeping the batch full; with a
    # tiny floor an iteration costs by the sequences in it, the tail is cheap and the gain shrinks
    def gain(floor_s: float, per_seq_s: float) -> float:
        layout = _long_tail_layout(floor_s, per_seq_s)
        step = sim.mean_result(layout, 16, 1, range(4))
        stream = sim.mean_result(layout, 16, 1, range(4), "stream", sim.StreamOptions("resubmit"))
        return stream.samples_per_s / step.samples_per_s

    large, tiny = gain(5e-3, 1e-4), gain(1e-5, 1e-4)
    assert large > 1.0
    assert tiny < large


def test_stream_options_and_rollout_are_checked() -> None:
    layout = _constant_layout(1.0, 1.0, padded=False)
    with pytest.raises(ValueError, match="finish"):
        sim.StreamOptions("later")
    with pytest.raises(ValueError, match="'step' or 'stream'"):
        sim.simulate(layout, steps=2, max_staleness=1, rollout="streaming")
    with pytest.raises(ValueError, match="async"):
        sim.simulate(layout, steps=2, max_staleness=None, rollout="stream")


def test_split_iteration_keeps_the_step_figures_of_a_padded_engine() -> None:
    # the calibration engine has no floor; splitting its iteration as M3 did keeps floor + rows x per_seq, so the
    # step-mode loop is the same, and the floor / per-sequence ratio is M3's
    layout = sim.calibration_layout(sim.RUN_M1)
    split = sim.split_iteration(layout, *sim.HF_ITERATION_M3)
    rows = layout.rows_per_step
    assert split.engine.iter_floor_s + rows * split.engine.iter_per_seq_s == pytest.approx(rows * layout.engine.iter_per_seq_s)
    assert split.engine.iter_floor_s / split.engine.iter_per_seq_s == pytest.approx(
        sim.HF_ITERATION_M3[0] / sim.HF_ITERATION_M3[1])
    assert sim.simulate(split, 8, 1).loop_s == pytest.approx(sim.simulate(layout, 8, 1).loop_s)


# ---------------------------------------------------------------------------------------------------------------
# Iteration-accurate engines: the EMULATED engine's model (issue 51)
# ---------------------------------------------------------------------------------------------------------------

from trinity_like.explorer.engines.emulated import BatchServer, CostCurve  # noqa: E402

_CURVE = CostCurve("test", iter_floor_s=5.9e-3, iter_per_seq_s=87e-6, prefill_s_per_token=2.57e-5, load_s=0.67,
                   max_seqs=8)


@pytest.mark.parametrize("seed", range(4))
def test_iteration_server_times_equal_batch_servers(seed: int) -> None:
    """Both servers driven by the same calls (arrivals at random times, more requests than slots, loads with and
    without keep, a request cut and resubmitted with its tokens so far): every request finishes at the same time,
    to 1e-9 s, and the servers end at the same clock."""
    rng = np.random.default_rng(seed)
    ref, fast = BatchServer(_CURVE), sim.IterationServer(_CURVE)
    finished_ref: dict[str, float] = {}
    finished_fast: dict[str, float] = {}
    live: dict[str, sim._Req] = {}
    t, n = 0.0, 0

    def advance(to: float) -> None:
        for r in ref.advance_to(to):
            finished_ref[r.rid] = r.finished_at
        for r in fast.advance_to(to):
            finished_fast[r.owner] = r.finished_at
            live.pop(r.owner, None)

    for _ in range(30):
        t += float(rng.exponential(0.05))
        advance(t)
        action = rng.random()
        if action < 0.7:
            for _ in range(int(rng.integers(1, 4))):
                rid, prompt, target = f"r{n}", int(rng.integers(1, 60)), int(rng.integers(1, 40))
                n += 1
                ref.submit(rid, prompt, target, at=t)
                live[rid] = fast.submit(n, prompt, target, at=t, owner=rid)
        elif action < 0.85:
            keep = bool(rng.random() < 0.5)
            ref.load(keep=keep, at=t)
            fast.load(keep=keep, at=t)
        elif live:
            rid = sorted(live)[0]
            req = live.pop(rid)
            got = ref.abort(rid)
            assert fast.abort(req) == got
            if got + 1 < req.target:
                ref.submit(rid + "'", req.prompt_len, req.target, got, at=t)
                live[rid + "'"] = fast.submit(10_000 + n, req.prompt_len, req.target, got, at=t, owner=rid + "'")
                n += 1
    advance(math.inf)
    assert finished_fast.keys() == finished_ref.keys() and len(finished_ref) > 10
    for rid, when in finished_ref.items():
        assert finished_fast[rid] == pytest.approx(when, abs=1e-9)
    assert fast.now == pytest.approx(ref.now, abs=1e-9)
    assert fast.busy_s == pytest.approx(ref.busy_s, abs=1e-9)


@pytest.mark.parametrize("count", [5, 8, 30])
def test_iterations_engine_step_equals_batch_server(count: int) -> None:
    """A step's requests all arriving at once, within the slots (the closed form) or beyond them (queued, each
    paying its prefill when it joins): EngineCost.step_s equals BatchServer's clock to 1e-9."""
    lengths = np.random.default_rng(count).integers(1, 50, count)
    engine = sim.EngineCost(iter_floor_s=_CURVE.iter_floor_s, iter_per_seq_s=_CURVE.iter_per_seq_s,
                            prefill_s_per_prompt=0.0, padded=False, max_seqs=_CURVE.max_seqs,
                            prefill_s_per_token=_CURVE.prefill_s_per_token, iterations=True)
    ref = BatchServer(_CURVE)
    for i, n in enumerate(lengths):
        ref.submit(str(i), 51, int(n))
    ref.advance_to(math.inf)
    assert engine.step_s(lengths, prompts=1, prompt_len=51) == pytest.approx(ref.now, abs=1e-9)


def _iter_layout(*, engines: int, prompts: int, samples: int, trainer_s_per_token: float, poll_s: float = 0.5,
                 prefill_s_per_token: float = 0.0, load_s: float = 0.5) -> sim.Layout:
    """Iteration-accurate engines whose iteration costs 1 s whatever it holds, prompts of 0 tokens, loads of
    ``load_s``, no buffer, publication or Synchronizer cost, ``flush_s`` set by the caller."""
    return sim.Layout(
        num_engines=engines, num_workers=1, prompts_per_step=prompts, samples_per_prompt=samples,
        lengths=sim.Lengths(1e-12, 10, prompt_len=0),
        engine=sim.EngineCost(iter_floor_s=1.0, iter_per_seq_s=0.0, prefill_s_per_prompt=0.0, padded=False,
                              max_seqs=64, prefill_s_per_token=prefill_s_per_token, iterations=True),
        trainer=sim.TrainerCost(s_per_token=trainer_s_per_token, allreduce_s=0.0, micro_batch=0),
        sync=sim.SyncCost(publish_s=0.0, load_s=load_s, gather_window_s=0.0, call_s=0.0, explorer_calls_per_step=3),
        buffer=sim.BufferCost(write_s_per_row=0.0, read_s_per_row=0.0, read_fixed_s=0.0, poll_s=poll_s),
        lockstep_s=0.0)


@pytest.mark.parametrize("mode,loop_s", [("finish", 24.5), ("resubmit", 26.0), ("keep", 25.5)])
def test_fleet_load_modes_by_hand(mode: str, loop_s: float) -> None:
    """One engine, 1 prompt x 2 samples of 10 tokens, iterations of 1 s, loads 0.5 s, training 2 s, bound 1, re-prefill
    0.1 s per token. Steps 0 and 1 run 0-10; trainer steps 0 and 1 end at 12 and 14. Version 1 loads 12-12.5 (the
    engine is empty) and admits step 2, 12.5-22.5 from scratch. Version 2, published at 14, finds step 2 running:
    - finish: the engine drains at 22.5, loads to 23; step 2's rows train 22.5-24.5 (loop 24.5);
    - resubmit: its first iteration ended at 13.5 (1 token each), the second is lost; cut, load 14-14.5, prefill of
      the token so far (2 x 0.1 s) in the first of the 9 iterations left: done at 23.7, seen at the reader's next
      poll (every 0.5 s from 14) at 24, trained to 26;
    - keep: the same pause, no prefill: done at 23.5, trained to 25.5; tokens after the first carry version 2."""
    layout = _iter_layout(engines=1, prompts=1, samples=2, trainer_s_per_token=0.1, prefill_s_per_token=0.1)
    result = sim.simulate_fleet(layout, 3, 1, options=sim.StreamOptions(mode, flush_s=0.0))
    assert result.loop_s == pytest.approx(loop_s, abs=1e-9)
    assert result.staleness_max == 1 and result.stale_dropped == 0
    # per row: step 0's at trainer step 0 (0), step 1's (version 0) at 1 (1), step 2's at 2: version 1 (finish: 1),
    # or 1 token of version 1 and 9 of version 2 (0.1)
    last = 1.0 if mode == "finish" else 0.1
    token_staleness = (0 + 0 + 1 + 1 + last + last) / 6
    assert result.extra["token_staleness_mean"] == pytest.approx(token_staleness)


def test_fleet_admits_a_group_on_the_first_engine_holding_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two engines, 2 prompts x 1 sample a step, bound 1, finish. Step 0 is (10, 2) tokens, steps 1 and 2 (2, 2):
    groups go to the least-loaded engine, so engine 0 runs 10 and 2, engine 1 runs 2 and 2; three rows end at 2 and
    trainer step 0 (2 rows x 2 tokens x 0.25 s) ends at 3. Version 1: engine 1 is empty and loads 3-3.5, engine 0
    drains its long request until 10. Step 2 needs version 1: both its groups start on engine 1 at 3.5 (not after
    the whole fleet loaded at 10.5) and end at 5.5, seen by the reader at once (polls every 0.5 s from 3);
    trainer step 1 ends at 6.5."""
    per_step = {0: np.array([10, 2]), 1: np.array([2, 2]), 2: np.array([2, 2])}
    monkeypatch.setattr(sim, "step_lengths", lambda layout, seed, step: per_step.get(step, np.array([2, 2])))
    layout = _iter_layout(engines=2, prompts=2, samples=1, trainer_s_per_token=0.25)
    result = sim.simulate_fleet(layout, 2, 1, options=sim.StreamOptions("finish", flush_s=0.0))
    assert result.loop_s == pytest.approx(6.5, abs=1e-9)
    assert result.capacity_held


@pytest.mark.parametrize("mode", ["finish", "resubmit", "keep"])
def test_fleet_train_slack_bounds_what_is_trained(mode: str) -> None:
    # the emulated 1/10 layout on 2 engines, bound 1: with slack 0 no trained row is older than the bound; with
    # slack 1 a row may be one version older (late groups kept), and only tokens within it stay unmasked
    layout = sim.emulated_layout(2, 1, 4, 4, s_per_token=2e-6)
    strict = sim.simulate_fleet(layout, 10, 1, options=sim.StreamOptions(mode, train_slack=0))
    loose = sim.simulate_fleet(layout, 10, 1, options=sim.StreamOptions(mode, train_slack=1))
    assert strict.staleness_max <= 1 and strict.extra["masked_tokens"] == 0
    assert loose.staleness_max <= 2 + (mode != "finish") * 8  # a resubmitted / kept row's oldest token may be older
    assert loose.stale_dropped <= strict.stale_dropped
    assert strict.capacity_held and loose.capacity_held


def test_prompt_correlated_lengths() -> None:
    # sigma 0 draws exactly what sample draws; sigma > 0 makes a prompt's samples run long or short together (the
    # variance of the group means grows well beyond that of independent draws), keeping the untruncated mean
    lengths = sim.Lengths.from_mean(200.0, 100_000, prompt_len=0)
    assert np.array_equal(lengths.sample_grouped(np.random.default_rng(3), 64, 16),
                          lengths.sample(np.random.default_rng(3), 64))
    correlated = sim.Lengths(lengths.p, 100_000, 0, prompt_sigma=0.8)
    draws = correlated.sample_grouped(np.random.default_rng(0), 16 * 4000, 16).reshape(4000, 16)
    iid = lengths.sample(np.random.default_rng(0), 16 * 4000).reshape(4000, 16)
    assert draws.mean(axis=1).var() > 5 * iid.mean(axis=1).var()
    assert draws.mean() == pytest.approx(200.0, rel=0.05)


def test_keep_needs_iteration_accurate_engines() -> None:
    with pytest.raises(ValueError, match="keep"):
        sim.simulate(_constant_layout(1.0, 1.0, padded=False), steps=2, max_staleness=1, rollout="stream",
                     stream=sim.StreamOptions("keep"))
    with pytest.raises(ValueError, match="padded"):
        sim.EngineCost(iter_floor_s=1.0, iter_per_seq_s=0.0, prefill_s_per_prompt=0.0, padded=True, max_seqs=1,
                       iterations=True)


def test_against_reads_scale_runs_by_their_names_and_refuses_a_run_without_its_layout(tmp_path: Path) -> None:
    # a run's fields may go by the config's names (max_staleness, batch_size, repeat_times, sps) or sit under
    # "config"; the simulated layout of a run the model itself wrote agrees with it exactly
    layout = sim.emulated_layout(2, 1, 4, 4)
    sps = sim.simulate(layout, 3, 1, 0, "stream", sim.StreamOptions("resubmit")).samples_per_s
    path = tmp_path / "scale.json"
    path.write_text(json.dumps([{"name": "a", "rollout": "stream", "on_new_version": "resubmit", "sps": sps,
                                 "config": {"num_engines": 2, "workers": 1, "max_staleness": 1, "steps": 3,
                                            "batch_size": 4, "repeat_times": 4}}]))
    runs = sim.load_scale_runs(path)
    assert runs[0]["engines"] == 2 and runs[0]["bound"] == 1 and runs[0]["prompts"] == 4 and runs[0]["samples"] == 4
    figures = sim.against(path, seeds=1)
    assert figures["against_within"] == 1 and figures["against_max_abs_error"] == pytest.approx(0.0, abs=1e-12)
    assert figures["agrees"] == "yes"
    path.write_text(json.dumps({"runs": [{"name": "b", "rollout": "step", "engines": 2, "steps": 3, "prompts": 4,
                                          "rows_per_s": 1.0}]}))
    with pytest.raises(SystemExit, match="run b: no bound"):
        sim.load_scale_runs(path)


def test_step_mode_spreads_a_steps_rows_over_iteration_accurate_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    # step mode sends a step's rows in one call spread over the engines, row r on engine r % n (run_batch,
    # generate_spread): 1 prompt x 4 samples of (10, 1, 3, 1) tokens on 2 engines of 1 s iterations: engine 0 runs
    # (10, 3), engine 1 (1, 1); the fleet's step is engine 0's 10 s, their mean (10 + 1) / 2
    monkeypatch.setattr(sim, "step_lengths", lambda layout, seed, step: np.array([10, 1, 3, 1]))
    layout = _iter_layout(engines=2, prompts=1, samples=4, trainer_s_per_token=0.1)
    sim.explore_steps.cache_clear()
    (fleet, mean, train), = sim.explore_steps(layout, 1, 0)
    sim.explore_steps.cache_clear()
    assert (fleet, mean, train) == pytest.approx((10.0, 5.5, 1.5))


def test_best_split_finds_the_peak_of_a_unimodal_curve_with_few_runs() -> None:
    # rows/s peaking at 37 engines of 64: the coarse grid (every 8th) then halving steps find it in ~15 runs
    calls: list[int] = []

    def run(e: int) -> sim.SimResult:
        calls.append(e)
        return sim.SimResult(loop_s=1.0, samples_per_s=-abs(e - 37), busy={}, waits_s={}, staleness_mean=0.0)

    best, result = sim.best_split(lambda e: e, 64, run, 8)
    assert best == 37 and result.samples_per_s == 0
    assert len(calls) <= 16 and len(set(calls)) == len(calls)
