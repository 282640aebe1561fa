"""Where and in what precision the trainer computes: ``trainer.device``, ``trainer.dtype`` and
``trainer.weights_dtype``, and the torch.distributed backend that follows from them.

- The device is resolved in the worker's own process: ``auto`` means "the GPU Ray assigned this worker
  (``trainer.gpus_per_worker``), if any", by the ids Ray assigned, not by what CUDA shows (Ray leaves every GPU
  visible to an actor that asked for none; ``common.placement.resolve_device``).
- ``bfloat16`` is mixed precision: parameters, gradients and optimizer state stay float32 (the master weights);
  forward and backward run under ``torch.autocast``; log-probs, losses and advantages are float32.
- NCCL joins ranks that each hold a whole GPU; every other case (CPU tensors, or ranks sharing one GPU, where
  NCCL cannot join two ranks) uses gloo.
"""

from __future__ import annotations

import contextlib

import torch

from trinity_like.common.placement import resolve_device as resolve_process_device

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(setting: str) -> torch.device:
    """The trainer's device for ``trainer.device`` (``auto``, ``cpu`` or ``cuda``) in this process."""
    return resolve_process_device(setting, "trainer")


def resolve_dtype(setting: str, device: torch.device) -> str:
    """The compute precision for ``trainer.dtype``: ``auto`` is bfloat16 on a GPU (an H100 runs bf16 ~10x faster
    than float32 with TF32 off) and float32 on the CPU (which has no fast bf16 matmul, and where the tests
    compare against float32 references)."""
    if setting != "auto":
        return setting
    return "bfloat16" if device.type == "cuda" else "float32"


def resolve_weights_dtype(setting: str, engine_dtype: str, engines_on_gpus: bool) -> str:
    """The dtype of published weights for ``trainer.weights_dtype``: ``auto`` is the engines' own dtype
    (``explorer.dtype``; its ``auto`` is bfloat16 for engines on GPUs, float32 on the CPU), so a version crosses
    at the size the engines hold it and nothing is cast twice. Checkpoints keep float32 master weights apart."""
    if setting != "auto":
        return setting
    if engine_dtype != "auto":
        return engine_dtype
    return "bfloat16" if engines_on_gpus else "float32"


def resolve_checkpointing(setting: bool | None, device: torch.device) -> bool:
    """Gradient checkpointing for ``trainer.gradient_checkpointing``: empty (auto) is on with CUDA, where
    activations rather than compute bound the micro-batch, and off on the CPU."""
    return device.type == "cuda" if setting is None else bool(setting)


def enable_checkpointing(module) -> None:
    """Non-reentrant gradient checkpointing on a transformers model (or a PEFT model around one). Reentrant
    checkpointing passes no gradient through a block whose inputs do not require it, which with frozen
    embeddings (LoRA) leaves the adapters without gradients."""
    kwargs = {"use_reentrant": False}
    enable = getattr(module, "activation_checkpointing_enable", None)  # transformers 5's name
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    module.config.use_cache = False


def dist_backend(device: torch.device, gpus_per_worker: float) -> str:
    """``nccl`` when every rank holds a whole GPU of its own, else ``gloo`` (never NCCL with CPU tensors)."""
    return "nccl" if device.type == "cuda" and gpus_per_worker >= 1 else "gloo"


def autocast(device: torch.device, dtype: str, enabled: bool = True):
    """The context of forward passes: bf16 autocast under a resolved ``trainer.dtype`` of bfloat16, nothing
    otherwise."""
    if not enabled or dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])


def to_host(state_dict: dict[str, torch.Tensor], dtype: str,
            device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Full tensors on the CPU (or ``device``) in ``dtype`` (``trainer.weights_dtype``): what engines, files and
    the object store receive (floating-point tensors are cast, others only moved). Tensors already there are
    passed through."""
    want = DTYPES[dtype]
    return {k: t.to(device, want if t.is_floating_point() else t.dtype) for k, t in state_dict.items()}
