"""The EMULATED engine behind the engine interface (issue 51): seeded responses every rollout mode draws alike, and
a weight load under each ``explorer.stream.on_new_version`` policy (``finish`` drains, ``resubmit`` cuts and
re-prefills, ``keep`` pauses and goes on), on real time, with the virtual clock's busy time worked by hand. Emulation
only: these test the emulation, never an engine (no model runs). No Ray: the engine on this test's event loop."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch

from trinity_like.config import SamplingConfig, load_config
from trinity_like.explorer.engines.base import WeightsMismatch
from trinity_like.explorer.engines.emulated import (
    EMULATED_LOGPROB,
    CostCurve,
    EmulatedEngine,
    EmulatedVocabulary,
    response_length,
)
from trinity_like.weights.fingerprint import weights_fingerprint
from trinity_like.weights.messages import WeightsInfo

# 10 ms per iteration at any batch size, 2 ms of prefill per token, a load of 0.3 s
CURVE = CostCurve("test", iter_floor_s=0.01, iter_per_seq_s=0.0, prefill_s_per_token=0.002, load_s=0.3, max_seqs=8)
PROMPT = 20  # explorer.emulated.prompt_tokens: 40 ms of prefill
N = 40  # every response is cut at max_new_tokens (the drawn lengths are ~1e6): 40 x 10 ms
SAMPLING = SamplingConfig(max_new_tokens=N)
ALONE_S = PROMPT * 0.002 + N * 0.01  # 0.44 s for one request alone
SLACK_S = 0.25  # a busy 2-core machine's scheduling delays, on top of the emulated times (a drain would add 0.34)


def _cfg(tmp_path, model_path, policy: str):
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}", "project=emu",
                              "explorer.engine=emulated", "mode=async", "explorer.rollout=stream",
                              f"explorer.stream.on_new_version={policy}", f"explorer.emulated.prompt_tokens={PROMPT}",
                              "explorer.emulated.mean_response_tokens=1e6", "explorer.emulated.max_response_tokens=10000"])


def _version(v: int) -> WeightsInfo:
    sd = {"w": torch.full((3,), float(v))}
    return WeightsInfo(version=v, state_dict=sd, fingerprint=weights_fingerprint(sd))


async def _timed(coro, t0: float):
    result = await coro
    return result, time.monotonic() - t0


def _load_under_a_running_request(engine: EmulatedEngine, interruptible: bool):
    """A request starts at 0; a load at 0.1 s; another request at 0.15 s. (first, load end, later, their ends)."""
    async def main():
        t0 = time.monotonic()
        first = asyncio.ensure_future(_timed(engine.agenerate([[1, 2]], SAMPLING, [1], None, interruptible), t0))
        await asyncio.sleep(0.1)
        load = asyncio.ensure_future(_timed(engine.aupdate_weights(_version(1)), t0))
        await asyncio.sleep(0.05)
        later = asyncio.ensure_future(_timed(engine.agenerate([[3]], SAMPLING, [2], None, interruptible), t0))
        (first, t_first), (_, t_load), (later, t_later) = await asyncio.gather(first, load, later)
        return first[0], t_first, t_load, later[0], t_later

    return asyncio.run(main())


def test_responses_are_drawn_from_the_seed_alone(tiny_model_path):
    vocab = EmulatedVocabulary.of(tiny_model_path)
    ids, reason = vocab.response(7, 0, 10_000, 200.0, 819)
    length, ends = response_length(7, 200.0, 819)
    assert len(ids) == length and reason == ("stop" if ends else "length")
    again, _ = vocab.response(7, 0, 10_000, 200.0, 819)
    assert np.array_equal(ids, again)
    assert ids.min() >= 0 and ids.max() < vocab.size
    assert not set(ids[:-1].tolist()) & set(vocab.stop_ids) and (reason != "stop" or ids[-1] == vocab.stop_ids[0])
    tail, _ = vocab.response(7, 5, 10_000, 200.0, 819)  # a continuation 5 tokens in: the rest of the same one
    assert np.array_equal(tail, ids[5:])
    cut, cut_reason = vocab.response(7, 0, 3, 200.0, 819)
    assert np.array_equal(cut, ids[:3]) and cut_reason == "length" or length <= 3
    # geometric of mean 200 capped at 819: E[min(G, 819)] = 200 (1 - (1 - 1/200)^819) = 196.7
    lengths = [response_length(seed, 200.0, 819)[0] for seed in range(4000)]
    assert np.mean(lengths) == pytest.approx(196.7, rel=0.05) and max(lengths) == 819
    assert sum(response_length(seed, 200.0, 819)[1] for seed in range(4000)) == sum(n < 819 for n in lengths)


def test_finish_drains_the_running_request_before_the_load(tmp_path, tiny_model_path):
    engine = EmulatedEngine(_cfg(tmp_path, tiny_model_path, "finish"), "emulated-0", curve=CURVE)
    first, t_first, t_load, later, t_later = _load_under_a_running_request(engine, interruptible=True)
    assert first.model_version == 0 and first.token_versions is None and len(first.response_ids) == N
    assert first.finish_reason == "length" and np.all(first.logprobs == EMULATED_LOGPROB)
    assert ALONE_S - 0.01 <= t_first <= ALONE_S + SLACK_S
    assert t_first + 0.3 - 0.01 <= t_load <= t_first + 0.3 + SLACK_S  # the load waited for it, then took load_s
    assert later.model_version == 1 and t_later >= t_load + ALONE_S - 0.01  # it waited at the gate
    assert engine.server.busy_s == pytest.approx(2 * ALONE_S + 0.3)
    assert engine.cuts == 0 and engine.model_version == 1 and engine.fingerprint == _version(1).fingerprint


def test_resubmit_cuts_the_request_and_it_pays_prefill_of_prompt_and_tokens_so_far(tmp_path, tiny_model_path):
    engine = EmulatedEngine(_cfg(tmp_path, tiny_model_path, "resubmit"), "emulated-0", curve=CURVE)
    first, t_first, t_load, later, t_later = _load_under_a_running_request(engine, interruptible=True)
    versions = first.token_versions
    assert versions is not None and len(versions) == N and first.model_version == 0
    g = int((versions == 0).sum())  # tokens made before the cut: ~(0.1 - 0.04) / 0.01
    assert 1 <= g <= 10 and versions.tolist() == [0] * g + [1] * (N - g)
    assert 0.1 + 0.3 - 0.01 <= t_load <= 0.1 + 0.3 + SLACK_S  # no drain: load_s from the cut
    assert later.model_version == 1 and later.token_versions is None
    # first: prefill 20, g tokens; the load; prefill 20 + g, N - g tokens. later: joins it after the load (its own
    # prefill in the same iteration), 40 tokens
    resumed = (PROMPT + g) * 0.002 + (N - g) * 0.01
    assert t_first >= 0.4 + resumed - 0.01
    assert engine.cuts == 1
    # busy: prefill 20 + g tokens; the load; then both in one batch (one iteration apart at most): prefill of
    # 20 + g and of 20, N iterations
    assert engine.server.busy_s == pytest.approx(PROMPT * 0.002 + g * 0.01 + 0.3 + (2 * PROMPT + g) * 0.002
                                                 + N * 0.01, abs=0.011)


def test_keep_pauses_for_the_load_and_the_request_goes_on_without_prefill(tmp_path, tiny_model_path):
    engine = EmulatedEngine(_cfg(tmp_path, tiny_model_path, "keep"), "emulated-0", curve=CURVE)
    first, t_first, t_load, later, t_later = _load_under_a_running_request(engine, interruptible=False)
    versions = first.token_versions
    g = int((versions == 0).sum())
    assert 1 <= g <= 10 and versions.tolist() == [0] * g + [1] * (N - g) and first.model_version == 0
    assert 0.1 + 0.3 - 0.01 <= t_load <= 0.1 + 0.3 + SLACK_S  # no drain
    assert ALONE_S + 0.3 - 0.01 <= t_first <= ALONE_S + 0.3 + SLACK_S  # paused load_s, nothing paid again
    assert later.model_version == 1 and later.token_versions is None  # joined during the pause: new weights
    assert engine.cuts == 0
    # busy: prefill 20, g tokens; the load (the iteration under way at 0.1 s dropped, run again); later's prefill of
    # 20 in the first iteration after it; 40 more iterations (later's 40 cover first's N - g)
    assert engine.server.busy_s == pytest.approx(PROMPT * 0.002 + g * 0.01 + 0.3 + PROMPT * 0.002 + N * 0.01)


def test_a_version_whose_fingerprint_differs_is_refused_and_the_previous_one_serves(tmp_path, tiny_model_path):
    engine = EmulatedEngine(_cfg(tmp_path, tiny_model_path, "finish"), "emulated-0", curve=CURVE)
    bad = WeightsInfo(version=1, state_dict={"w": torch.zeros(3)}, fingerprint=_version(1).fingerprint)
    with pytest.raises(WeightsMismatch, match="version 1 is refused"):
        asyncio.run(engine.aupdate_weights(bad))
    assert engine.model_version == 0 and engine.server.busy_s == 0.0


def test_chat_renders_the_conversation_with_the_models_tokenizer(tmp_path, tiny_model_path):
    from trinity_like.common.tokenizer import hf_tokenizer
    from trinity_like.explorer.engines.base import render_chat

    engine = EmulatedEngine(_cfg(tmp_path, tiny_model_path, "finish"), "emulated-0", curve=CURVE)
    messages = [{"role": "user", "content": "1+2="}]
    sample = asyncio.run(engine.achat(messages, SamplingConfig(max_new_tokens=3), 5))
    assert sample.prompt_ids.tolist() == render_chat(messages, hf_tokenizer(tiny_model_path))
    assert np.array_equal(sample.response_ids, engine.vocabulary.response(5, 0, 3, 1e6, 10_000)[0])


def test_a_request_whose_caller_goes_away_leaves_the_batch(tmp_path, tiny_model_path):
    engine = EmulatedEngine(_cfg(tmp_path, tiny_model_path, "finish"), "emulated-0", curve=CURVE)

    async def main():
        call = asyncio.ensure_future(engine.agenerate([[1]], SAMPLING, [1]))
        await asyncio.sleep(0.1)
        call.cancel()
        await asyncio.sleep(0.01)
        return engine.server.active, engine.server.waiting, engine.health()

    active, waiting, health = asyncio.run(main())
    assert not active and not waiting and health["in_flight"] == 0
