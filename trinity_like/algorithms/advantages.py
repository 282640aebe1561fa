"""Advantage estimators. Every entry takes the same keyword arguments and returns (advantages, returns),
both (B, L), zero outside ``response_mask``.

``token_level_rewards`` is (B, L) with the outcome reward on the last valid token; ``index`` holds one group
id per sequence (samples of the same task in one explorer step).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from trinity_like.algorithms.registry import Registry

ADV_ESTIMATORS: Registry = Registry("advantage estimator")


@ADV_ESTIMATORS.register("grpo")
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: list[str],
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (Shao et al. 2024, arXiv:2402.03300):

        A_i = (R_i - mean_g(R)) / (std_g(R) + eps)   broadcast over the response tokens of sequence i

    ``R_i`` is the sum of the (B, L) token rewards of sequence i; ``mean_g``/``std_g`` are over the sequences
    sharing i's group id (std unbiased, as torch.std; statistics in float64). A group of one sample gets mean 0 and std 1, so its
    advantage is its reward (as in verl). ``norm_adv_by_std_in_grpo=False`` gives Dr. GRPO's A = R - mean.
    """
    # Group statistics in float64: in float32 the mean of equal scores can miss them by an ulp, and dividing
    # that by (std ~ 1e-7) + eps would turn a zero-variance group into advantages of order 0.1.
    scores = (token_level_rewards.double() * response_mask.double()).sum(-1)  # (B,)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(index):
        groups[g].append(i)
    mean = torch.zeros_like(scores)
    std = torch.ones_like(scores)
    for rows in groups.values():
        if len(rows) > 1:
            group_scores = scores[rows]  # (G,)
            mean[rows] = group_scores.mean()
            std[rows] = group_scores.std()
    if norm_adv_by_std_in_grpo:
        adv = (scores - mean) / (std + epsilon)
    else:
        adv = scores - mean
    advantages = adv.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask  # (B, L)
    return advantages, advantages
