"""Loss aggregation and policy losses.

Shapes: ``B`` sequences, ``L`` response tokens. Masks are float or bool with 1 = the token counts.
"""

from __future__ import annotations

import torch

from trinity_like.algorithms.registry import Registry

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

POLICY_LOSSES: Registry = Registry("policy loss")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(values * mask) / sum(mask); 0 when the mask is empty."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """Aggregate a (B, L) loss matrix into a scalar.

    - ``token-mean``: sum over all valid tokens / number of valid tokens.
    - ``seq-mean-token-sum``: per sequence sum over tokens, then mean over sequences.
    - ``seq-mean-token-mean``: per sequence mean over tokens, then mean over sequences.
    - ``seq-mean-token-sum-norm``: per sequence sum over tokens divided by L (the mask's width), then mean
      over sequences (Dr. GRPO, arXiv:2503.20783).
    Sequences whose mask is all zero do not count as sequences in the ``seq-*`` modes.
    """
    mask = loss_mask.to(loss_mat.dtype)  # (B, L)
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, mask)
    seq_valid = (mask.sum(-1) > 0).to(loss_mat.dtype)  # (B,)
    n_seq = seq_valid.sum().clamp(min=1.0)
    token_sum = (loss_mat * mask).sum(-1)  # (B,)
    if loss_agg_mode == "seq-mean-token-sum":
        seq_loss = token_sum
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_loss = token_sum / mask.sum(-1).clamp(min=1.0)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        seq_loss = token_sum / loss_mat.shape[-1]
    else:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")
    return (seq_loss * seq_valid).sum() / n_seq


@POLICY_LOSSES.register("ppo")
def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate with asymmetric clip ranges and dual-clip (Schulman et al. 2017,
    arXiv:1707.06347; dual-clip: Ye et al. 2019, arXiv:1912.09729).

        r = exp(clamp(log_prob - old_log_prob, -20, 20))
        L_clip = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
        L = min(L_clip, -A c)  where A < 0 (dual-clip), else L_clip

    All inputs are (B, L). Returns ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``: the aggregated
    loss; the fraction of valid tokens where clipping changed the loss; the masked mean of
    ``old_log_prob - log_prob``; the fraction of valid tokens where the dual clip was active.
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1.0 for dual-clip PPO, got {clip_ratio_c}")
    if cliprange_low is None:
        cliprange_low = cliprange
    if cliprange_high is None:
        cliprange_high = cliprange
    if cliprange_low is None or cliprange_high is None:
        raise ValueError("compute_policy_loss needs cliprange or both cliprange_low and cliprange_high")
    mask = response_mask.to(log_prob.dtype)
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # (B, L)
    ratio = torch.exp(negative_approx_kl)  # (B, L)
    ppo_kl = masked_mean(-negative_approx_kl, mask)

    pg_losses1 = -advantages * ratio  # (B, L)
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cliprange_low, 1.0 + cliprange_high)  # (B, L)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)  # (B, L)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).to(mask.dtype), mask)

    pg_losses3 = -advantages * clip_ratio_c  # (B, L)
    clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)  # (B, L)
    negative_adv = advantages < 0
    pg_clipfrac_lower = masked_mean((torch.gt(clip_pg_losses1, pg_losses3) & negative_adv).to(mask.dtype), mask)
    pg_losses = torch.where(negative_adv, clip_pg_losses2, clip_pg_losses1)  # (B, L)
    pg_loss = agg_loss(pg_losses, mask, loss_agg_mode)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower
