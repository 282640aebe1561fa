import dataclasses

import pytest
import torch

from trinity_like.common.experience import Experience
from trinity_like.common.modeling import export_state_dict, load_causal_lm
from trinity_like.common.tokenizer import hf_tokenizer
from trinity_like.config import SamplingConfig
from trinity_like.explorer.engines.base import WeightUpdate
from trinity_like.explorer.engines.hf_engine import HFEngine
from trinity_like.trainer.batch import compute_log_probs, experiences_to_batch

PROMPTS = ["1+2=", "13+45=", "7+8=", "the answer is"]


def _seeds(prompts, base):
    return [base * 100 + i for i in range(len(prompts))]


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    return HFEngine(tiny_model_path, device="cpu")


@pytest.fixture(scope="module")
def prompts(tiny_model_path):
    tok = hf_tokenizer(tiny_model_path)
    return [tok.encode(p) for p in PROMPTS]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_behaviour_logprobs_match_trainer_recompute(engine, prompts, tiny_model_path, temperature):
    samples = engine.generate(prompts, SamplingConfig(temperature=temperature, max_new_tokens=10), _seeds(prompts, 1))
    exps = [Experience(prompt_ids=p, response_ids=s.response_ids, logprobs=s.logprobs)
            for p, s in zip(prompts, samples, strict=True)]
    trainer_model = load_causal_lm(tiny_model_path, train=True)  # an independent copy, as the trainer has
    batch = experiences_to_batch(exps, engine.pad_token_id)
    with torch.no_grad():
        recomputed = compute_log_probs(trainer_model, batch, temperature)
    diff = ((recomputed - batch["old_log_probs"]) * batch["response_mask"]).abs().max().item()
    assert diff < 1e-4
    assert batch["response_mask"].sum() > 0


def test_a_static_kv_cache_gives_the_samples_of_the_dynamic_one(engine, prompts, tiny_model_path):
    """``explorer.kv_cache: static`` (the GPU default) preallocates the cache: same tokens, log-probs within
    float32 rounding, with prompts of different lengths (left padding) and early stops."""
    static = HFEngine(tiny_model_path, device="cpu", kv_cache="static")
    assert (engine.kv_cache, static.kv_cache) == ("dynamic", "static") and static.health()["kv_cache"] == "static"
    for sampling in (SamplingConfig(temperature=1.0, max_new_tokens=12), SamplingConfig(temperature=0, max_new_tokens=6)):
        a = engine.generate(prompts * 2, sampling, _seeds(prompts * 2, 3))
        b = static.generate(prompts * 2, sampling, _seeds(prompts * 2, 3))
        assert [s.response_ids.tolist() for s in a] == [s.response_ids.tolist() for s in b]
        assert [s.finish_reason for s in a] == [s.finish_reason for s in b]
        assert max(abs(x.logprobs - y.logprobs).max() for x, y in zip(a, b, strict=True)) < 1e-5
    with pytest.raises(ValueError, match="kv_cache must be auto, dynamic or static"):
        HFEngine(tiny_model_path, device="cpu", kv_cache="paged")


def test_same_seed_same_samples_other_seed_differs(engine, prompts):
    sp = SamplingConfig(temperature=1.0, max_new_tokens=8)
    a = engine.generate(prompts, sp, _seeds(prompts, 5))
    b = engine.generate(prompts, sp, _seeds(prompts, 5))
    c = engine.generate(prompts, sp, _seeds(prompts, 6))
    assert [s.response_ids.tolist() for s in a] == [s.response_ids.tolist() for s in b]
    assert [s.response_ids.tolist() for s in a] != [s.response_ids.tolist() for s in c]


def test_length_limit_and_eos_stop(engine, prompts):
    samples = engine.generate(prompts, SamplingConfig(temperature=1.0, max_new_tokens=3), _seeds(prompts, 0))
    for s in samples:
        assert 1 <= len(s.response_ids) <= 3 and len(s.logprobs) == len(s.response_ids)
        assert (s.finish_reason == "stop") == (s.response_ids[-1] == engine.eos_token_id)
        assert engine.eos_token_id not in s.response_ids[:-1].tolist()


def test_generation_stops_at_eos(engine, prompts):
    import copy

    from trinity_like.common.modeling import import_state_dict

    # A zero final norm makes every logit 0, so greedy decoding picks token 0, the tokenizer's EOS.
    assert engine.eos_token_id == 0
    sd = export_state_dict(engine.model)
    sd["model.norm.weight"] = torch.zeros_like(sd["model.norm.weight"])
    eos_engine = copy.copy(engine)
    eos_engine.model = copy.deepcopy(engine.model)
    import_state_dict(eos_engine.model, sd)
    greedy = eos_engine.generate(prompts, SamplingConfig(temperature=0, max_new_tokens=4), _seeds(prompts, 0))
    assert all(s.response_ids.tolist() == [0] and s.finish_reason == "stop" for s in greedy)


def test_top_k_one_is_greedy(engine, prompts):
    greedy = engine.generate(prompts, SamplingConfig(temperature=0, max_new_tokens=6), _seeds(prompts, 0))
    top1 = engine.generate(prompts, SamplingConfig(temperature=1.0, top_k=1, max_new_tokens=6), _seeds(prompts, 9))
    assert [s.response_ids.tolist() for s in greedy] == [s.response_ids.tolist() for s in top1]
    nucleus = engine.generate(prompts, SamplingConfig(temperature=1.0, top_p=1e-6, max_new_tokens=6), _seeds(prompts, 9))
    assert [s.response_ids.tolist() for s in greedy] == [s.response_ids.tolist() for s in nucleus]


def test_loading_new_weights_changes_outputs_and_version(tiny_model_path, tmp_path, prompts):
    from safetensors.torch import save_file

    engine = HFEngine(tiny_model_path, device="cpu")
    sp = SamplingConfig(temperature=0, max_new_tokens=6)
    before = engine.generate(prompts, sp, _seeds(prompts, 0))
    sd = export_state_dict(engine.model)
    generator = torch.Generator().manual_seed(0)
    sd = {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in sd.items()}
    save_file(sd, str(tmp_path / "v1.safetensors"))
    engine.update_weights(WeightUpdate(version=1, path=str(tmp_path / "v1.safetensors")))
    assert engine.model_version == 1
    after = engine.generate(prompts, sp, _seeds(prompts, 0))
    assert [s.response_ids.tolist() for s in before] != [s.response_ids.tolist() for s in after]
    with pytest.raises(ValueError, match="do not fit"):
        engine.update_weights(WeightUpdate(version=2, state_dict={"bogus": torch.zeros(1)}))


def test_a_bfloat16_engine_verifies_float32_weights_by_their_rounded_copy_and_refuses_a_load_not_applied(
        tiny_model_path, prompts):
    """The engine checks the bytes it received against the published fingerprint, then that what it serves is
    what it received in its own dtype; a load that leaves other weights (here: an import that does nothing)
    takes it out of service until a version loads and verifies."""
    from trinity_like.explorer.engines import hf_engine
    from trinity_like.explorer.engines.base import WeightsMismatch
    from trinity_like.weights.fingerprint import weights_fingerprint

    engine = HFEngine(tiny_model_path, device="cpu", dtype="bfloat16")
    assert engine.health()["dtype"] == "bfloat16" and next(engine.model.parameters()).dtype == torch.bfloat16
    generator = torch.Generator().manual_seed(1)
    sd = {k: v.float() + 0.1 * torch.randn(v.shape, generator=generator)
          for k, v in export_state_dict(engine.model).items()}
    published = weights_fingerprint(sd)
    engine.update_weights(WeightUpdate(version=1, state_dict=sd, fingerprint=published))
    assert engine.fingerprint == published and engine.verified
    assert engine.weights_fingerprint() == weights_fingerprint({k: v.to(torch.bfloat16) for k, v in sd.items()})

    sd2 = {k: v + 0.1 for k, v in sd.items()}
    real_import = hf_engine.import_state_dict
    hf_engine.import_state_dict = lambda model, state_dict: None  # a loader that silently applies nothing
    try:
        with pytest.raises(WeightsMismatch, match="did not apply them"):
            engine.update_weights(WeightUpdate(version=2, state_dict=sd2, fingerprint=weights_fingerprint(sd2)))
    finally:
        hf_engine.import_state_dict = real_import
    assert engine.model_version == 1 and not engine.verified
    with pytest.raises(WeightsMismatch, match="refuses requests|failed their fingerprint check"):
        engine.generate(prompts, SamplingConfig(max_new_tokens=2), _seeds(prompts, 0))
    engine.update_weights(WeightUpdate(version=2, state_dict=sd2, fingerprint=weights_fingerprint(sd2)))
    assert engine.verified and engine.model_version == 2
    assert len(engine.generate(prompts, SamplingConfig(max_new_tokens=2), _seeds(prompts, 0))) == len(prompts)


def test_chat_uses_the_plain_format_and_stop_tokens_end_a_response(engine, tiny_model_path):
    from trinity_like.explorer.engines.base import render_chat

    tok = hf_tokenizer(tiny_model_path)
    messages = [{"role": "user", "content": "1+2="}]
    sample = engine.chat(messages, SamplingConfig(temperature=1.0, max_new_tokens=5), seed=3)
    assert sample.prompt_ids.tolist() == render_chat(messages, tok)
    assert tok.decode(sample.prompt_ids.tolist()).endswith("<|assistant|>\n")
    assert sample.model_version == engine.model_version and sample.engine_id == engine.engine_id
    # make every token a stop token: each response then ends after exactly one token, with reason "stop"
    everything = list(range(len(tok)))
    samples = engine.generate([sample.prompt_ids.tolist()] * 3, SamplingConfig(temperature=1.0, max_new_tokens=5,
                                                                               stop_token_ids=everything), [1, 2, 3])
    assert all(len(s.response_ids) == 1 and s.finish_reason == "stop" for s in samples)


def test_the_engine_runs_where_explorer_device_says(tmp_path, tiny_model_path):
    from trinity_like.common.errors import UserError
    from trinity_like.config import load_config
    from trinity_like.explorer.fleet import make_engine

    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}",
                             "explorer.device=cpu", "explorer.dtype=bfloat16"])
    pinned = make_engine(cfg, "pinned")
    assert pinned.device == torch.device("cpu") and next(pinned.model.parameters()).dtype == torch.bfloat16
    assert pinned.health()["device"] == "cpu" and pinned.health()["dtype"] == "bfloat16"
    with pytest.raises(ValueError, match="device must be auto, cpu or cuda"):
        HFEngine(tiny_model_path, device="tpu")
    if not torch.cuda.is_available():  # without a GPU, `cuda` is refused naming the setting that gives one
        with pytest.raises(UserError, match="explorer.device is cuda.*explorer.gpus_per_engine"):
            HFEngine(tiny_model_path, device="cuda")
        assert HFEngine(tiny_model_path).device == torch.device("cpu")  # auto


def test_a_buffer_refilled_while_an_engine_loads_it_is_never_loaded_torn(tiny_model_path, tmp_path, monkeypatch):
    """Method ipc: the trainer keeps one buffer here (keep=1) and refills it in place with the next version while
    an engine is loading the current one, at the two worst moments. Refilled after the engine's copy, between its
    check and its load: the engine loads version 1 whole, the bytes it checked (it used to load the buffer's
    bytes as they were then, version 2's, under version 1's name). Refilled before its copy: the copy does not
    match version 1's fingerprint, the version is refused and the old one keeps serving; version 2's handle then
    loads."""
    import trinity_like.explorer.engines.hf_engine as hf
    from trinity_like.explorer.engines.base import WeightsMismatch
    from trinity_like.weights import shared as shared_weights
    from trinity_like.weights.fingerprint import weights_fingerprint
    from trinity_like.weights.shared import SharedWeights

    engine = HFEngine(tiny_model_path, device="cpu")
    base = export_state_dict(engine.model)
    g = torch.Generator().manual_seed(1)
    versions = {v: {k: t + 0.1 * v * torch.randn(t.shape, generator=g) for k, t in base.items()} for v in (1, 2, 3)}
    fp = {v: weights_fingerprint(sd) for v, sd in versions.items()}
    trainer = SharedWeights("test-refill", keep=1, root=tmp_path)
    try:
        # 1. refilled between the check and the load
        h1 = trainer.publish(1, versions[1], fp[1])
        real_import = hf.import_state_dict
        handles = {}

        def refill_then_import(model, state_dict):
            handles[2] = trainer.publish(2, versions[2], fp[2])  # the same buffer, version 2's bytes
            return real_import(model, state_dict)

        monkeypatch.setattr(hf, "import_state_dict", refill_then_import)
        engine.update_weights(WeightUpdate(version=1, shared=h1, fingerprint=fp[1]))
        assert engine.model_version == 1 and engine.weights_fingerprint() == fp[1]
        monkeypatch.setattr(hf, "import_state_dict", real_import)

        # 2. refilled before the copy: refused, version 1 keeps serving; the next version loads
        real_open = shared_weights.open_shared

        def refill_then_open(handle, copy=False):
            # the engine has mapped version 2's buffer; the trainer refills it with version 3 before the copy
            handles[3] = trainer.publish(3, versions[3], fp[3])
            return real_open(dataclasses.replace(handle, path=handles[3].path), copy=copy)  # the same pages, renamed

        monkeypatch.setattr(shared_weights, "open_shared", refill_then_open)
        with pytest.raises(WeightsMismatch, match="version 2"):
            engine.update_weights(WeightUpdate(version=2, shared=handles[2], fingerprint=fp[2]))
        assert engine.model_version == 1 and engine.weights_fingerprint() == fp[1]
        monkeypatch.setattr(shared_weights, "open_shared", real_open)
        engine.update_weights(WeightUpdate(version=3, shared=handles[3], fingerprint=fp[3]))
        assert engine.model_version == 3 and engine.weights_fingerprint() == fp[3]
    finally:
        trainer.close()
