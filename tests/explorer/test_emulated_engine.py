"""The emulated engine's server (EMULATION of a continuous-batching GPU engine's timing, issue 51): its virtual
clock checked against timings worked by hand on a small curve, and its cost per event rather than per token."""

from __future__ import annotations

import math

import pytest

from trinity_like.explorer.engines.emulated import CURVES, BatchServer, CostCurve

# floor 1 s, 0.5 s per active sequence, prefill 0.1 s per token, load 3 s
CURVE = CostCurve("hand", iter_floor_s=1.0, iter_per_seq_s=0.5, prefill_s_per_token=0.1, load_s=3.0, max_seqs=4)


def test_two_requests_share_iterations_and_pay_prefill_once():
    s = BatchServer(CURVE)
    s.submit("a", prompt_len=10, target_len=3)
    s.submit("b", prompt_len=10, target_len=5)
    assert s.next_event_s() == pytest.approx(8.0)
    done = s.advance_to(math.inf)
    # iteration 1: 1 + 2 x 0.5 + 20 prompt tokens x 0.1 = 4; iterations 2-3: 2 each -> a at 8;
    # iterations 4-5 with b alone: 1.5 each -> b at 11
    assert [(r.rid, r.finished_at) for r in done] == [("a", pytest.approx(8.0)), ("b", pytest.approx(11.0))]
    assert s.busy_s == pytest.approx(11.0)


def test_a_full_server_queues_and_the_next_request_joins_when_a_slot_frees():
    s = BatchServer(CostCurve("one", 1.0, 0.5, 0.1, 3.0, max_seqs=1))
    s.submit("a", 10, 3)
    s.submit("b", 10, 5)
    done = s.advance_to(math.inf)
    # a: 1 (prefill) + 3 x 1.5 = 5.5; b joins then: 1 + 5 x 1.5 = 8.5 -> 14
    assert [r.finished_at for r in done] == [pytest.approx(5.5), pytest.approx(14.0)]


def test_a_late_arrival_joins_at_the_first_iteration_boundary_after_it():
    s = BatchServer(CURVE)
    s.submit("a", 10, 10)  # alone: 1 + 1.5 first iteration (2.5), then 1.5 each
    s.submit("b", 0, 2, at=4.5)  # arrives mid-iteration [4.0, 5.5): joins at 5.5
    done = s.advance_to(math.inf)
    # a: 2.5, 4.0, 5.5 (3 tokens); with b from 5.5: iterations of 2.0 -> b done after 2 (9.5), a's tokens 4, 5
    # then a alone: 5 more tokens of 1.5 -> 17.0
    assert [(r.rid, r.finished_at) for r in done] == [("b", pytest.approx(9.5)), ("a", pytest.approx(17.0))]


def test_abort_returns_the_tokens_so_far_and_a_resubmit_pays_their_prefill():
    s = BatchServer(CURVE)
    s.submit("a", 10, 8)
    assert s.advance_to(5.5) == [] and s.now == pytest.approx(5.5)  # 2.5 + 1.5 + 1.5: 3 tokens
    assert s.abort("a") == 3
    s.submit("a", 10, 8, generated=3)
    done = s.advance_to(math.inf)
    # prefill of 10 + 3 tokens (1.3) + 1.5, then 4 x 1.5 -> 5.5 + 2.8 + 6.0 = 14.3
    assert done[0].finished_at == pytest.approx(14.3)


def test_a_load_pauses_decoding_and_empties_the_cache():
    s = BatchServer(CURVE)
    s.submit("a", 10, 4)
    s.advance_to(4.0)  # 2 tokens
    s.load()  # 3 s, then a prefills its 10 + 2 tokens again
    assert s.now == pytest.approx(7.0)
    done = s.advance_to(math.inf)
    assert done[0].finished_at == pytest.approx(7.0 + 1.2 + 1.5 + 1.5)
    assert s.busy_s == pytest.approx(s.now)  # never idle here


def test_cost_is_per_event_not_per_token():
    s = BatchServer(CURVES["7b_h100"])
    for i in range(64):
        s.submit(f"r{i}", 512, 2000 + 100 * i)
    done = s.advance_to(math.inf)
    assert len(done) == 64 and s.events == 64  # one run of identical iterations per finish, 134,400 tokens
    # the first iteration: 64 x 512 prompt tokens of prefill; then 2,000 iterations of 64 before the first finish
    c = CURVES["7b_h100"]
    assert done[0].finished_at == pytest.approx(64 * 512 * c.prefill_s_per_token + 2000 * c.iteration_s(64))


def test_bad_requests_are_refused():
    s = BatchServer(CURVE)
    with pytest.raises(ValueError, match="must exceed"):
        s.submit("a", 10, 3, generated=3)
    with pytest.raises(KeyError):
        s.abort("nobody")
    assert s.next_event_s() == math.inf and s.advance_to(5.0) == [] and s.now == 5.0


def test_a_keep_load_pauses_decoding_and_keeps_the_cache():
    s = BatchServer(CURVE)
    s.submit("a", 10, 4)
    s.advance_to(4.0)  # 2.5 (prefill of 10) + 1.5: 2 tokens
    s.load(keep=True)  # 3 s, nothing decodes, no prefill after it
    assert s.now == pytest.approx(7.0)
    done = s.advance_to(math.inf)
    assert done[0].finished_at == pytest.approx(7.0 + 1.5 + 1.5)  # where a resubmit pays 1.2 more: 11.2
    assert s.busy_s == pytest.approx(10.0)


def test_a_load_arriving_mid_iteration_starts_then_and_the_iteration_runs_again():
    s = BatchServer(CURVE)
    s.submit("a", 10, 4)
    s.advance_to(4.7)  # iterations end at 2.5 and 4.0; the one of [4.0, 5.5) is under way
    assert s.now == pytest.approx(4.0)
    s.load(keep=True, at=4.7)
    assert s.now == pytest.approx(7.7)
    done = s.advance_to(math.inf)
    assert done[0].generated == 4 and done[0].finished_at == pytest.approx(7.7 + 3.0)
    assert s.busy_s == pytest.approx(2.5 + 1.5 + 3.0 + 3.0)  # the 0.7 s of the dropped iteration: not busy


def test_the_next_event_is_when_advancing_finishes_the_next_request():
    """``next_event_s`` (computed without a probe when nobody joins first) against running a copy to that finish,
    over random arrivals, lengths, loads and aborts."""
    import copy
    import random

    rng = random.Random(0)
    s = BatchServer(CostCurve("small", 1.0, 0.5, 0.1, 3.0, max_seqs=3))
    for i in range(200):
        action = rng.random()
        if action < 0.5:
            s.submit(f"r{i}", rng.randint(0, 20), rng.randint(1, 30), at=s.now + rng.choice([0.0, rng.random() * 5]))
        elif action < 0.6:
            s.load(keep=rng.random() < 0.5)
        elif action < 0.7 and s.active:
            s.abort(rng.choice(s.active).rid)
        probe = copy.deepcopy(s)
        done = probe.advance_to(math.inf, stop_at_finish=True)
        assert s.next_event_s() == (pytest.approx(done[0].finished_at) if done else math.inf)
        s.advance_to(s.now + rng.random() * 10)


def test_an_iteration_ending_at_t_by_rounding_alone_still_runs():
    """``now + first <= t`` can hold while ``t - now - first`` rounds below 0; the iteration that ends by ``t`` must
    run (it once made ``k`` 0 and the loop spin)."""
    curve = CostCurve("x", iter_floor_s=0.1, iter_per_seq_s=0.0, prefill_s_per_token=0.0, load_s=0.0, max_seqs=4)
    server = BatchServer(curve, now=0.7)
    server.submit("a", 1, 3)
    t = 0.7 + 0.1  # 0.7999999999999999: now + first == t, t - now - first < 0
    assert server.now + curve.iteration_s(1) <= t and t - server.now - curve.iteration_s(1) < 0
    server.advance_to(t)
    assert server.active[0].generated == 1 and server.now == pytest.approx(0.8)
