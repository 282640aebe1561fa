"""Metrics of a training batch, with verl's names (``verl/trainer/ppo/metric_utils.py``).

Pure functions over our training batch (a TensorDict from ``trinity_like.trainer.batch.experiences_to_batch``, or
any mapping with its keys), ``B`` sequences, ``P`` prompt width, ``R`` response width:

    token_level_scores, token_level_rewards, advantages, returns, response_mask, responses (B, R)
    attention_mask (B, P+R): the prompt (left-padded) then the response (right-padded)
    values (B, R): with a critic

Departures from verl: the padded widths of our batch are the batch's longest prompt and response, not the
configured maxima, so the clip ratios compare with ``max_response_length`` / ``max_prompt_length`` when given
(verl's widths otherwise); statistics of an empty selection (no valid token) are 0 rather than an error; the
multi-turn and aborted-response metrics are not computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def _mean_max_min(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, max and min of a 1-D tensor as 0-d float tensors (all 0 for an empty one)."""
    if values.numel() == 0:
        zero = torch.zeros((), device=values.device)
        return zero, zero, zero
    values = values.float()
    return values.mean(), values.max(), values.min()


def _to_floats(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """0-d tensors -> floats, with one device-to-host copy for all of them."""
    values = torch.stack([v.float() for v in metrics.values()]).tolist()
    return dict(zip(metrics, values, strict=True))


def compute_data_metrics(batch: Mapping[str, Any], use_critic: bool = True, max_response_length: int | None = None,
                         max_prompt_length: int | None = None) -> dict[str, float]:
    """verl's data metrics of a batch after its advantages are computed:

    - ``critic/score/{mean,max,min}``: per sequence the sum of ``token_level_scores`` (the reward function's)
    - ``critic/rewards/{mean,max,min}``: the same of ``token_level_rewards`` (the scores minus the in-reward KL)
    - ``critic/advantages/*``, ``critic/returns/*``: over the valid tokens (``response_mask``)
    - with ``use_critic``: ``critic/values/*`` over the valid tokens and ``critic/vf_explained_var``,
      1 - Var(returns - values) / (Var(returns) + 1e-5) over them (0 with fewer than two valid tokens)
    - ``response_length/*``, ``prompt_length/*``: tokens per sequence (from ``attention_mask``: a response's
      every token, tool output included), and ``*/clip_ratio``, the fraction of sequences whose length equals
      ``max_response_length`` / ``max_prompt_length`` (default: the batch's padded widths, as verl).
    """
    width_r = batch["responses"].shape[-1]
    attention = batch["attention_mask"]  # (B, P+R)
    prompt_length = attention[:, :-width_r].sum(-1).float()  # (B,)
    response_length = attention[:, -width_r:].sum(-1).float()  # (B,)
    max_r = width_r if max_response_length is None else max_response_length
    max_p = attention.shape[-1] - width_r if max_prompt_length is None else max_prompt_length
    valid = batch["response_mask"].bool()  # (B, R)
    valid_returns = torch.masked_select(batch["returns"], valid)  # (valid tokens,)
    score = _mean_max_min(batch["token_level_scores"].sum(-1))
    reward = _mean_max_min(batch["token_level_rewards"].sum(-1))
    adv = _mean_max_min(torch.masked_select(batch["advantages"], valid))
    ret = _mean_max_min(valid_returns)
    resp, prompt = _mean_max_min(response_length), _mean_max_min(prompt_length)
    metrics = {
        "critic/score/mean": score[0], "critic/score/max": score[1], "critic/score/min": score[2],
        "critic/rewards/mean": reward[0], "critic/rewards/max": reward[1], "critic/rewards/min": reward[2],
        "critic/advantages/mean": adv[0], "critic/advantages/max": adv[1], "critic/advantages/min": adv[2],
        "critic/returns/mean": ret[0], "critic/returns/max": ret[1], "critic/returns/min": ret[2],
        "response_length/mean": resp[0], "response_length/max": resp[1], "response_length/min": resp[2],
        "response_length/clip_ratio": (response_length == max_r).float().mean(),
        "prompt_length/mean": prompt[0], "prompt_length/max": prompt[1], "prompt_length/min": prompt[2],
        "prompt_length/clip_ratio": (prompt_length == max_p).float().mean(),
    }
    if use_critic:
        valid_values = torch.masked_select(batch["values"], valid)  # (valid tokens,)
        values = _mean_max_min(valid_values)
        metrics.update({"critic/values/mean": values[0], "critic/values/max": values[1],
                        "critic/values/min": values[2]})
        if valid_values.numel() > 1:  # an unbiased variance needs two tokens
            explained = 1.0 - torch.var(valid_returns - valid_values) / (torch.var(valid_returns) + 1e-5)
        else:
            explained = torch.zeros((), device=valid_values.device)
        metrics["critic/vf_explained_var"] = explained
    return _to_floats(metrics)


def compute_throughout_metrics(batch: Mapping[str, Any], timing_raw: Mapping[str, float], n_gpus: int) -> dict[str, float]:
    """verl's throughput metrics (its spelling, "throughout"): ``perf/total_num_tokens``, the batch's prompt and
    response tokens (``attention_mask``); ``perf/time_per_step``, ``timing_raw["step"]`` in seconds; and
    ``perf/throughput``, tokens per second per GPU, total / (time * n_gpus). ``n_gpus``: the devices that
    trained the step (the trainer's data-parallel world size here)."""
    total_tokens = float(batch["attention_mask"].sum())
    step_s = float(timing_raw["step"])
    return {
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": step_s,
        "perf/throughput": total_tokens / (max(step_s, 1e-9) * n_gpus),
    }


def compute_mismatch_metrics(behaviour: torch.Tensor, recomputed: torch.Tensor, mask: torch.Tensor,
                             clip_low: float, clip_high: float) -> dict[str, float]:
    """How far the engines' log-probs (``behaviour``, (B, R)) are from the trainer's for the same weights
    (``recomputed``) over the tokens of ``mask`` (B, R): mean and max absolute difference, and the share of tokens
    whose ratio exp(recomputed - behaviour) lies outside PPO's clip range [1 - clip_low, 1 + clip_high], where
    the clip would fire on the two sides' rounding alone. Empty when ``mask`` holds no token."""
    mask = mask.bool()
    n = int(mask.sum())
    if n == 0:
        return {}
    diff = (recomputed - behaviour)[mask].float()
    ratio = diff.exp()
    outside = (ratio < 1 - clip_low) | (ratio > 1 + clip_high)
    return {
        "mismatch/logprob_abs_diff_mean": float(diff.abs().mean()),
        "mismatch/logprob_abs_diff_max": float(diff.abs().max()),
        "mismatch/frac_outside_clip": float(outside.float().mean()),
        "mismatch/tokens": float(n),
    }
