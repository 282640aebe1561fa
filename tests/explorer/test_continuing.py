"""Responses generated in pieces (``explorer.stream.chunk_tokens``) on a real fleet of hf engine actors and the
real tiny model: a version loaded between pieces makes the rest, and every token records its version."""

import asyncio

import numpy as np
import pytest
import ray
import torch

from trinity_like.common.modeling import export_state_dict, load_causal_lm, log_softmax_at
from trinity_like.common.tokenizer import hf_tokenizer
from trinity_like.config import ConfigError, SamplingConfig, load_config
from trinity_like.explorer.continuing import ContinuingEngine
from trinity_like.explorer.fleet import EngineFleet
from trinity_like.runtime.schedule import on_new_version
from trinity_like.weights.messages import WeightsInfo

pytestmark = pytest.mark.slow

SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=14)


def _cfg(tmp_path, model_path, *overrides):
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}", "project=ex",
                              "name=pieces", *overrides])


def _prompts(model_path, n):
    tok = hf_tokenizer(model_path)
    return [tok.encode(f"{i}+{i}=") for i in range(n)]


def _perturbed(model_path, scale=0.05):
    """Version 1: the tiny model's weights plus noise (its samples differ from version 0's)."""
    g = torch.Generator().manual_seed(7)
    return {k: t + scale * torch.randn(t.shape, generator=g, dtype=t.dtype) if t.is_floating_point() else t
            for k, t in export_state_dict(load_causal_lm(model_path)).items()}


def _logprobs(model_path, state_dict, prompt, response):
    """Each response token's log-prob under the weights ``state_dict``, the whole sequence in one forward pass
    (an independent reference for the engine's incremental decoding)."""
    model = load_causal_lm(model_path)
    model.load_state_dict(state_dict, strict=False)
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1]
    return log_softmax_at(logits, SAMPLING.temperature).gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


class LoadAfterFirstPiece(ContinuingEngine):
    """Loads ``info`` into the fleet once the first piece of the call is back: the trainer publishing mid-response."""

    def __init__(self, fleet, chunk_tokens, info):
        super().__init__(fleet, chunk_tokens)
        self.info = info

    async def _piece(self, prompts, sampling, seeds, so_far):
        out = await super()._piece(prompts, sampling, seeds, so_far)
        if self.info is not None:
            await self.fleet.update_weights(self.info)
            self.info = None
        return out


def test_pieces_on_unchanged_weights_are_the_uncut_response_and_a_version_between_pieces_makes_the_rest(
        tmp_path, tiny_model_path, ray_session):
    cfg = _cfg(tmp_path, tiny_model_path)
    prompts, seeds = _prompts(tiny_model_path, 6), list(range(300, 306))
    v1 = _perturbed(tiny_model_path)

    async def main():
        fleet = EngineFleet(cfg)
        await fleet.ready()
        whole = await fleet.generate(prompts, SAMPLING, seeds)
        pieces = ContinuingEngine(fleet, 4)
        cut = await pieces.generate(prompts, SAMPLING, seeds)
        calls_unchanged = pieces.pieces
        info = WeightsInfo(version=1, refs=[ray.put(v1)], method="memory")
        switched = await LoadAfterFirstPiece(fleet, 4, info).generate(prompts, SAMPLING, seeds)
        fleet.kill()
        return whole, cut, calls_unchanged, switched

    whole, cut, calls, switched = asyncio.run(main())
    longest = max(len(s.response_ids) for s in whole)
    assert longest > 8 and calls == -(-longest // 4)  # some responses were cut at least twice
    for a, b in zip(whole, cut, strict=True):
        assert a.response_ids.tolist() == b.response_ids.tolist() and a.finish_reason == b.finish_reason
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)  # the cuts' prefills round differently
        assert b.model_version == 0 and b.token_versions is None  # one version: stored as v1 rows are
    v0 = export_state_dict(load_causal_lm(tiny_model_path))
    mixed = [s for s in switched if len(s.response_ids) > 4]
    assert mixed, "no response outlived its first piece"
    for prompt, s in zip(prompts, switched, strict=True):
        n = len(s.response_ids)
        if n <= 4:
            assert s.token_versions is None and s.model_version == 0
            continue
        assert s.model_version == 0 and s.token_versions.tolist() == [0] * 4 + [1] * (n - 4)
        ref0 = _logprobs(tiny_model_path, v0, prompt, s.response_ids.tolist())
        ref1 = _logprobs(tiny_model_path, v1, prompt, s.response_ids.tolist())
        np.testing.assert_allclose(s.logprobs[:4], ref0[:4].numpy(), atol=1e-4)
        np.testing.assert_allclose(s.logprobs[4:], ref1[4:].numpy(), atol=1e-4)
        assert np.abs(ref0[4:].numpy() - ref1[4:].numpy()).max() > 1e-2  # the versions do differ there
    # the responses after the switch differ from the uncut ones on version 0: the new weights made them
    assert any(a.response_ids.tolist() != b.response_ids.tolist() for a, b in zip(whole, mixed, strict=False))


def test_resubmit_and_chunk_settings_are_refused_where_they_cannot_act(tmp_path):
    base = ["mode=async", "explorer.rollout=stream"]
    with pytest.raises(ConfigError, match="interrupted only between calls; set explorer.stream.chunk_tokens"):
        _cfg(tmp_path, "m", *base, "explorer.stream.on_new_version=resubmit")
    with pytest.raises(ConfigError, match="which on_new_version=finish forbids"):
        _cfg(tmp_path, "m", *base, "explorer.stream.chunk_tokens=8", "explorer.stream.on_new_version=finish")
    # by default (auto) pieces mean resubmit: the rest of a response is made by the new version
    assert on_new_version(_cfg(tmp_path, "m", *base, "synchronizer.max_staleness=1",
                               "explorer.stream.chunk_tokens=8")) == "resubmit"
    with pytest.raises(ConfigError, match="with explorer.rollout=step weights change only between steps"):
        _cfg(tmp_path, "m", "explorer.stream.on_new_version=resubmit", "explorer.stream.chunk_tokens=8")
    ok = _cfg(tmp_path, "m", *base, "explorer.stream.on_new_version=resubmit", "explorer.stream.chunk_tokens=8")
    assert ok.explorer.stream.chunk_tokens == 8
    share = f"explorer.gpus_per_engine={0.3 if torch.cuda.is_available() else 0}"  # vLLM on CUDA needs one (R4)
    vllm = _cfg(tmp_path, "m", *base, "explorer.engine=vllm", "explorer.vllm.async_engine=true", share,
                "explorer.stream.on_new_version=resubmit")  # vLLM's async engine cuts requests itself
    assert vllm.explorer.stream.on_new_version == "resubmit"


class CrashAfterFirstPiece(ContinuingEngine):
    """Raises once its first piece is journaled: an explorer killed mid-response, as far as the journal knows."""

    async def _piece(self, prompts, sampling, seeds, so_far):
        out = await super()._piece(prompts, sampling, seeds, so_far)
        if self.counts["pieces"] == 1:
            self._record(0, seeds, out)
            raise RuntimeError("killed")
        return out


def test_a_journal_left_mid_response_is_taken_up_where_it_was(tmp_path, tiny_model_path, ray_session):
    from trinity_like.buffer.partial import PartialStore
    from trinity_like.explorer.continuing import GroupJournal
    cfg = _cfg(tmp_path, tiny_model_path)
    prompts, seeds = _prompts(tiny_model_path, 6), list(range(300, 306))
    store = PartialStore(tmp_path / "buffer")

    async def main():
        fleet = EngineFleet(cfg)
        await fleet.ready()
        whole = await fleet.generate(prompts, SAMPLING, seeds)
        with pytest.raises(RuntimeError, match="killed"):
            await CrashAfterFirstPiece(fleet, 4, journal=GroupJournal(store, 5, 2, min_version=0)).generate(
                prompts, SAMPLING, seeds)
        journal = GroupJournal(store, 5, 2, min_version=0)  # a restarted explorer's
        engine = ContinuingEngine(fleet, 4, journal=journal)
        resumed = await engine.generate(prompts, SAMPLING, seeds)
        too_old = GroupJournal(store, 5, 2, min_version=1)  # after a long outage the bound needs version 1
        fleet.kill()
        return whole, resumed, journal, engine.pieces, too_old

    whole, resumed, journal, pieces, too_old = asyncio.run(main())
    assert journal.resumed_tokens == sum(min(4, len(s.response_ids)) for s in whole)  # the first pieces
    longest = max(len(s.response_ids) for s in whole)
    assert pieces == -(-longest // 4) - 1  # only the pieces after the first were generated
    for a, b in zip(whole, resumed, strict=True):  # the same weights: the uncut responses
        assert a.response_ids.tolist() == b.response_ids.tolist()
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    assert too_old.discarded and too_old.calls == {} and store.load(5, 2) is None
    assert store.steps() == [5]
    store.drop_step(5)
    assert store.steps() == []
