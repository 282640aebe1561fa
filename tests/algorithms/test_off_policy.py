"""Off-policy corrections (trinity_like.algorithms.off_policy): hand-worked weights and metrics, invariants."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trinity_like.algorithms import OFF_POLICY_CORRECTIONS, OffPolicyConfig, get_off_policy_correction_fn

F64 = torch.float64
NAMES = ("decoupled", "geo_mask", "icepop", "none", "seq_mis", "seq_tis", "tis")

# Token ratios rho = pi_prox / pi_behav; behaviour log-probs 0 so old_log_prob - behaviour = log(rho) exactly.
RATIOS = [[1.5, 0.4, 4.0], [1.0, 3.0, 0.25]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=F64)  # row 1's third token (rho .25) is padding


def run(name, config=None, ratios=RATIOS, mask=MASK, staleness=None, behaviour_known=None):
    old = torch.tensor(ratios, dtype=F64).log()
    return get_off_policy_correction_fn(name)(torch.zeros_like(old), old, mask, staleness, config,
                                              behaviour_known=behaviour_known)


def close(actual, expected, atol=1e-9):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def test_registry_names_and_unknown_name():
    assert OFF_POLICY_CORRECTIONS.names() == NAMES
    with pytest.raises(KeyError, match=r"unknown off-policy correction 'vtrace'; valid names: decoupled, geo_mask"):
        get_off_policy_correction_fn("vtrace")


# ---------------------------------------------------------------- hand-worked weights
# row 0 rho [1.5, .4, 4]: product 1.5*.4*4 = 2.4, geometric mean 2.4^(1/3) = 1.3389
# row 1 rho [1, 3, (.25 masked)]: product 1*3 = 3, geometric mean sqrt(3) = 1.7321

@pytest.mark.parametrize(("name", "config", "expected"), [
    ("none", None, [[1, 1, 1], [1, 1, 0]]),
    # min(rho, 2): 4 -> 2, 3 -> 2
    ("tis", {"cap": 2.0}, [[1.5, 0.4, 2.0], [1.0, 2.0, 0]]),
    # min(product, 2.5) on every valid token: 2.4, min(3, 2.5) = 2.5
    ("seq_tis", {"cap": 2.5}, [[2.4, 2.4, 2.4], [2.5, 2.5, 0]]),
    # rho kept only inside [.5, 2]: 1.5 and 1 kept; .4, 4 and 3 dropped
    ("icepop", OffPolicyConfig(low=0.5, high=2.0), [[1.5, 0, 0], [1.0, 0, 0]]),
    # product kept if <= 2.5: row 0 (2.4) kept, row 1 (3) dropped
    ("seq_mis", OffPolicyConfig(cap=2.5), [[2.4, 2.4, 2.4], [0, 0, 0]]),
    # geometric mean inside [.5, 1.5]: row 0 (1.3389) kept with weight 1, row 1 (1.7321) dropped
    ("geo_mask", {"low": 0.5, "high": 1.5}, [[1, 1, 1], [0, 0, 0]]),
    # rho kept if <= 2: 4 and 3 dropped
    ("decoupled", {"cap": 2.0}, [[1.5, 0.4, 0], [1.0, 0, 0]]),
])
def test_weights_by_hand(name, config, expected):
    weights, _ = run(name, config)
    close(weights, expected)


def test_defaults_apply_when_config_is_none_or_lacks_a_key():
    # defaults cap 2, low .5, high 2: tis -> min(rho, 2), same as an explicit cap 2 (see above)
    for config in (None, {}, {"cap": None}, object()):
        close(run("tis", config)[0], [[1.5, 0.4, 2.0], [1.0, 2.0, 0]])
    # a dict config may hold ints: cap 3 -> 4 -> 3, 3 stays 3
    close(run("tis", {"cap": 3})[0], [[1.5, 0.4, 3.0], [1.0, 3.0, 0]])


def test_icepop_bounds_are_inclusive():
    # rho = e^0 = 1 exactly; with low = high = 1 it is kept (low <= rho <= high)
    weights, _ = run("icepop", {"low": 1.0, "high": 1.0}, ratios=[[1.0, 2.0], [1.0, 1.0]], mask=torch.ones(2, 2))
    close(weights, [[1, 0], [1, 1]])


def test_log_ratio_is_clamped_at_20():
    # old - behav = 30 -> clamped to 20 -> rho = e^20; decoupled with cap e^21 keeps it
    old, behav = torch.tensor([[30.0, 0.0]], dtype=F64), torch.zeros(1, 2, dtype=F64)
    weights, _ = get_off_policy_correction_fn("decoupled")(behav, old, torch.ones(1, 2), None, {"cap": math.exp(21)})
    close(weights, [[math.exp(20), 1.0]], atol=1e-3)


def test_metrics_by_hand():
    # tis cap 2, valid weights [1.5, .4, 2, 1, 2]: mean 6.9/5 = 1.38, max 2, none masked,
    # ESS = 6.9^2 / (5 * (2.25 + .16 + 4 + 1 + 4)) = 47.61 / 57.05 = .83453
    _, m = run("tis", {"cap": 2.0}, staleness=torch.tensor([0, 3]))
    assert m["off_policy/weight_mean"] == pytest.approx(1.38)
    assert m["off_policy/weight_max"] == pytest.approx(2.0)
    assert m["off_policy/masked_frac"] == 0.0
    assert m["off_policy/ess"] == pytest.approx(47.61 / 57.05)
    # staleness [0, 3]: mean 1.5, max 3
    assert m["off_policy/staleness_mean"] == pytest.approx(1.5)
    assert m["off_policy/staleness_max"] == 3.0
    assert "off_policy/unknown_behaviour_frac" not in m
    # icepop [.5, 2], valid weights [1.5, 0, 0, 1, 0]: 3 of 5 masked -> .6; ESS = 2.5^2 / (5 * 3.25) = .38462
    _, m = run("icepop", {"low": 0.5, "high": 2.0})
    assert m["off_policy/masked_frac"] == pytest.approx(0.6)
    assert m["off_policy/ess"] == pytest.approx(6.25 / 16.25)
    assert "off_policy/staleness_mean" not in m


def test_ess_is_zero_when_every_weight_is_masked():
    # decoupled cap .1: every rho (>= .4) is above the cap -> all dropped; ESS 0, masked_frac 1
    _, m = run("decoupled", {"cap": 0.1})
    assert m["off_policy/ess"] == 0.0
    assert m["off_policy/masked_frac"] == 1.0


@pytest.mark.parametrize("name", NAMES)
def test_unknown_behaviour_rows_get_weight_one(name):
    # row 1 unknown: weight 1 on its 2 valid tokens, 0 on its padding; row 0 as in test_weights_by_hand
    weights, m = run(name, {"cap": 2.5, "low": 0.5, "high": 1.5}, behaviour_known=torch.tensor([True, False]))
    close(weights[1], [1.0, 1.0, 0.0])
    assert m["off_policy/unknown_behaviour_frac"] == pytest.approx(0.5)  # 1 of 2 rows


def test_unknown_behaviour_rows_get_weight_one_even_with_a_cap_below_one():
    weights, _ = run("tis", {"cap": 0.5}, behaviour_known=torch.tensor([True, False]))
    close(weights[1], [1.0, 1.0, 0.0])  # documented; the code gives [.5, .5, 0]


def test_weights_carry_no_gradient_and_accept_a_bool_mask():
    old = torch.tensor(RATIOS, dtype=F64).log().requires_grad_(True)
    behav = torch.zeros(2, 3, dtype=F64, requires_grad=True)
    for name in NAMES:
        weights, _ = get_off_policy_correction_fn(name)(behav, old, MASK.bool(), None, None)
        assert not weights.requires_grad, name
        assert weights.dtype == F64 and weights.shape == (2, 3), name


# ---------------------------------------------------------------- properties


@st.composite
def inputs(draw):
    b, n = draw(st.integers(1, 4)), draw(st.integers(1, 4))

    def matrix(elements):
        return draw(st.lists(st.lists(elements, min_size=n, max_size=n), min_size=b, max_size=b))

    logp = st.floats(-5.0, 0.0, allow_nan=False)
    behav, old = torch.tensor(matrix(logp), dtype=F64), torch.tensor(matrix(logp), dtype=F64)
    mask = torch.tensor(matrix(st.booleans()), dtype=F64)
    known = torch.tensor(draw(st.lists(st.booleans(), min_size=b, max_size=b)))
    # realistic bounds: cap >= 1 and low <= 1 <= high, so a ratio of 1 is always kept unchanged
    config = OffPolicyConfig(cap=draw(st.floats(1.0, 5.0)), low=draw(st.floats(0.05, 1.0)),
                             high=draw(st.floats(1.0, 5.0)))
    return behav, old, mask, known, config


@settings(max_examples=50, deadline=None)
@given(data=inputs(), name=st.sampled_from(NAMES), junk=st.floats(-50.0, 50.0))
def test_weight_invariants(data, name, junk):
    behav, old, mask, known, config = data
    fn = get_off_policy_correction_fn(name)
    weights, m = fn(behav, old.clone().requires_grad_(True), mask, torch.tensor([1, 2]), config,
                    behaviour_known=known)
    valid = mask.bool()
    assert not weights.requires_grad
    assert (weights[~valid] == 0).all()  # zero outside the mask
    assert (weights >= 0).all() and torch.isfinite(weights).all()
    unknown = valid & ~known.unsqueeze(-1)
    assert (weights[unknown] == 1).all()  # no behaviour log-probs: weight 1 on valid tokens
    if name == "tis":
        assert weights.max().item() <= config.cap
    if name == "icepop":
        kept = weights[weights != 0]
        assert ((kept >= config.low) & (kept <= config.high)).all()
    if name in ("seq_tis", "seq_mis", "geo_mask", "none"):  # one weight per sequence
        for row, row_mask in zip(weights, valid, strict=True):
            assert len(set(row[row_mask].tolist())) <= 1
    if (weights[valid] > 0).any():
        assert 0 < m["off_policy/ess"] <= 1 + 1e-9
    else:
        assert m["off_policy/ess"] == 0.0
    # log-probs at masked positions never change the weights
    noisy = ~valid * junk
    weights2, _ = fn(behav + noisy, old - noisy, mask, None, config, behaviour_known=known)
    torch.testing.assert_close(weights2, weights, rtol=1e-12, atol=0)


# ---------------------------------------------------------------- pessimistic weights (off_policy.negative_cap)
def test_pessimistic_weights_raise_only_negative_advantage_tokens_cut_below_their_ratio():
    from trinity_like.algorithms import pessimistic_weights

    old = torch.tensor(RATIOS, dtype=F64).log()
    behaviour = torch.zeros_like(old)
    advantages = torch.tensor([[-1.0, -1.0, -1.0], [1.0, -2.0, -1.0]], dtype=F64)
    # decoupled at cap 2 dropped rho 4 and 3: [[1.5, .4, 0], [1, 0, 0]]
    weights, _ = run("decoupled", {"cap": 2.0})
    out, metrics = pessimistic_weights(weights, behaviour, old, advantages, MASK, 3.0)
    # row 0: 1.5 and .4 are already their ratio; rho 4 (dropped, negative advantage) -> min(4, 3) = 3
    # row 1: rho 1 kept (positive); rho 3 (dropped, negative) -> 3; the padded token stays 0
    close(out, [[1.5, 0.4, 3.0], [1.0, 3.0, 0.0]])
    assert metrics["off_policy/negative_raised_frac"] == pytest.approx(2 / 5)
    # tis truncated 4 -> 2 and 3 -> 2; a positive advantage keeps its truncation
    weights, _ = run("tis", {"cap": 2.0})
    out, _ = pessimistic_weights(weights, behaviour, old, -advantages, MASK, 3.0)
    close(out, [[1.5, 0.4, 2.0], [1.0, 2.0, 0.0]])
    # unknown behaviour rows (ratio taken as 1) are never raised above their weight of 1
    known = torch.tensor([False, True])
    weights, _ = run("decoupled", {"cap": 2.0}, behaviour_known=known)
    out, _ = pessimistic_weights(weights, behaviour, old, advantages, MASK, 3.0, behaviour_known=known)
    close(out, [[1.0, 1.0, 1.0], [1.0, 3.0, 0.0]])
    assert not out.requires_grad
