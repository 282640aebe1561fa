"""Trinity-RFT's ``algorithm`` section with Trinity's meaning: the table its ``algorithm_type`` and functions
translate through to our config keys (``trinity_like.config.trinity`` reads it; docs/algorithms.md lists it).

Trinity (upstream commit 9051d6374db5d4199dbe317d33eb1caa2e42a9fb) resolves an algorithm section in three
layers, and so does :func:`translate_algorithm`:

1. the validator's global defaults (``trinity/common/config_validator.py``): sample_strategy ``warmup``,
   policy_loss_fn ``ppo``, advantage_fn ``ppo``, kl_penalty_fn ``none``, kl_loss_fn ``k2``, entropy_loss_fn
   ``default``, loss_agg_mode ``token-mean``;
2. over them the type's ``default_config()`` (``trinity/algorithm/algorithm.py``; e.g. grpo: advantage_fn grpo,
   policy_loss_fn ppo, kl_loss_fn k2, ...);
3. over them the section's own keys. A function's ``*_args`` default to the function's ``default_args()``
   (here: the section's args over them). Where ``loss_agg_mode`` is among the policy loss's args, Trinity
   overwrites it with ``algorithm.loss_agg_mode``: the section's ``loss_agg_mode`` is the one that counts (so
   Trinity's gspo, whose ``default_args`` say ``seq-mean-token-mean``, runs token-mean unless the section says
   otherwise).

Our keys are dotted paths from the config's root (``algorithm.adv_estimator``, ``algorithm.kl_ctrl.kl_coef``,
``buffer.mix``). ``optimizer`` and ``repeat_times`` are not this table's: the config translator maps them
(:data:`DEFAULT_REPEAT_TIMES` holds each type's default ``repeat_times``).

Where our functions compute something other than Trinity's code on some inputs, the function's docstring says
so and tests/algorithms/test_trinity_algorithms.py shows exactly where (against Trinity's own code, run by
tools/trinity_reference.py): DPO (Trinity sums every pair of a micro-batch into one logit), MIX (Trinity scales
each micro-batch by its own row counts), k3 (ours clamped), seq-mean-token-sum-norm (Trinity divides the
batch's total by L only), GSPO (ours clamps the log ratio at 10).

No torch here: the table is plain data, read by the config layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trinity_like.common.errors import ConfigError

UPSTREAM_COMMIT = "9051d6374db5d4199dbe317d33eb1caa2e42a9fb"
"""The Trinity-RFT commit whose meaning this table follows."""

# ---------------------------------------------------------------- Trinity's own defaults

_GLOBAL_DEFAULTS: dict[str, str] = {
    "sample_strategy": "warmup", "policy_loss_fn": "ppo", "advantage_fn": "ppo", "kl_penalty_fn": "none",
    "kl_loss_fn": "k2", "entropy_loss_fn": "default", "loss_agg_mode": "token-mean",
}
"""The validator's defaults, under every type's ``default_config()``."""

_PG = {"advantage_fn": "grpo", "sample_strategy": "default", "policy_loss_fn": "ppo", "kl_penalty_fn": "none",
       "kl_loss_fn": "k2", "entropy_loss_fn": "default"}

TRINITY_TYPES: dict[str, dict[str, Any]] = {
    "sft": {"sample_strategy": "default", "policy_loss_fn": "sft", "kl_loss_fn": "none", "entropy_loss_fn": "none"},
    "ppo": {**_PG, "advantage_fn": "ppo"},
    "grpo": dict(_PG),
    "grpo_verl": dict(_PG),
    "reinforceplusplus": {**_PG, "advantage_fn": "reinforceplusplus"},
    "rloo": {**_PG, "advantage_fn": "rloo"},
    "opmd": {**_PG, "advantage_fn": "opmd", "policy_loss_fn": "opmd"},
    "dpo": {"sample_strategy": "default", "policy_loss_fn": "dpo", "kl_loss_fn": "k2", "entropy_loss_fn": "default"},
    "cispo": {**_PG, "policy_loss_fn": "cispo"},
    "gspo": {**_PG, "policy_loss_fn": "gspo"},
    "mix": {"advantage_fn": "grpo", "policy_loss_fn": "mix", "sample_strategy": "mix", "entropy_loss_fn": "mix"},
}
"""Each algorithm_type that runs here -> its ``default_config()`` in Trinity (Trinity's function names;
``repeat_times`` is in :data:`DEFAULT_REPEAT_TIMES`)."""

DEFAULT_REPEAT_TIMES: dict[str, int] = {
    "sft": 1, "ppo": 1, "grpo": 2, "grpo_verl": 2, "reinforceplusplus": 2, "rloo": 2, "opmd": 2, "dpo": 2,
    "cispo": 2, "gspo": 2, "mix": 8,
}
"""Trinity's ``repeat_times`` of each type (its AlgorithmConfig default is 1; dpo's 2 is forced: one pair)."""

_NO_ADVANTAGE = {"sft", "dpo"}
"""Types whose loss reads no advantage: their (default ``ppo``) advantage_fn means nothing in Trinity."""

REFUSED_ALGORITHMS: dict[str, str] = {
    "asymre": "AsymRE's advantage (a group baseline shifted by a fixed offset) is not here yet (issue 52); nearest: "
              "opmd",
    "asymre_verl": "AsymRE's advantage is not here yet (issue 52); nearest: advantage_fn opmd",
    "topr": "TOPR's truncated importance-sampled policy loss is not here yet (issue 52); nearest: grpo with "
            "algorithm.off_policy.correction tis",
    "sapo": "SAPO's soft-gated policy loss is not here yet (issue 52); nearest: grpo",
    "rec": "REC's policy loss and advantage are not here yet (issue 52); nearest: grpo",
    "raft": "RAFT (SFT on the explorer's best rollouts) is not here yet (issue 52); nearest: sft on rows kept by "
            "buffer.where",
    "sppo": "sPPO's loss is not here yet (issue 52); nearest: opmd",
    "mix_chord": "CHORD's dynamically weighted SFT term is not here yet (issue 52); nearest: mix",
    "sft_is": "CHORD's importance-weighted SFT loss is not here yet (issue 52); nearest: policy_loss_fn sft",
    "sft_phi": "CHORD's phi-weighted SFT loss is not here yet (issue 52); nearest: policy_loss_fn sft",
    "multi_step_grpo": "step-wise GRPO (one advantage per turn of a multi-step episode) is not here yet (issue 52); "
                       "nearest: grpo over whole episodes",
    "step_wise_grpo": "step-wise GRPO's advantage is not here yet (issue 52); nearest: advantage_fn grpo",
    "on_policy_distill": "on-policy distillation needs a teacher's log-probs on every row, not here yet (issue 52); "
                         "nearest: none",
    "jsd": "JSD distillation needs a teacher's log-probs on every row, not here yet (issue 52); nearest: none",
    "clipb": "the clipb advantage is not here yet (issue 52); nearest: advantage_fn grpo",
    "clipv": "the clipv advantage is not here yet (issue 52); nearest: advantage_fn grpo",
    "corrected_k3": "the importance-corrected k3 KL is not here yet (issue 52); nearest: k3 (kl_loss_fn low_var_kl)",
}
"""Each Trinity algorithm_type or function name whose meaning needs something this project lacks -> what is
missing and the nearest here."""

# ---------------------------------------------------------------- the functions


class _Out:
    """What one section translates to: our keys, and the differences of meaning that remain."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {}
        self.notes: list[str] = []


_Rule = Callable[[dict[str, Any], _Out, str], None]
"""(the function's args with its defaults under them, the output, the section's loss_agg_mode)."""


def _unused(args: dict[str, Any], out: _Out, where: str, names: tuple[str, ...], default: Any = None) -> None:
    """Args that mean nothing here and nothing that changes a result: a note when set to other than default."""
    for name in names:
        if args.get(name, default) != default:
            out.notes.append(f"{where}.{name} has no effect here: {_NO_EFFECT.get(name, 'not needed')}")


_NO_EFFECT = {
    "sft_dataset_name": "the expert rows are the buffer's `human` rows (ingest the SFT set with `trinity-like "
                        "buffer ingest`)",
    "duplicate_experiences": "only read with std_threshold",
    "adaptive": "Trinity adapts only the in-reward coefficient (kl_penalty_fn)",
    "target_kl": "Trinity adapts only the in-reward coefficient (kl_penalty_fn)",
    "horizon": "Trinity adapts only the in-reward coefficient (kl_penalty_fn)",
}


def _refuse_unless(args: dict[str, Any], where: str, name: str, allowed: Any, why: str) -> None:
    if args.get(name, allowed) != allowed:
        raise ConfigError(f"{where}.{name}={args[name]!r} is not supported here ({why}); remove it")


def _clip(args: dict[str, Any], out: _Out) -> None:
    base = args.get("clip_range")
    low = args.get("clip_range_low")
    high = args.get("clip_range_high")
    low, high = base if low is None else low, base if high is None else high
    if low is None or high is None:
        raise ConfigError("policy_loss_fn_args needs clip_range, or clip_range_low and clip_range_high")
    out.keys["algorithm.clip_ratio_low"] = float(low)
    out.keys["algorithm.clip_ratio_high"] = float(high)


def _agg_note(given: Any, out: _Out, agg: str) -> None:
    """A policy loss's own loss_agg_mode, as the section gives it: Trinity overwrites it (it is no difference)."""
    if isinstance(given, dict) and given.get("loss_agg_mode", agg) != agg:
        out.notes.append(f"policy_loss_fn_args.loss_agg_mode {given['loss_agg_mode']!r} has no effect, in Trinity "
                         f"either: it overwrites it with algorithm.loss_agg_mode ({agg!r}), taken here too")


def _ppo_loss(args, out, agg):
    w = "policy_loss_fn_args"
    _refuse_unless(args, w, "enable_sequence_masking", False, "DeepSeek-V3.2's sequence masking is not here")
    _refuse_unless(args, w, "fallback_to_policy_gradient", False,
                   "for a plain policy gradient use policy_loss_fn importance_sampling")
    out.keys["algorithm.policy_loss"] = "vanilla"
    _clip(args, out)
    out.keys["algorithm.clip_ratio_c"] = float(args.get("clip_ratio_c", 3.0))


def _opmd_loss(args, out, agg):
    out.keys["algorithm.policy_loss"] = "opmd"
    out.keys["algorithm.tau"] = float(args.get("tau", 1.0))


def _sft_loss(args, out, agg):
    out.keys["algorithm.policy_loss"] = "sft"


def _dpo_loss(args, out, agg):
    out.keys["algorithm.policy_loss"] = "dpo"
    out.keys["algorithm.dpo_beta"] = float(args.get("beta", 0.1))
    out.keys["algorithm.dpo_label_smoothing"] = float(args.get("label_smoothing", 0.0))
    out.notes.append("dpo: each pair is its own logit in the mean (the paper's loss); Trinity's code sums the "
                     "log-ratios of every pair of a micro-batch into one logit, the same only for one pair per "
                     "micro-batch")


def _gspo_loss(args, out, agg):
    out.keys["algorithm.policy_loss"] = "gspo"
    _clip(args, out)


def _cispo_loss(args, out, agg):
    _refuse_unless(args, "policy_loss_fn_args", "enable_mask_clip", False, "CISPO's token mask is not here")
    _unused(args, out, "policy_loss_fn_args", ("mask_clip_range_low",), 1.0)
    _unused(args, out, "policy_loss_fn_args", ("mask_clip_range_high",), 0.28)
    out.keys["algorithm.policy_loss"] = "cispo"
    out.keys["algorithm.clip_ratio_low"] = float(args.get("clip_range_low", 1.0))
    out.keys["algorithm.clip_ratio_high"] = float(args.get("clip_range_high", 0.28))


def _is_loss(args, out, agg):
    out.keys["algorithm.policy_loss"] = "reinforce"


_MIX_SCALING = ("use_dynamic_bsz", "ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "ngpus_trainer",
                "train_batch_size_usual", "train_batch_size_expert")


def _mix_loss(args, out, agg):
    w = "policy_loss_fn_args"
    out.keys["algorithm.policy_loss"] = "vanilla"
    _clip(args, out)
    out.keys["algorithm.clip_ratio_c"] = 3.0  # Trinity's mix builds its PPO part with the default dual clip
    out.keys["algorithm.sft_loss_form"] = "mix"
    out.keys["algorithm.sft_loss_coef"] = float(args.get("mu", 0.1))
    out.keys["algorithm.sft_sources"] = ["human"]
    grpo_agg = args.get("grpo_loss_agg_mode")
    if grpo_agg is not None and grpo_agg != agg:
        out.keys["algorithm.loss_agg_mode"] = grpo_agg
        out.notes.append(f"{w}.grpo_loss_agg_mode {grpo_agg!r} also aggregates the KL and entropy terms here "
                         f"(Trinity aggregates those by algorithm.loss_agg_mode {agg!r})")
    sft_agg = args.get("sft_loss_agg_mode") or agg
    if sft_agg != "token-mean":
        out.notes.append(f"mix: the SFT term is a token mean over the expert rows here; Trinity aggregates it by "
                         f"{sft_agg!r}")
    scaling = [name for name in _MIX_SCALING if name in args]
    if scaling:
        out.notes.append(f"{w}.{', '.join(scaling)}: no effect here (they set Trinity's per-micro-batch scaling)")
    out.notes.append("mix: each term is averaged over the mini-batch's rows of its kind, (1 - mu) * pg + mu * sft "
                     "as the paper writes it; Trinity's code scales each micro-batch's terms by its own row counts "
                     "over train_batch_size_usual/expert, the same only when those are the rows each mini-batch has")


POLICY_LOSS_FNS: dict[str, tuple[frozenset[str], dict[str, Any], _Rule]] = {
    "ppo": (frozenset({"clip_range", "clip_range_low", "clip_range_high", "clip_ratio_c", "loss_agg_mode",
                       "enable_sequence_masking", "delta_sequence_masking", "fallback_to_policy_gradient"}),
            {"clip_range": 0.2, "clip_ratio_c": 3.0, "loss_agg_mode": "token-mean"}, _ppo_loss),
    "opmd": (frozenset({"tau", "loss_agg_mode"}), {"tau": 1.0, "loss_agg_mode": "token-mean"}, _opmd_loss),
    "sft": (frozenset({"loss_agg_mode"}), {"loss_agg_mode": "token-mean"}, _sft_loss),
    "dpo": (frozenset({"beta", "label_smoothing"}), {"beta": 0.1, "label_smoothing": 0.0}, _dpo_loss),
    "gspo": (frozenset({"clip_range", "clip_range_low", "clip_range_high", "loss_agg_mode"}),
             {"clip_range_low": 0.0003, "clip_range_high": 0.0004, "loss_agg_mode": "seq-mean-token-mean"},
             _gspo_loss),
    "cispo": (frozenset({"clip_range_low", "clip_range_high", "enable_mask_clip", "mask_clip_range_low",
                         "mask_clip_range_high", "loss_agg_mode"}),
              {"clip_range_low": 1.0, "clip_range_high": 0.28, "loss_agg_mode": "token-mean"}, _cispo_loss),
    "importance_sampling": (frozenset({"loss_agg_mode"}), {"loss_agg_mode": "token-mean"}, _is_loss),
    "mix": (frozenset({"mu", "clip_range", "clip_range_low", "clip_range_high", "use_dynamic_bsz",
                       "ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "ngpus_trainer",
                       "train_batch_size_usual", "train_batch_size_expert", "loss_agg_mode", "sft_loss_agg_mode",
                       "grpo_loss_agg_mode"}),
            {"mu": 0.1, "clip_range": 0.2, "loss_agg_mode": "token-mean"}, _mix_loss),
}
"""Trinity policy_loss_fn -> (the keys its ``policy_loss_fn_args`` take, its ``default_args()``, its rule)."""


def _gae(args, out, agg):
    out.keys["algorithm.adv_estimator"] = "gae"
    out.keys["algorithm.gamma"] = float(args.get("gamma", 1.0))
    out.keys["algorithm.lam"] = float(args.get("lam", 1.0))


_STD_THRESHOLD_MAX = 0.01
"""Largest GRPO std_threshold taken as "drop the groups with equal rewards" (Trinity's examples use 1e-4)."""


def _grpo(args, out, agg):
    w = "advantage_fn_args"
    out.keys["algorithm.adv_estimator"] = "grpo"
    out.keys["algorithm.norm_adv_by_std_in_grpo"] = True
    _refuse_unless(args, w, "epsilon", 1e-6, "GRPO's epsilon is 1e-6 here")
    _refuse_unless(args, w, "rank_penalty", None, "the rank penalty is not here")
    _refuse_unless(args, w, "std_cal_level", "group", "the batch-level std is not here")
    threshold = args.get("std_threshold")
    if threshold is None:
        _unused(args, out, w, ("duplicate_experiences",), False)
    elif isinstance(threshold, (int, float)) and 0 <= threshold <= _STD_THRESHOLD_MAX:
        out.keys["explorer.dynamic_sampling"] = True
        kept = f"; a group whose std is in (0, {threshold:g}] is kept here" if threshold > 0 else ""
        out.notes.append("advantage_fn_args.std_threshold: groups whose rewards are all equal are dropped "
                         "(explorer.dynamic_sampling) and more tasks are explored to fill the batch, where Trinity "
                         "trains a smaller batch" + (" (or duplicates groups)" if args.get("duplicate_experiences")
                                                     else "") + kept)
    else:
        raise ConfigError(f"advantage_fn_args.std_threshold={threshold!r} is not supported here (up to "
                          f"{_STD_THRESHOLD_MAX:g}: drop groups with equal rewards, explorer.dynamic_sampling); "
                          "lower it or remove it")


def _opmd(args, out, agg):
    baseline = args.get("opmd_baseline", "mean")
    if baseline not in ("mean", "logavgexp"):
        raise ConfigError(f"advantage_fn_args.opmd_baseline={baseline!r}: use mean or logavgexp")
    out.keys["algorithm.adv_estimator"] = "opmd"
    out.keys["algorithm.opmd_baseline"] = baseline
    if baseline == "logavgexp":
        out.keys["algorithm.tau"] = float(args.get("tau", 1.0))


def _rloo(args, out, agg):
    out.keys["algorithm.adv_estimator"] = "rloo"


def _reinforce_pp(args, out, agg):
    out.keys["algorithm.adv_estimator"] = "reinforce_plus_plus"
    out.keys["algorithm.gamma"] = float(args.get("gamma", 1.0))


def _remax(args, out, agg):
    out.keys["algorithm.adv_estimator"] = "remax"


def _reinforce(args, out, agg):
    out.keys["algorithm.adv_estimator"] = "reinforce"


ADVANTAGE_FNS: dict[str, tuple[frozenset[str], dict[str, Any], _Rule]] = {
    "ppo": (frozenset({"gamma", "lam"}), {"gamma": 1.0, "lam": 1.0}, _gae),
    "grpo": (frozenset({"epsilon", "std_threshold", "duplicate_experiences", "rank_penalty", "std_cal_level"}),
             {"epsilon": 1e-6, "std_threshold": None, "duplicate_experiences": False, "rank_penalty": None,
              "std_cal_level": "group"}, _grpo),
    "grpo_verl": (frozenset({"epsilon"}), {"epsilon": 1e-6}, _grpo),
    "opmd": (frozenset({"opmd_baseline", "tau"}), {"opmd_baseline": "mean", "tau": 1.0}, _opmd),
    "opmd_verl": (frozenset({"opmd_baseline", "tau"}), {"opmd_baseline": "mean", "tau": 1.0}, _opmd),
    "rloo": (frozenset(), {}, _rloo),
    "reinforceplusplus": (frozenset({"gamma"}), {"gamma": 1.0}, _reinforce_pp),
    "remax": (frozenset(), {}, _remax),
    "reinforce": (frozenset(), {}, _reinforce),
}
"""Trinity advantage_fn -> (the keys of its ``advantage_fn_args``, its ``default_args()``, its rule)."""

_KL_ARGS = frozenset({"adaptive", "kl_coef", "target_kl", "horizon"})
_KL_DEFAULTS = {"adaptive": False, "kl_coef": 0.001}
KL_FNS: dict[str, str | None] = {
    "none": None, "k1": "k1", "k2": "k2", "k3": "k3", "low_var_kl": "low_var_kl", "abs": "abs",
}
"""Trinity kl_fn (kl_loss_fn and kl_penalty_fn) -> our KL estimator (None = no KL term). Its args: adaptive,
kl_coef (default 0.001), target_kl, horizon."""


def _kl_loss(name: str, args: dict[str, Any], out: _Out) -> None:
    estimator = KL_FNS[name]
    out.keys["algorithm.use_kl_loss"] = estimator is not None
    if estimator is None:
        return
    out.keys["algorithm.kl_loss_type"] = estimator
    out.keys["algorithm.kl_loss_coef"] = float(args.get("kl_coef", 0.001))
    _unused(args, out, "kl_loss_fn_args", ("adaptive",), False)
    _unused(args, out, "kl_loss_fn_args", ("target_kl", "horizon"))
    if estimator == "k3":
        out.notes.append("kl_loss_fn k3: ours clamps the log ratio to [-20, 20] and the estimate to [-10, 10] (as "
                         "low_var_kl); Trinity's k3 does not, the same wherever |log ratio| < ~2.3")


def _kl_penalty(name: str, args: dict[str, Any], out: _Out) -> None:
    estimator = KL_FNS[name]
    out.keys["algorithm.use_kl_in_reward"] = estimator is not None
    if estimator is None:
        return
    out.keys["algorithm.kl_penalty"] = estimator
    out.keys["algorithm.kl_ctrl.kl_coef"] = float(args.get("kl_coef", 0.001))
    adaptive = bool(args.get("adaptive", False))
    out.keys["algorithm.kl_ctrl.type"] = "adaptive" if adaptive else "fixed"
    if adaptive:
        if args.get("target_kl") is None or args.get("horizon") is None:
            raise ConfigError("kl_penalty_fn_args.adaptive needs target_kl and horizon (as in Trinity); set both")
        out.keys["algorithm.kl_ctrl.target_kl"] = float(args["target_kl"])
        out.keys["algorithm.kl_ctrl.horizon"] = int(args["horizon"])
        out.notes.append("kl_penalty_fn_args.adaptive: Trinity's code raises at its first update (torch.clip on a "
                         "float); here the coefficient adapts as Ziegler et al. write it")
    if estimator == "k3":
        out.notes.append("kl_penalty_fn k3: ours clamps (as low_var_kl); Trinity's k3 does not")


ENTROPY_LOSS_FNS = ("default", "mix", "none")
"""Trinity entropy_loss_fn names; args: entropy_coef (default 0.0)."""

SAMPLE_STRATEGIES: dict[str, frozenset[str]] = {
    "default": frozenset(), "warmup": frozenset(), "staleness_control": frozenset({"max_staleness"}),
    "mix": frozenset({"expert_data_ratio", "sft_dataset_name"}),
}
"""Trinity sample_strategy -> the keys of its ``sample_strategy_args``."""

_SECTION_KEYS = frozenset({
    "algorithm_type", "sample_strategy", "sample_strategy_args", "advantage_fn", "advantage_fn_args",
    "kl_penalty_fn", "kl_penalty_fn_args", "policy_loss_fn", "policy_loss_fn_args", "kl_loss_fn",
    "kl_loss_fn_args", "entropy_loss_fn", "entropy_loss_fn_args", "loss_agg_mode",
})
_OTHERS = frozenset({"optimizer", "repeat_times"})
"""The section's keys that the config translator maps itself; skipped here."""

_LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _args(section: dict[str, Any], fn_key: str, name: str, known: frozenset[str],
          defaults: dict[str, Any]) -> dict[str, Any]:
    """The fn's args: the section's ``<fn_key>_args`` over its defaults; an unknown key is a ConfigError."""
    given = section.get(f"{fn_key}_args")
    if given is None:
        return dict(defaults)
    if not isinstance(given, dict):
        raise ConfigError(f"algorithm.{fn_key}_args must be a mapping, got {type(given).__name__}")
    unknown = sorted(set(given) - known)
    if unknown:
        valid = ", ".join(sorted(known)) or "none"
        raise ConfigError(f"algorithm.{fn_key}_args: unknown key {unknown[0]!r} for {fn_key} {name!r}; valid: {valid}")
    return {**defaults, **given}


def _name(section: dict[str, Any], key: str, table) -> str:
    name = section[key]
    if name in REFUSED_ALGORITHMS:
        raise ConfigError(f"algorithm.{key} {name!r} is not supported here: {REFUSED_ALGORITHMS[name]}")
    if name not in table:
        raise ConfigError(f"algorithm.{key} {name!r} is unknown; valid: {', '.join(sorted(table))}")
    return name


def _apply(rule: _Rule, args: dict[str, Any], out: _Out, agg: str, where: str) -> None:
    """``rule`` on ``args``; an arg of the wrong type (a word where a number goes) is a one-line ConfigError."""
    try:
        rule(args, out, agg)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"algorithm.{where}: a value of the wrong type ({e}); give numbers as numbers") from None


def translate_algorithm(section: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Trinity's ``algorithm`` section (``optimizer`` and ``repeat_times`` are skipped: the config translator maps
    them) -> (our dotted keys -> values, one line per difference of meaning that remains).

    Applies Trinity's defaults for omitted keys (the validator's, then the type's ``default_config()``, then each
    function's ``default_args()``). Raises ConfigError, one line, for a refused type or function, an unknown
    type, function or key (of the section or of an ``*_args``), or an arg whose meaning is not here."""
    try:
        return _translate(section)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:  # a word where a number goes, a list where a mapping goes
        raise ConfigError(f"algorithm: a value of the wrong type ({e}); give numbers as numbers") from None


def _translate(section: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    if not isinstance(section, dict):
        raise ConfigError(f"algorithm must be a mapping, got {type(section).__name__}")
    unknown = sorted(set(section) - _SECTION_KEYS - _OTHERS)
    if unknown:
        raise ConfigError(f"algorithm.{unknown[0]} is not a key of Trinity-RFT's algorithm section; valid: "
                          f"{', '.join(sorted(_SECTION_KEYS | _OTHERS))}")
    algorithm_type = section.get("algorithm_type", "ppo")
    if algorithm_type in REFUSED_ALGORITHMS:
        raise ConfigError(f"algorithm.algorithm_type {algorithm_type!r} is not supported here: "
                          f"{REFUSED_ALGORITHMS[algorithm_type]}")
    if algorithm_type not in TRINITY_TYPES:
        valid = ", ".join(sorted(TRINITY_TYPES))
        raise ConfigError(f"algorithm.algorithm_type {algorithm_type!r} is unknown; valid here: {valid}")
    given = {k: v for k, v in section.items() if k in _SECTION_KEYS and v is not None}
    full: dict[str, Any] = {**_GLOBAL_DEFAULTS, **TRINITY_TYPES[algorithm_type], **given}
    if algorithm_type == "dpo" and full["kl_loss_fn"] in ("none", None):
        full["kl_loss_fn"] = "k2"  # Trinity: "DPO must use KL loss"
    out = _Out()

    agg = full["loss_agg_mode"]
    if agg not in _LOSS_AGG_MODES:
        raise ConfigError(f"algorithm.loss_agg_mode {agg!r} is unknown; valid: {', '.join(_LOSS_AGG_MODES)}")
    out.keys["algorithm.loss_agg_mode"] = agg
    if agg == "seq-mean-token-sum-norm":
        out.notes.append("loss_agg_mode seq-mean-token-sum-norm: ours is the mean over sequences of each one's sum "
                         "/ L (Dr. GRPO); Trinity's code divides the whole batch's sum by L (B times ours)")
    elif agg.startswith("seq-"):
        out.notes.append(f"loss_agg_mode {agg}: a row with no valid token is left out of the mean over sequences "
                         "here; Trinity counts it")

    policy = _name(full, "policy_loss_fn", POLICY_LOSS_FNS)
    known, defaults, rule = POLICY_LOSS_FNS[policy]
    _apply(rule, _args(full, "policy_loss_fn", policy, known, defaults), out, agg, "policy_loss_fn_args")
    _agg_note(full.get("policy_loss_fn_args"), out, agg)  # (mix's sft/grpo_loss_agg_mode are not overwritten)

    advantage = _name(full, "advantage_fn", ADVANTAGE_FNS)
    known, defaults, rule = ADVANTAGE_FNS[advantage]
    adv_args = _args(full, "advantage_fn", advantage, known, defaults)
    if algorithm_type in _NO_ADVANTAGE and policy in ("sft", "dpo"):
        if "advantage_fn" in given or "advantage_fn_args" in given:
            out.notes.append(f"algorithm.advantage_fn has no effect with policy_loss_fn {policy} (none is read)")
    else:
        _apply(rule, adv_args, out, agg, "advantage_fn_args")
    if policy == "opmd" and out.keys.get("algorithm.opmd_baseline") == "logavgexp":
        policy_tau = float(_args(full, "policy_loss_fn", policy, *POLICY_LOSS_FNS[policy][:2]).get("tau", 1.0))
        if float(adv_args.get("tau", 1.0)) != policy_tau:
            raise ConfigError("advantage_fn_args.tau and policy_loss_fn_args.tau differ; both are algorithm.tau "
                              "here: give them one value")

    kl_loss = _name(full, "kl_loss_fn", KL_FNS)
    _kl_loss(kl_loss, _args(full, "kl_loss_fn", kl_loss, _KL_ARGS, _KL_DEFAULTS), out)
    kl_pen = _name(full, "kl_penalty_fn", KL_FNS)
    _kl_penalty(kl_pen, _args(full, "kl_penalty_fn", kl_pen, _KL_ARGS, _KL_DEFAULTS), out)

    entropy = _name(full, "entropy_loss_fn", dict.fromkeys(ENTROPY_LOSS_FNS))
    ent_args = _args(full, "entropy_loss_fn", entropy, frozenset({"entropy_coef"}), {"entropy_coef": 0.0})
    coef = 0.0 if entropy == "none" else float(ent_args["entropy_coef"])
    out.keys["algorithm.entropy_coeff"] = coef
    if coef and policy == "mix" and entropy != "mix":
        out.notes.append("entropy_loss_fn default with mix: the entropy bonus is over the non-expert rows here "
                         "(Trinity's mix entropy); Trinity's default averages it over every row")
    if coef and entropy == "mix" and policy != "mix":
        out.notes.append("entropy_loss_fn mix without policy_loss_fn mix: every row is non-expert")

    strategy = _name(full, "sample_strategy", SAMPLE_STRATEGIES)
    s_args = _args(full, "sample_strategy", strategy, SAMPLE_STRATEGIES[strategy],
                   {"expert_data_ratio": 0.5, "sft_dataset_name": "sft_dataset"} if strategy == "mix" else {})
    if strategy == "staleness_control" and "max_staleness" in s_args:
        out.keys["synchronizer.max_staleness"] = int(s_args["max_staleness"])
        out.notes.append("sample_strategy staleness_control: max_staleness also holds the explorer back here "
                         "(it waits rather than write rows the trainer would skip); Trinity only skips them")
    if strategy == "mix":
        ratio = float(s_args["expert_data_ratio"])
        if not 0.0 < ratio < 1.0:
            raise ConfigError(f"sample_strategy_args.expert_data_ratio={ratio!r}: use a share strictly between 0 and 1")
        out.keys["buffer.mix"] = {"explorer": 1.0 - ratio, "human": ratio}
        _unused(s_args, out, "sample_strategy_args", ("sft_dataset_name",), "sft_dataset")
        out.notes.append("sample_strategy mix: the expert rows are the buffer's `human` rows (buffer.mix quota by "
                         "largest remainder, whole groups, mode async); Trinity reads ceil(ratio x batch) rows of "
                         "its SFT set")
        if policy != "mix":
            raise ConfigError(f"sample_strategy mix with policy_loss_fn {policy!r} is not supported here (Trinity "
                              "feeds the expert rows to it with zero advantages); use policy_loss_fn mix")
    elif policy == "mix":
        raise ConfigError("policy_loss_fn mix needs sample_strategy mix (its expert rows); set "
                          "algorithm.sample_strategy: mix")
    return out.keys, out.notes


ALGORITHM_TYPES: dict[str, dict[str, Any]] = {t: translate_algorithm({"algorithm_type": t})[0] for t in TRINITY_TYPES}
"""Each Trinity algorithm_type that runs here -> our dotted config keys -> values, Trinity's defaults included
(``translate_algorithm({"algorithm_type": t})``)."""


def markdown_tables() -> str:
    """The types and refusals as Markdown tables (docs/algorithms.md carries them; a test keeps them equal)."""
    short = {"algorithm.": "", "explorer.": "explorer.", "buffer.": "buffer."}

    def key(dotted: str) -> str:
        for prefix, shown in short.items():
            if dotted.startswith(prefix):
                return shown + dotted[len(prefix):]
        return dotted

    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {x:g}" for k, x in v.items()) + "}"
        if isinstance(v, list):
            return "[" + ", ".join(v) + "]"
        return str(v).lower() if isinstance(v, bool) else str(v)

    lines = ["| Trinity `algorithm_type` | repeat_times | our keys (`algorithm.` omitted) |", "|---|---|---|"]
    for name, keys in ALGORITHM_TYPES.items():
        shown = ", ".join(f"`{key(k)}: {value(v)}`" for k, v in keys.items())
        lines.append(f"| `{name}` | {DEFAULT_REPEAT_TIMES[name]} | {shown} |")
    lines += ["", "| refused (type or function) | what is missing; nearest here |", "|---|---|"]
    lines += [f"| `{name}` | {why} |" for name, why in REFUSED_ALGORITHMS.items()]
    return "\n".join(lines) + "\n"
