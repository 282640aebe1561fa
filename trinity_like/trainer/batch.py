"""Experiences -> one padded training batch (a TensorDict), in verl's layout.

``input_ids`` is the left-padded prompt followed by the right-padded response, so every response starts at
column P (the prompt width) and ``logits[:, P-1 : P+R-1]`` score the response tokens.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import torch
from tensordict import TensorDict

from trinity_like.common.experience import Experience
from trinity_like.common.modeling import log_softmax_at
from trinity_like.common.train_bound import row_trainable, token_trained


def experiences_to_batch(exps: list[Experience], pad_token_id: int, sft_sources: Collection[str] = ()) -> TensorDict:
    """Build the batch. Keys (B sequences, P prompt width, R response width):

    input_ids, attention_mask, position_ids (B, P+R); responses, response_mask, old_log_probs,
    token_level_scores, token_level_rewards, token_versions (B, R); rewards, reward_baselines, model_version,
    group_index, has_log_probs, sft (B,).

    ``token_versions`` is the policy version of each response token: the row's ``token_versions`` where it has
    them, else its ``model_version`` (also on the padding columns, which every mask leaves out).

    ``token_level_scores`` holds each row's token rewards plus its outcome reward on the last response token;
    ``token_level_rewards`` starts as a copy of it (the trainer subtracts the in-reward KL from it, verl's
    two keys). ``reward_baselines`` is ``info["reward_baseline"]`` (the reward of the prompt's greedy response,
    ReMax's baseline, which the explorer records when ``algorithm.adv_estimator`` is remax), NaN for a row
    without one.

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
    token_level_scores = torch.zeros((batch, width_r), dtype=torch.float32)
    token_versions = torch.tensor([e.model_version for e in exps], dtype=torch.long).unsqueeze(-1).repeat(1, width_r)
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
            token_level_scores[i, :r] = torch.from_numpy(e.token_rewards)
        if e.token_versions is not None:
            token_versions[i, :r] = torch.from_numpy(e.token_versions)
        if e.reward is not None and r > 0:
            token_level_scores[i, r - 1] += float(e.reward)
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
            "token_level_scores": token_level_scores,
            "token_level_rewards": token_level_scores.clone(),
            "token_versions": token_versions,
            "rewards": torch.tensor([float(e.reward or 0.0) for e in exps]),
            "reward_baselines": torch.tensor([_reward_baseline(e) for e in exps]),
            "model_version": torch.tensor([e.model_version for e in exps], dtype=torch.long),
            "group_index": torch.tensor([group_of[e.group_id or e.eid] for e in exps], dtype=torch.long),
            "has_log_probs": has_log_probs,
            "sft": torch.tensor([e.source in sft_sources for e in exps], dtype=torch.bool),
        },
        batch_size=[batch],
    )


def mask_stale_tokens(batch: TensorDict, bound: int, train_slack: int) -> int:
    """Take the response tokens older than the training bound out of the loss (``synchronizer.train_slack``,
    ``common.train_bound``): ``response_mask`` (B, R) becomes 0 where ``token_versions`` is below
    ``bound - train_slack`` (``bound`` = the trainer's version - ``max_staleness``), in each row the rule trains
    (``row_trainable``). Every loss, its normaliser (``token-mean``: the mask's sum; ``seq-*``: each row's own
    count) and the advantage estimators read this mask, so a masked token weighs exactly as a token outside it (a
    prompt or padding). Returns how many valid tokens were masked.

    A row the rule drops whole (no token left) never comes from the buffer reader; one handed to the engine
    directly (a tool, a test) is trained as given, as before the slack existed."""
    mask = batch["response_mask"]  # (B, R)
    versions = batch["token_versions"]  # (B, R); padding columns hold model_version, the oldest
    kept = row_trainable(batch["model_version"], versions.max(-1).values, bound, train_slack)  # (B,)
    stale = (mask > 0) & ~token_trained(versions, bound, train_slack) & kept.unsqueeze(-1)  # (B, R)
    masked = int(stale.sum())
    if masked:
        batch["response_mask"] = mask.masked_fill(stale, 0.0)
    return masked


def staleness(versions: torch.Tensor, step: int) -> torch.Tensor:
    """``step - version`` of each entry of ``versions`` (any shape: a row's ``model_version`` (B,) or its
    ``token_versions`` (B, R)), as float, 0 for version -1 (not generated by this run's policy: imported rows,
    demonstrations) and for versions past ``step`` (rows replayed from another run may carry them)."""
    return torch.where(versions < 0, 0, step - versions).clamp(min=0).float()


def widths(batch: TensorDict) -> tuple[int, int]:
    """The batch's prompt and response widths (P, R)."""
    width_r = batch["responses"].shape[1]
    return batch["input_ids"].shape[1] - width_r, width_r


def row_widths(batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's real prompt and response lengths, (B,) each (left-padded prompts, right-padded responses)."""
    width_p, _ = widths(batch)
    mask = batch["attention_mask"]
    return mask[:, :width_p].sum(-1), mask[:, width_p:].sum(-1)


def trim(batch: TensorDict) -> TensorDict:
    """``batch`` cut to its own widest prompt and widest response: the columns that are padding in every row go
    (a micro-batch of short rows no longer carries the width of the longest row of the whole batch). Keys of the
    sequence's width (B, P+R) lose leading and trailing columns, keys of the response's width (B, R) trailing
    ones; per-row keys stay. Log-probs, losses and gradients over the kept columns are the same: the cut columns
    are masked out everywhere."""
    width_p, width_r = widths(batch)
    prompt_len, response_len = row_widths(batch)
    p, r = int(prompt_len.max()), max(int(response_len.max()), 1)
    if p == width_p and r == width_r:
        return batch
    lo, hi = width_p - p, width_p + r
    out = {}
    for key, value in batch.items():
        if value.dim() >= 2 and value.shape[1] == width_p + width_r:
            value = value[:, lo:hi]
        elif value.dim() >= 2 and value.shape[1] == width_r:
            value = value[:, :r]
        out[key] = value
    return TensorDict(out, batch_size=batch.batch_size, device=batch.device)


def pad_responses(values: torch.Tensor, width_r: int) -> torch.Tensor:
    """(b, r) response values widened to (b, ``width_r``) with zeros on the right (undoes ``trim``'s cut)."""
    if values.shape[1] == width_r:
        return values
    return torch.nn.functional.pad(values, (0, width_r - values.shape[1]))


def _reward_baseline(e: Experience) -> float:
    """The row's ReMax baseline, ``info["reward_baseline"]``; NaN when it has none."""
    value = e.info.get("reward_baseline")
    return math.nan if value is None else float(value)


class ResponseScorer(torch.nn.Module):
    """A causal LM that returns the log-probs (and entropy) of a batch's response tokens.

    The decoder runs once over prompt + response; the output layer and the float32 log-softmax then run over
    the real response tokens only (padding scores 0), ``chunk_tokens`` tokens at a time, each chunk recomputed
    in the backward pass (``torch.utils.checkpoint``), so float32 logits of at most ``chunk_tokens x vocabulary``
    exist at once instead of ``batch x length x vocabulary`` (with a 151,936-token vocabulary, 8 x 2,048 tokens
    are ~10 GB).
    ``chunk_tokens`` 0 = one chunk, nothing recomputed. It is the module a trainer trains (and wraps in DDP or
    shards with FSDP2), so every pass goes through its forward. Models whose output layer does more than a
    linear map (final logit soft-capping, a logit scale) are scored by their own forward, unchunked."""

    def __init__(self, lm: torch.nn.Module, chunk_tokens: int = 0) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_tokens = chunk_tokens
        config = getattr(lm, "config", None)
        self.plain_head = not (getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None))

    def forward(self, input_ids, attention_mask, position_ids, responses, temperature: float,
                with_entropy: bool = False):
        width_r = responses.shape[1]
        width_p = input_ids.shape[1] - width_r
        if not self.plain_head:
            logits = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=False).logits[:, width_p - 1:width_p + width_r - 1]  # (B, R, V)
            return _score(lambda x: x, logits, responses, temperature, with_entropy)
        hidden = self.lm.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                       use_cache=False).last_hidden_state
        hidden = hidden[:, width_p - 1:width_p + width_r - 1]  # (B, R, H): the states that predict the response
        head = self.lm.get_output_embeddings()
        # only the real response tokens go through the output layer (padding scores 0)
        real = attention_mask[:, width_p:].bool()  # (B, R)
        flat_h, flat_t = hidden[real], responses[real]  # (n, H), (n,)
        n = flat_t.shape[0]
        if not self.chunk_tokens or n <= self.chunk_tokens:
            out = _score(head, flat_h, flat_t, temperature, with_entropy)
        else:
            from torch.utils.checkpoint import checkpoint

            parts = []
            for lo in range(0, n, self.chunk_tokens):
                args = (head, flat_h[lo:lo + self.chunk_tokens], flat_t[lo:lo + self.chunk_tokens], temperature,
                        with_entropy)
                parts.append(checkpoint(_score, *args, use_reentrant=False) if torch.is_grad_enabled()
                             else _score(*args))
            out = tuple(torch.cat(p) for p in zip(*parts, strict=True)) if with_entropy else torch.cat(parts)
        if with_entropy:
            return _scatter(out[0], real), _scatter(out[1], real)
        return _scatter(out, real)


def _scatter(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """``values`` (n,) placed at the true positions of ``where`` (B, R), zeros elsewhere (differentiable)."""
    return torch.zeros(where.shape, dtype=values.dtype, device=values.device).masked_scatter(where, values)


def _score(head, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float, with_entropy: bool):
    """Log-probs of ``tokens`` (and the entropy of each position's temperature-scaled distribution) from the
    states ``hidden`` through the output layer ``head``, in float32."""
    logp_all = log_softmax_at(head(hidden), temperature)  # (n, V): the log-prob rule of common.modeling
    log_prob = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return log_prob
    return log_prob, -(logp_all.exp() * logp_all).sum(-1)


def compute_log_probs(model, batch: TensorDict, temperature: float, with_entropy: bool = False):
    """Log-probs (B, R) of the batch's response tokens under ``model`` at ``temperature``; with
    ``with_entropy`` also the entropy (B, R) of the temperature-scaled distribution at each position.
    ``model`` is a ResponseScorer (possibly inside DDP) or a plain causal LM (scored in one chunk)."""
    inner = getattr(model, "module", model)  # DDP keeps the wrapped module as .module
    scorer = model if isinstance(inner, ResponseScorer) else ResponseScorer(model)
    return scorer(batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["responses"],
                  temperature, with_entropy)
