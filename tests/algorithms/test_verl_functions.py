"""verl's batch-level trainer functions (apply_kl_penalty, compute_advantage, compute_data_metrics,
compute_throughout_metrics) on 2x3 batches worked by hand."""

import math

import pytest
import torch
from tensordict import TensorDict

from trinity_like.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_advantage,
    compute_data_metrics,
    compute_throughout_metrics,
)

F64 = torch.float64


def t(rows, dtype=F64):
    return torch.tensor(rows, dtype=dtype)


# ---------------------------------------------------------------- apply_kl_penalty

# Row 1's last position is padding (mask 0) with a junk score 5 and junk log-probs.
SCORES = t([[0.0, 0.0, 1.0], [0.0, 2.0, 5.0]])
MASK = t([[1, 1, 1], [1, 1, 0]])
OLD = t([[-1.0, -2.0, -0.5], [-1.0, -1.0, -3.0]])
REF = t([[-1.5, -1.0, -0.5], [-2.0, -1.0, 0.0]])


def test_apply_kl_penalty_by_hand_with_the_adaptive_controller():
    # k1 = old - ref = [[.5, -1, 0], [1, 0, -3 (masked -> 0)]]; beta = .1 (the value before the update)
    # rewards = scores - .1 * kld = [[-.05, .1, 1], [-.1, 2, 5 (masked: untouched)]]
    # current KL = mean over rows of the per-row masked means: row 0 (.5 - 1 + 0) / 3 = -1/6, row 1 (1 + 0) / 2
    #   = .5 -> (-1/6 + .5) / 2 = 1/6
    # adaptive update: e = clip(1/6 / .1 - 1, -.2, .2) = .2; beta *= 1 + .2 * n_steps (B = 2) / horizon 10 = 1.04
    ctrl = AdaptiveKLController(0.1, target_kl=0.1, horizon=10)
    rewards, metrics = apply_kl_penalty(SCORES, OLD, REF, MASK, ctrl, kl_penalty="kl")
    torch.testing.assert_close(rewards, t([[-0.05, 0.1, 1.0], [-0.1, 2.0, 5.0]]), atol=1e-12, rtol=0)
    assert rewards[1, 2] == SCORES[1, 2]  # the masked position keeps its score
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(1 / 6, abs=1e-7)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1
    assert ctrl.value == pytest.approx(0.104)
    assert torch.equal(SCORES, t([[0.0, 0.0, 1.0], [0.0, 2.0, 5.0]]))  # the input is not modified


def test_apply_kl_penalty_by_hand_with_a_fixed_controller_and_another_estimator():
    # abs: |old - ref| masked = [[.5, 1, 0], [1, 0, 0]]; beta = .2 -> rewards = [[-.1, -.2, 1], [-.2, 2, 5]]
    # current KL: row 0 1.5 / 3 = .5, row 1 1 / 2 = .5 -> .5; a fixed controller keeps .2
    ctrl = FixedKLController(0.2)
    rewards, metrics = apply_kl_penalty(SCORES, OLD, REF, MASK, ctrl, kl_penalty="abs")
    torch.testing.assert_close(rewards, t([[-0.1, -0.2, 1.0], [-0.2, 2.0, 5.0]]), atol=1e-12, rtol=0)
    assert metrics == pytest.approx({"actor/reward_kl_penalty": 0.5, "actor/reward_kl_penalty_coeff": 0.2})
    assert ctrl.value == 0.2


def test_apply_kl_penalty_rejects_an_unknown_estimator():
    with pytest.raises(ValueError, match="unknown kl_penalty 'k9'"):
        apply_kl_penalty(SCORES, OLD, REF, MASK, FixedKLController(0.1), kl_penalty="k9")


# ---------------------------------------------------------------- compute_advantage


def _batch(**tensors) -> TensorDict:
    return TensorDict(tensors, batch_size=[2])


@pytest.mark.parametrize("estimator", ["grpo", "dapo"])
def test_compute_advantage_grpo_writes_advantages_and_returns(estimator):
    # one group of two: outcomes 1 (row 0, on its last valid token) and 0 -> mean .5, unbiased std
    # sqrt((.25 + .25) / 1) = .70711 -> A = +-.5 / (.70711 + 1e-6) = +-.70711 on the valid tokens, 0 elsewhere
    batch = _batch(token_level_rewards=t([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]), response_mask=t([[1, 1, 0], [1, 1, 1]]),
                   group_index=torch.tensor([7, 7]))
    out = compute_advantage(batch, estimator)
    assert out is batch
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(batch["advantages"], t([[a, a, 0.0], [-a, -a, -a]]), atol=1e-9, rtol=0)
    assert torch.equal(batch["returns"], batch["advantages"])
    # without std normalisation (Dr. GRPO): +-.5
    compute_advantage(batch, estimator, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(batch["advantages"], t([[0.5, 0.5, 0.0], [-0.5, -0.5, -0.5]]), atol=1e-12, rtol=0)


def test_compute_advantage_gae_writes_advantages_and_returns():
    # gamma = lam = 1: A_t = sum of the rewards from t on - V_t. Row 1's last position is padding (junk V = 9).
    # row 0: r = [0, 0, 1], V = .5 each -> A = [.5, .5, .5], returns = A + V = [1, 1, 1]
    # row 1: r = [0, 1, pad], V = [.2, .4, 9] -> A = [.8, .6], returns = [1, 1]
    # whitened over the 5 valid tokens {.5, .5, .5, .8, .6}: mean .58, unbiased var .068 / 4 = .017, std .130384
    # -> .5: -.08 / .130384 = -.613572; .8: 1.687323; .6: .153393
    batch = _batch(token_level_rewards=t([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]), response_mask=t([[1, 1, 1], [1, 1, 0]]),
                   values=t([[0.5, 0.5, 0.5], [0.2, 0.4, 9.0]]), group_index=torch.tensor([0, 1]))
    compute_advantage(batch, "gae", gamma=1.0, lam=1.0)
    valid = batch["response_mask"].bool()
    lo, hi, mid = -0.08 / math.sqrt(0.017), 0.22 / math.sqrt(0.017), 0.02 / math.sqrt(0.017)
    torch.testing.assert_close(batch["advantages"][valid], t([lo, lo, lo, hi, mid]), atol=1e-5, rtol=0)
    torch.testing.assert_close(batch["returns"][valid], t([1.0, 1.0, 1.0, 1.0, 1.0]), atol=1e-12, rtol=0)


def test_compute_advantage_remax_reads_the_baselines_and_says_when_one_is_missing():
    # row 0: r = [0, 0, 1], b = .25 -> G = [1, 1, 1], A = [.75, .75, .75]; row 1: r = [0, 2, pad], b = 1 -> A = [1, 1, 0]
    batch = _batch(token_level_rewards=t([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]]), response_mask=t([[1, 1, 1], [1, 1, 0]]),
                   reward_baselines=t([0.25, 1.0]))
    compute_advantage(batch, "remax")
    torch.testing.assert_close(batch["advantages"], t([[0.75, 0.75, 0.75], [1.0, 1.0, 0.0]]), atol=1e-12, rtol=0)
    torch.testing.assert_close(batch["returns"], t([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]), atol=1e-12, rtol=0)
    batch["reward_baselines"] = t([0.25, math.nan])  # a row without a baseline (trinity_like.trainer.batch)
    with pytest.raises(ValueError, match=r"remax needs a reward baseline for every row, 1 of 2 rows have none"):
        compute_advantage(batch, "remax")
    del batch["reward_baselines"]
    with pytest.raises(ValueError, match="remax needs `reward_baselines`"):
        compute_advantage(batch, "remax")


def test_compute_advantage_unknown_name_lists_the_valid_ones():
    batch = _batch(token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3))
    with pytest.raises(KeyError, match="unknown advantage estimator 'ppo2'; valid names: dapo, gae, grpo"):
        compute_advantage(batch, "ppo2")


# ---------------------------------------------------------------- compute_data_metrics, compute_throughout_metrics


def _metrics_batch() -> TensorDict:
    """Prompt width 2, response width 3. Row 0: prompt 2 tokens, response 3; row 1: prompt 1 (left-padded),
    response 2 of which only the first is the policy's (the second is tool output, mask 0); 100 and 50 are junk
    at positions outside the mask."""
    return _batch(
        attention_mask=torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 0]]),
        responses=torch.tensor([[5, 6, 7], [8, 9, 0]]),
        response_mask=t([[1, 1, 1], [1, 0, 0]]),
        token_level_scores=t([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]]),
        token_level_rewards=t([[0.0, 0.0, 0.8], [-0.1, 0.5, 0.0]]),
        advantages=t([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]]),
        returns=t([[1.0, 1.0, 1.0], [3.0, 100.0, 100.0]]),
        values=t([[0.0, 1.0, 1.0], [2.0, 50.0, 50.0]]),
    )


def test_compute_data_metrics_by_hand():
    m = compute_data_metrics(_metrics_batch(), use_critic=True)
    expected = {
        # scores per row 1, .5; rewards per row .8, .4
        "critic/score/mean": 0.75, "critic/score/max": 1.0, "critic/score/min": 0.5,
        "critic/rewards/mean": 0.6, "critic/rewards/max": 0.8, "critic/rewards/min": 0.4,
        # over the 4 valid tokens: advantages {1, 2, 3, 4}, returns {1, 1, 1, 3}, values {0, 1, 1, 2}
        "critic/advantages/mean": 2.5, "critic/advantages/max": 4.0, "critic/advantages/min": 1.0,
        "critic/returns/mean": 1.5, "critic/returns/max": 3.0, "critic/returns/min": 1.0,
        "critic/values/mean": 1.0, "critic/values/max": 2.0, "critic/values/min": 0.0,
        # returns - values = {1, 0, 0, 1}: unbiased var 1/3; Var(returns) = (.25 * 3 + 2.25) / 3 = 1
        # -> 1 - (1/3) / (1 + 1e-5)
        "critic/vf_explained_var": 1 - (1 / 3) / (1 + 1e-5),
        # lengths from the attention mask: responses 3, 2 (tool output counts); prompts 2, 1
        "response_length/mean": 2.5, "response_length/max": 3.0, "response_length/min": 2.0,
        "response_length/clip_ratio": 0.5,  # row 0 fills the padded width 3
        "prompt_length/mean": 1.5, "prompt_length/max": 2.0, "prompt_length/min": 1.0,
        "prompt_length/clip_ratio": 0.5,
    }
    assert m.keys() == expected.keys()
    assert m == pytest.approx(expected, abs=1e-6)
    assert all(type(v) is float for v in m.values())


def test_compute_data_metrics_without_a_critic_and_with_configured_maxima():
    m = compute_data_metrics(_metrics_batch(), use_critic=False, max_response_length=4, max_prompt_length=1)
    assert not any(k.startswith("critic/values") for k in m) and "critic/vf_explained_var" not in m
    assert m["response_length/clip_ratio"] == 0.0  # no response is 4 tokens long
    assert m["prompt_length/clip_ratio"] == 0.5  # row 1's prompt is 1 token long


def test_compute_data_metrics_of_a_batch_without_valid_tokens_is_zero_not_an_error():
    batch = _metrics_batch()
    batch["response_mask"] = torch.zeros(2, 3, dtype=F64)
    m = compute_data_metrics(batch, use_critic=True)
    assert m["critic/advantages/max"] == m["critic/values/min"] == m["critic/vf_explained_var"] == 0.0


def test_compute_throughout_metrics_by_hand():
    # tokens: 5 (row 0) + 3 (row 1) = 8; a 2 s step on 2 GPUs -> 8 / (2 * 2) = 2 tokens/s per GPU
    m = compute_throughout_metrics(_metrics_batch(), {"step": 2.0}, n_gpus=2)
    assert m == {"perf/total_num_tokens": 8.0, "perf/time_per_step": 2.0, "perf/throughput": 2.0}
