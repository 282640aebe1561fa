"""The vLLM engine's device-dependent defaults, resolved without vLLM (the device is passed in, so the GPU side is
checked on the CPU): ``explorer.vllm.max_num_seqs`` and ``explorer.vllm.seeded``. ``test_vllm_engine.py`` checks
what a real engine takes on the device it runs on."""

import pytest

from trinity_like.config import ConfigError, load_config
from trinity_like.explorer.engines.vllm_engine import CPU_MAX_NUM_SEQS, resolve_max_num_seqs, resolve_seeded


def test_the_config_leaves_batch_size_and_seeding_to_the_device():
    v = load_config(None, []).explorer.vllm
    assert (v.max_num_seqs, v.seeded) == (None, None)
    v = load_config(None, ["explorer.vllm.max_num_seqs=512", "explorer.vllm.seeded=true"]).explorer.vllm
    assert (v.max_num_seqs, v.seeded) == (512, True)
    with pytest.raises(ConfigError, match="max_num_seqs"):
        load_config(None, ["explorer.vllm.max_num_seqs=0"])


def test_max_num_seqs_is_64_on_the_cpu_and_vllms_own_default_on_a_gpu():
    assert CPU_MAX_NUM_SEQS == 64  # what the CPU build always had
    assert resolve_max_num_seqs(None, "cpu") == 64
    assert resolve_max_num_seqs(None, "cuda") is None  # vLLM then picks its LLM-class default for the GPU
    assert resolve_max_num_seqs(None, "rocm") is None
    assert resolve_max_num_seqs(300, "cpu") == 300 and resolve_max_num_seqs(32, "cuda") == 32


def test_requests_are_seeded_on_the_cpu_and_not_on_a_gpu_unless_asked():
    assert resolve_seeded(None, "cpu") is True
    assert resolve_seeded(None, "cuda") is False
    assert resolve_seeded(True, "cuda") is True
    assert resolve_seeded(False, "cpu") is False


def test_a_fixed_kv_cache_is_passed_on_a_gpu_only(tmp_path):
    from trinity_like.explorer.engines.vllm_engine import memory_args

    assert memory_args(0.3, 0.0, "cuda") == {"gpu_memory_utilization": 0.3}
    assert memory_args(0.1, 4.5, "cuda") == {"gpu_memory_utilization": 0.1, "kv_cache_memory_bytes": 4.5 * 2**30}
    assert memory_args(0.3, 4.5, "cpu") == {"gpu_memory_utilization": 0.3}  # the CPU build: VLLM_CPU_KVCACHE_SPACE
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", "explorer.vllm.kv_cache_memory_gb=2"])
    assert cfg.explorer.vllm.kv_cache_memory_gb == 2.0
    with pytest.raises(ConfigError, match="kv_cache_memory_gb"):
        load_config(None, [f"checkpoint_root_dir={tmp_path}", "explorer.vllm.kv_cache_memory_gb=-1"])
