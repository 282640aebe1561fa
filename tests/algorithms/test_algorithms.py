import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trinity_like.algorithms import (
    ADV_ESTIMATORS,
    agg_loss,
    arithmetic_reward,
    compute_grpo_outcome_advantage,
    compute_policy_loss,
    get_adv_estimator_fn,
)
from trinity_like.common.registry import Registry


def test_agg_loss_modes_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    # token-mean: (1+2+3+4)/4 = 2.5; the fully masked row adds nothing
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(2.5)
    # seq-mean-token-sum: rows 6 and 4, two valid rows -> 5
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(5.0)
    # seq-mean-token-mean: rows 2 and 4 -> 3
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    # seq-mean-token-sum-norm: rows 6/3 and 4/3 -> 5/3
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(5 / 3)
    with pytest.raises(ValueError, match="unknown loss_agg_mode"):
        agg_loss(loss, mask, "median")


def test_ppo_loss_by_hand():
    # ratios e^0.5=1.6487 (clipped to 1.2 for A>0), e^-0.5=0.6065 (A<0: clipped to 0.8), 1.0
    old = torch.zeros(1, 3)
    new = torch.tensor([[0.5, -0.5, 0.0]])
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    mask = torch.ones(1, 3)
    loss, clipfrac, kl, clip_lower = compute_policy_loss(old, new, adv, mask, cliprange=0.2)
    # token 0: max(-1.6487, -1.2) = -1.2 (clipped); token 1: max(0.6065, 0.8) = 0.8 (clipped);
    # token 2: -2.0. Mean = (-1.2 + 0.8 - 2.0) / 3 = -0.8
    assert loss.item() == pytest.approx(-0.8, abs=1e-6)
    assert clipfrac.item() == pytest.approx(2 / 3)
    assert kl.item() == pytest.approx(0.0, abs=1e-7)  # mean of (-0.5, 0.5, 0)
    assert clip_lower.item() == 0.0


def test_ppo_dual_clip_and_asymmetric_ranges():
    old = torch.zeros(1, 2)
    new = torch.tensor([[2.0, 0.25]])  # ratios e^2 = 7.389, e^0.25 = 1.284
    adv = torch.tensor([[-1.0, 1.0]])
    mask = torch.ones(1, 2)
    loss, _, _, clip_lower = compute_policy_loss(old, new, adv, mask, cliprange_low=0.2, cliprange_high=0.28,
                                                 clip_ratio_c=3.0)
    # token 0: A<0, max(7.389, 1.2) = 7.389 > c*|A| = 3 -> dual clip to 3.0
    # token 1: A>0, ratio 1.284 > 1.28 -> -1.28
    assert loss.item() == pytest.approx((3.0 - 1.28) / 2, abs=1e-6)
    assert clip_lower.item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_policy_loss(old, new, adv, mask, cliprange=0.2, clip_ratio_c=1.0)


def test_ppo_gradient_at_ratio_one_is_minus_advantage():
    old = torch.zeros(2, 2)
    new = torch.zeros(2, 2, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, *_ = compute_policy_loss(old, new, adv, mask, cliprange=0.2)
    loss.backward()
    # d/dlogp of -A*exp(logp - old) at 0 = -A, divided by 3 valid tokens, zero where masked
    expected = torch.tensor([[-1 / 3, -1 / 3], [2 / 3, 0.0]])
    assert torch.allclose(new.grad, expected)


def test_grpo_advantage_by_hand():
    rewards = torch.zeros(4, 2)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 0.5, 0.5])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    # the reward of row 1 sits on a masked token: its score is 0
    adv, ret = compute_grpo_outcome_advantage(rewards, mask, index=["a", "a", "b", "b"])
    # group a: scores 1, 0 -> mean 0.5, std (unbiased) 0.7071 -> +-0.7071
    s = 0.5 / math.sqrt(0.5)
    assert adv[0].tolist() == pytest.approx([s, s], abs=1e-5)
    assert adv[1].tolist() == pytest.approx([-s, 0.0], abs=1e-5)
    # group b: equal scores -> 0
    assert adv[2:].abs().max().item() == pytest.approx(0.0, abs=1e-6)
    assert torch.equal(adv, ret)


def test_grpo_single_sample_group_keeps_reward():
    rewards = torch.tensor([[0.0, 0.7]])
    adv, _ = compute_grpo_outcome_advantage(rewards, torch.ones(1, 2), index=["x"])
    assert adv[0, 0].item() == pytest.approx(0.7, abs=1e-5)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=8))
def test_grpo_advantages_are_centred_per_group(scores):
    b = len(scores)
    rewards = torch.zeros(b, 1)
    rewards[:, 0] = torch.tensor(scores)
    adv, _ = compute_grpo_outcome_advantage(rewards, torch.ones(b, 1), index=["g"] * b)
    assert abs(adv.sum().item()) < 1e-3


def test_registry_rules():
    reg = Registry("widget")
    reg.register("a")(lambda: 1)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: 2)
    with pytest.raises(KeyError, match="valid names: a"):
        reg.get("b")
    assert get_adv_estimator_fn("grpo") is compute_grpo_outcome_advantage
    assert "grpo" in ADV_ESTIMATORS


@pytest.mark.parametrize(
    "response, reward",
    [("7", 1.0), (" 7<|endoftext|>", 1.0), ("12", 0.1), ("-3", 0.1), ("seven", 0.0), ("", 0.0), ("71", 0.1)],
)
def test_arithmetic_reward(response, reward):
    assert arithmetic_reward(response, "7") == reward
