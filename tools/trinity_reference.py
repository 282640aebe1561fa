"""Trinity-RFT's own advantage, policy-loss, KL and entropy functions on fixed tensors, written to
tests/algorithms/trinity_reference.json for tests/algorithms/test_trinity_algorithms.py, which compares ours with
them (CI cannot fetch Trinity, and its code does not enter our package: it runs here, in this script only).

    .venv/bin/python tools/trinity_reference.py [--trinity-src /work/trinity-src] [--out tests/algorithms/...json]

Trinity is not installed: the script loads the single module files of ``trinity/algorithm/`` from a source tree
(upstream commit in ``UPSTREAM_COMMIT``) under stand-in parent packages, so that no package ``__init__`` runs
(they pull in Ray, verl, the buffer, the whole config). What those files import beyond torch is stood in for
here, and nothing of it changes a number:

- ``verl.DataProto``: a holder with ``batch`` (a TensorDict) and ``non_tensor_batch`` (a dict), what the
  verl-style advantage functions read and write;
- ``trinity.common.experience``: ``Experience`` (the fields the group advantages read: ``eid.tid``, ``reward``,
  ``action_mask``, ``logprobs``) and ``group_by`` (Trinity's: experiences grouped by ``eid.tid``, in order);
- ``trinity.utils.monitor.gather_metrics`` (metrics only), ``trinity.buffer.operators.ExperienceOperator`` (a
  base class with nothing the advantages call), ``trinity.utils.log.get_logger`` (logging).

Inputs are float64, drawn from ``torch.Generator().manual_seed(SEED)`` in the order of ``make_inputs`` and also
written to the json (the test reads them from there, so it does not depend on torch's generator).
The MIX case also runs Trinity's micro-batch scaling as its verl actor does (``dp_actor.update_policy``: each
micro-batch's loss times ``1 / gradient_accumulation``, summed), since that is where it departs from the paper.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import subprocess
import sys
import types
from pathlib import Path

import torch
from tensordict import TensorDict

UPSTREAM_COMMIT = "9051d6374db5d4199dbe317d33eb1caa2e42a9fb"
SEED = 20260409
B, L = 6, 5
LENGTHS = [5, 3, 4, 1, 5, 2]  # valid response tokens per row (right padding)
GROUPS = ["a", "a", "a", "b", "b", "c"]  # c: a group of one
EXPERT = [False, True, False, False, True, False]  # the MIX case's expert rows
ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- loading Trinity's files


def _package(name: str, path: Path | None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)] if path else []
    sys.modules[name] = module
    return module


def load_trinity(src: Path) -> dict[str, types.ModuleType]:
    """Trinity's algorithm modules, loaded file by file under stand-in packages (see the module docstring)."""
    t = src / "trinity"
    for name, path in [("trinity", t), ("trinity.algorithm", t / "algorithm"),
                       ("trinity.algorithm.policy_loss_fn", t / "algorithm/policy_loss_fn"),
                       ("trinity.algorithm.advantage_fn", t / "algorithm/advantage_fn"),
                       ("trinity.algorithm.kl_fn", t / "algorithm/kl_fn"),
                       ("trinity.algorithm.entropy_loss_fn", t / "algorithm/entropy_loss_fn"),
                       ("trinity.utils", t / "utils"), ("trinity.common", None), ("trinity.buffer", None)]:
        _package(name, path)

    class DataProto:  # verl's: a TensorDict of tensors and a dict of the rest
        def __init__(self, batch, non_tensor_batch):
            self.batch, self.non_tensor_batch = batch, non_tensor_batch

    verl = types.ModuleType("verl")
    verl.DataProto = DataProto
    sys.modules["verl"] = verl

    class Experience:
        def __init__(self, tid, reward, action_mask, logprobs):
            self.eid = types.SimpleNamespace(tid=tid)
            self.reward, self.action_mask, self.logprobs = reward, action_mask, logprobs
            self.advantages = self.returns = None

    def group_by(experiences, id_type):
        assert id_type == "task"
        grouped: dict = {}
        for exp in experiences:
            grouped.setdefault(exp.eid.tid, []).append(exp)
        return grouped

    experience = types.ModuleType("trinity.common.experience")
    experience.Experience, experience.group_by = Experience, group_by
    sys.modules["trinity.common.experience"] = experience
    monitor = types.ModuleType("trinity.utils.monitor")
    monitor.gather_metrics = lambda metric_list, prefix, *a, **k: {}
    sys.modules["trinity.utils.monitor"] = monitor
    operators = types.ModuleType("trinity.buffer.operators")
    operators.ExperienceOperator = type("ExperienceOperator", (), {})
    sys.modules["trinity.buffer.operators"] = operators
    log = types.ModuleType("trinity.utils.log")
    log.get_logger = logging.getLogger
    sys.modules["trinity.utils.log"] = log

    adv_base = importlib.import_module("trinity.algorithm.advantage_fn.advantage_fn")
    adv_pkg = sys.modules["trinity.algorithm.advantage_fn"]
    adv_pkg.AdvantageFn, adv_pkg.GroupAdvantage = adv_base.AdvantageFn, adv_base.GroupAdvantage
    names = {
        "ppo": "policy_loss_fn.ppo_policy_loss", "opmd": "policy_loss_fn.opmd_policy_loss",
        "sft": "policy_loss_fn.sft_loss", "dpo": "policy_loss_fn.dpo_loss", "gspo": "policy_loss_fn.gspo_policy_loss",
        "cispo": "policy_loss_fn.cispo_policy_loss", "is": "policy_loss_fn.importance_sampling_policy_loss",
        "mix": "policy_loss_fn.mix_policy_loss", "kl": "kl_fn.kl_fn", "entropy": "entropy_loss_fn.entropy_loss_fn",
        "utils": "utils", "grpo": "advantage_fn.grpo_advantage", "opmd_adv": "advantage_fn.opmd_advantage",
        "rloo": "advantage_fn.rloo_advantage", "rpp": "advantage_fn.reinforce_plus_plus_advantage",
        "remax": "advantage_fn.remax_advantage", "gae": "advantage_fn.ppo_advantage",
        "reinforce": "advantage_fn.reinforce_advantage",
    }
    mods = {k: importlib.import_module(f"trinity.algorithm.{v}") for k, v in names.items()}
    mods["DataProto"], mods["Experience"] = DataProto, Experience
    return mods


# ---------------------------------------------------------------- inputs


def make_inputs() -> dict[str, torch.Tensor]:
    """The fixed inputs: (B, L) float64 tensors, right-padded; junk values at padding (they must not matter)."""
    gen = torch.Generator().manual_seed(SEED)
    mask = torch.zeros(B, L, dtype=torch.float64)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1.0
    old = -torch.rand(B, L, generator=gen, dtype=torch.float64) * 2.0 - 0.05  # behaviour log-probs
    log_prob = old + (torch.rand(B, L, generator=gen, dtype=torch.float64) - 0.5) * 0.8  # ratios ~ e^+-0.4
    ref = old + (torch.rand(B, L, generator=gen, dtype=torch.float64) - 0.5) * 1.0
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 0.3], dtype=torch.float64)  # group b: zero variance
    token_rewards = torch.zeros(B, L, dtype=torch.float64)
    for i, n in enumerate(LENGTHS):
        token_rewards[i, n - 1] = rewards[i]
    dense = torch.randn(B, L, generator=gen, dtype=torch.float64) * 0.3 * mask  # dense rewards (gae, rpp)
    values = torch.randn(B, L, generator=gen, dtype=torch.float64) * 0.5 * mask  # critic values, 0 at padding
    advantages = torch.randn(B, L, generator=gen, dtype=torch.float64) * mask
    entropy = torch.rand(B, L, generator=gen, dtype=torch.float64) * 3.0
    baselines = torch.tensor([0.5, 0.5, 0.5, 1.0, 1.0, 0.0], dtype=torch.float64)
    # GSPO's clip range is ~3e-4: sequence ratios that straddle it
    gspo_log_prob = old + (torch.rand(B, L, generator=gen, dtype=torch.float64) - 0.5) * 0.002
    # a KL beyond the clamps (log ratio 3): where Trinity's k3 and ours part
    far_ref = log_prob.clone()
    far_ref[0, 0] += 3.0
    return {"response_mask": mask, "old_log_prob": old, "log_prob": log_prob, "ref_log_prob": ref,
            "rewards": rewards, "token_level_rewards": token_rewards, "dense_rewards": dense, "values": values,
            "advantages": advantages, "entropy": entropy, "reward_baselines": baselines,
            "gspo_log_prob": gspo_log_prob, "far_ref_log_prob": far_ref}


# ---------------------------------------------------------------- Trinity's outputs


def _loss_and_grad(fn, log_prob: torch.Tensor, **kwargs) -> dict:
    """Trinity's loss (a policy-loss call with ``logprob``) and its gradient w.r.t. the log-probs."""
    lp = log_prob.clone().requires_grad_(True)
    loss, metrics = fn(logprob=lp, **kwargs)
    loss.backward()
    return {"loss": float(loss.detach()), "grad": lp.grad.tolist(),
            "metrics": {k: float(v) for k, v in metrics.items()}}


def policy_losses(m, x) -> dict:
    common = {"old_logprob": x["old_log_prob"], "action_mask": x["response_mask"], "advantages": x["advantages"]}
    out = {}
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        out[f"ppo/{agg}"] = _loss_and_grad(m["ppo"].PPOPolicyLossFn(clip_range=0.2, loss_agg_mode=agg),
                                           x["log_prob"], **common)
    out["ppo/asymmetric"] = _loss_and_grad(
        m["ppo"].PPOPolicyLossFn(clip_range_low=0.1, clip_range_high=0.28, clip_ratio_c=2.0), x["log_prob"], **common)
    for tau in (1.0, 0.5):
        out[f"opmd/tau={tau}"] = _loss_and_grad(m["opmd"].OPMDPolicyLossFn(tau=tau), x["log_prob"], **common)
    out["sft"] = _loss_and_grad(m["sft"].SFTLossFn(), x["log_prob"], action_mask=x["response_mask"])
    for agg in ("token-mean", "seq-mean-token-mean"):
        out[f"gspo/{agg}"] = _loss_and_grad(
            m["gspo"].GSPOLossFn(clip_range_low=0.0003, clip_range_high=0.0004, loss_agg_mode=agg),
            x["gspo_log_prob"], **common)
    out["cispo"] = _loss_and_grad(m["cispo"].CISPOPolicyLossFn(clip_range_low=1.0, clip_range_high=0.28),
                                  x["log_prob"], **common)
    out["cispo/narrow"] = _loss_and_grad(m["cispo"].CISPOPolicyLossFn(clip_range_low=0.1, clip_range_high=0.1),
                                         x["log_prob"], **common)
    out["importance_sampling"] = _loss_and_grad(m["is"].ImportanceSamplingLossFn(), x["log_prob"], **common)
    dpo = m["dpo"].DPOLossFn(beta=0.1, label_smoothing=0.1)
    for rows in (2, 6):  # one pair (Trinity's code and the paper agree), three pairs (they part)
        out[f"dpo/rows={rows}"] = _loss_and_grad(dpo, x["log_prob"][:rows], ref_logprob=x["ref_log_prob"][:rows],
                                                 action_mask=x["response_mask"][:rows])
    return out


def mix_losses(m, x) -> dict:
    """Trinity's MIXPolicyLossFn: once on the whole mini-batch as one micro-batch with train_batch_size_usual /
    _expert its row counts (the paper's loss), once split into micro-batches [0, 1, 2] and [3, 4, 5] as its verl
    actor runs it (each micro-batch's loss / gradient_accumulation, summed)."""
    expert = torch.tensor(EXPERT)
    n_expert = int(expert.sum())
    kwargs = {"mu": 0.1, "clip_range": 0.2, "use_dynamic_bsz": False, "ppo_mini_batch_size": B,
              "ngpus_trainer": 1, "train_batch_size_usual": B - n_expert, "train_batch_size_expert": n_expert}
    out = {}
    whole = m["mix"].MIXPolicyLossFn(ppo_micro_batch_size_per_gpu=B, **kwargs)
    out["mix/one_micro_batch"] = _loss_and_grad(
        whole, x["log_prob"], old_logprob=x["old_log_prob"], action_mask=x["response_mask"],
        advantages=x["advantages"], expert_mask=expert)
    split = m["mix"].MIXPolicyLossFn(ppo_micro_batch_size_per_gpu=B // 2, **kwargs)
    gradient_accumulation = 2
    lp = x["log_prob"].clone().requires_grad_(True)
    total = 0.0
    for rows in (slice(0, 3), slice(3, 6)):
        loss, _ = split(logprob=lp[rows], old_logprob=x["old_log_prob"][rows], action_mask=x["response_mask"][rows],
                        advantages=x["advantages"][rows], expert_mask=expert[rows])
        (loss / gradient_accumulation).backward()
        total += float(loss.detach()) / gradient_accumulation
    out["mix/two_micro_batches"] = {"loss": total, "grad": lp.grad.tolist(), "metrics": {}}
    return out


def kl_and_entropy(m, x) -> dict:
    kl, mask = m["kl"], x["response_mask"]
    out = {}
    for name, cls in (("k1", kl.K1Fn), ("k2", kl.K2Fn), ("k3", kl.K3Fn), ("low_var_kl", kl.LowVarKLFn),
                      ("abs", kl.AbsFn)):
        fn = cls(kl_coef=0.05)
        for ref_key in ("ref_log_prob", "far_ref_log_prob"):
            lp = x["log_prob"].clone().requires_grad_(True)
            loss, _ = fn.calculate_kl_loss(lp, x[ref_key], mask, "token-mean")
            loss.backward()
            out[f"kl_loss/{name}/{ref_key}"] = {"loss": float(loss.detach()), "grad": lp.grad.tolist(),
                                                "kl": fn.calculate_kl(x["log_prob"], x[ref_key]).tolist()}
    for name, args in (("fixed", {"kl_coef": 0.1}),
                       ("adaptive", {"kl_coef": 0.1, "adaptive": True, "target_kl": 0.01, "horizon": 10})):
        fn = kl.K1Fn(**args)
        batch = TensorDict({"responses": torch.zeros(B, L, dtype=torch.long), "attention_mask": torch.ones(B, 7 + L),
                            "token_level_scores": x["token_level_rewards"], "response_mask": mask,
                            "old_log_probs": x["old_log_prob"], "ref_log_prob": x["ref_log_prob"]}, batch_size=[B])
        try:
            data, metrics = fn.apply_kl_penalty_to_reward(m["DataProto"](batch, {}))
        except TypeError as e:  # the adaptive update calls torch.clip on a float: Trinity's code fails there, after
            # it wrote the penalised rewards (kept: they are computed with the coefficient before the update)
            out[f"kl_penalty/{name}"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}",
                                         "token_level_rewards": batch["token_level_rewards"].tolist()}
            continue
        out[f"kl_penalty/{name}"] = {"token_level_rewards": data.batch["token_level_rewards"].tolist(),
                                     "kl": float(metrics["kl"]), "kl_coef_after": float(fn.kl_coef)}
    ent = m["entropy"]
    loss, _ = ent.DefaultEntropyLossFn(entropy_coef=0.01)(x["entropy"], mask, loss_agg_mode="token-mean")
    out["entropy/default"] = {"loss": float(loss)}
    loss, _ = ent.MixEntropyLossFn(entropy_coef=0.01)(x["entropy"], mask, expert_mask=torch.tensor(EXPERT),
                                                      loss_agg_mode="token-mean")
    out["entropy/mix"] = {"loss": float(loss)}
    for agg in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        with_empty = mask.clone()
        with_empty[3] = 0.0  # a row with no valid token
        out[f"agg/{agg}"] = {"loss": float(m["utils"].aggregate_loss(x["entropy"], mask, agg)),
                             "loss_with_empty_row": float(m["utils"].aggregate_loss(x["entropy"], with_empty, agg))}
    return out


def advantages(m, x) -> dict:
    mask = x["response_mask"]
    out = {}

    def verl_style(fn, rewards_key="token_level_rewards"):
        batch = TensorDict({"token_level_rewards": x[rewards_key].clone(), "response_mask": mask,
                            "values": x["values"], "reward_baselines": x["reward_baselines"]}, batch_size=[B])
        data, _ = fn(m["DataProto"](batch, {"uid": list(GROUPS)}))
        return {"advantages": data.batch["advantages"].tolist(), "returns": data.batch["returns"].tolist()}

    def grouped(fn):
        exps = [m["Experience"](GROUPS[i], float(x["rewards"][i]), mask[i].float(), x["old_log_prob"][i].float())
                for i in range(B)]
        rows = {id(e): i for i, e in enumerate(exps)}
        done, _ = fn(exps)
        adv = [None] * B
        for e in done:
            adv[rows[id(e)]] = e.advantages.double().tolist()
        return {"advantages": adv}

    out["grpo"] = grouped(m["grpo"].GRPOGroupedAdvantage())
    out["grpo_verl"] = verl_style(m["grpo"].GRPOAdvantageFn())
    out["opmd/mean"] = grouped(m["opmd_adv"].OPMDGroupAdvantage())
    out["opmd/logavgexp"] = grouped(m["opmd_adv"].OPMDGroupAdvantage(opmd_baseline="logavgexp", tau=0.5))
    out["opmd_verl/logavgexp"] = verl_style(m["opmd_adv"].OPMDAdvantageFn(opmd_baseline="logavgexp", tau=0.5))
    out["rloo"] = verl_style(m["rloo"].RLOOAdvantageFn())
    out["reinforceplusplus"] = verl_style(m["rpp"].REINFORCEPLUSPLUSAdvantageFn(gamma=0.9), "dense_rewards")
    out["remax"] = verl_style(m["remax"].REMAXAdvantageFn(), "dense_rewards")
    out["ppo"] = verl_style(m["gae"].PPOAdvantageFn(gamma=0.9, lam=0.8), "dense_rewards")
    out["reinforce"] = grouped(m["reinforce"].REINFORCEGroupAdvantage())
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trinity-src", type=Path, default=Path("/work/trinity-src"))
    parser.add_argument("--out", type=Path, default=ROOT / "tests/algorithms/trinity_reference.json")
    args = parser.parse_args(argv)
    mods = load_trinity(args.trinity_src)
    x = make_inputs()
    cases = {**policy_losses(mods, x), **mix_losses(mods, x), **kl_and_entropy(mods, x), **advantages(mods, x)}
    try:
        git = subprocess.run(["git", "-C", str(args.trinity_src), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=False).stdout.strip()
    except OSError:
        git = ""
    doc = {
        "upstream": "https://github.com/yanxi-chen/Trinity-RFT", "upstream_commit": git or UPSTREAM_COMMIT,
        "generated_by": "tools/trinity_reference.py",
        "recipe": (f"make_inputs(): torch.Generator().manual_seed({SEED}), float64, B={B}, L={L}, right-padded "
                   f"lengths {LENGTHS}, groups {GROUPS}, expert rows {EXPERT}; inputs stored below"),
        "constants": {"lengths": LENGTHS, "groups": GROUPS, "expert": EXPERT},
        "inputs": {k: v.tolist() for k, v in x.items()},
        "cases": cases,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
