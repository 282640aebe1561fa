"""Pure tensor maths for RL fine-tuning: advantage estimators, policy losses, KL, loss aggregation,
off-policy corrections, rewards, and the batch-level steps of verl's trainer (``apply_kl_penalty``,
``compute_advantage``, ``compute_data_metrics``, ``compute_throughout_metrics``).

No Ray, no engines, no config objects of ours: every function takes tensors (and plain values, or any object
with the documented attributes) and returns tensors. Registries map names to functions of one signature.

Names load lazily (PEP 562): importing ``trinity_like.algorithms.rewards`` (as the explorer does, to score)
does not pull in torch through this package's other modules.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    'ADV_ESTIMATORS': 'advantages',
    'AdaptiveKLController': 'losses',
    'DAPORewardManager': 'rewards',
    'FixedKLController': 'losses',
    'KL_PENALTIES': 'losses',
    'LOSS_AGG_MODES': 'losses',
    'LossNeeds': 'losses',
    'NaiveRewardManager': 'rewards',
    'OFF_POLICY_CORRECTIONS': 'off_policy',
    'OffPolicyConfig': 'off_policy',
    'POLICY_LOSSES': 'losses',
    'PolicyLossConfig': 'losses',
    'agg_loss': 'losses',
    'apply_kl_penalty': 'losses',
    'arithmetic_reward': 'rewards',
    'compute_advantage': 'advantages',
    'compute_dapo_outcome_advantage': 'advantages',
    'compute_data_metrics': 'metrics',
    'compute_mismatch_metrics': 'metrics',
    'compute_gae_advantage_return': 'advantages',
    'compute_grpo_outcome_advantage': 'advantages',
    'compute_opmd_outcome_advantage': 'advantages',
    'compute_policy_loss': 'losses',
    'compute_reinforce_plus_plus_baseline_outcome_advantage': 'advantages',
    'compute_reinforce_plus_plus_outcome_advantage': 'advantages',
    'compute_remax_outcome_advantage': 'advantages',
    'compute_rloo_outcome_advantage': 'advantages',
    'compute_reward': 'rewards',
    'compute_score': 'rewards',
    'compute_throughout_metrics': 'metrics',
    'compute_value_loss': 'losses',
    'countdown_score': 'rewards',
    'format_score': 'rewards',
    'get_off_policy_correction_fn': 'off_policy',
    'kl_penalty': 'losses',
    'load_reward_function': 'rewards',
    'load_reward_manager': 'rewards',
    'loss_needs': 'losses',
    'masked_mean': 'functional',
    'masked_sum': 'functional',
    'masked_var': 'functional',
    'masked_whiten': 'functional',
    'math_score': 'rewards',
    'pessimistic_weights': 'off_policy',
    'scorer_for': 'rewards',
}
"""Public name -> the module of this package that defines it."""


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trinity_like.algorithms' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"trinity_like.algorithms.{module}"), name)
    globals()[name] = value
    return value


def get_adv_estimator_fn(name: str):
    """The advantage estimator registered as ``name`` (KeyError listing the valid names otherwise)."""
    from trinity_like.algorithms.advantages import ADV_ESTIMATORS

    return ADV_ESTIMATORS.get(name)


def get_policy_loss_fn(name: str):
    """The policy loss registered as ``name`` (KeyError listing the valid names otherwise)."""
    from trinity_like.algorithms.losses import POLICY_LOSSES

    return POLICY_LOSSES.get(name)


def get_kl_controller(kl_ctrl_type: str, kl_coef: float, target_kl: float | None = None, horizon: int | None = None):
    """``fixed`` or ``adaptive`` KL controller."""
    from trinity_like.algorithms.losses import AdaptiveKLController, FixedKLController

    if kl_ctrl_type == "fixed":
        return FixedKLController(kl_coef)
    if kl_ctrl_type == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError("an adaptive KL controller needs target_kl and horizon")
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller {kl_ctrl_type!r}; valid: fixed, adaptive")


__all__ = [
    "ADV_ESTIMATORS", "KL_PENALTIES", "LOSS_AGG_MODES", "OFF_POLICY_CORRECTIONS", "POLICY_LOSSES",
    "AdaptiveKLController", "DAPORewardManager", "FixedKLController", "NaiveRewardManager", "OffPolicyConfig",
    "PolicyLossConfig", "agg_loss", "apply_kl_penalty", "arithmetic_reward", "compute_advantage",
    "compute_dapo_outcome_advantage", "compute_data_metrics", "compute_mismatch_metrics", "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage", "compute_opmd_outcome_advantage", "compute_policy_loss",
    "compute_reinforce_plus_plus_baseline_outcome_advantage", "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage", "compute_rloo_outcome_advantage", "compute_reward", "compute_score",
    "compute_throughout_metrics", "compute_value_loss", "countdown_score", "format_score", "get_adv_estimator_fn", "get_kl_controller", "get_off_policy_correction_fn",
    "get_policy_loss_fn", "kl_penalty", "loss_needs", "LossNeeds", "load_reward_function", "load_reward_manager", "masked_mean", "masked_sum",
    "masked_var", "masked_whiten", "math_score", "pessimistic_weights", "scorer_for",
]
