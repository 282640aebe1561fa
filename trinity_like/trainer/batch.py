"""Experiences -> one padded training batch (a TensorDict), in verl's layout.

``input_ids`` is the left-padded prompt followed by the right-padded response, so every response starts at
column P (the prompt width) and ``logits[:, P-1 : P+R-1]`` score the response tokens.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from tensordict import TensorDict

from trinity_like.common.experience import Experience
from trinity_like.common.modeling import logprobs_from_logits


def experiences_to_batch(exps: list[Experience], pad_token_id: int, sft_sources: Collection[str] = ()) -> TensorDict:
    """Build the batch. Keys (B sequences, P prompt width, R response width):

    input_ids, attention_mask, position_ids (B, P+R); responses, response_mask, old_log_probs,
    token_level_rewards (B, R); rewards, model_version, group_index, has_log_probs, sft (B,).

    ``sft`` is true for rows whose source is in ``sft_sources`` (trained with the SFT loss instead of the policy
    loss, ``algorithm.sft_sources``); a per-row key, so data-parallel sharding and mini-batch shuffles carry it."""
    if not exps:
        raise ValueError("cannot build a batch from zero experiences")
    batch = len(exps)
    width_p = max(len(e.prompt_ids) for e in exps)
    width_r = max(max(len(e.response_ids) for e in exps), 1)
    input_ids = torch.full((batch, width_p + width_r), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width_p + width_r), dtype=torch.long)
    response_mask = torch.zeros((batch, width_r), dtype=torch.float32)
    old_log_probs = torch.zeros((batch, width_r), dtype=torch.float32)
    token_level_rewards = torch.zeros((batch, width_r), dtype=torch.float32)
    has_log_probs = torch.zeros(batch, dtype=torch.bool)
    group_of: dict[str, int] = {}
    for i, e in enumerate(exps):
        p, r = len(e.prompt_ids), len(e.response_ids)
        input_ids[i, width_p - p:width_p] = torch.from_numpy(e.prompt_ids)
        input_ids[i, width_p:width_p + r] = torch.from_numpy(e.response_ids)
        attention_mask[i, width_p - p:width_p + r] = 1
        response_mask[i, :r] = 1.0 if e.action_mask is None else torch.from_numpy(e.action_mask).float()
        if e.logprobs is not None:
            old_log_probs[i, :r] = torch.from_numpy(e.logprobs)
            has_log_probs[i] = True
        if e.token_rewards is not None:
            token_level_rewards[i, :r] = torch.from_numpy(e.token_rewards)
        if e.reward is not None and r > 0:
            token_level_rewards[i, r - 1] += float(e.reward)
        group_of.setdefault(e.group_id or e.eid, len(group_of))
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "responses": input_ids[:, width_p:].clone(),
            "response_mask": response_mask,
            "old_log_probs": old_log_probs,
            "token_level_rewards": token_level_rewards,
            "rewards": torch.tensor([float(e.reward or 0.0) for e in exps]),
            "model_version": torch.tensor([e.model_version for e in exps], dtype=torch.long),
            "group_index": torch.tensor([group_of[e.group_id or e.eid] for e in exps], dtype=torch.long),
            "has_log_probs": has_log_probs,
            "sft": torch.tensor([e.source in sft_sources for e in exps], dtype=torch.bool),
        },
        batch_size=[batch],
    )


def compute_log_probs(model, batch: TensorDict, temperature: float, with_entropy: bool = False):
    """Log-probs (B, R) of the batch's response tokens under ``model`` at ``temperature``; with
    ``with_entropy`` also the entropy (B, R) of the temperature-scaled distribution at each position."""
    width_r = batch["responses"].shape[1]
    width_p = batch["input_ids"].shape[1] - width_r
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"],
        use_cache=False,
    ).logits  # (B, P+R, V)
    logits = logits[:, width_p - 1:width_p + width_r - 1, :]  # (B, R, V)
    log_prob = logprobs_from_logits(logits, batch["responses"], temperature)
    if not with_entropy:
        return log_prob
    logp_all = torch.log_softmax(logits.float() / (temperature if temperature > 0 else 1.0), dim=-1)  # (B, R, V)
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # (B, R)
    return log_prob, entropy
