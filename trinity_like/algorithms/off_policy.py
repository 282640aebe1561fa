"""Off-policy corrections: importance weights for training on stale or mismatched data.

An experience was sampled by the behaviour policy (the engine, at ``model_version``); the trainer updates
pi_theta starting from the proximal policy pi_prox (its weights before this update, ``old_log_prob``). The
PPO ratio pi_theta / pi_prox is clipped by the policy loss; the remaining gap pi_prox / pi_behav is what these
corrections handle, as per-token weights (B, L) passed to the policy loss as ``rollout_is_weights``:

    rho_t = exp(clamp(old_log_prob_t - behaviour_log_prob_t, -20, 20))      token ratio pi_prox / pi_behav

- ``none``: weight 1.
- ``tis``: truncated IS per token, min(rho_t, C)  (Yao et al. 2025, "Your efficient RL framework secretly
  brings you off-policy RL training").
- ``seq_tis``: truncated IS per sequence, min(prod_t rho_t, C), on every token of the sequence.
- ``icepop``: token masking, rho_t where low <= rho_t <= high and 0 outside (IcePop, Ling team 2025).
- ``seq_mis``: sequence masking, prod_t rho_t for sequences whose ratio is <= C and 0 for the others.
- ``geo_mask``: drop sequences whose geometric-mean ratio exp(mean_t log rho_t) is outside [low, high];
  weight 1 for the kept ones.
- ``decoupled``: AReaL's decoupled PPO (Fu et al. 2025, arXiv:2505.24298): weight rho_t = pi_prox / pi_behav
  on the clipped ratio pi_theta / pi_prox; tokens whose rho_t exceeds C are dropped (AReaL's cap).

Every method has ONE signature::

    fn(behaviour_log_prob, old_log_prob, response_mask, staleness, config, behaviour_known=None)
        -> (weights (B, L), metrics)

Rows whose behaviour log-probs are unknown (imported or human-written experiences: ``behaviour_known`` False)
get weight 1 on every token: with nothing to compare, their behaviour policy is taken to be the proximal one,
and they are counted in ``off_policy/unknown_behaviour_frac``. Weights are zero outside the mask and carry no
gradient. Metrics: mean and max weight over valid tokens, the fraction of valid tokens masked to 0, the
effective sample size ESS = (sum w)^2 / (n sum w^2) over valid tokens, and staleness mean / max.
"""

from __future__ import annotations

from typing import Any

import torch

from trinity_like.algorithms.functional import masked_mean, masked_sum
from trinity_like.common.algorithm_params import OffPolicyParams
from trinity_like.common.registry import Registry

OFF_POLICY_CORRECTIONS: Registry = Registry("off-policy correction")


OffPolicyConfig = OffPolicyParams
"""The corrections' parameters (defaults in ``trinity_like.common.algorithm_params``)."""

_DEFAULTS = OffPolicyConfig()


def _param(config: Any, name: str) -> float:
    value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
    return getattr(_DEFAULTS, name) if value is None else float(value)


def _log_ratio(behaviour_log_prob, old_log_prob, response_mask, behaviour_known):
    """log rho (B, L), zero outside the mask and on rows with unknown behaviour log-probs; no gradient."""
    mask = response_mask.to(old_log_prob.dtype)
    log_rho = torch.clamp(old_log_prob.detach() - behaviour_log_prob.detach(), min=-20.0, max=20.0) * mask
    if behaviour_known is not None:
        log_rho = log_rho * behaviour_known.to(log_rho.dtype).unsqueeze(-1)
    return log_rho, mask


def _metrics(weights: torch.Tensor, mask: torch.Tensor, staleness: torch.Tensor | None,
             behaviour_known: torch.Tensor | None) -> dict[str, float]:
    valid = mask > 0
    w = weights[valid]
    n = max(int(valid.sum()), 1)
    ess = float(w.sum() ** 2 / (n * (w ** 2).sum())) if w.numel() and float((w ** 2).sum()) > 0 else 0.0
    out = {
        "off_policy/weight_mean": float(w.mean()) if w.numel() else 0.0,
        "off_policy/weight_max": float(w.max()) if w.numel() else 0.0,
        "off_policy/masked_frac": float((w == 0).float().mean()) if w.numel() else 0.0,
        "off_policy/ess": ess,
    }
    if staleness is not None and staleness.numel():
        s = staleness.double()
        out["off_policy/staleness_mean"] = float(s.mean())
        out["off_policy/staleness_max"] = float(s.max())
    if behaviour_known is not None and behaviour_known.numel():
        out["off_policy/unknown_behaviour_frac"] = float((~behaviour_known.bool()).float().mean())
    return out


def _finish(weights, mask, staleness, behaviour_known):
    if behaviour_known is not None:  # unknown behaviour: weight 1, whatever the method's bounds
        weights = torch.where(behaviour_known.bool().unsqueeze(-1), weights, torch.ones_like(weights))
    weights = (weights * mask).detach()
    return weights, _metrics(weights, mask, staleness, behaviour_known)


@OFF_POLICY_CORRECTIONS.register("none")
def no_correction(behaviour_log_prob, old_log_prob, response_mask, staleness=None, config=None,
                  behaviour_known=None):
    mask = response_mask.to(old_log_prob.dtype)
    return _finish(torch.ones_like(mask), mask, staleness, behaviour_known)


@OFF_POLICY_CORRECTIONS.register("tis")
def token_tis(behaviour_log_prob, old_log_prob, response_mask, staleness=None, config=None, behaviour_known=None):
    log_rho, mask = _log_ratio(behaviour_log_prob, old_log_prob, response_mask, behaviour_known)
    return _finish(torch.clamp(torch.exp(log_rho), max=_param(config, "cap")), mask, staleness, behaviour_known)


@OFF_POLICY_CORRECTIONS.register("seq_tis")
def sequence_tis(behaviour_log_prob, old_log_prob, response_mask, staleness=None, config=None,
                 behaviour_known=None):
    log_rho, mask = _log_ratio(behaviour_log_prob, old_log_prob, response_mask, behaviour_known)
    seq_log = torch.clamp(masked_sum(log_rho, mask, dim=-1), max=20.0)  # (B,)
    weight = torch.clamp(torch.exp(seq_log), max=_param(config, "cap")).unsqueeze(-1).expand_as(mask)
    return _finish(weight, mask, staleness, behaviour_known)


@OFF_POLICY_CORRECTIONS.register("icepop")
def icepop(behaviour_log_prob, old_log_prob, response_mask, staleness=None, config=None, behaviour_known=None):
    log_rho, mask = _log_ratio(behaviour_log_prob, old_log_prob, response_mask, behaviour_known)
    rho = torch.exp(log_rho)
    keep = (rho >= _param(config, "low")) & (rho <= _param(config, "high"))
    return _finish(torch.where(keep, rho, torch.zeros_like(rho)), mask, staleness, behaviour_known)


@OFF_POLICY_CORRECTIONS.register("seq_mis")
def sequence_mis(behaviour_log_prob, old_log_prob, response_mask, staleness=None, config=None,
                 behaviour_known=None):
    log_rho, mask = _log_ratio(behaviour_log_prob, old_log_prob, response_mask, behaviour_known)
    seq_ratio = torch.exp(torch.clamp(masked_sum(log_rho, mask, dim=-1), max=20.0))  # (B,)
    weight = torch.where(seq_ratio <= _param(config, "cap"), seq_ratio, torch.zeros_like(seq_ratio))
    return _finish(weight.unsqueeze(-1).expand_as(mask), mask, staleness, behaviour_known)


@OFF_POLICY_CORRECTIONS.register("geo_mask")
def geometric_mask(behaviour_log_prob, old_log_prob, response_mask, staleness=None, config=None,
                   behaviour_known=None):
    log_rho, mask = _log_ratio(behaviour_log_prob, old_log_prob, response_mask, behaviour_known)
    geo = torch.exp(masked_mean(log_rho, mask, dim=-1))  # (B,)
    keep = ((geo >= _param(config, "low")) & (geo <= _param(config, "high"))).to(mask.dtype)
    return _finish(keep.unsqueeze(-1).expand_as(mask), mask, staleness, behaviour_known)


@OFF_POLICY_CORRECTIONS.register("decoupled")
def decoupled_ppo(behaviour_log_prob, old_log_prob, response_mask, staleness=None, config=None,
                  behaviour_known=None):
    log_rho, mask = _log_ratio(behaviour_log_prob, old_log_prob, response_mask, behaviour_known)
    rho = torch.exp(log_rho)
    weight = torch.where(rho <= _param(config, "cap"), rho, torch.zeros_like(rho))
    return _finish(weight, mask, staleness, behaviour_known)


def pessimistic_weights(weights: torch.Tensor, behaviour_log_prob: torch.Tensor, old_log_prob: torch.Tensor,
                        advantages: torch.Tensor, response_mask: torch.Tensor, negative_cap: float,
                        behaviour_known: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Raise the weight of every token with a negative advantage to at least min(rho_t, negative_cap).

    A correction truncates (tis) or drops (decoupled, icepop) the tokens whose ratio rho_t = pi_prox / pi_behav
    is large: tokens that became much likelier since the data was sampled. For a token with a positive
    advantage that only weakens a push up. For one with a negative advantage it removes the push down on
    exactly the token that grew, and with the batches some versions stale such a token can run away before
    fresh samples, where it is frequent, arrive (docs/learning.md). PPO's clip keeps the unclipped ratio for
    negative advantages for the same reason; this keeps the correction's weight pessimistic likewise, bounded by
    ``negative_cap`` for the variance. Returns the weights (no gradient) and the share of valid tokens raised."""
    log_rho, mask = _log_ratio(behaviour_log_prob, old_log_prob, response_mask, behaviour_known)
    floor = torch.clamp(torch.exp(log_rho), max=negative_cap)
    raise_ = (advantages < 0) & (floor > weights) & (mask > 0)
    out = torch.where(raise_, floor, weights).detach()
    return out, {"off_policy/negative_raised_frac": float(raise_.sum() / mask.sum().clamp(min=1.0))}


def get_off_policy_correction_fn(name: str):
    return OFF_POLICY_CORRECTIONS.get(name)
