"""Pure tensor maths for RL fine-tuning: advantage estimators, policy losses, KL, loss aggregation,
off-policy corrections and rewards.

No Ray, no engines, no config objects of ours: every function takes tensors (and plain values, or any object
with the documented attributes) and returns tensors. Registries map names to functions of one signature.
"""

from trinity_like.algorithms.advantages import (
    ADV_ESTIMATORS,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_opmd_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
)
from trinity_like.algorithms.functional import masked_mean, masked_sum, masked_var, masked_whiten
from trinity_like.algorithms.losses import (
    KL_PENALTIES,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    AdaptiveKLController,
    FixedKLController,
    LossNeeds,
    PolicyLossConfig,
    agg_loss,
    compute_policy_loss,
    compute_value_loss,
    kl_penalty,
    loss_needs,
)
from trinity_like.algorithms.off_policy import (
    OFF_POLICY_CORRECTIONS,
    OffPolicyConfig,
    get_off_policy_correction_fn,
)
from trinity_like.algorithms.rewards import (
    DAPORewardManager,
    NaiveRewardManager,
    arithmetic_reward,
    compute_score,
    countdown_score,
    format_score,
    load_reward_function,
    load_reward_manager,
    math_score,
)


def get_adv_estimator_fn(name: str):
    """The advantage estimator registered as ``name`` (KeyError listing the valid names otherwise)."""
    return ADV_ESTIMATORS.get(name)


def get_policy_loss_fn(name: str):
    """The policy loss registered as ``name`` (KeyError listing the valid names otherwise)."""
    return POLICY_LOSSES.get(name)


def get_kl_controller(kl_ctrl_type: str, kl_coef: float, target_kl: float | None = None, horizon: int | None = None):
    """``fixed`` or ``adaptive`` KL controller."""
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
    "PolicyLossConfig", "agg_loss", "arithmetic_reward", "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage", "compute_opmd_outcome_advantage", "compute_policy_loss",
    "compute_reinforce_plus_plus_baseline_outcome_advantage", "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage", "compute_rloo_outcome_advantage", "compute_score", "compute_value_loss",
    "countdown_score", "format_score", "get_adv_estimator_fn", "get_kl_controller", "get_off_policy_correction_fn",
    "get_policy_loss_fn", "kl_penalty", "loss_needs", "LossNeeds", "load_reward_function", "load_reward_manager", "masked_mean", "masked_sum",
    "masked_var", "masked_whiten", "math_score",
]
