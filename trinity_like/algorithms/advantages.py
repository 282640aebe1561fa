"""Advantage estimators. Each returns ``(advantages, returns)``, both (B, L).

All are registered in ``ADV_ESTIMATORS`` and called by keyword with the same set of inputs; each takes what
it needs and ignores the rest (``**kwargs``), so the trainer's call site is one line for every estimator:

    token_level_rewards (B, L)   rewards per response token; an outcome reward sits on the last token
    response_mask (B, L)         1 = a token the policy produced
    index (list, B)              group id per row (samples of one task in one explorer step)
    values (B, L)                critic values (gae)
    reward_baselines (B,)        reward of the greedy response (remax)
    gamma, lam, epsilon, norm_adv_by_std_in_grpo, opmd_baseline, tau

Conventions, those of verl so numbers match: the outcome score of a row is the sum of its token-level rewards
(over every position: rewards are zero outside the mask by construction); group statistics use torch.mean
and torch.std (unbiased); a group of one gets mean 0 and std 1; GRPO divides by (std + epsilon); whitening is
``masked_whiten``. Group statistics are computed in float64 (see ``_group_stats``).

``compute_advantage`` is the batch-level entry (verl's ``ray_trainer.compute_advantage``): it reads those inputs
from a batch, calls the estimator registered under a name, and writes ``advantages`` and ``returns`` back.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from trinity_like.algorithms.functional import masked_whiten
from trinity_like.common.registry import Registry

ADV_ESTIMATORS: Registry = Registry("advantage estimator")


def _group_rows(index) -> dict:
    rows: dict = defaultdict(list)
    for i, g in enumerate(index):
        rows[g].append(i)
    return rows


def _check_index(index, batch: int, name: str) -> None:
    if index is None or len(index) != batch:
        raise ValueError(f"{name} needs `index`, one group id per row ({batch} rows), got "
                         f"{None if index is None else len(index)}")


def _group_stats(scores: torch.Tensor, index) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row group mean, std and size, in float64. In float32 the mean of equal scores can miss them by
    an ulp, and dividing that by (std ~ 1e-7) + eps turns a zero-variance group into advantages ~0.1."""
    scores = scores.double()
    mean = torch.zeros_like(scores)
    std = torch.ones_like(scores)
    size = torch.ones_like(scores)
    for rows in _group_rows(index).values():
        size[rows] = float(len(rows))
        if len(rows) > 1:
            group = scores[rows]  # (G,)
            mean[rows] = group.mean()
            std[rows] = group.std()
    return mean, std, size


@ADV_ESTIMATORS.register("gae")
def compute_gae_advantage_return(token_level_rewards: torch.Tensor, values: torch.Tensor,
                                 response_mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0,
                                 **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv:1506.02438):

        delta_t = r_t + gamma * V_{t+1} - V_t;     A_t = delta_t + gamma * lam * A_{t+1}
        returns = A + V;   advantages = whiten(A) over the mask

    Masked positions (tool output inside a multi-turn response) are skipped: the recursion carries V_{t+1}
    and A_{t+1} from the next unmasked token, so values and rewards there never change a result.
    """
    if values is None:
        raise ValueError("gae needs `values` from a critic")
    mask = response_mask.to(values.dtype)
    with torch.no_grad():
        next_values = torch.zeros_like(values[:, 0])  # (B,)
        last_gae = torch.zeros_like(values[:, 0])  # (B,)
        reversed_adv = []
        for t in reversed(range(token_level_rewards.shape[-1])):
            delta = token_level_rewards[:, t] + gamma * next_values - values[:, t]
            gae = delta + gamma * lam * last_gae
            next_values = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_values
            last_gae = gae * mask[:, t] + (1 - mask[:, t]) * last_gae
            reversed_adv.append(last_gae)
        advantages = torch.stack(reversed_adv[::-1], dim=1)  # (B, L)
        returns = advantages + values
        advantages = masked_whiten(advantages, mask)
    return advantages, returns


@ADV_ESTIMATORS.register("grpo")
def compute_grpo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                                   epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True,
                                   **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (Shao et al. 2024, arXiv:2402.03300), broadcast over the response tokens:

        A_i = (R_i - mean_g(R)) / (std_g(R) + epsilon)

    ``norm_adv_by_std_in_grpo=False`` gives Dr. GRPO's A_i = R_i - mean_g(R) (arXiv:2503.20783)."""
    _check_index(index, token_level_rewards.shape[0], "grpo")
    scores = token_level_rewards.sum(-1)  # (B,)
    mean, std, _ = _group_stats(scores, index)
    adv = scores.double() - mean
    if norm_adv_by_std_in_grpo:
        adv = adv / (std + epsilon)
    advantages = adv.to(scores.dtype).unsqueeze(-1) * response_mask  # (B, L)
    return advantages, advantages


@ADV_ESTIMATORS.register("dapo")
def compute_dapo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                                   epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True,
                                   **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """DAPO's advantage (Yu et al. 2025, arXiv:2503.14476, eq. 9): GRPO's group-normalised outcome advantage,
    broadcast over the response tokens,

        A_i = (R_i - mean_g(R)) / (std_g(R) + epsilon)

    token_level_rewards, response_mask (B, L); index (B,) group ids; returns (advantages, returns), both (B, L)
    and equal. DAPO's other parts are not advantages: clip-higher (``clip_ratio_high`` of the policy loss),
    token-mean loss aggregation, dynamic sampling (``explorer.dynamic_sampling``) and overlong reward shaping
    (the ``dapo`` reward manager). The name exists so a DAPO run reads as one."""
    _check_index(index, token_level_rewards.shape[0], "dapo")
    return compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=epsilon,
                                          norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)


@ADV_ESTIMATORS.register("rloo")
def compute_rloo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                                   **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, arXiv:2402.14740): the baseline of a sample is the mean
    of the other samples of its group,

        A_i = R_i - mean_{j != i} R_j = G / (G - 1) * (R_i - mean_g(R));   a group of one keeps R_i."""
    _check_index(index, token_level_rewards.shape[0], "rloo")
    scores = token_level_rewards.sum(-1)  # (B,)
    mean, _, size = _group_stats(scores, index)
    factor = torch.where(size > 1, size / (size - 1).clamp(min=1.0), torch.ones_like(size))
    adv = torch.where(size > 1, (scores.double() - mean) * factor, scores.double())
    advantages = adv.to(scores.dtype).unsqueeze(-1) * response_mask
    return advantages, advantages


@ADV_ESTIMATORS.register("reinforce")
def compute_reinforce_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                        **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE without a baseline (Williams 1992; Trinity-RFT's ``reinforce`` advantage_fn, the one its TOPR
    uses): the outcome reward itself on every valid token, A_i = R_i."""
    scores = token_level_rewards.sum(-1)  # (B,)
    advantages = scores.unsqueeze(-1) * response_mask.to(scores.dtype)  # (B, L)
    return advantages, advantages


@ADV_ESTIMATORS.register("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards: torch.Tensor,
                                                  response_mask: torch.Tensor, gamma: float = 1.0,
                                                  **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted returns over the valid tokens,
    G_t = r_t + gamma * G_next where G_next is the return of the next valid token; advantages are the returns
    whitened over the whole batch's mask.

    Masked positions (tool output between turns) are skipped, as in ``gae``: they carry the return of the next
    valid token and their rewards are ignored, so a first turn still sees the outcome reward. On right-padded
    responses this equals verl's reset-after-EOS recursion."""
    mask = response_mask.to(token_level_rewards.dtype)
    with torch.no_grad():
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])  # (B,)
        for t in reversed(range(token_level_rewards.shape[-1])):
            running = mask[:, t] * (token_level_rewards[:, t] + gamma * running) + (1 - mask[:, t]) * running
            returns[:, t] = running
        advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


@ADV_ESTIMATORS.register("reinforce_plus_plus_baseline")
def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards: torch.Tensor,
                                                           response_mask: torch.Tensor, index,
                                                           **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline: A_i = R_i - mean_g(R) on every valid token, then whitened over
    the batch's mask (a group of one has baseline 0)."""
    _check_index(index, token_level_rewards.shape[0], "reinforce_plus_plus_baseline")
    scores = token_level_rewards.sum(-1)
    mean, _, _ = _group_stats(scores, index)
    mask = response_mask.to(token_level_rewards.dtype)
    centred = (scores.double() - mean).to(scores.dtype).unsqueeze(-1) * mask  # (B, L)
    advantages = masked_whiten(centred, mask) * mask
    return advantages, advantages


@ADV_ESTIMATORS.register("remax")
def compute_remax_outcome_advantage(token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor,
                                    response_mask: torch.Tensor, **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv:2310.10505): the baseline is the reward of the greedy response,

        G_t = sum_{s >= t} m_s r_s;     A_t = G_t - b * m_t"""
    if reward_baselines is None:
        raise ValueError("remax needs `reward_baselines`, the reward of each prompt's greedy response")
    missing = torch.isnan(reward_baselines)  # (B,): NaN marks a row without one (trinity_like.trainer.batch)
    if bool(missing.any()):
        raise ValueError(
            f"remax needs a reward baseline for every row, {int(missing.sum())} of {missing.numel()} rows have none: "
            "the single_turn workflow stores the reward of a greedy response as info['reward_baseline'] when "
            "algorithm.adv_estimator is remax; rows from other workflows or imported rows lack it")
    mask = response_mask.to(token_level_rewards.dtype)
    returns = (token_level_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])  # (B, L)
    advantages = returns - reward_baselines.unsqueeze(-1) * mask
    return advantages, returns


@ADV_ESTIMATORS.register("opmd")
def compute_opmd_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                                   opmd_baseline: str = "mean", tau: float = 1.0,
                                   **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Online policy mirror descent (Trinity-RFT, arXiv:2505.17826): A_i = R_i - b_g with the group baseline

        b_g = mean_g(R)                                          (opmd_baseline="mean")
        b_g = tau * (logsumexp_g(R / tau) - log G)               (opmd_baseline="logavgexp")

    A group of one has baseline 0."""
    _check_index(index, token_level_rewards.shape[0], "opmd")
    if opmd_baseline not in ("mean", "logavgexp"):
        raise ValueError(f"opmd_baseline must be 'mean' or 'logavgexp', got {opmd_baseline!r}")
    scores = token_level_rewards.sum(-1)  # (B,)
    baseline = torch.zeros(scores.shape, dtype=torch.float64, device=scores.device)
    s64 = scores.double()
    for rows in _group_rows(index).values():
        if len(rows) > 1:
            group = s64[rows]
            if opmd_baseline == "mean":
                baseline[rows] = group.mean()
            else:
                baseline[rows] = tau * (torch.logsumexp(group / tau, dim=-1) - math.log(len(rows)))
    advantages = (s64 - baseline).to(scores.dtype).unsqueeze(-1) * response_mask
    return advantages, advantages


def compute_advantage(batch, adv_estimator: str, gamma: float = 1.0, lam: float = 1.0,
                      norm_adv_by_std_in_grpo: bool = True, epsilon: float = 1e-6, opmd_baseline: str = "mean",
                      tau: float = 1.0):
    """Advantages and returns of a batch by the estimator registered as ``adv_estimator`` (verl's
    ``compute_advantage``); writes ``batch["advantages"]`` and ``batch["returns"]`` (B, L) and returns the batch.

    ``batch`` is our training batch (a TensorDict from ``trinity_like.trainer.batch.experiences_to_batch``) or any
    mapping with its keys. It reads ``token_level_rewards`` and ``response_mask`` (B, L), and when present
    ``group_index`` (B,) (the estimator's ``index``), ``values`` (B, L) and ``reward_baselines`` (B,). Every
    estimator gets the same keywords and uses what it needs (an estimator missing an input says so).

    Departures from verl: the batch is a TensorDict, not a DataProto; groups come from the ``group_index``
    tensor, not a ``uid`` array; there is no ``num_repeat`` or ``config`` (``epsilon``, ``opmd_baseline`` and
    ``tau`` are plain keywords)."""
    group_index = batch.get("group_index", None)  # (B,)
    advantages, returns = ADV_ESTIMATORS.get(adv_estimator)(
        token_level_rewards=batch["token_level_rewards"], response_mask=batch["response_mask"],
        index=None if group_index is None else group_index.tolist(),
        values=batch.get("values", None), reward_baselines=batch.get("reward_baselines", None), gamma=gamma,
        lam=lam, epsilon=epsilon, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, opmd_baseline=opmd_baseline,
        tau=tau)
    batch["advantages"] = advantages
    batch["returns"] = returns
    return batch
