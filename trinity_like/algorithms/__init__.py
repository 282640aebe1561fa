"""Pure tensor maths for RL fine-tuning: advantages, policy losses, loss aggregation, rewards.

No Ray, no engines, no config objects: every function takes tensors (and plain values) and returns tensors.
"""

from trinity_like.algorithms.advantages import ADV_ESTIMATORS, compute_grpo_outcome_advantage
from trinity_like.algorithms.losses import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    agg_loss,
    compute_policy_loss,
    masked_mean,
)
from trinity_like.algorithms.rewards import arithmetic_reward


def get_adv_estimator_fn(name: str):
    return ADV_ESTIMATORS.get(name)


def get_policy_loss_fn(name: str):
    return POLICY_LOSSES.get(name)


__all__ = [
    "ADV_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "agg_loss",
    "arithmetic_reward",
    "compute_grpo_outcome_advantage",
    "compute_policy_loss",
    "get_adv_estimator_fn",
    "get_policy_loss_fn",
    "masked_mean",
]
