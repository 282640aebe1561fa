"""Advantage estimators (trinity_like.algorithms.advantages): hand-worked values, error paths, invariants."""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trinity_like.algorithms import (
    ADV_ESTIMATORS,
    compute_dapo_outcome_advantage,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_opmd_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator_fn,
)

F64 = torch.float64
ALL_NAMES = ("dapo", "gae", "grpo", "opmd", "reinforce", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo")
GROUPED = ("dapo", "grpo", "rloo", "reinforce_plus_plus_baseline", "opmd")


def t(rows, dtype=F64):
    return torch.tensor(rows, dtype=dtype)


def close(actual, expected, atol):
    torch.testing.assert_close(actual, t(expected, actual.dtype), atol=atol, rtol=0)


def outcome(scores, lengths, width):
    """Token-level rewards with each score on the last of its row's `lengths` tokens, and the mask."""
    rewards, mask = torch.zeros(len(scores), width, dtype=F64), torch.zeros(len(scores), width, dtype=F64)
    for i, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        rewards[i, n - 1], mask[i, :n] = s, 1.0
    return rewards, mask


# ---------------------------------------------------------------- registry and call site


def test_registry_names_and_lookup():
    assert ADV_ESTIMATORS.names() == tuple(sorted(ALL_NAMES))
    assert get_adv_estimator_fn("grpo") is compute_grpo_outcome_advantage
    assert get_adv_estimator_fn("gae") is compute_gae_advantage_return
    with pytest.raises(KeyError, match=r"unknown advantage estimator 'ppo2'.*valid names: dapo, gae, grpo, opmd"):
        get_adv_estimator_fn("ppo2")


@pytest.mark.parametrize("name", ALL_NAMES)
def test_every_estimator_takes_the_same_keywords(name):
    rewards, mask = outcome([1.0, 0.0, 2.0], [2, 1, 3], 3)
    kwargs = dict(token_level_rewards=rewards, response_mask=mask, index=["a", "a", "b"],
                  values=torch.zeros(3, 3, dtype=F64), reward_baselines=t([0.5, 0.5, 1.0]), gamma=1.0, lam=1.0,
                  epsilon=1e-6, norm_adv_by_std_in_grpo=True, opmd_baseline="mean", tau=1.0, unused=object())
    adv, ret = get_adv_estimator_fn(name)(**kwargs)
    assert adv.shape == ret.shape == (3, 3)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    if name != "gae":  # gae whitens every position and leaves masked ones non-zero (the loss masks them)
        assert (adv[mask == 0] == 0).all()


@pytest.mark.parametrize("name", GROUPED)
@pytest.mark.parametrize("index", [None, ["a", "a"]])
def test_grouped_estimators_need_index(name, index):
    rewards, mask = outcome([1.0, 0.0, 2.0], [1, 1, 1], 2)
    with pytest.raises(ValueError, match=rf"{name} needs `index`, one group id per row \(3 rows\)"):
        get_adv_estimator_fn(name)(token_level_rewards=rewards, response_mask=mask, index=index)


def test_gae_needs_values_and_remax_needs_baselines():
    rewards, mask = outcome([1.0, 0.0], [2, 2], 2)
    with pytest.raises(ValueError, match="gae needs `values` from a critic"):
        compute_gae_advantage_return(token_level_rewards=rewards, values=None, response_mask=mask)
    with pytest.raises(ValueError, match="remax needs `reward_baselines`"):
        compute_remax_outcome_advantage(token_level_rewards=rewards, reward_baselines=None, response_mask=mask)


def test_opmd_rejects_unknown_baseline():
    rewards, mask = outcome([1.0, 0.0], [1, 1], 1)
    with pytest.raises(ValueError, match="opmd_baseline must be 'mean' or 'logavgexp', got 'median'"):
        compute_opmd_outcome_advantage(rewards, mask, ["a", "a"], opmd_baseline="median")


# ---------------------------------------------------------------- hand-worked values


def test_gae_by_hand_with_padding_and_masked_middle():
    # gamma=.5, lam=.5 (gamma*lam=.25). Row 0: r=[0,1,pad], V=[.5,.25,pad]. Row 1: the middle token is tool
    # output (mask 0) with junk r=9, V=7 that must be skipped.
    # t=last valid: delta = 1 + .5*0 - .25 = .75 -> A = .75
    # t=0: delta = 0 + .5*.25 - .5 = -.375 -> A = -.375 + .25*.75 = -.1875
    # returns = A + V = [-.1875+.5, .75+.25] = [.3125, 1.0] in both rows
    rewards = t([[0.0, 1.0, 0.0], [0.0, 9.0, 1.0]])
    values = t([[0.5, 0.25, 0.0], [0.5, 7.0, 0.25]])
    mask = t([[1, 1, 0], [1, 0, 1]])
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.5, lam=0.5)
    assert ret[0, :2].tolist() == pytest.approx([0.3125, 1.0], abs=1e-12)
    assert [ret[1, 0].item(), ret[1, 2].item()] == pytest.approx([0.3125, 1.0], abs=1e-12)
    # whiten {-.1875, .75, -.1875, .75}: mean .28125, deviations +-.46875, unbiased var 4*.46875^2/3 = .29297,
    # std .54127 -> +-.46875/.54127 = +-.86603 (= sqrt(3/4))
    s = math.sqrt(0.75)
    assert adv[0, :2].tolist() == pytest.approx([-s, s], abs=1e-6)
    assert [adv[1, 0].item(), adv[1, 2].item()] == pytest.approx([-s, s], abs=1e-6)


def test_grpo_by_hand_interleaved_groups():
    # rows (index, score): 0 a 1 | 1 b 3 | 2 a 0 | 3 b 1 | 4 b 2 | 5 c 2
    # a: mean .5, std sqrt(2*.25/1) = .70711 -> +-.5/(.70711+1e-6) = +-.70711
    # b: mean 2, std sqrt((1+1+0)/2) = 1 -> [1, -1, 0]/(1+1e-6)
    # c: a group of one has mean 0, std 1 -> 2/(1+1e-6)
    rewards, mask = outcome([1.0, 3.0, 0.0, 1.0, 2.0, 2.0], [2, 1, 2, 2, 1, 2], 2)
    index = ["a", "b", "a", "b", "b", "c"]
    adv, ret = compute_grpo_outcome_advantage(rewards, mask, index)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    b = 1.0 / (1.0 + 1e-6)
    expected = [[a, a], [b, 0], [-a, -a], [-b, -b], [0, 0], [2 * b, 2 * b]]  # times the mask
    close(adv, expected, 1e-12)
    assert torch.equal(adv, ret)
    # Dr. GRPO: no division by std -> a: +-.5, b: [1, -1, 0], c: 2 - 0 = 2
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    close(adv, [[0.5, 0.5], [1, 0], [-0.5, -0.5], [-1, -1], [0, 0], [2, 2]], 1e-12)


def test_grpo_zero_variance_group_is_exactly_zero_in_float32():
    # three equal float32 scores 0.1: mean 0.1, std 0 -> (0.1 - 0.1)/(0 + eps) must be exactly 0, not ~0.1
    rewards = torch.full((3, 1), 0.1, dtype=torch.float32)
    adv, _ = compute_grpo_outcome_advantage(rewards, torch.ones(3, 1), [7, 7, 7])
    assert adv.dtype == torch.float32
    assert adv.abs().max().item() == 0.0


def test_rloo_by_hand():
    # a: [1, 0, 2] -> each minus the mean of the other two: 1-1=0, 0-1.5=-1.5, 2-.5=1.5
    #    (= 3/2 * (R - 1): 0, -1.5, 1.5)
    # b: [5, 3] -> 5-3=2, 3-5=-2;  c: a group of one keeps R = 4
    rewards, mask = outcome([1.0, 5.0, 0.0, 2.0, 3.0, 4.0], [1, 2, 2, 1, 2, 2], 2)
    adv, ret = compute_rloo_outcome_advantage(rewards, mask, ["a", "b", "a", "a", "b", "c"])
    close(adv, [[0, 0], [2, 2], [-1.5, -1.5], [1.5, 0], [-2, -2], [4, 4]], 1e-12)
    assert torch.equal(adv, ret)


def test_reinforce_plus_plus_by_hand():
    # gamma=.5. Row 0: r=[0,2] -> G=[0+.5*2, 2]=[1,2]. Row 1: r=[0,pad] -> G=[0].
    # whiten {1, 2, 0}: mean 1, unbiased var (0+1+1)/2 = 1 -> [0, 1], [-1]; masked position -> 0
    rewards, mask = t([[0.0, 2.0], [0.0, 0.0]]), t([[1, 1], [1, 0]])
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    close(ret, [[1.0, 2.0], [0.0, 0.0]], 1e-12)
    close(adv, [[0.0, 1.0], [-1.0, 0.0]], 1e-6)


def test_reinforce_plus_plus_masked_middle_keeps_the_outcome_reward():
    # gamma=1, r=[0, 0(tool output, masked), 1], mask [1,0,1]: G_2 = 1, G_0 = 0 + 1*G_{next} = 1
    rewards, mask = t([[0.0, 0.0, 1.0]]), t([[1, 0, 1]])
    _, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=1.0)
    assert [ret[0, 0].item(), ret[0, 2].item()] == pytest.approx([1.0, 1.0])


def test_reinforce_plus_plus_baseline_by_hand():
    # a: scores 2, 0 -> mean 1 -> centred +1, -1; b: a group of one, baseline 0 -> centred 1. Two tokens each:
    # {1,1,-1,-1,1,1}: mean 1/3, deviations 2/3 (x4), -4/3 (x2); sum sq 16/9+32/9 = 16/3; var /5 = 16/15,
    # std 1.03280 -> 2/3/1.03280 = .64550, -4/3/1.03280 = -1.29099
    rewards, mask = outcome([2.0, 0.0, 1.0], [2, 2, 2], 2)
    adv, ret = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, ["a", "a", "b"])
    hi, lo = (2 / 3) / math.sqrt(16 / 15), (-4 / 3) / math.sqrt(16 / 15)
    close(adv, [[hi, hi], [lo, lo], [hi, hi]], 1e-6)
    assert torch.equal(adv, ret)


def test_remax_by_hand():
    # row 0: r=[1,2], b=.5 -> G=[3,2], A=[2.5,1.5]; row 1: r=[3, 4 (masked)], b=1 -> G=[3,0], A=[2,0]
    rewards, mask = t([[1.0, 2.0], [3.0, 4.0]]), t([[1, 1], [1, 0]])
    adv, ret = compute_remax_outcome_advantage(rewards, t([0.5, 1.0]), mask)
    close(ret, [[3.0, 2.0], [3.0, 0.0]], 1e-12)
    close(adv, [[2.5, 1.5], [2.0, 0.0]], 1e-12)


def test_remax_says_which_rows_lack_a_baseline():
    rewards, mask = t([[1.0, 2.0], [3.0, 4.0]]), t([[1, 1], [1, 0]])
    with pytest.raises(ValueError, match=r"remax needs a reward baseline for every row, 1 of 2 rows have none: "
                                         r"the single_turn workflow stores"):
        compute_remax_outcome_advantage(rewards, t([0.5, math.nan]), mask)


@pytest.mark.parametrize("norm", [True, False])
def test_dapo_is_grpo(norm):
    # a: scores 2, 0, 1 on rows of different lengths; b: a group of one
    rewards, mask = outcome([2.0, 0.0, 1.0, 5.0], [3, 1, 2, 2], 3)
    index = ["a", "a", "a", "b"]
    dapo = compute_dapo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    grpo = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    assert torch.equal(dapo[0], grpo[0]) and torch.equal(dapo[1], grpo[1])
    assert get_adv_estimator_fn("dapo") is compute_dapo_outcome_advantage


def test_opmd_by_hand():
    # mean: a [1, 0] -> +-.5; b (group of one) baseline 0 -> 3
    rewards, mask = outcome([1.0, 0.0, 3.0], [1, 1, 1], 1)
    adv, ret = compute_opmd_outcome_advantage(rewards, mask, ["a", "a", "b"], opmd_baseline="mean")
    assert adv[:, 0].tolist() == pytest.approx([0.5, -0.5, 3.0], abs=1e-12)
    assert torch.equal(adv, ret)
    # logavgexp, tau=1, a = [0, ln3]: b = ln((e^0 + e^ln3)/2) = ln 2 -> A = [-ln2, ln3-ln2 = ln1.5]
    ln3 = math.log(3)
    rewards, mask = outcome([0.0, ln3, 3.0], [1, 1, 1], 1)
    adv, _ = compute_opmd_outcome_advantage(rewards, mask, ["a", "a", "b"], opmd_baseline="logavgexp", tau=1.0)
    assert adv[:, 0].tolist() == pytest.approx([-math.log(2), math.log(1.5), 3.0], abs=1e-12)
    # tau=.5: R/tau = [0, 2ln3] -> e^. = 1, 9 -> b = .5*(ln10 - ln2) = .5 ln5 = .80472
    adv, _ = compute_opmd_outcome_advantage(rewards, mask, ["a", "a", "b"], opmd_baseline="logavgexp", tau=0.5)
    b = 0.5 * math.log(5)
    assert adv[:, 0].tolist() == pytest.approx([-b, ln3 - b, 3.0], abs=1e-12)


# ---------------------------------------------------------------- properties

small_ints = st.integers(-3, 3).map(float)


@st.composite
def padded_batch(draw):
    """(rewards, values, mask) float64 (B, L), B in 2..4, L in 2..4, the first token of every row valid."""
    b, n = draw(st.integers(2, 4)), draw(st.integers(2, 4))
    cells = st.lists(st.lists(small_ints, min_size=n, max_size=n), min_size=b, max_size=b)
    mask = t(draw(st.lists(st.lists(st.booleans(), min_size=n, max_size=n), min_size=b, max_size=b)))
    mask[:, 0] = 1.0
    return t(draw(cells)), t(draw(cells)), mask


@st.composite
def grouped_scores(draw):
    """Outcome rewards (B, 1) and a shuffled index of 1..3 groups, each of 2..4 rows."""
    sizes = draw(st.lists(st.integers(2, 4), min_size=1, max_size=3))
    index = [g for g, size in enumerate(sizes) for _ in range(size)]
    index = draw(st.permutations(index))
    scores = draw(st.lists(st.floats(-5, 5, allow_nan=False), min_size=len(index), max_size=len(index)))
    return t(scores).unsqueeze(-1), list(index)


@settings(max_examples=50, deadline=None)
@given(batch=padded_batch(), junk=st.floats(-100, 100), gamma=st.sampled_from([0.5, 1.0]),
       lam=st.sampled_from([0.5, 1.0]))
def test_masked_positions_never_change_valid_results(batch, junk, gamma, lam):
    rewards, values, mask = batch
    valid = mask.bool()
    noisy = ~valid * junk  # changes only the masked positions
    for name in ("gae", "reinforce_plus_plus", "remax"):
        fn = get_adv_estimator_fn(name)
        kw = dict(response_mask=mask, gamma=gamma, lam=lam, reward_baselines=t([1.0] * len(mask)))
        adv, ret = fn(token_level_rewards=rewards, values=values, **kw)
        adv2, ret2 = fn(token_level_rewards=rewards + noisy, values=values + noisy, **kw)
        assert torch.allclose(adv[valid], adv2[valid], atol=1e-9), name
        assert torch.allclose(ret[valid], ret2[valid], atol=1e-9), name


@settings(max_examples=50, deadline=None)
@given(data=grouped_scores(), name=st.sampled_from(["grpo", "grpo_no_std", "rloo", "opmd"]))
def test_group_centred_advantages_sum_to_zero_per_group(data, name):
    rewards, index = data
    mask = torch.ones_like(rewards)
    fn = get_adv_estimator_fn(name.removesuffix("_no_std"))
    adv, _ = fn(token_level_rewards=rewards, response_mask=mask, index=index, opmd_baseline="mean",
                norm_adv_by_std_in_grpo=name != "grpo_no_std")
    for g in set(index):
        rows = [i for i, x in enumerate(index) if x == g]
        # 1e-7: an equal-score group can leave an ulp in R - mean, which GRPO divides by (std ~ 0) + 1e-6
        assert abs(adv[rows, 0].sum().item()) < 1e-7 * max(1.0, adv.abs().max().item())


@settings(max_examples=50, deadline=None)
@given(batch=padded_batch(), gamma=st.sampled_from([0.5, 1.0]), lam=st.sampled_from([0.5, 1.0]),
       groups=st.lists(st.sampled_from("ab"), min_size=4, max_size=4))
def test_whitened_advantages_have_zero_mean_unit_variance_over_mask(batch, gamma, lam, groups):
    rewards, values, mask = batch
    valid = mask.bool()
    index = groups[: len(mask)]
    cases = {  # estimator output and the un-whitened quantity it whitens
        "gae": compute_gae_advantage_return(rewards, values, mask, gamma=gamma, lam=lam),
        "reinforce_plus_plus": compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=gamma),
        "reinforce_plus_plus_baseline":
            compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, index),
    }
    raws = {
        "gae": cases["gae"][1] - values,  # returns = A + V
        "reinforce_plus_plus": cases["reinforce_plus_plus"][1],
        "reinforce_plus_plus_baseline": compute_opmd_outcome_advantage(rewards, mask, index)[0],  # R - mean_g
    }
    assume(raws["gae"][valid].var().item() > 1e-3)  # gae is always checked; the others when not degenerate
    for name, (adv, _) in cases.items():
        if raws[name][valid].var().item() < 1e-3:  # all (nearly) equal: nothing to whiten
            continue
        w = adv[valid]
        assert abs(w.mean().item()) < 1e-6, name
        assert w.var().item() == pytest.approx(1.0, abs=1e-4), name  # unbiased, as masked_var

