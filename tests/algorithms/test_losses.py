"""Policy losses, value loss, KL estimators and controllers: hand-worked values, gradients, invariants."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trinity_like.algorithms import (
    POLICY_LOSSES,
    AdaptiveKLController,
    FixedKLController,
    PolicyLossConfig,
    agg_loss,
    compute_policy_loss,
    compute_value_loss,
    get_kl_controller,
    get_policy_loss_fn,
    kl_penalty,
)

D = torch.float64


def _t(rows):
    return torch.tensor(rows, dtype=D)


# ---------------------------------------------------------------- registry and config access


def test_registry_has_one_signature_for_every_loss():
    old, new, adv = _t([[0.0, 0.1]]), _t([[0.1, 0.0]]), _t([[1.0, -1.0]])
    mask = torch.ones(1, 2, dtype=D)
    pair = (torch.cat([old, old]), torch.cat([new, new]), torch.cat([adv, adv]), torch.cat([mask, mask]))
    for name in POLICY_LOSSES.names():
        loss, metrics = get_policy_loss_fn(name)(*pair, loss_agg_mode="token-mean", config=None,
                                                 rollout_is_weights=None)
        assert loss.dim() == 0 and math.isfinite(float(loss)), name
        assert all(k.startswith("actor/") and isinstance(v, float) for k, v in metrics.items()), name
    with pytest.raises(KeyError, match="valid names: cispo, dpo, gspo, opmd, reinforce, sft, vanilla"):
        get_policy_loss_fn("ppo2")


def test_vanilla_equals_compute_policy_loss_and_reads_config_forms():
    g = torch.Generator().manual_seed(0)
    old, new = torch.randn(3, 4, generator=g, dtype=D), torch.randn(3, 4, generator=g, dtype=D)
    adv, mask = torch.randn(3, 4, generator=g, dtype=D), (torch.rand(3, 4, generator=g) > 0.3).to(D)
    ref, clipfrac, kl, lower = compute_policy_loss(old, new, adv, mask, cliprange_low=0.1, cliprange_high=0.3,
                                                   clip_ratio_c=2.5)
    for config in (PolicyLossConfig(clip_ratio_low=0.1, clip_ratio_high=0.3, clip_ratio_c=2.5),
                   {"clip_ratio": 0.7, "clip_ratio_low": 0.1, "clip_ratio_high": 0.3, "clip_ratio_c": 2.5}):
        loss, m = get_policy_loss_fn("vanilla")(old, new, adv, mask, "token-mean", config)
        assert float(loss) == pytest.approx(float(ref), rel=1e-12)
        assert m["actor/pg_clipfrac"] == pytest.approx(float(clipfrac))
        assert m["actor/ppo_kl"] == pytest.approx(float(kl))
        assert m["actor/pg_clipfrac_lower"] == pytest.approx(float(lower))


def test_symmetric_clip_ratio_fills_missing_bounds():
    old, new, adv, mask = _t([[0.0]]), _t([[1.0]]), _t([[1.0]]), torch.ones(1, 1, dtype=D)
    # ratio e = 2.718 > 1 + 0.5: clipped at 1.5 -> loss -1.5
    loss, _ = get_policy_loss_fn("vanilla")(old, new, adv, mask, config={"clip_ratio": 0.5})
    assert float(loss) == pytest.approx(-1.5)


def test_rollout_is_weights_scale_per_token_losses():
    old, new, adv = _t([[0.0, 0.0]]), _t([[0.0, 0.0]]), _t([[1.0, 2.0]])
    mask = torch.ones(1, 2, dtype=D)
    # ratio 1: per-token losses -1, -2; weights 0.5, 0 -> (-0.5 + 0) / 2 = -0.25
    loss, _ = get_policy_loss_fn("vanilla")(old, new, adv, mask, rollout_is_weights=_t([[0.5, 0.0]]))
    assert float(loss) == pytest.approx(-0.25)


# ---------------------------------------------------------------- the other losses, by hand


def test_gspo_by_hand():
    old = _t([[0.0, 0.0], [0.0, 0.0]])
    new = _t([[0.2, 0.0], [0.0, 0.0]])
    adv = _t([[1.0, 1.0], [-1.0, -1.0]])
    mask = _t([[1, 1], [1, 0]])
    cfg = {"clip_ratio_low": 0.05, "clip_ratio_high": 0.05}
    loss, m = get_policy_loss_fn("gspo")(old, new, adv, mask, "seq-mean-token-mean", cfg)
    # row 0: s = exp((0.2 + 0) / 2) = 1.10517 > 1.05 with A > 0 -> clipped term -1.05 on both tokens
    # row 1: s = exp(0) = 1 -> loss +1 on its valid token; seq-mean -> (-1.05 + 1) / 2 = -0.025
    assert float(loss) == pytest.approx(-0.025, rel=1e-6)  # the token mean divides by count + 1e-8
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 3)  # 2 of 3 valid tokens clipped


def test_cispo_by_hand_and_its_gradient():
    old = _t([[0.0, 0.0]])
    new = torch.tensor([[math.log(2.0), math.log(0.5)]], dtype=D, requires_grad=True)
    adv, mask = _t([[1.0, 1.0]]), torch.ones(1, 2, dtype=D)
    loss, m = get_policy_loss_fn("cispo")(old, new, adv, mask, config={"clip_ratio_low": 0.2, "clip_ratio_high": 0.2})
    # ratios 2 and 0.5 clip to 1.2 and 0.8 (stop-gradient): L = -(1.2 ln 2 + 0.8 ln 0.5) / 2 = -0.2 ln 2
    assert float(loss.detach()) == pytest.approx(-0.2 * math.log(2.0))
    assert m["actor/pg_clipfrac"] == pytest.approx(1.0)
    loss.backward()
    # dL/dlog_prob = -sg(clip(r)) * A / 2: every token keeps a gradient even though both were clipped
    assert new.grad[0].tolist() == pytest.approx([-0.6, -0.4])


def test_reinforce_sft_and_dpo_by_hand():
    old, new = _t([[0.0, 0.0]]), _t([[math.log(2.0), 0.0]])
    adv, mask = _t([[1.0, 3.0]]), torch.ones(1, 2, dtype=D)
    loss, _ = get_policy_loss_fn("reinforce")(old, new, adv, mask)
    # no clip: (-1 * 2 + -3 * 1) / 2 = -2.5
    assert float(loss) == pytest.approx(-2.5)
    loss, m = get_policy_loss_fn("sft")(old, _t([[-1.0, -3.0]]), adv, mask)
    assert float(loss) == pytest.approx(2.0)  # mean NLL of 1 and 3
    # DPO: chosen row 0, rejected row 1; sequence log-probs -1 vs -3 under the policy, -2 vs -2 under ref
    log_prob, ref = _t([[-0.5, -0.5], [-1.5, -1.5]]), _t([[-1.0, -1.0], [-1.0, -1.0]])
    loss, m = get_policy_loss_fn("dpo")(ref, log_prob, torch.zeros(2, 2, dtype=D), torch.ones(2, 2, dtype=D),
                                        config={"dpo_beta": 0.5})
    # h = 0.5 * ((-1 - -2) - (-3 - -2)) = 1 -> loss = -log sigmoid(1) = 0.31326
    assert float(loss) == pytest.approx(-math.log(1 / (1 + math.exp(-1.0))))
    assert m["actor/dpo_accuracy"] == 1.0 and m["actor/dpo_chosen_reward"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="even number of rows"):
        get_policy_loss_fn("dpo")(ref[:1], log_prob[:1], adv, mask)


@pytest.mark.parametrize("name", ["vanilla", "gspo", "reinforce", "sft", "dpo"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradcheck_float64(name, mode):
    g = torch.Generator().manual_seed(1)
    old = torch.randn(4, 3, generator=g, dtype=D) * 0.1
    new = (old + torch.randn(4, 3, generator=g, dtype=D) * 0.05).requires_grad_(True)
    adv = torch.randn(4, 3, generator=g, dtype=D)
    if name == "gspo":
        # GSPO's token gradient equals the gradient of its sequence ratio only for a sequence-level advantage
        adv = adv[:, :1].expand(4, 3)
    mask = _t([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    fn = get_policy_loss_fn(name)
    # small clip ranges are kept away from the ratios (all within 1 +- 0.2), so the function is smooth here
    assert torch.autograd.gradcheck(lambda x: fn(old, x, adv, mask, mode, {"clip_ratio": 0.5})[0], (new,))


# ---------------------------------------------------------------- invariants


@st.composite
def loss_inputs(draw):
    b, n = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    floats = st.floats(-2, 2, allow_nan=False)
    mk = lambda: torch.tensor(draw(st.lists(st.lists(floats, min_size=n, max_size=n), min_size=b, max_size=b)),  # noqa: E731
                              dtype=D)
    mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=n, max_size=n), min_size=b, max_size=b)),
                        dtype=D)
    return mk(), mk(), mk(), mask


@settings(max_examples=50, deadline=None)
@given(loss_inputs(), st.sampled_from(["vanilla", "gspo", "cispo", "reinforce", "sft"]),
       st.sampled_from(["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]), st.integers(1, 3))
def test_masked_positions_and_padding_width_never_change_the_loss(inputs, name, mode, pad):
    old, new, adv, mask = inputs
    fn = get_policy_loss_fn(name)
    loss, _ = fn(old, new, adv, mask, mode, None)
    # scramble every masked position
    noise = torch.full_like(old, 7.0) * (1 - mask)
    scrambled, _ = fn(old + noise, new - noise, adv + noise, mask, mode, None)
    assert float(scrambled) == pytest.approx(float(loss), rel=1e-9, abs=1e-12)
    # pad the response width with masked columns
    widen = lambda x, v=0.0: torch.cat([x, torch.full((x.shape[0], pad), v, dtype=D)], dim=-1)  # noqa: E731
    padded, _ = fn(widen(old, 3.0), widen(new, -3.0), widen(adv, 5.0), widen(mask), mode, None)
    assert float(padded) == pytest.approx(float(loss), rel=1e-9, abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(loss_inputs(), st.floats(1.5, 5.0))
def test_dual_clip_bounds_each_token(inputs, c):
    old, new, adv, mask = inputs
    # each token scored alone: for A < 0 its loss never exceeds c * |A| (dual clip); for A > 0 it never
    # goes below -A * (1 + eps) (the clip removes any gain from pushing the ratio further)
    ones = torch.ones(1, 1, dtype=D)
    for i in range(old.shape[0]):
        for j in range(old.shape[1]):
            cell = (slice(i, i + 1), slice(j, j + 1))
            loss, *_ = compute_policy_loss(old[cell], new[cell], adv[cell], ones, cliprange=0.2, clip_ratio_c=c)
            a = float(adv[i, j])
            if a < 0:
                assert float(loss) <= c * -a + 1e-9
            else:
                assert float(loss) >= -a * 1.2 - 1e-9


def test_fully_masked_loss_is_zero_not_nan():
    z = torch.zeros(2, 3, dtype=D)
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert float(agg_loss(torch.ones(2, 3, dtype=D), z, mode)) == 0.0


# ---------------------------------------------------------------- value loss, KL


def test_value_loss_by_hand():
    vpreds, values = _t([[1.0, 0.0]]), _t([[0.5, 0.0]])
    returns, mask = _t([[2.0, 1.0]]), torch.ones(1, 2, dtype=D)
    loss, clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2)
    # token 0: unclipped (1-2)^2 = 1; clipped pred 0.7 -> (0.7-2)^2 = 1.69 (larger, counts as clipped)
    # token 1: pred 0 within range -> 1 both. 0.5 * mean(1.69, 1) = 0.6725
    assert float(loss) == pytest.approx(0.6725)
    assert float(clipfrac) == pytest.approx(0.5)


def test_kl_estimators_by_hand():
    lp, ref = _t([0.0, 0.5]), _t([0.5, 0.0])
    # d = lp - ref = (-0.5, 0.5)
    assert kl_penalty(lp, ref, "k1").tolist() == pytest.approx([-0.5, 0.5])
    assert kl_penalty(lp, ref, "kl").tolist() == pytest.approx([-0.5, 0.5])
    assert kl_penalty(lp, ref, "abs").tolist() == pytest.approx([0.5, 0.5])
    assert kl_penalty(lp, ref, "mse").tolist() == pytest.approx([0.125, 0.125])
    # k3 = exp(ref - lp) - (ref - lp) - 1: e^.5 - .5 - 1 = 0.148721, e^-.5 + .5 - 1 = 0.106531
    assert kl_penalty(lp, ref, "low_var_kl").tolist() == pytest.approx([0.148721, 0.106531], abs=1e-6)
    # clamps: inner log-ratio to 20, result to 10
    assert float(kl_penalty(_t([0.0]), _t([30.0]), "k3")[0]) == 10.0
    with pytest.raises(ValueError, match="unknown kl_penalty"):
        kl_penalty(lp, ref, "full")


@pytest.mark.parametrize("name", ["k1+", "k3+", "abs+", "low_var_kl+"])
def test_straight_through_kl_has_value_of_estimator_and_gradient_of_k2(name):
    lp = _t([0.3, -0.2]).requires_grad_(True)
    ref = _t([0.1, 0.4])
    out = kl_penalty(lp, ref, name)
    assert out.tolist() == pytest.approx(kl_penalty(lp, ref, name[:-1]).tolist())
    out.sum().backward()
    assert lp.grad.tolist() == pytest.approx([0.2, -0.6])  # d/dlp 0.5 (lp - ref)^2 = lp - ref


def test_kl_controllers_by_hand():
    fixed = FixedKLController(0.1)
    fixed.update(5.0, 10)
    assert fixed.value == 0.1
    ctrl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
    ctrl.update(current_kl=0.11, n_steps=10)  # error 0.1 -> mult 1 + 0.1 * 10 / 100 = 1.01
    assert ctrl.value == pytest.approx(0.202)
    ctrl.update(current_kl=1.0, n_steps=10)  # error clipped to 0.2 -> mult 1.02
    assert ctrl.value == pytest.approx(0.202 * 1.02)
    assert isinstance(get_kl_controller("fixed", 0.1), FixedKLController)
    with pytest.raises(ValueError, match="target_kl and horizon"):
        get_kl_controller("adaptive", 0.1)
