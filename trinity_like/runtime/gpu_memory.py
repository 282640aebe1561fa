"""What each part of a run holds on the GPU it is given: a plan from the config and the model's shape, checked
against the peaks measured on H100 / H200 (bench/RESULTS.md; tests/runtime/test_gpu_memory.py) and used by the
launcher to warn, before anything starts, when parts that share a GPU would fill more than 90% of it
(docs/gpu.md, "GPU shares, start-up and the memory plan").

A trainer worker of P parameters, ``b`` rows of S = prompt + response tokens per micro-batch (T = b x S tokens,
n = b x R response positions), hidden size H, L layers, MLP width I, query width Q, key/value width K, vocabulary V:

- states, all float32 (master weights, gradients, AdamW's two moments): 16 P;
- activations kept for the backward pass, per token and layer, in bf16 autocast (float32 residual stream):
  2 RMSNorms x (float32 input + normalised output) 16 H, autocast's bf16 copies of the normalised inputs of the
  q / k / v / gate / up projections 10 H, attention (rotated q, k, v, k and v repeated to Q for SDPA with a padding
  mask, SDPA's output and its reshaped copy) 2 x (5 Q + 2 K), MLP (gate, up, SiLU, product) 8 I; plus autocast's
  bf16 copies of every weight a matmul saves (2 x the linear parameters, the output layer's included). With
  gradient checkpointing only each layer's float32 input (4 H per token and layer) is kept, and one layer is
  recomputed at a time;
- the output layer: float32 log-softmax of ``logprob_chunk_tokens`` (all n with 0) x V positions, kept for the
  backward, plus its incoming gradient and the gradient it passes on: 12 bytes per position and token;
- the peak is states + the larger of (activations + the output layer, or one recomputed layer) and AdamW's step
  (a float32 temporary of P for the square roots), plus a reference model in the compute dtype with a KL term,
  a value model (16 P) with ``gae``, and with ``synchronizer.method: ipc`` on the trainer's GPU the publisher's
  kept versions (``IPC_KEPT_VERSIONS`` buffers of P in ``trainer.weights_dtype``, cast straight into them).

At the measured shapes (Qwen2.5-0.5B / 1.5B, 64 x (16 + 1008) tokens, micro-batches of 8, one chunk) this gives
37.7 / 71.9 GB against 36.8 / 70.0 GB measured without checkpointing and 41.4 against 41.5 GB with it (torch's
``max_memory_allocated``; the CUDA context, ``CUDA_CONTEXT_BYTES`` a process, comes on top).

A vLLM engine takes ``explorer.vllm.gpu_memory_utilization`` x the device (its weights, activations and KV cache;
vLLM checks that much is free when it starts), or with ``kv_cache_memory_gb`` its weights + that cache +
``VLLM_RUNTIME_BYTES``; an ``hf`` engine its weights and a static KV cache for its share of a step's rows. With
``ipc`` an engine copies each version before it loads it (a copy of P in ``weights_dtype``, outside vLLM's
budget). Parts are placed on GPUs as Ray places fractional shares: in order (the trainer's workers, then the
engines), each on the first GPU with room for its share.

Not planned: a reward model on a GPU (``reward.model.num_gpus``: its size is another model's), fragmentation in
torch's caching allocator (what ``nvidia-smi`` shows above ``max_memory_allocated``), LoRA's frozen base
counted as fully trained (an over-estimate).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trinity_like.config import Config

GB = 1e9
GIB = 2**30
IPC_KEPT_VERSIONS = 2
"""Versions the ``ipc`` publisher keeps in shared buffers (``weights.publish``: ``SharedWeights(keep=2)``), each the
whole model in ``trainer.weights_dtype``; it casts the trainer's tensors straight into them (issue 49: no
converted copy of the weights first)."""
CUDA_CONTEXT_BYTES = 0.5e9
"""The CUDA context and kernels of one process, outside torch's allocator (about 0.5 GB on an H100 with CUDA 13)."""
VLLM_RUNTIME_BYTES = 2e9
"""A vLLM engine's memory besides weights and a fixed KV cache (``kv_cache_memory_gb``): the activation peak of its
profile run, the sampler's logits, CUDA graphs. An estimate, not measured here."""
WARN_FRACTION = 0.9
"""Parts that share a GPU and plan more than this fraction of it are warned about."""
PROMPT_TOKENS_UNSET = 512
"""Prompt tokens assumed when ``explorer.max_prompt_tokens`` is 0 (no limit): verl's default limit."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer the plan needs, read from its config (``config.json``)."""

    hidden: int
    layers: int
    intermediate: int
    query_width: int
    """num_attention_heads x head_dim."""
    kv_width: int
    """num_key_value_heads x head_dim."""
    vocab: int
    tied: bool
    attention_bias: bool

    @classmethod
    def of(cls, model_config: Any) -> ModelShape:
        """From a transformers config or its dict (``config.json``)."""
        c = model_config if isinstance(model_config, Mapping) else model_config.to_dict()
        hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
        head_dim = int(c.get("head_dim") or hidden // heads)
        kv_heads = int(c.get("num_key_value_heads") or heads)
        bias = c.get("attention_bias", c.get("model_type") == "qwen2")  # Qwen2 has q/k/v biases, no key for them
        return cls(hidden=hidden, layers=int(c["num_hidden_layers"]), intermediate=int(c["intermediate_size"]),
                   query_width=heads * head_dim, kv_width=kv_heads * head_dim, vocab=int(c["vocab_size"]),
                   tied=bool(c.get("tie_word_embeddings", False)), attention_bias=bool(bias))

    @property
    def layer_linear_params(self) -> int:
        """Weights of one layer's matmuls (q, k, v, o, gate, up, down)."""
        h, q, kv = self.hidden, self.query_width, self.kv_width
        return h * q + 2 * h * kv + q * h + 3 * h * self.intermediate

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """All parameters (a tied output layer counted once)."""
        bias = (self.query_width + 2 * self.kv_width) if self.attention_bias else 0
        layer = self.layer_linear_params + bias + 2 * self.hidden  # + the two RMSNorm weights
        return self.layers * layer + self.hidden + self.head_params * (1 if self.tied else 2)

    def activation_bytes_per_token_layer(self, act: int, cast: int) -> int:
        """What one layer keeps for the backward pass per token (module docstring): ``act`` bytes per element
        of the computed activations, ``cast`` of autocast's copies of projection inputs (0 without autocast)."""
        h, q, kv = self.hidden, self.query_width, self.kv_width
        return 16 * h + cast * 5 * h + act * (5 * q + 2 * kv) + act * 4 * self.intermediate


@dataclass
class Part:
    """One process's memory on its GPU: named items (bytes) that add up to its plan."""

    name: str
    gpu_share: float
    items: dict[str, float] = field(default_factory=dict)

    @property
    def bytes(self) -> float:
        return sum(self.items.values())

    @property
    def allocated_bytes(self) -> float:
        """What torch's allocator holds (``max_memory_allocated``): all but the CUDA context."""
        return self.bytes - self.items.get("CUDA context", 0.0)


@dataclass
class GpuMemoryPlan:
    total_bytes: float
    """Memory of one GPU."""
    gpus: list[list[Part]]
    """The parts on each GPU the run uses, the trainer's first."""

    @property
    def parts(self) -> list[Part]:
        return [p for gpu in self.gpus for p in gpu]

    def part(self, name: str) -> Part:
        return next(p for p in self.parts if p.name == name)

    def warning(self, fraction: float = WARN_FRACTION) -> str | None:
        """One line naming the parts and their sums on the fullest GPU that parts share, when they plan more than
        ``fraction`` of it; None otherwise."""
        shared = [gpu for gpu in self.gpus if len(gpu) > 1]
        if not shared:
            return None
        gpu = max(shared, key=lambda g: sum(p.bytes for p in g))
        used = sum(p.bytes for p in gpu)
        if used <= fraction * self.total_bytes:
            return None
        parts = " + ".join(f"{p.name} {p.bytes / GB:.1f}" for p in gpu)
        return (f"warning: GPU memory plan: {parts} = {used / GB:.1f} GB on one GPU of {self.total_bytes / GB:.1f} GB "
                f"({100 * used / self.total_bytes:.0f}%, over {100 * fraction:.0f}%); lower "
                "explorer.vllm.gpu_memory_utilization (or kv_cache_memory_gb), trainer.micro_batch_size or "
                "trainer.logprob_chunk_tokens, or give the parts GPUs of their own (docs/gpu.md)")


def gpu_memory_plan(cfg: Config, model_config: Any, total_bytes: float) -> GpuMemoryPlan:
    """The memory plan of ``cfg``'s parts with the model ``model_config`` (a transformers config or the dict of
    its ``config.json``) on GPUs of ``total_bytes`` each (module docstring)."""
    shape = ModelShape.of(model_config)
    tr, ex = cfg.trainer, cfg.explorer
    trainer_gpu = tr.gpus_per_worker > 0 and tr.device != "cpu"
    engine_gpu = ex.gpus_per_engine > 0 and (ex.engine == "vllm" or ex.device != "cpu")
    placed: list[Part] = []
    if trainer_gpu:
        placed += [trainer_part(cfg, shape, f"trainer worker {i}" if tr.num_workers > 1 else "trainer")
                   for i in range(tr.num_workers)]
    if engine_gpu:
        placed += [engine_part(cfg, shape, total_bytes, f"engine {i} ({ex.engine})") for i in range(ex.num_engines)]
    return GpuMemoryPlan(total_bytes, _place(placed))


def trainer_part(cfg: Config, shape: ModelShape, name: str = "trainer") -> Part:
    """One trainer worker on its GPU (module docstring)."""
    tr, algo = cfg.trainer, cfg.algorithm
    dtype = "bfloat16" if tr.dtype == "auto" else tr.dtype  # auto: bf16 on a GPU (trainer.device)
    checkpointing = True if tr.gradient_checkpointing is None else tr.gradient_checkpointing  # auto: on with CUDA
    p = shape.params
    act, cast = (2, 2) if dtype != "float32" else (4, 0)
    prompt, response = _row_tokens(cfg)
    if tr.max_token_len_per_micro_batch:
        tokens = tr.max_token_len_per_micro_batch
        positions = tokens * response // (prompt + response)
    else:
        tokens, positions = tr.micro_batch_size * (prompt + response), tr.micro_batch_size * response
    per_layer = shape.activation_bytes_per_token_layer(act, cast)
    final_norm = 8 * shape.hidden * tokens + 4 * shape.hidden * positions  # + the response states gathered
    chunk = min(tr.logprob_chunk_tokens or positions, positions)
    logits = 12.0 * chunk * shape.vocab
    if checkpointing:
        kept = 4.0 * shape.hidden * shape.layers * tokens + final_norm + cast * shape.head_params
        recompute = per_layer * tokens + cast * shape.layer_linear_params
    else:
        kept = per_layer * shape.layers * tokens + final_norm + cast * (shape.layers * shape.layer_linear_params
                                                                       + shape.head_params)
        recompute = 0.0
    items = {"fp32 weights": 4.0 * p, "fp32 gradients": 4.0 * p, "AdamW moments": 8.0 * p}
    if kept + max(logits, recompute) >= 4.0 * p:
        items["activations" + (" (checkpointed)" if checkpointing else "")] = kept
        items[f"float32 logits ({chunk} x {shape.vocab})" if logits >= recompute else "a recomputed layer"] = \
            max(logits, recompute)
    else:
        items["AdamW step temporaries"] = 4.0 * p
    if algo.use_kl_loss or algo.use_kl_in_reward:
        items["reference model"] = float(DTYPE_BYTES[dtype] * p)
    if algo.adv_estimator == "gae":
        items["value model (weights, gradients, AdamW)"] = 16.0 * p
    if cfg.synchronizer.method == "ipc" and 0 < cfg.explorer.gpus_per_engine < 1:
        items[f"ipc buffers ({IPC_KEPT_VERSIONS} versions)"] = IPC_KEPT_VERSIONS * _weights_bytes(cfg, p)
    items["CUDA context"] = CUDA_CONTEXT_BYTES
    return Part(name, cfg.trainer.gpus_per_worker, items)


def engine_part(cfg: Config, shape: ModelShape, total_bytes: float, name: str = "engine") -> Part:
    """One rollout engine on its GPU (module docstring)."""
    ex = cfg.explorer
    p = shape.params
    weights = float(DTYPE_BYTES["bfloat16" if ex.dtype == "auto" else ex.dtype] * p)
    items: dict[str, float] = {}
    if ex.engine == "vllm" and ex.vllm.kv_cache_memory_gb == 0:
        items[f"vLLM budget ({ex.vllm.gpu_memory_utilization:g} x the GPU)"] = ex.vllm.gpu_memory_utilization * total_bytes
    elif ex.engine == "vllm":
        items.update({"weights": weights, "KV cache": ex.vllm.kv_cache_memory_gb * GIB,
                      "vLLM activations, sampler, CUDA graphs": VLLM_RUNTIME_BYTES, "CUDA context": CUDA_CONTEXT_BYTES})
    else:  # hf: a static cache for prompt + max_new_tokens of its share of a step's rows
        prompt, response = _row_tokens(cfg)
        rows = math.ceil(ex.batch_size * ex.repeat_times / ex.num_engines)
        kv = 2.0 * shape.layers * shape.kv_width * (weights / p) * rows * (prompt + response)
        items.update({"weights": weights, "KV cache": kv, "CUDA context": CUDA_CONTEXT_BYTES})
    if cfg.synchronizer.method == "ipc" and cfg.trainer.gpus_per_worker > 0 and 0 < ex.gpus_per_engine < 1:
        items["copy of a version being loaded"] = _weights_bytes(cfg, p)
    return Part(name, ex.gpus_per_engine, items)


def _weights_bytes(cfg: Config, params: int) -> float:
    """A published version's size: ``trainer.weights_dtype`` (auto: the engines' dtype, bf16 on GPUs)."""
    wd = cfg.trainer.weights_dtype
    if wd == "auto":
        wd = "bfloat16" if cfg.explorer.dtype == "auto" else cfg.explorer.dtype
    return float(DTYPE_BYTES[wd] * params)


def _row_tokens(cfg: Config) -> tuple[int, int]:
    """(prompt, response) tokens of the longest row."""
    ex = cfg.explorer
    return ex.max_prompt_tokens or PROMPT_TOKENS_UNSET, ex.sampling.max_new_tokens


def _place(parts: list[Part]) -> list[list[Part]]:
    """Parts on GPUs as Ray places GPU shares: a fraction on the first GPU with room for it, whole GPUs alone."""
    gpus: list[list[Part]] = []
    free: list[float] = []
    for part in parts:
        if part.gpu_share >= 1:
            gpus.append([part])
            free.append(0.0)
            continue
        room = next((i for i, f in enumerate(free) if f + 1e-9 >= part.gpu_share), None)
        if room is None:
            gpus.append([])
            free.append(1.0)
            room = len(gpus) - 1
        gpus[room].append(part)
        free[room] -= part.gpu_share
    return gpus
