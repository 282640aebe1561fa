"""What the launcher checks before anything starts (issue 49, R7 and R1): vLLM engines sharing the trainer's GPU
need a fixed KV cache (`explorer.vllm.kv_cache_memory_gb`) wherever they can set up while the trainer allocates,
and parts that share a GPU over 90% of it are warned about in one line. No GPU here: GPU sizes are fakes."""

from __future__ import annotations

import itertools
import json

import pytest

from trinity_like.config import ConfigError, load_config
from trinity_like.launcher import start_up_checks
from trinity_like.runtime.gpu_memory import GIB

LAYOUTS = {
    "shared": ("trainer.gpus_per_worker=0.5", "explorer.gpus_per_engine=0.5"),  # one GPU, half each
    "apart": ("trainer.gpus_per_worker=1", "explorer.gpus_per_engine=1"),  # a GPU each
    "engines on the CPU": ("trainer.gpus_per_worker=0.5", "explorer.gpus_per_engine=0"),
}


def _unordered(role: str, transport: str, method: str) -> bool:
    """The start-ups the issue lists as off the ordered path: an explorer job of its own beside a trainer job, and
    Redis with ipc / memory / broadcast (the explorer takes the run from the trainer, so both set up at once)."""
    return role == "explorer" or (role == "all" and transport == "redis" and method != "checkpoint")


def test_every_unordered_start_up_of_engines_sharing_the_trainers_gpu_needs_a_fixed_kv_cache(tmp_path):
    """Every combination of transport, method, role, GPU layout and KV cache setting of vLLM engines (and the
    hf engine, which sizes no cache from free memory, where vLLM's would race): refused exactly where vLLM engines
    share the trainer's GPU without kv_cache_memory_gb and set up unordered; warned (restarts race too) where the
    launcher orders their start-up; silent otherwise."""
    refused = warned = 0
    cases = [(*c, "vllm") for c in itertools.product(("file", "redis"), ("checkpoint", "ipc", "memory", "broadcast"),
                                                      ("all", "explorer", "trainer"), LAYOUTS, (0, 4))]
    cases += [("redis", "ipc", "all", "shared", 0, "hf"), ("file", "checkpoint", "explorer", "shared", 0, "hf")]
    configs = {layout: load_config(None, [f"checkpoint_root_dir={tmp_path}", *overrides])
               for layout, overrides in LAYOUTS.items()}
    for transport, method, role, layout, kv, engine in cases:
        cfg = configs[layout]  # loaded (and validated) once per layout; the rest set here (load_config: ~0.1 s)
        cfg.buffer.transport, cfg.synchronizer.method, cfg.explorer.engine = transport, method, engine
        cfg.explorer.vllm.kv_cache_memory_gb = kv
        case = (transport, method, role, layout, engine, kv)
        races = engine == "vllm" and layout == "shared" and kv == 0 and role != "trainer"
        if races and _unordered(role, transport, method):
            with pytest.raises(ConfigError) as err:
                start_up_checks(cfg, role, total_bytes=0)
            msg = str(err.value)
            assert "explorer.vllm.kv_cache_memory_gb (e.g. 4)" in msg and "\n" not in msg, case
            assert ("--role explorer" in msg) if role == "explorer" else (f"buffer.transport {transport}" in msg)
            refused += 1
        elif races:
            lines = start_up_checks(cfg, role, total_bytes=0)
            assert len(lines) == 1 and lines[0].startswith("warning: ") and "restarts" in lines[0], case
            warned += 1
        else:
            assert start_up_checks(cfg, role, total_bytes=0) == [], case
    # refused: 8 explorer jobs (2 transports x 4 methods) + 3 with Redis (ipc, memory, broadcast); warned: the
    # 5 ordered ones (file transport x 4 methods, Redis with checkpoint)
    assert (refused, warned) == (11, 5)


def test_the_launcher_warns_in_one_line_when_parts_sharing_a_gpu_plan_over_ninety_percent(tmp_path):
    """The memory plan of runtime.gpu_memory from the model's config.json (no weights needed) and one GPU's size,
    here fakes of an H100 and an H200: trainer 0.5 + vLLM engine 0.5 at utilization 0.5, Qwen2.5-1.5B."""
    model = tmp_path / "qwen-1.5b"
    model.mkdir()
    model.joinpath("config.json").write_text(json.dumps(dict(
        hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True, model_type="qwen2")))
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model}", "explorer.engine=vllm",
                             "trainer.gpus_per_worker=0.5", "explorer.gpus_per_engine=0.5",
                             "explorer.vllm.gpu_memory_utilization=0.5", "explorer.vllm.kv_cache_memory_gb=4",
                             "trainer.micro_batch_size=8", "explorer.max_prompt_tokens=16",
                             "explorer.sampling.max_new_tokens=1008", "trainer.logprob_chunk_tokens=0",
                             "trainer.gradient_checkpointing=false"])
    lines = start_up_checks(cfg, "all", total_bytes=79.2 * GIB)
    assert len(lines) == 1 and lines[0].startswith("warning: GPU memory plan: trainer ")
    assert "+ engine 0 (vllm) " in lines[0] and "on one GPU of 85.0 GB" in lines[0] and "over 90%" in lines[0]
    assert start_up_checks(cfg, "all", total_bytes=139.8 * GIB * 4) == []  # room enough
    assert start_up_checks(cfg, "all", total_bytes=0) == []  # no GPU here: no plan
