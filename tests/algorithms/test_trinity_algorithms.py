"""Trinity-RFT's algorithms here: our functions, driven with the values the translation table gives, against
Trinity's own implementation (tests/algorithms/trinity_reference.json, written by tools/trinity_reference.py from
Trinity's source at the commit it names), and the table itself (trinity_like.algorithms.trinity_algorithms).

Where Trinity's code departs from its paper, ours follows the paper and the test shows exactly the difference:
DPO (Trinity sums all pairs of a micro-batch into one logit), MIX (Trinity scales each micro-batch by its row
counts), k3 (ours clamped), seq-mean-token-sum-norm (Trinity divides the batch's sum by L only), the seq-* modes
with an empty row (Trinity counts it), the adaptive in-reward KL (Trinity's update raises)."""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trinity_like.algorithms import (
    ADV_ESTIMATORS,
    POLICY_LOSSES,
    AdaptiveKLController,
    FixedKLController,
    agg_loss,
    apply_kl_penalty,
    kl_penalty,
)
from trinity_like.algorithms.losses import mix_policy_loss
from trinity_like.algorithms.trinity_algorithms import (
    ALGORITHM_TYPES,
    DEFAULT_REPEAT_TIMES,
    REFUSED_ALGORITHMS,
    UPSTREAM_COMMIT,
    translate_algorithm,
)
from trinity_like.common.errors import ConfigError

REF = json.loads((Path(__file__).parent / "trinity_reference.json").read_text())
CASES = REF["cases"]
X = {k: torch.tensor(v, dtype=torch.float64) for k, v in REF["inputs"].items()}
MASK = X["response_mask"]
GROUPS = REF["constants"]["groups"]
EXPERT = torch.tensor(REF["constants"]["expert"])
B = MASK.shape[0]
TIGHT = dict(rtol=1e-7, atol=1e-10)  # float64 on both sides; means divide by count + 1e-8
F32 = dict(rtol=1e-6, atol=1e-6)  # Trinity's group statistics are float32


def close(ours, theirs, tol=TIGHT):
    torch.testing.assert_close(torch.as_tensor(ours, dtype=torch.float64),
                               torch.as_tensor(theirs, dtype=torch.float64), **tol)


def ours_loss(name, config, log_prob=None, loss_agg_mode="token-mean", rows=slice(None), **kw):
    """Our registered policy loss and its gradient w.r.t. the log-probs."""
    lp = (X["log_prob"] if log_prob is None else log_prob)[rows].clone().requires_grad_(True)
    old = kw.pop("old", X["old_log_prob"])[rows]
    loss, _ = POLICY_LOSSES.get(name)(old, lp, X["advantages"][rows], MASK[rows], loss_agg_mode, config)
    loss.backward()
    return float(loss.detach()), lp.grad


def test_the_reference_is_of_the_upstream_commit_the_table_follows():
    assert REF["upstream_commit"] == UPSTREAM_COMMIT


# ---------------------------------------------------------------- policy losses


def _table(algorithm_type, **section):
    keys, _ = translate_algorithm({"algorithm_type": algorithm_type, **section})
    return {k.removeprefix("algorithm."): v for k, v in keys.items() if k.startswith("algorithm.")}


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_ppo_is_trinitys(agg):
    cfg = _table("grpo", loss_agg_mode=agg)
    assert cfg["policy_loss"] == "vanilla" and cfg["loss_agg_mode"] == agg
    loss, grad = ours_loss("vanilla", cfg, loss_agg_mode=agg)
    close(loss, CASES[f"ppo/{agg}"]["loss"])
    close(grad, CASES[f"ppo/{agg}"]["grad"])


def test_ppo_with_trinitys_asymmetric_clip_and_dual_clip():
    cfg = _table("ppo", policy_loss_fn_args={"clip_range_low": 0.1, "clip_range_high": 0.28, "clip_ratio_c": 2.0})
    assert (cfg["clip_ratio_low"], cfg["clip_ratio_high"], cfg["clip_ratio_c"]) == (0.1, 0.28, 2.0)
    loss, grad = ours_loss("vanilla", cfg)
    close(loss, CASES["ppo/asymmetric"]["loss"])
    close(grad, CASES["ppo/asymmetric"]["grad"])


def test_seq_mean_token_sum_norm_is_dr_grpos_and_trinitys_code_is_b_times_it():
    # ours (Dr. GRPO, verl): mean over sequences of sum_t / L; Trinity's code: the batch's whole sum / L
    loss, grad = ours_loss("vanilla", {"clip_ratio": 0.2}, loss_agg_mode="seq-mean-token-sum-norm")
    theirs = CASES["ppo/seq-mean-token-sum-norm"]
    close(B * loss, theirs["loss"])
    close(B * grad, theirs["grad"])
    assert not math.isclose(loss, theirs["loss"], rel_tol=0.1)


@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_opmd_policy_loss_is_trinitys(tau):
    cfg = _table("opmd", policy_loss_fn_args={"tau": tau})
    assert cfg["policy_loss"] == "opmd" and cfg["tau"] == tau
    loss, grad = ours_loss("opmd", cfg)
    close(loss, CASES[f"opmd/tau={tau}"]["loss"])
    close(grad, CASES[f"opmd/tau={tau}"]["grad"])


def test_sft_is_trinitys():
    assert _table("sft")["policy_loss"] == "sft"
    loss, grad = ours_loss("sft", {})
    close(loss, CASES["sft"]["loss"])
    close(grad, CASES["sft"]["grad"])


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_gspo_is_trinitys(agg):
    cfg = _table("gspo", loss_agg_mode=agg)
    assert (cfg["clip_ratio_low"], cfg["clip_ratio_high"]) == (0.0003, 0.0004)
    loss, grad = ours_loss("gspo", cfg, log_prob=X["gspo_log_prob"], loss_agg_mode=agg)
    # ours divides a sequence's log-ratio sum by max(count, 1), Trinity's by count + 1e-8
    close(loss, CASES[f"gspo/{agg}"]["loss"], dict(rtol=1e-7, atol=1e-12))
    close(grad, CASES[f"gspo/{agg}"]["grad"], dict(rtol=1e-7, atol=1e-12))


def test_trinitys_gspo_runs_token_mean_unless_the_section_says_otherwise():
    # its default_args say seq-mean-token-mean, but Trinity overwrites a policy loss's loss_agg_mode with
    # algorithm.loss_agg_mode (token-mean by default)
    assert _table("gspo")["loss_agg_mode"] == "token-mean"


@pytest.mark.parametrize("case, args", [("cispo", {}), ("cispo/narrow", {"clip_range_low": 0.1, "clip_range_high": 0.1})])
def test_cispo_is_trinitys(case, args):
    cfg = _table("cispo", **({"policy_loss_fn_args": args} if args else {}))
    loss, grad = ours_loss("cispo", cfg)
    close(loss, CASES[case]["loss"])
    close(grad, CASES[case]["grad"])


def test_importance_sampling_is_our_reinforce_loss():
    cfg = _table("grpo", policy_loss_fn="importance_sampling")
    assert cfg["policy_loss"] == "reinforce"
    loss, grad = ours_loss("reinforce", cfg)
    close(loss, CASES["importance_sampling"]["loss"])
    close(grad, CASES["importance_sampling"]["grad"])


def test_dpo_is_trinitys_for_one_pair():
    cfg = _table("dpo", policy_loss_fn_args={"beta": 0.1, "label_smoothing": 0.1})
    assert (cfg["dpo_beta"], cfg["dpo_label_smoothing"]) == (0.1, 0.1)
    loss, grad = ours_loss("dpo", cfg, old=X["ref_log_prob"], rows=slice(0, 2))
    close(loss, CASES["dpo/rows=2"]["loss"])
    close(grad, CASES["dpo/rows=2"]["grad"])


def test_dpo_averages_pairs_where_trinitys_code_sums_them_into_one_logit():
    cfg = {"dpo_beta": 0.1, "dpo_label_smoothing": 0.1}
    ours, _ = ours_loss("dpo", cfg, old=X["ref_log_prob"])  # 3 pairs: the mean of 3 per-pair losses (the paper)
    theirs = CASES["dpo/rows=6"]["loss"]
    seq = (X["log_prob"] * MASK).sum(-1) - (X["ref_log_prob"] * MASK).sum(-1)  # (B,)
    h = 0.1 * (seq[0::2] - seq[1::2])  # (3,) one logit per pair
    per_pair = (-(0.9) * F.logsigmoid(h) - 0.1 * F.logsigmoid(-h)).mean()
    summed = h.sum()  # Trinity: masked_sum over the whole micro-batch, one logit
    close(ours, per_pair)
    close(theirs, -(0.9) * F.logsigmoid(summed) - 0.1 * F.logsigmoid(-summed))
    assert abs(ours - theirs) > 1e-3


# ---------------------------------------------------------------- mix


def test_mix_table_entry():
    keys, notes = translate_algorithm({"algorithm_type": "mix", "sample_strategy_args": {"expert_data_ratio": 0.2},
                                       "policy_loss_fn_args": {"mu": 0.3}})
    assert keys["algorithm.sft_loss_form"] == "mix" and keys["algorithm.sft_loss_coef"] == 0.3
    assert keys["algorithm.sft_sources"] == ["human"]
    assert keys["buffer.mix"] == pytest.approx({"explorer": 0.8, "human": 0.2})
    assert keys["algorithm.use_kl_loss"] and keys["algorithm.kl_loss_type"] == "k2"  # the validator's default
    assert any("row counts" in n for n in notes)
    assert ALGORITHM_TYPES["mix"]["algorithm.sft_loss_coef"] == 0.1 and DEFAULT_REPEAT_TIMES["mix"] == 8


def test_mix_by_hand():
    # two rows of two tokens: row 0 usual (A = 1 on both tokens, ratio 1: pg = -1 per token), row 1 expert
    # (log-probs -1 and -3: token-mean NLL 2). mu 0.25: (1 - .25) * (-1) + .25 * 2 = -0.25
    lp = torch.tensor([[-0.5, -0.7], [-1.0, -3.0]], dtype=torch.float64, requires_grad=True)
    old = lp.detach().clone()
    adv = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.float64)
    loss, metrics = mix_policy_loss(old, lp, adv, mask, torch.tensor([False, True]), 0.25, "token-mean",
                                    {"clip_ratio": 0.2})
    assert float(loss.detach()) == pytest.approx(-0.25)
    assert metrics["actor/pg_loss"] == pytest.approx(-1.0) and metrics["actor/sft_loss"] == pytest.approx(2.0)
    loss.backward()
    # d/d lp: usual tokens -(1 - mu) * A * ratio / 2 = -0.375; expert tokens -mu / 2 = -0.125
    close(lp.grad, [[-0.375, -0.375], [-0.125, -0.125]])


def test_mix_is_trinitys_on_one_micro_batch():
    cfg = _table("mix")
    lp = X["log_prob"].clone().requires_grad_(True)
    loss, _ = mix_policy_loss(X["old_log_prob"], lp, X["advantages"], MASK, EXPERT, cfg["sft_loss_coef"],
                              cfg["loss_agg_mode"], cfg)
    loss.backward()
    close(float(loss.detach()), CASES["mix/one_micro_batch"]["loss"])
    close(lp.grad, CASES["mix/one_micro_batch"]["grad"])


def test_trinitys_mix_weighs_each_micro_batch_by_its_row_counts_ours_by_the_mini_batch():
    mu, cfg = 0.1, {"clip_ratio": 0.2}
    n_usual, n_expert = int((~EXPERT).sum()), int(EXPERT.sum())
    lp = X["log_prob"].clone().requires_grad_(True)
    trinity_form = 0.0
    for rows in (slice(0, 3), slice(3, 6)):  # the micro-batches Trinity's actor ran
        e = EXPERT[rows]
        usual_mask, expert_mask = MASK[rows] * ~e.unsqueeze(-1), MASK[rows] * e.unsqueeze(-1)
        pg, _ = POLICY_LOSSES.get("vanilla")(X["old_log_prob"][rows], lp[rows], X["advantages"][rows], usual_mask,
                                             "token-mean", cfg)
        sft = -(lp[rows] * expert_mask).sum() / expert_mask.sum()
        trinity_form = trinity_form + (1 - mu) * pg * int((~e).sum()) / n_usual + mu * sft * int(e.sum()) / n_expert
    trinity_form.backward()
    theirs = CASES["mix/two_micro_batches"]
    close(float(trinity_form.detach()), theirs["loss"])
    close(lp.grad, theirs["grad"])
    ours, _ = mix_policy_loss(X["old_log_prob"], X["log_prob"], X["advantages"], MASK, EXPERT, mu, "token-mean", cfg)
    close(float(ours), CASES["mix/one_micro_batch"]["loss"])  # ours: the same whatever the split
    assert abs(float(ours) - theirs["loss"]) > 1e-4  # the micro-batches hold 9 and 3 usual tokens, 2 rows each


def test_mix_entropy_is_over_the_usual_rows():
    usual = MASK * ~EXPERT.unsqueeze(-1)
    close(0.01 * agg_loss(X["entropy"], usual, "token-mean"), CASES["entropy/mix"]["loss"])
    close(0.01 * agg_loss(X["entropy"], MASK, "token-mean"), CASES["entropy/default"]["loss"])
    assert _table("grpo", entropy_loss_fn_args={"entropy_coef": 0.01})["entropy_coeff"] == 0.01


# ---------------------------------------------------------------- KL and aggregation


@pytest.mark.parametrize("name", ["k1", "k2", "k3", "low_var_kl", "abs"])
def test_kl_loss_is_trinitys(name):
    cfg = _table("grpo", kl_loss_fn=name, kl_loss_fn_args={"kl_coef": 0.05})
    assert cfg["use_kl_loss"] and cfg["kl_loss_coef"] == 0.05
    lp = X["log_prob"].clone().requires_grad_(True)
    loss = cfg["kl_loss_coef"] * agg_loss(kl_penalty(lp, X["ref_log_prob"], cfg["kl_loss_type"]), MASK, "token-mean")
    loss.backward()
    theirs = CASES[f"kl_loss/{name}/ref_log_prob"]
    close(float(loss.detach()), theirs["loss"])
    close(lp.grad, theirs["grad"])
    close(kl_penalty(X["log_prob"], X["ref_log_prob"], cfg["kl_loss_type"]), theirs["kl"])


def test_k3_is_clamped_here_and_not_in_trinity():
    ours = kl_penalty(X["log_prob"], X["far_ref_log_prob"], "k3")
    theirs = torch.tensor(CASES["kl_loss/k3/far_ref_log_prob"]["kl"], dtype=torch.float64)
    close(theirs[0, 0], math.exp(3.0) - 1 - 3.0)  # log(ref / pi) = 3: e^3 - 1 - 3 = 16.09
    assert float(ours[0, 0]) == 10.0  # ours clamps at 10 (as low_var_kl, Trinity's low_var_kl too)
    close(ours[0, 1:], theirs[0, 1:])
    close(ours[1:], theirs[1:])
    close(kl_penalty(X["log_prob"], X["far_ref_log_prob"], "low_var_kl"),
          CASES["kl_loss/low_var_kl/far_ref_log_prob"]["kl"])


def test_in_reward_kl_is_trinitys_with_a_fixed_coefficient():
    keys, _ = translate_algorithm({"algorithm_type": "grpo", "kl_penalty_fn": "k1",
                                   "kl_penalty_fn_args": {"kl_coef": 0.1}})
    assert keys["algorithm.use_kl_in_reward"] and keys["algorithm.kl_penalty"] == "k1"
    assert (keys["algorithm.kl_ctrl.type"], keys["algorithm.kl_ctrl.kl_coef"]) == ("fixed", 0.1)
    ctrl = FixedKLController(0.1)
    rewards, metrics = apply_kl_penalty(X["token_level_rewards"], X["old_log_prob"], X["ref_log_prob"], MASK, ctrl, "k1")
    theirs = CASES["kl_penalty/fixed"]
    close(rewards, theirs["token_level_rewards"])
    close(metrics["actor/reward_kl_penalty"], theirs["kl"])
    assert ctrl.value == theirs["kl_coef_after"]


def test_trinitys_adaptive_in_reward_kl_raises_ours_adapts_as_ziegler():
    theirs = CASES["kl_penalty/adaptive"]
    assert theirs["error"].startswith("TypeError")  # torch.clip on a float, after it wrote the rewards
    keys, _ = translate_algorithm({"algorithm_type": "grpo", "kl_penalty_fn": "k1", "kl_penalty_fn_args": {
        "kl_coef": 0.1, "adaptive": True, "target_kl": 0.01, "horizon": 10}})
    assert (keys["algorithm.kl_ctrl.type"], keys["algorithm.kl_ctrl.target_kl"], keys["algorithm.kl_ctrl.horizon"]) \
        == ("adaptive", 0.01, 10)
    ctrl = AdaptiveKLController(0.1, 0.01, 10)
    rewards, metrics = apply_kl_penalty(X["token_level_rewards"], X["old_log_prob"], X["ref_log_prob"], MASK, ctrl, "k1")
    close(rewards, theirs["token_level_rewards"])  # the rewards use the coefficient before the update, as Trinity's
    error = min(max(metrics["actor/reward_kl_penalty"] / 0.01 - 1, -0.2), 0.2)
    assert ctrl.value == pytest.approx(0.1 * (1 + error * B / 10))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_loss_aggregation_is_trinitys_and_an_empty_row_is_no_sequence_here(agg):
    close(agg_loss(X["entropy"], MASK, agg), CASES[f"agg/{agg}"]["loss"])
    with_empty = MASK.clone()
    with_empty[3] = 0.0
    ours, theirs = float(agg_loss(X["entropy"], with_empty, agg)), CASES[f"agg/{agg}"]["loss_with_empty_row"]
    # Trinity's seq-* modes count the empty row as a sequence of loss 0: (B - 1) / B of ours
    close(theirs, ours if agg == "token-mean" else ours * (B - 1) / B)


def test_seq_mean_token_sum_norm_with_an_empty_row():
    with_empty = MASK.clone()
    with_empty[3] = 0.0
    close(CASES["agg/seq-mean-token-sum-norm"]["loss"], B * agg_loss(X["entropy"], MASK, "seq-mean-token-sum-norm"))
    close(CASES["agg/seq-mean-token-sum-norm"]["loss_with_empty_row"],
          (B - 1) * agg_loss(X["entropy"], with_empty, "seq-mean-token-sum-norm"))


# ---------------------------------------------------------------- advantages


def _adv(name, rewards="token_level_rewards", **kw):
    adv, ret = ADV_ESTIMATORS.get(name)(token_level_rewards=X[rewards], response_mask=MASK, index=GROUPS,
                                        values=X["values"], reward_baselines=X["reward_baselines"], **kw)
    return adv, ret


@pytest.mark.parametrize("algorithm_type, case", [("grpo", "grpo"), ("grpo_verl", "grpo_verl")])
def test_grpo_advantage_is_trinitys(algorithm_type, case):
    cfg = _table(algorithm_type)
    assert cfg["adv_estimator"] == "grpo" and cfg["norm_adv_by_std_in_grpo"]
    adv, _ = _adv("grpo")
    close(adv, CASES[case]["advantages"], F32)


@pytest.mark.parametrize("case, args", [("opmd/mean", {}), ("opmd/logavgexp", {"opmd_baseline": "logavgexp", "tau": 0.5}),
                                        ("opmd_verl/logavgexp", {"opmd_baseline": "logavgexp", "tau": 0.5})])
def test_opmd_advantage_is_trinitys(case, args):
    section = {"advantage_fn_args": args, **({"policy_loss_fn_args": {"tau": args["tau"]}} if "tau" in args else {})}
    cfg = _table("opmd", **section)
    adv, _ = _adv("opmd", opmd_baseline=cfg["opmd_baseline"], tau=cfg.get("tau", 1.0))
    close(adv, CASES[case]["advantages"], F32)


@pytest.mark.parametrize("algorithm_type, case, estimator, rewards, kw", [
    ("rloo", "rloo", "rloo", "token_level_rewards", {}),
    ("reinforceplusplus", "reinforceplusplus", "reinforce_plus_plus", "dense_rewards", {"gamma": 0.9}),
    ("ppo", "ppo", "gae", "dense_rewards", {"gamma": 0.9, "lam": 0.8}),
])
def test_trainer_side_advantages_are_trinitys(algorithm_type, case, estimator, rewards, kw):
    cfg = _table(algorithm_type, advantage_fn_args=kw) if kw else _table(algorithm_type)
    assert cfg["adv_estimator"] == estimator
    adv, ret = _adv(estimator, rewards, **{k: cfg[k] for k in kw})
    close(adv, CASES[case]["advantages"], F32)
    close(ret, CASES[case]["returns"], F32)


@pytest.mark.parametrize("fn, estimator, rewards", [("remax", "remax", "dense_rewards"),
                                                    ("reinforce", "reinforce", "token_level_rewards")])
def test_other_advantages_are_trinitys(fn, estimator, rewards):
    assert _table("grpo", advantage_fn=fn)["adv_estimator"] == estimator
    adv, _ = _adv(estimator, rewards)
    close(adv, CASES[fn]["advantages"], F32)


# ---------------------------------------------------------------- the table


def test_every_type_has_trinitys_defaults():
    grpo = ALGORITHM_TYPES["grpo"]
    assert grpo == {**grpo, "algorithm.adv_estimator": "grpo", "algorithm.policy_loss": "vanilla",
                    "algorithm.clip_ratio_low": 0.2, "algorithm.clip_ratio_high": 0.2, "algorithm.use_kl_loss": True,
                    "algorithm.kl_loss_type": "k2", "algorithm.kl_loss_coef": 0.001,
                    "algorithm.use_kl_in_reward": False, "algorithm.entropy_coeff": 0.0,
                    "algorithm.loss_agg_mode": "token-mean"}
    assert ALGORITHM_TYPES["ppo"]["algorithm.adv_estimator"] == "gae"
    assert ALGORITHM_TYPES["sft"]["algorithm.use_kl_loss"] is False
    assert "algorithm.adv_estimator" not in ALGORITHM_TYPES["dpo"]  # DPO reads no advantage
    assert ALGORITHM_TYPES["dpo"]["algorithm.use_kl_loss"] is True  # Trinity: "DPO must use KL loss"
    assert ALGORITHM_TYPES["cispo"]["algorithm.clip_ratio_low"] == 1.0
    assert set(ALGORITHM_TYPES) == set(DEFAULT_REPEAT_TIMES)
    assert not set(ALGORITHM_TYPES) & set(REFUSED_ALGORITHMS)


def test_every_type_loads_as_our_config(tmp_path):
    import yaml

    from trinity_like.config import load_config

    for algorithm_type, keys in ALGORITHM_TYPES.items():
        tree: dict = {"explorer": {"repeat_times": DEFAULT_REPEAT_TIMES[algorithm_type]}}
        if "buffer.mix" in keys:
            tree["mode"] = "async"
        for dotted, value in keys.items():
            node = tree
            *parents, leaf = dotted.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
        path = tmp_path / f"{algorithm_type}.yaml"
        path.write_text(yaml.safe_dump(tree))
        cfg = load_config(path)
        assert cfg.algorithm.policy_loss == keys["algorithm.policy_loss"], algorithm_type


@pytest.mark.parametrize("section, needle", [
    ({"algorithm_type": "asymre"}, "'asymre' is not supported here: AsymRE"),
    ({"algorithm_type": "mix_chord"}, "nearest: mix"),
    ({"algorithm_type": "nope"}, "'nope' is unknown; valid here: cispo, dpo"),
    ({"algorithm_type": "grpo", "policy_loss_fn": "topr"}, "policy_loss_fn 'topr' is not supported"),
    ({"algorithm_type": "grpo", "kl_loss_fn": "corrected_k3"}, "kl_loss_fn 'corrected_k3' is not supported"),
    ({"algorithm_type": "grpo", "policy_loss_fn_args": {"clip_rang": 0.2}}, "unknown key 'clip_rang' for policy_loss_fn"),
    ({"algorithm_type": "grpo", "advantage_fn_args": {"std_threshold": 0.1}}, "std_threshold=0.1 is not supported"),
    ({"algorithm_type": "grpo", "policy_loss_fn_args": {"clip_range": 0.2, "enable_sequence_masking": True}},
     "enable_sequence_masking=True is not supported"),
    ({"algorithm_type": "grpo", "policy_loss_fn": "mix"}, "needs sample_strategy mix"),
    ({"algorithm_type": "grpo", "lr": 1}, "algorithm.lr is not a key of Trinity-RFT's algorithm section"),
    ({"algorithm_type": "grpo", "policy_loss_fn_args": {"clip_range": "wide"}},
     "algorithm.policy_loss_fn_args: a value of the wrong type"),
    ({"algorithm_type": "grpo", "kl_loss_fn_args": {"kl_coef": "x"}}, "algorithm: a value of the wrong type"),
])
def test_refusals_are_one_line_config_errors(section, needle):
    with pytest.raises(ConfigError) as err:
        translate_algorithm(section)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_remaining_differences_are_said():
    _, notes = translate_algorithm({"algorithm_type": "dpo"})
    assert any("sums the log-ratios" in n for n in notes)
    for threshold in (0.0, 0.0001):  # Trinity's examples use 1e-4
        keys, notes = translate_algorithm({"algorithm_type": "grpo", "advantage_fn_args": {"std_threshold": threshold}})
        assert keys["explorer.dynamic_sampling"] is True and any("explorer.dynamic_sampling" in n for n in notes)
    keys, notes = translate_algorithm({"algorithm_type": "grpo", "policy_loss_fn_args": {
        "clip_range": 0.2, "loss_agg_mode": "seq-mean-token-mean"}})
    assert keys["algorithm.loss_agg_mode"] == "token-mean" and any("overwrites" in n for n in notes)
    for same in ("grpo", "grpo_verl", "ppo", "rloo", "reinforceplusplus", "opmd", "cispo", "gspo", "sft"):
        assert translate_algorithm({"algorithm_type": same})[1] == [], same  # Trinity's defaults mean the same here
    _, notes = translate_algorithm({"algorithm_type": "grpo", "loss_agg_mode": "seq-mean-token-mean"})
    assert notes == ["loss_agg_mode seq-mean-token-mean: a row with no valid token is left out of the mean over "
                     "sequences here; Trinity counts it"]


def test_docs_carry_the_table():
    from trinity_like.algorithms.trinity_algorithms import markdown_tables

    doc = (Path(__file__).parents[2] / "docs/algorithms.md").read_text()
    begin, end = "<!-- trinity-algorithm-tables: begin -->\n", "<!-- trinity-algorithm-tables: end -->"
    assert doc[doc.index(begin) + len(begin):doc.index(end)] == markdown_tables(), \
        "docs/algorithms.md: paste trinity_algorithms.markdown_tables() between its trinity-algorithm-tables markers"
