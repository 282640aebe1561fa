"""The transformers rollout engine: batched sampling with a transformers causal LM, on the CPU or on the GPU
Ray gave its process (``explorer.gpus_per_engine``), in ``explorer.dtype``.

Prompts are left-padded into one batch; generation runs step by step with the KV cache under
``torch.inference_mode``. Each sampled token's behaviour log-prob is taken from the temperature-scaled
distribution (``logprobs_from_logits``), the same rule the trainer uses.

The prefill computes the output layer at each prompt's last position only (transformers' ``logits_to_keep=1``):
the logits of the other positions are never used, and for 64 prompts x 512 tokens x a 151,936-token vocabulary
they would take 10 GB in bfloat16 (measured on the CPU, 16 x 256 tokens of that vocabulary: 2.4 GB of peak memory
in float32 before, 67 MB with it). Same tokens (tested); the first token's log-prob moves by float32 rounding (the
output layer's matmul has B rows instead of B x P). A model whose forward lacks ``logits_to_keep`` computes them
all and keeps the last.

Departure from "sampled distribution" when ``top_p < 1`` or ``top_k > 0``: tokens are drawn from the
truncated distribution but scored under the untruncated temperature-scaled one, because that is the
distribution the trainer can recompute (as in verl); the truncation is a property of the sampler.
"""

from __future__ import annotations

import inspect
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trinity_like.common.modeling import (
    export_state_dict,
    import_state_dict,
    load_causal_lm,
    logprobs_from_logits,
)
from trinity_like.common.placement import resolve_device
from trinity_like.config import SamplingConfig
from trinity_like.explorer.engines.base import (
    ChatByGenerate,
    Sample,
    WeightsMismatch,
    check_fingerprint,
    response_stop_ids,
)
from trinity_like.weights.fingerprint import received_fingerprint, weights_fingerprint
from trinity_like.weights.messages import WeightsInfo
from trinity_like.weights.receive import read_weights


def _filter_logits(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / nucleus to -inf. scaled (B, V)."""
    if top_k > 0 and top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]  # (B, 1)
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)  # (B, V)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop_sorted = cum - torch.softmax(sorted_logits, dim=-1) >= top_p  # keep the token that crosses p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


class HFEngine(ChatByGenerate):
    """A transformers model that samples responses and loads new weights between calls.

    Each request has its own seeded random stream (``seeds``), drawn up front, so a request's sample does not
    depend on which other requests share its batch. ``_lock`` makes generation and weight updates mutually
    exclusive: no request ever runs on half-loaded weights."""

    def __init__(self, model_path: str | Path, engine_id: str = "hf-0", num_threads: int = 1,
                 dtype: str = "auto", kv_cache: str = "auto", device: str = "auto") -> None:
        """``device`` (``explorer.device``): ``auto`` is the GPU Ray assigned this engine's actor
        (``explorer.gpus_per_engine``; outside Ray the GPU this process sees), else the CPU; ``cpu`` pins the
        CPU even where a GPU is visible (what CPU reference computations need); ``cuda`` fails without a GPU. ``dtype`` ``auto`` is
        bfloat16 on a GPU and float32 on the CPU; ``kv_cache`` ``auto`` is ``static`` (preallocated for the
        whole batch) on a GPU and ``dynamic`` on the CPU."""
        torch.set_num_threads(num_threads)
        self.engine_id = engine_id
        self.model_path = str(model_path)
        self.device = resolve_device(device, "explorer")
        if dtype == "auto":
            dtype = "bfloat16" if self.device.type == "cuda" else "float32"
        self.dtype = dtype
        if kv_cache not in ("auto", "dynamic", "static"):
            raise ValueError(f"kv_cache must be auto, dynamic or static, got {kv_cache!r}")
        self.kv_cache = ("static" if self.device.type == "cuda" else "dynamic") if kv_cache == "auto" else kv_cache
        self.model = load_causal_lm(model_path).to(self.device, getattr(torch, dtype))
        self._last_logits_only = ({"logits_to_keep": 1}
                                  if "logits_to_keep" in inspect.signature(self.model.forward).parameters else {})
        """Keyword that makes the prefill compute logits at the last position only (empty: the model lacks it)."""
        eos = self.model.config.eos_token_id
        self.stop_ids = response_stop_ids(model_path) or [int(e) for e in (eos if isinstance(eos, list) else [eos])]
        """Ids a response ends at (``response_stop_ids``: every EOS, the chat template's turn end)."""
        self.eos_token_id = self.stop_ids[0]
        pad = self.model.config.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.eos_token_id)
        self.model_version = 0
        """Version of the weights loaded now; stamped on every sample this engine makes."""
        self._lock = threading.Lock()
        self._tokenizer = None
        self._served = 0
        self.last_load_bytes = 0
        """Bytes read by the last weight update."""
        self.fingerprint = weights_fingerprint(export_state_dict(self.model, copy=False))
        """Fingerprint of the weights served, recomputed from the model after every update."""
        self.verified = True
        """False after a load that left weights other than the published ones: the engine then refuses to
        generate until a version loads and verifies."""
        self.on_received = None
        """Test hook (fault injection): called with each update's tensors after the transfer, before the check."""

    # ------------------------------------------------------------ weights
    def update_weights(self, update: WeightsInfo) -> None:
        """Load a version: its tensors are checked against the published fingerprint before anything changes
        (a damaged transfer is refused, the previous version keeps serving), and the weights served after the
        load are fingerprinted again (a load that did not apply them takes the engine out of service)."""
        # files checked against their manifest, the tensors themselves, or this process's copy of a shared buffer
        received = read_weights(update)
        state_dict, self.last_load_bytes, checked = received.state_dict, received.bytes, received.checked
        if self.on_received is not None:
            self.on_received(state_dict)
            checked = ""  # the hook may have changed them since
        like = update.fingerprint  # computed in the scheme of the published fingerprint (an older version's: crc)
        received = received_fingerprint(state_dict, like, checked)
        if update.fingerprint:
            check_fingerprint(received, update, self.engine_id, self.model_version, "received")
        with self._lock:
            import_state_dict(self.model, state_dict)
            # what it serves must be what it received, in the engine's own dtype (a bfloat16 engine holds a
            # rounded copy of float32 weights): a load that did not apply them takes the engine out of service
            served_sd = export_state_dict(self.model, copy=False)
            served = weights_fingerprint(served_sd, like=like)
            cast = {k: t.dtype for k, t in served_sd.items() if k in state_dict and state_dict[k].dtype != t.dtype}
            expected = weights_fingerprint(state_dict, cast, like=like) if cast else received
            if served != expected:
                self.verified = False
                raise WeightsMismatch(
                    f"engine {self.engine_id}: after loading version {update.version} it serves weights of "
                    f"fingerprint {served}, not those it received ({expected}); the load did not apply them, and "
                    "the engine refuses requests until a version loads and verifies")
            # the version's fingerprint as published (what status compares), once both checks passed
            self.model_version, self.fingerprint, self.verified = update.version, update.fingerprint or served, True

    def weights_fingerprint(self) -> str:
        """``weights_fingerprint`` of the weights being served (tied aliases dropped, as the trainer sends them)."""
        with self._lock:
            return weights_fingerprint(export_state_dict(self.model, copy=False))

    def health(self) -> dict[str, Any]:
        return {"engine_id": self.engine_id, "model_version": self.model_version, "served": self._served,
                "busy": self._lock.locked(), "fingerprint": self.fingerprint, "verified": self.verified,
                "backend": "hf", "device": str(self.device), "dtype": self.dtype, "kv_cache": self.kv_cache}

    # ------------------------------------------------------------ generation
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int],
                 offsets: list[int] | None = None) -> list[Sample]:
        """Sample one response per prompt. The same prompt, weights and seed give the same sample. ``offsets``:
        tokens of each response already generated (ending its prompt): its random stream goes on from there, so
        a response continued on unchanged weights is the uncut one (up to the prefill's rounding)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate needs a non-empty list of non-empty prompts")
        if len(seeds) != len(prompts):
            raise ValueError(f"generate needs one seed per prompt, got {len(seeds)} for {len(prompts)}")
        with self._lock:
            if not self.verified:
                raise WeightsMismatch(f"engine {self.engine_id} serves weights that failed their fingerprint check; "
                                      "it takes requests again once a version loads and verifies")
            start = time.perf_counter()
            tok_mat, lp_mat, lengths = self._sample(prompts, sampling, seeds, offsets or [0] * len(prompts))
            elapsed = time.perf_counter() - start
            version = self.model_version
            self._served += len(prompts)
        stops = {*self.stop_ids, *sampling.stop_token_ids}
        samples = []
        for i in range(len(prompts)):
            n = int(lengths[i])
            ids = tok_mat[i, :n].copy()
            reason = "stop" if n and int(ids[-1]) in stops else "length"
            samples.append(Sample(response_ids=ids, logprobs=lp_mat[i, :n].copy(), finish_reason=reason,
                                  model_version=version, time_s=elapsed, engine_id=self.engine_id))
        return samples

    @torch.inference_mode()
    def _sample(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int], offsets: list[int]):
        batch = len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)  # (B, P)
        attention_mask = torch.zeros((batch, width), dtype=torch.long)  # (B, P)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p):] = torch.as_tensor(np.asarray(p), dtype=torch.long)
            attention_mask[i, width - len(p):] = 1
        dev = self.device
        input_ids, attention_mask = input_ids.to(dev), attention_mask.to(dev)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, P)
        steps = sampling.max_new_tokens
        # One uniform per (request, position), from the request's own generator: sampling is inverse-CDF on
        # these, so a request's tokens do not depend on the other requests in the batch.
        # (drawn on the CPU, so a seed gives the same stream on any device)
        uniforms = torch.stack([torch.rand(k + steps, generator=torch.Generator().manual_seed(s),
                                           dtype=torch.float64)[k:]
                                for s, k in zip(seeds, offsets, strict=True)]).to(dev)  # (B, T)
        stop_ids = torch.tensor(sorted({*self.stop_ids, *sampling.stop_token_ids}), dtype=torch.long, device=dev)

        static = self.kv_cache == "static"
        if static:  # one preallocated cache for prompt + every new token: no per-step concatenation
            from transformers import StaticCache

            past = StaticCache(config=self.model.config, max_cache_len=width + steps)
            positions = {"cache_position": torch.arange(width, device=dev)}
        else:
            past, positions = None, {}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past, use_cache=True, **positions, **self._last_logits_only)
        past = out.past_key_values
        logits = out.logits[:, -1, :]  # (B, V); out.logits is (B, 1, V), or (B, P, V) without logits_to_keep
        next_pos = position_ids[:, -1:] + 1  # (B, 1)
        tokens: list[torch.Tensor] = []
        logps: list[torch.Tensor] = []
        finished = torch.zeros(batch, dtype=torch.bool, device=dev)
        lengths = torch.zeros(batch, dtype=torch.long, device=dev)
        for t in range(steps):
            if sampling.temperature > 0:
                scaled = _filter_logits(logits.float() / sampling.temperature, sampling.top_k, sampling.top_p)
                cdf = torch.softmax(scaled, -1).double().cumsum(-1)  # (B, V)
                u = (uniforms[:, t] * cdf[:, -1]).unsqueeze(-1)  # (B, 1)
                tok = torch.searchsorted(cdf, u).squeeze(-1).clamp(max=cdf.shape[-1] - 1)  # (B,)
            else:
                tok = logits.argmax(-1)  # (B,)
            tok = torch.where(finished, torch.full_like(tok, self.pad_token_id), tok)
            tokens.append(tok)
            logps.append(logprobs_from_logits(logits, tok, sampling.temperature))
            lengths += (~finished).long()
            finished |= torch.isin(tok, stop_ids)
            if bool(finished.all()):
                break
            # Finished rows keep decoding pad tokens whose outputs are discarded; their mask value does not matter.
            attention_mask = torch.cat([attention_mask, torch.ones((batch, 1), dtype=torch.long, device=dev)], dim=-1)
            if static:
                positions = {"cache_position": torch.tensor([width + t], device=dev)}
            out = self.model(input_ids=tok.unsqueeze(-1), attention_mask=attention_mask, position_ids=next_pos,
                             past_key_values=past, use_cache=True, **positions)
            past = out.past_key_values
            logits = out.logits[:, -1, :]
            next_pos = next_pos + 1
        tok_mat = torch.stack(tokens, dim=1).to(torch.int32).cpu().numpy()  # (B, T)
        lp_mat = torch.stack(logps, dim=1).to(torch.float32).cpu().numpy()  # (B, T)
        return tok_mat, lp_mat, lengths.cpu()
