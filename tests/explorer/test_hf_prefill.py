"""The hf engine's prefill computes the output layer at each prompt's last position only (``logits_to_keep=1``),
and samples as it did when it computed logits at every prompt position and kept the last.

Not bit for bit in the first token's log-prob: the output layer is then a matmul of B rows instead of B x P, which
the CPU's BLAS blocks differently (measured on the tiny model: up to 4.8e-7, float32 rounding, for a batch with a
14-token prompt; 0 for shorter batches). The KV cache is the same, so every later step is bit for bit."""

import numpy as np
import pytest

from trinity_like.common.tokenizer import hf_tokenizer
from trinity_like.config import SamplingConfig
from trinity_like.explorer.engines.hf_engine import HFEngine

PROMPTS = ["1+2=", "13+45=", "7+8=", "the answer is a longer prompt than the others", "99+1="]


@pytest.fixture(scope="module")
def prompts(tiny_model_path):
    tok = hf_tokenizer(tiny_model_path)
    return [tok.encode(p) for p in PROMPTS]


def _generate_recording_logits(engine, prompts, sampling, seeds):
    """``engine.generate`` with the shape of every output of the model's ``lm_head`` recorded, in call order."""
    shapes = []
    hook = engine.model.lm_head.register_forward_hook(lambda _m, _i, out: shapes.append(tuple(out.shape)))
    try:
        return engine.generate(prompts, sampling, seeds), shapes
    finally:
        hook.remove()


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_prefill_logits_are_the_last_position_only_and_samples_are_unchanged(tiny_model_path, prompts, kv_cache):
    engine = HFEngine(tiny_model_path, device="cpu", kv_cache=kv_cache)
    assert engine._last_logits_only == {"logits_to_keep": 1}  # transformers' Qwen2ForCausalLM takes it
    batch, width, vocab = len(prompts), max(len(p) for p in prompts), engine.model.config.vocab_size
    assert width > 1
    seeds = list(range(10, 10 + batch))
    for sampling in (SamplingConfig(temperature=1.0, max_new_tokens=12), SamplingConfig(temperature=0.7, max_new_tokens=8),
                     SamplingConfig(temperature=0, max_new_tokens=6)):
        last, last_shapes = _generate_recording_logits(engine, prompts, sampling, seeds)
        # the same engine computing logits at every prompt position, as a model without logits_to_keep does
        engine._last_logits_only = {}
        try:
            full, full_shapes = _generate_recording_logits(engine, prompts, sampling, seeds)
        finally:
            engine._last_logits_only = {"logits_to_keep": 1}
        assert last_shapes[0] == (batch, 1, vocab)  # the prefill
        assert full_shapes[0] == (batch, width, vocab)
        assert set(last_shapes[1:]) <= {(batch, 1, vocab)} and last_shapes[1:] == full_shapes[1:]  # decode steps
        # same tokens and finish reasons; log-probs within float32 rounding at the first step, equal after it
        assert [s.response_ids.tolist() for s in last] == [s.response_ids.tolist() for s in full]
        assert max(abs(float(a.logprobs[0]) - float(b.logprobs[0])) for a, b in zip(last, full, strict=True)) < 1e-6
        assert all(np.array_equal(a.logprobs[1:], b.logprobs[1:]) for a, b in zip(last, full, strict=True))
        assert [s.finish_reason for s in last] == [s.finish_reason for s in full]
