"""Defaults by device (issue 35, item 3): what each `auto` resolves to; the reference model in the compute dtype;
no copy of the model when a checkpoint is written or a LoRA policy is published; LoRA under gradient
checkpointing learns."""

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trinity_like.common.modeling import export_state_dict
from trinity_like.config import load_config
from trinity_like.trainer.device import resolve_checkpointing, resolve_dtype, resolve_weights_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_each_auto_resolves_per_device():
    assert resolve_dtype("auto", CUDA) == "bfloat16" and resolve_dtype("auto", CPU) == "float32"
    assert resolve_dtype("float32", CUDA) == "float32" and resolve_dtype("bfloat16", CPU) == "bfloat16"
    assert resolve_checkpointing(None, CUDA) is True and resolve_checkpointing(None, CPU) is False
    assert resolve_checkpointing(False, CUDA) is False and resolve_checkpointing(True, CPU) is True
    # published weights follow the engines: their explicit dtype, else bf16 where they run on GPUs
    assert resolve_weights_dtype("auto", "auto", engines_on_gpus=True) == "bfloat16"
    assert resolve_weights_dtype("auto", "auto", engines_on_gpus=False) == "float32"
    assert resolve_weights_dtype("auto", "float16", engines_on_gpus=False) == "float16"
    assert resolve_weights_dtype("float32", "bfloat16", engines_on_gpus=True) == "float32"


def test_the_defaults_of_a_cpu_trainer_and_of_one_feeding_gpu_engines(make_trainer, tmp_path, tiny_model_path):
    config = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}"])
    assert (config.trainer.dtype, config.trainer.weights_dtype, config.trainer.gradient_checkpointing) == \
        ("auto", "auto", None)
    t = make_trainer(name="cpu")
    assert (t.dtype, t.weights_dtype, t.checkpointing) == ("float32", "float32", False)
    assert all(v.dtype == torch.float32 for v in t.policy_state_dict().values())
    # engines on GPUs (Ray's GPUs are resources here: the config alone decides) get bf16 versions
    g = make_trainer("explorer.gpus_per_engine=1", name="gpu-engines")
    assert g.weights_dtype == "bfloat16"
    assert all(v.dtype == torch.bfloat16 for v in g.policy_state_dict().values() if v.is_floating_point())


def test_the_reference_model_is_held_in_the_compute_dtype(make_trainer, tmp_path, tiny_model_path):
    t = make_trainer("trainer.dtype=bfloat16", "algorithm.use_kl_loss=true")
    assert {p.dtype for p in t.ref_model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in t.module.parameters()} == {torch.float32}  # master weights stay float32


class ClonedBytes(TorchDispatchMode):
    """Bytes of every tensor copy made on the CPU while active (clone, to/copy into a new tensor)."""

    COPIES = {torch.ops.aten.clone.default, torch.ops.aten._to_copy.default}

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.COPIES and isinstance(out, torch.Tensor):
            self.bytes += out.numel() * out.element_size()
        return out


def _model_bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in export_state_dict(module, copy=False).values())


def test_a_checkpoint_is_written_without_a_copy_of_the_model(make_trainer, tmp_path, tiny_model_path, batch_exps):
    t = make_trainer()
    t.train_step(batch_exps)
    with ClonedBytes() as copies:
        path = t.save_checkpoint()
    # the optimizer state is written as it is; the model's weights are not copied first
    assert copies.bytes < 0.05 * _model_bytes(t.module)
    from safetensors.torch import load_file

    saved = load_file(str(path / "model" / "model.safetensors"))
    for k, v in export_state_dict(t.module).items():
        assert torch.equal(saved[k], v)


@pytest.fixture
def lora_trainer(make_trainer):
    pytest.importorskip("peft")

    def make(*overrides):
        return make_trainer("trainer.lora.enabled=true", "trainer.lora.r=4", "trainer.optimizer.lr=0.05", *overrides)
    return make


def test_lora_is_published_merged_without_copying_the_model(lora_trainer, batch_exps):
    t = lora_trainer()
    t.train_step(batch_exps)
    t.train_step(batch_exps)
    before = {k: v.clone() for k, v in t.module.state_dict().items()}
    with ClonedBytes() as copies:
        merged = t.weights_for_export()
    # only the adapted matrices (q_proj and v_proj by default) are new tensors (each merged copy, and the delta
    # it adds), not the whole model
    adapted = sum(v.numel() * v.element_size() for k, v in merged.items() if k.endswith(("q_proj.weight",
                                                                                          "v_proj.weight")))
    assert 0 < copies.bytes <= 2 * adapted < 0.5 * _model_bytes(t.plain_policy())
    # the same weights as PEFT's merge on a copy, and the trained model is left as it was
    reference = export_state_dict(copy.deepcopy(t.module).merge_and_unload())
    assert merged.keys() == reference.keys()
    for k in reference:
        torch.testing.assert_close(merged[k], reference[k], rtol=0, atol=1e-6)
    assert any(not torch.equal(merged[k], reference[k].new_zeros(reference[k].shape)) for k in merged)
    after = t.module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_lora_with_gradient_checkpointing_trains_the_adapters(lora_trainer, batch_exps, tiny_model_path):
    """Non-reentrant checkpointing: with frozen embeddings, reentrant checkpointing gives the adapters no
    gradient. The adapters move, the same as without checkpointing, and the rewarded responses gain."""
    from trinity_like.trainer.batch import compute_log_probs, experiences_to_batch

    runs = {}
    for flag in ("false", "true"):
        t = lora_trainer(f"trainer.gradient_checkpointing={flag}")
        assert t.checkpointing is (flag == "true")
        rewarded = [e for e in batch_exps if e.reward]
        batch = experiences_to_batch(rewarded, t.pad_token_id)

        def nll(trainer=t, batch=batch):
            with torch.no_grad():
                lp = compute_log_probs(trainer.scorer, batch, 1.0)
            return float(-(lp * batch["response_mask"]).sum() / batch["response_mask"].sum())

        start = nll()
        lora_before = {k: v.clone() for k, v in t.module.state_dict().items() if "lora_" in k}
        for _ in range(3):
            metrics = t.train_step(batch_exps)
            assert metrics["actor/grad_norm"] > 0
        moved = [k for k, v in t.module.state_dict().items() if "lora_" in k and not torch.equal(v, lora_before[k])]
        assert len(moved) == len(lora_before)  # every adapter matrix got a gradient
        assert nll() < start  # and they learn: the rewarded responses became likelier
        runs[flag] = {k: v.clone() for k, v in t.module.state_dict().items() if "lora_" in k}
    for k in runs["false"]:
        torch.testing.assert_close(runs["true"][k], runs["false"][k], rtol=1e-4, atol=1e-6)


def test_mismatch_metrics_against_values_worked_by_hand():
    from trinity_like.algorithms import compute_mismatch_metrics

    behaviour = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
    recomputed = torch.tensor([[-1.1, -2.0, -2.0], [-0.5, -0.25, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the 5.0 is padding
    m = compute_mismatch_metrics(behaviour, recomputed, mask, clip_low=0.2, clip_high=0.28)
    # |diff| = 0.1, 0, 1, 0, 0.25 -> mean 1.35 / 5; ratios e^-0.1 = 0.905, 1, e^1 = 2.72, 1, e^0.25 = 1.284
    assert m["mismatch/logprob_abs_diff_mean"] == pytest.approx(0.27)
    assert m["mismatch/logprob_abs_diff_max"] == pytest.approx(1.0)
    assert m["mismatch/frac_outside_clip"] == pytest.approx(2 / 5)  # 2.72 and 1.284 are above 1.28
    assert m["mismatch/tokens"] == 5
    assert compute_mismatch_metrics(behaviour, recomputed, torch.zeros_like(mask), 0.2, 0.2) == {}


@pytest.mark.parametrize("engine_dtype", ["float32", "bfloat16"])
def test_engines_of_another_dtype_are_measured_and_their_log_probs_recomputed(make_trainer, tmp_path, tiny_model_path,
                                                                               engine_dtype):
    """An hf engine in bf16 on the CPU against a float32 trainer: the step reports the mismatch and, by
    `auto`, takes the trainer's own log-probs as the old policy, so on-policy data gives a ratio of 1 and no
    clipping; a float32 engine agrees with the trainer to rounding and its log-probs are used."""
    from trinity_like.common.experience import Experience
    from trinity_like.common.tokenizer import hf_tokenizer
    from trinity_like.config import SamplingConfig
    from trinity_like.explorer.engines.hf_engine import HFEngine

    tok = hf_tokenizer(tiny_model_path)
    engine = HFEngine(tiny_model_path, device="cpu", dtype=engine_dtype)
    prompts = [tok.encode(p) for p in ["1+2=", "3+4=", "5+1=", "2+2="] for _ in range(3)]
    samples = engine.generate(prompts, SamplingConfig(temperature=1.0, max_new_tokens=8), list(range(12)))
    exps = [Experience(prompt_ids=p, response_ids=s.response_ids, logprobs=s.logprobs, group_id=f"g{i // 3}",
                       reward=float(i % 3 == 0), model_version=0) for i, (p, s) in enumerate(zip(prompts, samples, strict=True))]
    t = make_trainer(f"explorer.dtype={engine_dtype}")
    assert t.recompute_old is (engine_dtype == "bfloat16")
    metrics = t.train_step(exps)
    assert metrics["mismatch/tokens"] == sum(len(s.response_ids) for s in samples)
    if engine_dtype == "float32":
        assert metrics["mismatch/logprob_abs_diff_max"] < 1e-5
    else:
        assert metrics["mismatch/logprob_abs_diff_max"] > 1e-3  # bf16 rounding, measured
        assert metrics["actor/pg_clipfrac"] == 0.0  # the recomputed old policy: ratio 1 on the first pass
    # off: never measured, never recomputed
    quiet = make_trainer(f"explorer.dtype={engine_dtype}",
                     "algorithm.off_policy.mismatch_interval=0", "algorithm.off_policy.recompute_old_log_probs=false", name="quiet")
    assert not quiet.recompute_old and not any(k.startswith("mismatch/") for k in quiet.train_step(exps))
