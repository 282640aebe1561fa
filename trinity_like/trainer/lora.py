"""The weights of a LoRA-adapted policy as the plain model holds them, without a copy of the model.

PEFT's ``merge_and_unload`` changes the model it is given, so publishing a version by it meant a deep copy of the
whole model first (the base weights twice in memory, every version). Here the base model's tensors are taken as
they are and only each adapted matrix is new: ``base + scale * B @ A`` (PEFT's own ``get_delta_weight``, which
knows each layer's scaling and layout). The trained model is never touched, so nothing drifts as merging and
unmerging in place would in bf16.
"""

from __future__ import annotations

import torch

from trinity_like.common.modeling import export_state_dict


def merged_state_dict(peft_model, copy: bool = True) -> dict[str, torch.Tensor]:
    """The plain model's weights (names without PEFT's wrappers, tied aliases dropped) with every active LoRA
    adapter merged in. Tensors of unadapted weights are the model's own unless ``copy``; merged ones are
    always new. Not for FSDP2-sharded modules (DTensors): there ``merge_and_unload`` on a copy is used."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    merged: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer) or module.merged or module.disable_adapters:
            continue
        weight = module.get_base_layer().weight
        with torch.no_grad():
            value = weight.detach().clone()
            for adapter in module.active_adapters:
                if adapter in module.lora_A or adapter in getattr(module, "lora_embedding_A", {}):
                    value += module.get_delta_weight(adapter).to(value.dtype)
        merged[f"{name}.weight"] = value
    out: dict[str, torch.Tensor] = {}
    for name, tensor in export_state_dict(base, copy=copy).items():
        if ".lora_" in name:
            continue
        plain = name.replace(".base_layer.", ".")
        out[plain] = merged.get(plain, tensor)
    return out
