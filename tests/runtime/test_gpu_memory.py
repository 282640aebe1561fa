"""The GPU memory plan (issue 49, R1) against the peaks measured on GPUs (bench/RESULTS.md): `bench/trainer.py` at
the Qwen2.5 shapes, 64 experiences of 16 prompt + 1008 response tokens, micro-batches of 8, bf16 autocast,
`--chunk 0` (`trainer.logprob_chunk_tokens=0`), GRPO without KL, each side alone on the GPU, peak =
`torch.cuda.max_memory_allocated` over a warm-up and the timed steps:

- H100, first lease (615e8c5, no checkpointing): 0.5B 36.82 GB, 1.5B 70.02 GB;
- H200, fourth lease (966c9b7, `trainer.gradient_checkpointing: auto`, on with CUDA): 1.5B 41.53 GB.

The GPU sizes are fakes of the two GPUs (numbers, no device)."""

from __future__ import annotations

import pytest
import torch

from trinity_like.config import load_config
from trinity_like.runtime.gpu_memory import GB, GIB, IPC_KEPT_VERSIONS, ModelShape, gpu_memory_plan

QWEN = {
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864),
    "qwen2.5-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960),
}
"""bench/trainer.py's SHAPES: Qwen2.5's published shapes, tied output layer, 151,936-token vocabulary."""
FAKE_H100_BYTES = 79.2 * GIB
FAKE_H200_BYTES = 139.8 * GIB


def qwen_config(shape: str) -> dict:
    return dict(QWEN[shape], vocab_size=151936, tie_word_embeddings=True, model_type="qwen2")


def bench_config(tmp_path, checkpointing: str, *overrides):
    """bench/trainer.py's config at the recorded runs' settings."""
    return load_config(None, [
        f"checkpoint_root_dir={tmp_path}", "explorer.repeat_times=8", "trainer.batch_size=64",
        "trainer.micro_batch_size=8", "trainer.dtype=bfloat16", "trainer.logprob_chunk_tokens=0",
        f"trainer.gradient_checkpointing={checkpointing}", "trainer.gpus_per_worker=1",
        "explorer.max_prompt_tokens=16", "explorer.sampling.max_new_tokens=1008", *overrides])


@pytest.mark.parametrize("shape, checkpointing, gpu_bytes, measured_gb", [
    ("qwen2.5-0.5b", "false", FAKE_H100_BYTES, 36.82),
    ("qwen2.5-1.5b", "false", FAKE_H100_BYTES, 70.02),
    ("qwen2.5-1.5b", "true", FAKE_H200_BYTES, 41.53),
])
def test_the_plan_reproduces_the_recorded_trainer_peaks_within_ten_percent(tmp_path, shape, checkpointing,
                                                                           gpu_bytes, measured_gb):
    plan = gpu_memory_plan(bench_config(tmp_path, checkpointing), qwen_config(shape), gpu_bytes)
    trainer = plan.part("trainer")
    planned_gb = trainer.allocated_bytes / GB  # what max_memory_allocated counts: all but the CUDA context
    assert abs(planned_gb - measured_gb) <= 0.10 * measured_gb, (planned_gb, trainer.items)
    assert plan.gpus == [[trainer]] and plan.warning() is None  # alone on its GPU: nothing shared


def test_the_model_shape_counts_the_parameters_torch_builds():
    """Qwen2.5-0.5B has 494.0M parameters (as published); the count the plan's states come from is torch's own
    (the model built on the meta device: no memory)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    for shape in QWEN:
        config = Qwen2Config(**QWEN[shape], vocab_size=151936, tie_word_embeddings=True)
        with torch.device("meta"):
            model = Qwen2ForCausalLM(config)
        assert ModelShape.of(config).params == sum(p.numel() for p in model.parameters())
    assert ModelShape.of(qwen_config("qwen2.5-0.5b")).params == 494_032_768


def test_parts_sharing_a_gpu_over_ninety_percent_are_named_in_one_warning_line(tmp_path):
    """The issue's colocated 1.5B run: trainer at 0.5 and a vLLM engine at 0.5 (utilization 0.5) publishing by
    ipc on an 80 GB GPU. The trainer holds the ipc publisher's kept versions, the engine its copy of a version
    being loaded, both outside vLLM's budget."""
    cfg = bench_config(tmp_path, "true", "trainer.gpus_per_worker=0.5", "explorer.engine=vllm",
                       "explorer.gpus_per_engine=0.5", "explorer.vllm.gpu_memory_utilization=0.5",
                       "synchronizer.method=ipc", "explorer.vllm.kv_cache_memory_gb=0")
    model = qwen_config("qwen2.5-1.5b")
    plan = gpu_memory_plan(cfg, model, FAKE_H100_BYTES)
    trainer, engine = plan.part("trainer"), plan.part("engine 0 (vllm)")
    assert plan.gpus == [[trainer, engine]]
    version = 2 * ModelShape.of(model).params  # bf16: weights_dtype auto is the engines' dtype
    assert trainer.items[f"ipc buffers ({IPC_KEPT_VERSIONS} versions)"] == IPC_KEPT_VERSIONS * version
    assert engine.items["copy of a version being loaded"] == version
    assert engine.items["vLLM budget (0.5 x the GPU)"] == 0.5 * FAKE_H100_BYTES
    line = plan.warning()
    used = (trainer.bytes + engine.bytes) / GB
    assert line is not None and "\n" not in line
    assert line.startswith(f"warning: GPU memory plan: trainer {trainer.bytes / GB:.1f} + engine 0 (vllm) "
                           f"{engine.bytes / GB:.1f} = {used:.1f} GB on one GPU of {FAKE_H100_BYTES / GB:.1f} GB")
    assert "over 90%" in line and "explorer.vllm.gpu_memory_utilization" in line
    # the same parts on an H200 fit
    assert gpu_memory_plan(cfg, model, FAKE_H200_BYTES).warning() is None


def test_parts_are_placed_as_ray_places_gpu_shares(tmp_path):
    model = qwen_config("qwen2.5-0.5b")
    # a whole GPU for the trainer; two engines of 0.5 share another
    cfg = bench_config(tmp_path, "true", "explorer.engine=vllm", "explorer.num_engines=2", "explorer.gpus_per_engine=0.5")
    assert [[p.name for p in gpu] for gpu in gpu_memory_plan(cfg, model, FAKE_H100_BYTES).gpus] == [
        ["trainer"], ["engine 0 (vllm)", "engine 1 (vllm)"]]
    # 0.4 + 3 x 0.2 share one GPU; engines on the CPU are not on any
    cfg = bench_config(tmp_path, "true", "trainer.gpus_per_worker=0.4", "explorer.engine=vllm",
                       "explorer.num_engines=3", "explorer.gpus_per_engine=0.2", "explorer.vllm.kv_cache_memory_gb=4")
    plan = gpu_memory_plan(cfg, model, FAKE_H100_BYTES)
    assert len(plan.gpus) == 1 and len(plan.gpus[0]) == 4
    assert plan.part("engine 2 (vllm)").items["KV cache"] == 4 * GIB
    cfg = bench_config(tmp_path, "true", "trainer.gpus_per_worker=0.5")
    assert [[p.name for p in gpu] for gpu in gpu_memory_plan(cfg, model, FAKE_H100_BYTES).gpus] == [["trainer"]]
