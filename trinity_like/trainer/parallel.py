"""Data-parallel strategies for the trainer's modules: DDP (replicas) and FSDP2 (``fully_shard``).

Every rank runs the same ``train_step`` on the same batch, so the collective calls FSDP2 makes in each forward
(all-gather of a layer's shards) happen in the same order everywhere. What differs between the strategies is
kept here:

- ``wrap``: DDP around the module, or ``fully_shard`` on every transformer block (the classes a Hugging Face
  model lists in ``_no_split_modules``) and then on the root, so the root group holds the embeddings and a
  tied ``lm_head`` together. ``fully_shard`` swaps the parameters for DTensors in place, so optimizers must be
  built after it.
- ``grad_sync``: DDP's ``no_sync`` / FSDP2's ``set_requires_gradient_sync`` for all but the last micro-batch.
- ``load_full_state_dict`` and the optimizer-state pair: full (unsharded) tensors in and out (weights go out
  through ``common.modeling.export_state_dict``). Under FSDP2 these are collectives: every rank calls them.
"""

from __future__ import annotations

import contextlib

import torch

STRATEGIES = ("ddp", "fsdp2")


def _is_dtensor(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _block_classes(module: torch.nn.Module) -> set[str]:
    names: set[str] = set()
    for sub in module.modules():
        names.update(getattr(sub, "_no_split_modules", None) or ())
    return names


def wrap(module: torch.nn.Module, strategy: str, mesh=None, dtype: str = "float32") -> torch.nn.Module:
    """The module for training under ``strategy``: a DDP wrapper, or the module itself, sharded in place (with
    ``dtype`` bfloat16: FSDP2's MixedPrecisionPolicy, bf16 compute and float32 gradient reduction over float32
    master shards)."""
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(module)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if dtype == "bfloat16" \
        else MixedPrecisionPolicy()
    blocks = _block_classes(module)
    for sub in module.modules():
        if type(sub).__name__ in blocks:
            fully_shard(sub, mesh=mesh, mp_policy=mp)
    fully_shard(module, mesh=mesh, mp_policy=mp)
    return module


def device_mesh(world_size: int, device: torch.device):
    """A 1-D mesh of the data-parallel ranks on the trainer's device type (never CUDA for a CPU trainer)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (world_size,))


def grad_sync(model: torch.nn.Module, enabled: bool):
    """A context in which backward does (``enabled``) or does not all-reduce / reduce-scatter gradients."""
    if enabled:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        @contextlib.contextmanager
        def off():
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return off()
    return contextlib.nullcontext()


def scalar(t) -> float:
    """A Python float of a (possibly distributed) 0-d tensor."""
    return float(t.full_tensor() if _is_dtensor(t) else t)


def is_sharded(module: torch.nn.Module) -> bool:
    return any(_is_dtensor(p) for p in module.parameters())


def load_full_state_dict(module: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Load full tensors into a sharded or plain module (every parameter given except tied aliases)."""
    if not is_sharded(module):
        from trinity_like.common.modeling import import_state_dict

        import_state_dict(module, state_dict)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(module, state_dict, options=StateDictOptions(full_state_dict=True, strict=False))


def optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state, with full tensors keyed by parameter name when the module is sharded."""
    if not is_sharded(module):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(module, optimizer, options=StateDictOptions(full_state_dict=True))


def load_optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    if not is_sharded(module):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(module, optimizer, state, options=StateDictOptions(full_state_dict=True))
