"""Model loading and the log-probability rule that explorer and trainer must share.

Both roles compute a token's log-probability as ``log_softmax(logits / temperature)[token]`` in float32.
The explorer does it step by step with a KV cache while sampling; the trainer does it in one forward pass over
prompt + response. Keeping this one function the only definition is what makes the behaviour log-probs stored
with an experience comparable to the trainer's.
"""

from __future__ import annotations

from pathlib import Path

import torch


def load_causal_lm(path: str | Path, train: bool = False, dtype: torch.dtype = torch.float32):
    """Load a causal LM from a local folder on the CPU, in float32 unless ``dtype`` says otherwise."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model path '{path}' has no config.json; set model.path to a Hugging Face "
                                "model folder or run `trinity-like make-tiny-model DIR`")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.train(train)
    return model


def log_softmax_at(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) over the last axis, in float32 (..., V). Temperature 0 (greedy) is
    scored at temperature 1; at 1 no scaled copy is made."""
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(token) under softmax(logits / temperature). logits (..., V), tokens (...) -> (...).

    Temperature 0 (greedy) is scored at temperature 1."""
    return log_softmax_at(logits, temperature).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def export_state_dict(model, copy: bool = True) -> dict[str, torch.Tensor]:
    """The model's weights as full tensors with aliases dropped (a tied ``lm_head.weight`` is the embedding),
    detached and contiguous, ready for safetensors or the object store; copies unless ``copy=False`` (then
    tensors may share memory with the model: write them out before the next update). Shards of a module under FSDP2
    (DTensors) are gathered, which is a collective: every rank of the group must call it."""
    from torch.distributed.tensor import DTensor

    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in model.state_dict(keep_vars=True).items():  # Parameters themselves: a tied one repeats
        if id(t) in seen:
            continue
        seen.add(id(t))
        if isinstance(t, DTensor):
            out[name] = t.full_tensor().detach().contiguous()  # a fresh tensor already
        else:
            out[name] = t.detach().contiguous().clone() if copy else t.detach().contiguous()
    return out


def import_state_dict(model, state_dict: dict[str, torch.Tensor]) -> None:
    """Load weights made by ``export_state_dict``; every parameter must be given except tied aliases."""
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    given = {t.data_ptr() for k, t in model.state_dict().items() if k in state_dict}
    full = model.state_dict()
    truly_missing = [k for k in missing if full[k].data_ptr() not in given]
    if truly_missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {truly_missing[:3]}, unexpected {unexpected[:3]}")
