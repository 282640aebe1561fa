"""verl-shaped configs: one table from verl's keys to ours, and the translation that applies it.

A verl config (``verl/trainer/config/ppo_trainer.yaml``: sections ``data``, ``algorithm``, ``actor_rollout_ref``,
``critic``, ``trainer``, ``reward_model``, ``custom_reward_function``) is read as YAML and translated into this
project's config, key by key, through ``RULES``: each rule names a verl key (or a whole section, ``section.*``),
the keys of ours it sets and how. A verl key no rule names is *unmapped*: the translation names every one of them
in one message and refuses the file unless ``allow_unmapped`` (then they are listed as ignored). Rules of kind
``no_effect`` accept a key whose job is done differently here (memory layouts of verl's workers, its log-prob
micro-batches, ...) and say why; rules of kind ``derived`` name a key that means nothing alone and is read where
it counts (by another key's converter, or by ``_derive`` for the keys of ours set from several verl keys at once).

The translation is two layers: verl's defaults (``VERL_DEFAULTS``) for the keys the file omits, then the file's
keys over them, so a short verl config means what it means to verl, and two keys of the file that set one of ours
to different values are refused. The async knobs verl lacks (``mode``, ``synchronizer.*``) keep this project's
defaults.

Units differ in three places, converted here: verl's ``data.train_batch_size`` and ``ppo_mini_batch_size`` count
prompts (ours count experiences: x ``rollout.n``); ``save_freq`` / ``test_freq`` of -1 mean never (ours 0);
``top_k`` -1 means off (ours 0).

The table is also rendered into ``docs/verl.md`` (``render_docs``; tests/config/test_verl.py keeps it current).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trinity_like.common.errors import ConfigError

VERL_SECTIONS = ("data", "algorithm", "actor_rollout_ref", "critic", "trainer", "reward_model",
                 "custom_reward_function", "ray_init", "ray_kwargs", "global_profiler")
"""Top-level sections of a verl config."""
VERL_ONLY_SECTIONS = ("data", "actor_rollout_ref", "critic", "reward_model", "custom_reward_function")
"""Sections no config of ours has: a file with any of them is read as verl-shaped."""


class Unmapped(Exception):
    """Raised by a converter: this value has no counterpart here (the reason says what would be needed)."""


class View:
    """Read access to the verl config (its file's values over ``VERL_DEFAULTS``) by dotted key."""

    def __init__(self, leaves: dict[str, Any], source: Path | None) -> None:
        self.leaves = leaves
        self.source = source

    def get(self, key: str, default: Any = None) -> Any:
        value = self.leaves.get(key)
        if value is None:
            value = VERL_DEFAULTS.get(key, VERL_READ_DEFAULTS.get(key, default))
        return value

    def given(self, key: str) -> bool:
        return self.leaves.get(key) is not None

    def path(self, value: str) -> str:
        """A file named in the verl config: relative to the config file's folder when it is not found as given."""
        p = Path(str(value)).expanduser()
        if not p.is_absolute() and not p.exists() and self.source is not None and (self.source.parent / p).exists():
            p = self.source.parent / p
        return str(p)


Convert = Callable[[Any, View], dict[str, Any]]


@dataclass(frozen=True)
class Rule:
    verl: str
    """A verl key (dotted), or ``section.*`` for every key under a section."""
    native: tuple[str, ...]
    """Our keys it sets (for the docs; the converter returns the values)."""
    how: str
    """One line for docs/verl.md and the translation report."""
    convert: Convert | None = None
    """value, view -> {our dotted key: value}; None = copy the value to ``native[0]``."""
    no_effect: bool = False
    """Accepted, sets nothing: ``how`` says why."""
    derived: bool = False
    """Not converted alone: read by another key's converter or by ``_derive``; ``native`` and ``how`` say what it
    feeds."""

    def __post_init__(self) -> None:
        if self.derived and (self.no_effect or self.convert is not None):
            raise RuntimeError(f"trinity_like.config.verl: the derived rule {self.verl} has a converter or no_effect")

    @property
    def kind(self) -> str:
        """The kind docs/verl.md shows: mapped, checked (accepted at some values only), derived or no effect."""
        if self.no_effect:
            return "no effect"
        if self.derived:
            return "derived"
        return "mapped" if self.native else "checked"


def _copy(key: str) -> Convert:
    return lambda v, _: {key: v}


def _times_n(key: str) -> Convert:
    """verl counts prompts where we count experiences: x ``actor_rollout_ref.rollout.n``."""
    return lambda v, view: {key: int(v) * int(view.get("actor_rollout_ref.rollout.n"))}


def _never_is_zero(key: str) -> Convert:
    return lambda v, _: {key: 0 if int(v) < 0 else int(v)}


def _only(allowed: tuple[Any, ...], what: str) -> Convert:
    """A verl setting we accept only at values this project behaves like (else Unmapped with ``what``)."""
    def convert(v: Any, _: View) -> dict[str, Any]:
        if v not in allowed:
            raise Unmapped(what)
        return {}
    return convert


def _rollout_name(v: Any, _: View) -> dict[str, Any]:
    engines = {"vllm": "vllm", "hf": "hf"}
    if v not in engines:
        raise Unmapped(f"rollout engine {v!r}: the engines here are {', '.join(engines)}")
    return {"explorer.engine": engines[v]}


def _clip_ratio(v: Any, view: View) -> dict[str, Any]:
    """verl's symmetric clip_ratio sets both sides unless clip_ratio_low/high are given (they win)."""
    out = {}
    if not view.given("actor_rollout_ref.actor.clip_ratio_low"):
        out["algorithm.clip_ratio_low"] = float(v)
    if not view.given("actor_rollout_ref.actor.clip_ratio_high"):
        out["algorithm.clip_ratio_high"] = float(v)
    return out


def _kl_type(key: str) -> Convert:
    aliases = {"low_var": "low_var_kl"}  # the seeds' spelling of verl's low_var_kl
    return lambda v, _: {key: aliases.get(v, v)}


def _dynamic_bsz(v: Any, view: View) -> dict[str, Any]:
    """On: micro-batches by the token budget ``ppo_max_token_len_per_gpu`` (a derived key, read only here)."""
    if not v:
        return {}
    return {"trainer.max_token_len_per_micro_batch": int(view.get("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"))}


def _lora_rank(v: Any, view: View) -> dict[str, Any]:
    if int(v) <= 0:
        return {"trainer.lora.enabled": False}
    return {"trainer.lora.enabled": True, "trainer.lora.r": int(v)}


def _target_modules(v: Any, _: View) -> dict[str, Any]:
    if v == "all-linear":
        return {"trainer.lora.target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj"]}
    return {"trainer.lora.target_modules": list(v)}


def _strategy(v: Any, _: View) -> dict[str, Any]:
    strategies = {"fsdp": "fsdp2", "fsdp2": "fsdp2"}  # our sharded strategy is FSDP2 (fully_shard)
    if v not in strategies:
        raise Unmapped(f"training backend {v!r}: the strategies here are ddp and fsdp2 (verl's fsdp and fsdp2 map "
                       "to fsdp2)")
    return {"trainer.strategy": strategies[v]}


def _warmup_style(v: Any, _: View) -> dict[str, Any]:
    if v not in ("constant", "cosine"):
        raise Unmapped(f"learning-rate schedule {v!r}: the schedules here are constant and cosine")
    return {"trainer.optimizer.lr_schedule": v}


def _betas(v: Any, _: View) -> dict[str, Any]:
    b1, b2 = v
    return {"trainer.optimizer.beta1": float(b1), "trainer.optimizer.beta2": float(b2)}


def _warmup_steps(v: Any, _: View) -> dict[str, Any]:
    return {} if int(v) < 0 else {"trainer.optimizer.warmup_steps": int(v)}  # -1: the ratio decides (derived)


def _top_k(v: Any, _: View) -> dict[str, Any]:
    return {"explorer.sampling.top_k": 0 if int(v) < 0 else int(v)}


def _response_length(v: Any, view: View) -> dict[str, Any]:
    return {"explorer.sampling.max_new_tokens": int(v), "reward.max_resp_len": int(v)}


def _train_files(v: Any, view: View) -> dict[str, Any]:
    files = [v] if isinstance(v, str) else list(v)
    if len(files) != 1:
        raise Unmapped(f"{len(files)} training files: name one Parquet file (concatenate them first)")
    return {"explorer.taskset.path": view.path(files[0])}


def _val_files(v: Any, view: View) -> dict[str, Any]:
    files = [v] if isinstance(v, str) else list(v)
    val = view.leaves.get("actor_rollout_ref.rollout.val_kwargs.n")
    temperature = view.leaves.get("actor_rollout_ref.rollout.val_kwargs.temperature")
    greedy = not view.leaves.get("actor_rollout_ref.rollout.val_kwargs.do_sample", False)
    sets = []
    for i, f in enumerate(files):
        ev = {"name": "val" if len(files) == 1 else f"val{i}", "path": view.path(f), "k": int(val or 1),
              "temperature": 0.0 if greedy else float(temperature if temperature is not None else 1.0)}
        sets.append(ev)
    return {"explorer.eval_tasksets": sets}


def _multi_turn(v: Any, view: View) -> dict[str, Any]:
    if not v:
        return {}
    return {"explorer.workflow": "tool_agent"}


def _tool_config(v: Any, view: View) -> dict[str, Any]:
    return {"explorer.tool_config_path": view.path(v)} if v else {}


def _logger(v: Any, _: View) -> dict[str, Any]:
    names = [v] if isinstance(v, str) else list(v)
    known = {"console": None, "wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow"}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise Unmapped(f"logger(s) {', '.join(unknown)}: the backends here are wandb, tensorboard and mlflow "
                       "(console output and metrics.jsonl are always on)")
    return {"monitor.backends": [known[n] for n in names if known[n]]}


def _gpus(v: Any, view: View) -> dict[str, Any]:
    """verl time-shares every GPU between actor and rollout (its hybrid engine, one phase at a time). Here the
    two run at once, so G GPUs are split: G // 2 trainer workers and G - G // 2 engines, a GPU each; one GPU
    is shared by one worker and one engine (half each). With a reward model (``reward_model.enable``), which
    verl also time-shares, it takes one GPU out of the split (G >= 3), or shares the engine's GPU (half of the
    engine's share, G <= 2). On the CPU (``trainer.device: cpu``) one worker and one engine, no GPU asked
    for."""
    total = int(view.get("trainer.n_gpus_per_node")) * int(view.get("trainer.nnodes"))
    if str(view.get("trainer.device")) == "cpu" or total <= 0:
        return {"trainer.num_workers": 1, "explorer.num_engines": 1}
    reward_model = bool(view.get("reward_model.enable"))
    if total <= 2:
        worker_share = 0.5 if total == 1 else 1.0
        engine_share = 1.0 - worker_share if total == 1 else 1.0
        out = {"trainer.num_workers": 1, "explorer.num_engines": 1, "trainer.gpus_per_worker": worker_share}
        if reward_model:
            return {**out, "explorer.gpus_per_engine": engine_share / 2, "reward.model.num_gpus": engine_share / 2}
        return {**out, "explorer.gpus_per_engine": engine_share}
    shared = total - 1 if reward_model else total
    workers = shared // 2
    out = {"trainer.num_workers": workers, "explorer.num_engines": shared - workers, "trainer.gpus_per_worker": 1.0,
           "explorer.gpus_per_engine": 1.0}
    return {**out, "reward.model.num_gpus": 1.0} if reward_model else out


def _device(v: Any, _: View) -> dict[str, Any]:
    if v not in ("cuda", "cpu"):
        raise Unmapped(f"device {v!r}: the devices here are cuda and cpu")
    return {"trainer.device": v}


def _default_local_dir(v: Any, view: View) -> dict[str, Any]:
    """verl writes checkpoints to ``default_local_dir`` (by default ``checkpoints/<project>/<experiment>``); our
    run directory is ``checkpoint_root_dir/<project>/<name>``, so the root is what precedes those two parts."""
    text = str(v)
    suffix = "/${trainer.project_name}/${trainer.experiment_name}"
    if text.endswith(suffix):
        return {"checkpoint_root_dir": text[: -len(suffix)] or "."}
    parts = Path(text).parts
    if len(parts) >= 3 and parts[-2:] == (str(view.get("trainer.project_name")), str(view.get("trainer.experiment_name"))):
        return {"checkpoint_root_dir": str(Path(*parts[:-2]))}
    raise Unmapped(f"checkpoint folder {text!r}: runs live in checkpoint_root_dir/<project>/<name>; give "
                   "default_local_dir as <root>/${trainer.project_name}/${trainer.experiment_name}")


def _hdfs(v: Any, _: View) -> dict[str, Any]:
    if v:
        raise Unmapped("HDFS checkpoint copies are not supported: checkpoints stay in the run directory")
    return {}


def _reward_model_enable(v: Any, view: View) -> dict[str, Any]:
    """verl scores with the reward model instead of the reward function when it is enabled (its score replaces
    the function's); here the model is served in its own actor beside the explorer (``reward.model``)."""
    if not v:
        return {}
    path = view.get("reward_model.model.path")
    if not path:
        raise Unmapped("reward_model.enable without reward_model.model.path: give the reward model's folder")
    return {"reward.model.path": view.path(str(path)), "reward.model.combine": "replace"}


def _reward_kwargs(_: Any, view: View) -> dict[str, Any]:
    """All of ``custom_reward_function.reward_kwargs`` at once (each of its keys gives the same whole)."""
    prefix = "custom_reward_function.reward_kwargs."
    kwargs: dict[str, Any] = {}
    for key, value in view.leaves.items():
        if key.startswith(prefix) and value is not None:
            *parents, leaf = key[len(prefix):].split(".")
            node = kwargs
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
    return {"reward.function_kwargs": kwargs}


def _rm_micro_batch(v: Any, _: View) -> dict[str, Any]:
    return {} if v is None else {"reward.model.micro_batch_size": int(v)}


def _rm_max_length(v: Any, _: View) -> dict[str, Any]:
    return {} if v is None else {"reward.model.max_length": int(v)}


def _reward_manager(v: Any, _: View) -> dict[str, Any]:
    managers = {"naive": "naive", "dapo": "dapo", "batch": "naive"}  # our naive manager scores whole batches
    if v not in managers:
        raise Unmapped(f"reward manager {v!r}: the managers here are naive, dapo (batch = naive)")
    return {"reward.manager": managers[v]}


def _reward_fn_path(v: Any, view: View) -> dict[str, Any]:
    return {"reward.function_path": view.path(v)} if v else {}


def _critic_model(v: Any, view: View) -> dict[str, Any]:
    if str(v) != str(view.get("actor_rollout_ref.model.path")):
        raise Unmapped("a critic model other than the policy's: the critic here is the policy's backbone with a "
                       "value head")
    return {}


def _same_as_actor(actor_key: str, what: str) -> Convert:
    def convert(v: Any, view: View) -> dict[str, Any]:
        if v != view.get(actor_key):
            raise Unmapped(f"a critic {what} other than the actor's ({view.get(actor_key)}): one setting serves both")
        return {}
    return convert


def _filter_groups(v: Any, view: View) -> dict[str, Any]:
    if not v:
        return {}
    metric = view.get("algorithm.filter_groups.metric")
    if metric not in ("acc", "score", "seq_reward", "seq_final_reward"):
        raise Unmapped(f"filter_groups.metric {metric!r}: groups are filtered on their rewards")
    return {"explorer.dynamic_sampling": True}


def _adv_estimator(v: Any, _: View) -> dict[str, Any]:
    return {"algorithm.adv_estimator": v}


def _kl_ctrl_type(v: Any, _: View) -> dict[str, Any]:
    return {"algorithm.kl_ctrl.type": v}


NOTHING: tuple[str, ...] = ()

RULES: tuple[Rule, ...] = (
    # ---- data
    Rule("data.train_files", ("explorer.taskset.path",), "one Parquet file in verl's format (chat-message "
         "`prompt`, `data_source`, `reward_model.ground_truth`, `extra_info`) or ours", _train_files),
    Rule("data.val_files", ("explorer.eval_tasksets",), "one evaluation task set per file (`val`), its k and "
         "temperature from `rollout.val_kwargs`", _val_files),
    Rule("data.train_batch_size", ("explorer.batch_size",), "prompts per step (each sampled `rollout.n` times)"),
    Rule("data.max_response_length", ("explorer.sampling.max_new_tokens", "reward.max_resp_len"),
         "longest response in tokens", _response_length),
    Rule("data.max_prompt_length", ("explorer.max_prompt_tokens",), "longest prompt in tokens after the chat "
         "template, training and validation sets alike, checked when the explorer loads them"),
    Rule("data.reward_fn_key", ("reward.reward_fn_key",), "the task column that picks the reward scorer"),
    Rule("data.prompt_key", NOTHING, "must be `prompt`", _only(("prompt",), "a prompt column other than `prompt`")),
    Rule("data.tokenizer", NOTHING, "the model's own tokenizer is used",
         _only((None,), "a tokenizer other than the model's")),
    Rule("data.shuffle", NOTHING, "tasks are always drawn in a seeded shuffled order", no_effect=True),
    Rule("data.seed", ("seed",), "the run's seed"),
    Rule("data.filter_overlong_prompts", ("explorer.filter_overlong_prompts",), "same: tasks over the limit are "
         "dropped when the explorer loads the task sets (logged)"),
    Rule("data.filter_overlong_prompts_workers", NOTHING, "the filter runs once, in the explorer", no_effect=True),
    Rule("data.truncation", ("explorer.prompt_truncation",), "same names: error, left, right, middle"),
    Rule("data.return_raw_chat", NOTHING, "the workflow always has the messages", no_effect=True),
    Rule("data.return_raw_input_ids", NOTHING, "no separate reward-model tokenizer", no_effect=True),
    Rule("data.return_full_prompt", NOTHING, "no effect on training", no_effect=True),
    Rule("data.trust_remote_code", NOTHING, "models load with trust_remote_code off",
         _only((False,), "trust_remote_code: models load without remote code here")),
    Rule("data.dataloader_num_workers", NOTHING, "tasks are read once into memory", no_effect=True),
    Rule("data.custom_cls.*", NOTHING, "a custom dataset class", _only((None, ""), "a custom dataset class")),
    # ---- algorithm
    Rule("algorithm.adv_estimator", ("algorithm.adv_estimator",), "same names (gae, grpo, rloo, "
         "reinforce_plus_plus, reinforce_plus_plus_baseline, remax, dapo, opmd)", _adv_estimator),
    Rule("algorithm.gamma", ("algorithm.gamma",), "same"),
    Rule("algorithm.lam", ("algorithm.lam",), "same"),
    Rule("algorithm.norm_adv_by_std_in_grpo", ("algorithm.norm_adv_by_std_in_grpo",), "same"),
    Rule("algorithm.use_kl_in_reward", ("algorithm.use_kl_in_reward",), "same"),
    Rule("algorithm.kl_penalty", ("algorithm.kl_penalty",), "same estimator names",
         _kl_type("algorithm.kl_penalty")),
    Rule("algorithm.kl_ctrl.type", ("algorithm.kl_ctrl.type",), "fixed or adaptive", _kl_ctrl_type),
    Rule("algorithm.kl_ctrl.kl_coef", ("algorithm.kl_ctrl.kl_coef",), "same"),
    Rule("algorithm.kl_ctrl.target_kl", ("algorithm.kl_ctrl.target_kl",), "same"),
    Rule("algorithm.kl_ctrl.horizon", ("algorithm.kl_ctrl.horizon",), "same"),
    Rule("algorithm.use_pf_ppo", NOTHING, "preference-feedback PPO", _only((False,), "PF-PPO reweighting")),
    Rule("algorithm.pf_ppo.*", NOTHING, "read only with use_pf_ppo", no_effect=True),
    Rule("algorithm.filter_groups.enable", ("explorer.dynamic_sampling",), "DAPO's dynamic sampling: groups "
         "whose samples all got the same reward are dropped", _filter_groups),
    Rule("algorithm.filter_groups.metric", NOTHING, "read with filter_groups.enable", no_effect=True),
    Rule("algorithm.filter_groups.max_num_gen_batches", ("explorer.max_empty_steps",), "explorer steps in a row "
         "that may write nothing before the run stops (0 = never)"),
    # ---- actor_rollout_ref: the model
    Rule("actor_rollout_ref.model.path", ("model.path",), "same"),
    Rule("actor_rollout_ref.model.enable_gradient_checkpointing", ("trainer.gradient_checkpointing",), "same"),
    Rule("actor_rollout_ref.model.lora_rank", ("trainer.lora.enabled", "trainer.lora.r"), "LoRA on when > 0",
         _lora_rank),
    Rule("actor_rollout_ref.model.lora_alpha", ("trainer.lora.alpha",), "same"),
    Rule("actor_rollout_ref.model.target_modules", ("trainer.lora.target_modules",), "a list, or `all-linear` "
         "(the attention and MLP projections)", _target_modules),
    Rule("actor_rollout_ref.model.use_remove_padding", NOTHING, "no padding is trained on here either (masks "
         "and token-budget micro-batches)", no_effect=True),
    Rule("actor_rollout_ref.model.use_fused_kernels", NOTHING, "kernel choice of verl's FSDP workers",
         no_effect=True),
    Rule("actor_rollout_ref.model.trust_remote_code", NOTHING, "models load with trust_remote_code off",
         _only((False,), "trust_remote_code: models load without remote code here")),
    Rule("actor_rollout_ref.model.external_lib", NOTHING, "an extra import", _only((None,), "an external model library")),
    Rule("actor_rollout_ref.model.override_config.*", NOTHING, "model config overrides",
         _only(({},), "model config overrides: edit the model's config.json")),
    Rule("actor_rollout_ref.model.backend", ("trainer.strategy",), "fsdp and fsdp2 -> fsdp2", _strategy),
    Rule("actor_rollout_ref.hybrid_engine", NOTHING, "actor and rollout share the GPUs (see trainer.n_gpus_per_node)",
         no_effect=True),
    # ---- actor
    Rule("actor_rollout_ref.actor.strategy", ("trainer.strategy",), "fsdp and fsdp2 -> fsdp2", _strategy),
    Rule("actor_rollout_ref.actor.ppo_mini_batch_size", ("trainer.mini_batch_size",), "prompts -> experiences "
         "(x rollout.n)", _times_n("trainer.mini_batch_size")),
    Rule("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", ("trainer.micro_batch_size",), "same (experiences "
         "per forward/backward)"),
    Rule("actor_rollout_ref.actor.ppo_micro_batch_size", ("trainer.micro_batch_size",), "verl's deprecated global "
         "form; read as per worker", _copy("trainer.micro_batch_size")),
    Rule("actor_rollout_ref.actor.use_dynamic_bsz", ("trainer.max_token_len_per_micro_batch",), "on: micro-batches "
         "by the token budget `ppo_max_token_len_per_gpu`", _dynamic_bsz),
    Rule("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", ("trainer.max_token_len_per_micro_batch",), "read by "
         "use_dynamic_bsz: its micro-batch token budget", derived=True),
    Rule("actor_rollout_ref.actor.ppo_epochs", ("trainer.ppo_epochs",), "same"),
    Rule("actor_rollout_ref.actor.shuffle", NOTHING, "mini-batches are always drawn in a seeded shuffled order",
         no_effect=True),
    Rule("actor_rollout_ref.actor.clip_ratio", ("algorithm.clip_ratio_low", "algorithm.clip_ratio_high"),
         "both sides, unless clip_ratio_low/high are given", _clip_ratio),
    Rule("actor_rollout_ref.actor.clip_ratio_low", ("algorithm.clip_ratio_low",), "same"),
    Rule("actor_rollout_ref.actor.clip_ratio_high", ("algorithm.clip_ratio_high",), "same"),
    Rule("actor_rollout_ref.actor.clip_ratio_c", ("algorithm.clip_ratio_c",), "same (dual-clip)"),
    Rule("actor_rollout_ref.actor.loss_agg_mode", ("algorithm.loss_agg_mode",), "same names"),
    Rule("actor_rollout_ref.actor.entropy_coeff", ("algorithm.entropy_coeff",), "same"),
    Rule("actor_rollout_ref.actor.use_kl_loss", ("algorithm.use_kl_loss",), "same"),
    Rule("actor_rollout_ref.actor.kl_loss_coef", ("algorithm.kl_loss_coef",), "same"),
    Rule("actor_rollout_ref.actor.kl_loss_type", ("algorithm.kl_loss_type",), "same names (`low_var` = low_var_kl)",
         _kl_type("algorithm.kl_loss_type")),
    Rule("actor_rollout_ref.actor.policy_loss.loss_mode", ("algorithm.policy_loss",), "vanilla, gspo, cispo, ... "
         "(our registry's names)"),
    Rule("actor_rollout_ref.actor.grad_clip", ("trainer.optimizer.max_grad_norm",), "same"),
    Rule("actor_rollout_ref.actor.max_grad_norm", ("trainer.optimizer.max_grad_norm",), "the seeds' spelling of "
         "grad_clip", _copy("trainer.optimizer.max_grad_norm")),
    Rule("actor_rollout_ref.actor.lr", ("trainer.optimizer.lr",), "the seeds' spelling of optim.lr",
         _copy("trainer.optimizer.lr")),
    Rule("actor_rollout_ref.actor.gradient_checkpointing", ("trainer.gradient_checkpointing",), "the seeds' "
         "spelling", _copy("trainer.gradient_checkpointing")),
    Rule("actor_rollout_ref.actor.optim.lr", ("trainer.optimizer.lr",), "same"),
    Rule("actor_rollout_ref.actor.optim.weight_decay", ("trainer.optimizer.weight_decay",), "same"),
    Rule("actor_rollout_ref.actor.optim.betas", ("trainer.optimizer.beta1", "trainer.optimizer.beta2"), "same",
         _betas),
    Rule("actor_rollout_ref.actor.optim.lr_warmup_steps", ("trainer.optimizer.warmup_steps",), "same (-1: from "
         "lr_warmup_steps_ratio)", _warmup_steps),
    Rule("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", ("trainer.optimizer.warmup_steps",), "x the "
         "run's total steps, when lr_warmup_steps is -1", derived=True),
    Rule("actor_rollout_ref.actor.optim.warmup_style", ("trainer.optimizer.lr_schedule",), "constant or cosine",
         _warmup_style),
    Rule("actor_rollout_ref.actor.optim.lr_scheduler_type", ("trainer.optimizer.lr_schedule",), "constant or "
         "cosine", _warmup_style),
    Rule("actor_rollout_ref.actor.optim.min_lr_ratio", ("trainer.optimizer.min_lr_ratio",), "same"),
    Rule("actor_rollout_ref.actor.optim.total_training_steps", NOTHING, "set from trainer.total_training_steps",
         no_effect=True),
    Rule("actor_rollout_ref.actor.ulysses_sequence_parallel_size", NOTHING, "sequence parallelism",
         _only((1,), "Ulysses sequence parallelism")),
    Rule("actor_rollout_ref.actor.fsdp_config.*", NOTHING, "memory layout of verl's FSDP workers: "
         "trainer.strategy and trainer.dtype decide ours", no_effect=True),
    Rule("actor_rollout_ref.actor.checkpoint.*", NOTHING, "checkpoints always hold the model, optimizer and "
         "extra state", no_effect=True),
    Rule("actor_rollout_ref.actor.use_torch_compile", NOTHING, "not compiled here", no_effect=True),
    Rule("actor_rollout_ref.actor.profiler.*", NOTHING, "verl's profiler", no_effect=True),
    Rule("actor_rollout_ref.actor.lora.enabled", ("trainer.lora.enabled",), "the seeds' spelling",
         _copy("trainer.lora.enabled")),
    Rule("actor_rollout_ref.actor.lora.r", ("trainer.lora.r",), "the seeds' spelling", _copy("trainer.lora.r")),
    Rule("actor_rollout_ref.actor.lora.alpha", ("trainer.lora.alpha",), "the seeds' spelling",
         _copy("trainer.lora.alpha")),
    Rule("actor_rollout_ref.actor.lora.target_modules", ("trainer.lora.target_modules",), "the seeds' spelling",
         _target_modules),
    Rule("actor_rollout_ref.actor.lora.dropout", ("trainer.lora.dropout",), "the seeds' spelling",
         _copy("trainer.lora.dropout")),
    # ---- rollout
    Rule("actor_rollout_ref.rollout.name", ("explorer.engine",), "vllm or hf", _rollout_name),
    Rule("actor_rollout_ref.rollout.mode", NOTHING, "engines are always served asynchronously", no_effect=True),
    Rule("actor_rollout_ref.rollout.n", ("explorer.repeat_times",), "samples per prompt"),
    Rule("actor_rollout_ref.rollout.temperature", ("explorer.sampling.temperature",), "same"),
    Rule("actor_rollout_ref.rollout.top_p", ("explorer.sampling.top_p",), "same"),
    Rule("actor_rollout_ref.rollout.top_k", ("explorer.sampling.top_k",), "same (-1 = off = 0)", _top_k),
    Rule("actor_rollout_ref.rollout.do_sample", NOTHING, "rollouts always sample (temperature 0 is greedy)",
         _only((True,), "greedy rollouts for training: set rollout.temperature 0 instead")),
    Rule("actor_rollout_ref.rollout.prompt_length", NOTHING, "verl fills it from data.max_prompt_length, which "
         "sets explorer.max_prompt_tokens", no_effect=True),
    Rule("actor_rollout_ref.rollout.response_length", ("explorer.sampling.max_new_tokens",), "see "
         "data.max_response_length", _response_length),
    Rule("actor_rollout_ref.rollout.tensor_model_parallel_size", ("explorer.gpus_per_engine",), "GPUs per vLLM "
         "engine (1 = the GPU split with a trainer worker)",
         lambda v, _: {} if int(v) <= 1 else {"explorer.gpus_per_engine": float(v)}),
    Rule("actor_rollout_ref.rollout.gpu_memory_utilization", ("explorer.vllm.gpu_memory_utilization",), "same"),
    Rule("actor_rollout_ref.rollout.max_num_seqs", ("explorer.vllm.max_num_seqs",), "same"),
    Rule("actor_rollout_ref.rollout.max_model_len", ("explorer.vllm.max_model_len",), "same"),
    Rule("actor_rollout_ref.rollout.enforce_eager", ("explorer.vllm.enforce_eager",), "same"),
    Rule("actor_rollout_ref.rollout.dtype", ("explorer.dtype",), "same names",
         lambda v, _: {"explorer.dtype": {"bf16": "bfloat16", "fp16": "float16"}.get(v, v)}),
    Rule("actor_rollout_ref.rollout.free_cache_engine", NOTHING, "engines keep their KV cache between steps "
         "(they generate while the trainer trains)", no_effect=True),
    Rule("actor_rollout_ref.rollout.load_format", NOTHING, "weights arrive by synchronizer.method", no_effect=True),
    Rule("actor_rollout_ref.rollout.layered_summon", NOTHING, "verl's FSDP weight gathering", no_effect=True),
    Rule("actor_rollout_ref.rollout.max_num_batched_tokens", NOTHING, "vLLM's default is used", no_effect=True),
    Rule("actor_rollout_ref.rollout.enable_chunked_prefill", NOTHING, "vLLM's default is used", no_effect=True),
    Rule("actor_rollout_ref.rollout.disable_log_stats", NOTHING, "engine statistics are not logged", no_effect=True),
    Rule("actor_rollout_ref.rollout.ignore_eos", NOTHING, "responses end at EOS",
         _only((False,), "ignore_eos: responses end at EOS here")),
    Rule("actor_rollout_ref.rollout.calculate_log_probs", NOTHING, "engines always return log-probs",
         no_effect=True),
    Rule("actor_rollout_ref.rollout.log_prob_micro_batch_size", NOTHING, "behaviour log-probs come from the "
         "engines; the trainer's recomputation uses trainer.micro_batch_size", no_effect=True),
    Rule("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", NOTHING, "see log_prob_micro_batch_size",
         no_effect=True),
    Rule("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", NOTHING, "see log_prob_micro_batch_size",
         no_effect=True),
    Rule("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", NOTHING, "see log_prob_micro_batch_size",
         no_effect=True),
    Rule("actor_rollout_ref.rollout.val_kwargs.*", ("explorer.eval_tasksets",), "k and temperature of the "
         "evaluation sets (with data.val_files)", no_effect=True),
    Rule("actor_rollout_ref.rollout.multi_turn.enable", ("explorer.workflow",), "on: the `tool_agent` workflow",
         _multi_turn),
    Rule("actor_rollout_ref.rollout.multi_turn.tool_config_path", ("explorer.tool_config_path",), "same format "
         "(OpenAI function schemas)", _tool_config),
    Rule("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", ("explorer.max_turns",), "same"),
    Rule("actor_rollout_ref.rollout.multi_turn.max_user_turns", NOTHING, "tool turns follow model turns",
         no_effect=True),
    Rule("actor_rollout_ref.rollout.multi_turn.format", NOTHING, "Hermes-style <tool_call> blocks",
         _only(("hermes",), "a tool-call format other than hermes")),
    Rule("actor_rollout_ref.rollout.multi_turn.interaction_config_path", NOTHING, "interaction agents",
         _only((None,), "interaction configs (user simulators): write a workflow")),
    Rule("actor_rollout_ref.rollout.engine_kwargs.*", NOTHING, "engine-specific extras", no_effect=True),
    Rule("actor_rollout_ref.rollout.agent.*", NOTHING, "verl's agent loop workers", no_effect=True),
    # ---- the reference model
    Rule("actor_rollout_ref.ref.*", NOTHING, "the frozen reference is the initial policy, held by each trainer "
         "worker; its micro-batches follow trainer.micro_batch_size", no_effect=True),
    # ---- critic
    Rule("critic.strategy", NOTHING, "the critic shares trainer.strategy", no_effect=True),
    Rule("critic.model.path", NOTHING, "must be the policy's model", _critic_model),
    Rule("critic.model.*", NOTHING, "the critic is the policy's backbone with a value head", no_effect=True),
    Rule("critic.optim.lr", ("trainer.critic.lr",), "same"),
    Rule("critic.optim.*", NOTHING, "the critic's other optimizer settings follow the actor's", no_effect=True),
    Rule("critic.cliprange_value", ("trainer.critic.cliprange_value",), "same"),
    Rule("critic.grad_clip", ("trainer.critic.max_grad_norm",), "same"),
    Rule("critic.ppo_epochs", NOTHING, "the actor's", _same_as_actor("actor_rollout_ref.actor.ppo_epochs", "ppo_epochs")),
    Rule("critic.ppo_mini_batch_size", NOTHING, "the actor's",
         _same_as_actor("actor_rollout_ref.actor.ppo_mini_batch_size", "ppo_mini_batch_size")),
    Rule("critic.*", NOTHING, "micro-batches, memory layout and checkpoints follow the actor's", no_effect=True),
    # ---- reward
    Rule("reward_model.enable", ("reward.model.path", "reward.model.combine"), "on: the model at "
         "reward_model.model.path scores every response in its own actor, its score replacing the reward "
         "function's (as in verl; `reward.model.combine: add` sums them); its GPU: see trainer.n_gpus_per_node",
         _reward_model_enable),
    Rule("reward_model.model.path", ("reward.model.path",), "read with reward_model.enable", derived=True),
    Rule("reward_model.model.input_tokenizer", NOTHING, "the reward model always reads the conversation rendered "
         "by its own tokenizer (verl re-renders only when this is set)", no_effect=True),
    Rule("reward_model.model.trust_remote_code", NOTHING, "reward models load without remote code",
         _only((False,), "trust_remote_code for the reward model: only models transformers ships are loaded")),
    Rule("reward_model.micro_batch_size_per_gpu", ("reward.model.micro_batch_size",), "sequences per forward "
         "pass (null: ours, 16)", _rm_micro_batch),
    Rule("reward_model.max_length", ("reward.model.max_length",), "longest input; longer keep their last tokens "
         "(null: ours, 1024)", _rm_max_length),
    Rule("reward_model.reward_manager", ("reward.manager",), "naive or dapo (batch = naive)", _reward_manager),
    Rule("reward_model.overlong_buffer.enable", ("reward.overlong_buffer.enable",), "DAPO's overlong shaping"),
    Rule("reward_model.overlong_buffer.len", ("reward.overlong_buffer.len",), "same"),
    Rule("reward_model.overlong_buffer.penalty_factor", ("reward.overlong_buffer.penalty_factor",), "same"),
    Rule("reward_model.overlong_buffer.log", NOTHING, "the penalty is always in the rollout metrics",
         no_effect=True),
    Rule("reward_model.launch_reward_fn_async", NOTHING, "rewards are computed in the explorer's workflows, "
         "beside generation", no_effect=True),
    Rule("reward_model.*", NOTHING, "the reward model's micro-batches and memory layout", no_effect=True),
    Rule("custom_reward_function.path", ("reward.function_path",), "a Python file; both signatures "
         "(verl's per-sample and the batched one)", _reward_fn_path),
    Rule("custom_reward_function.name", ("reward.function_name",), "same"),
    Rule("custom_reward_function.reward_kwargs.*", ("reward.function_kwargs",), "keyword arguments bound to the "
         "reward function", _reward_kwargs),
    # ---- trainer
    Rule("trainer.total_epochs", ("trainer.total_steps",), "x steps per epoch (the training file's rows // "
         "train_batch_size), unless total_training_steps is given", derived=True),
    Rule("trainer.total_training_steps", ("trainer.total_steps",), "the run's length (wins over total_epochs)",
         derived=True),
    Rule("trainer.project_name", ("project",), "same"),
    Rule("trainer.experiment_name", ("name",), "same"),
    Rule("trainer.logger", ("monitor.backends",), "wandb, tensorboard, mlflow (console is always on)", _logger),
    Rule("trainer.log_val_generations", NOTHING, "evaluation samples are not logged", no_effect=True),
    Rule("trainer.rollout_data_dir", NOTHING, "every rollout is kept in the run's buffer", no_effect=True),
    Rule("trainer.validation_data_dir", NOTHING, "evaluations are logged as metrics", no_effect=True),
    Rule("trainer.nnodes", ("trainer.num_workers", "explorer.num_engines"), "with n_gpus_per_node", _gpus),
    Rule("trainer.n_gpus_per_node", ("trainer.num_workers", "explorer.num_engines", "trainer.gpus_per_worker",
                                     "explorer.gpus_per_engine", "reward.model.num_gpus"),
         "G = nnodes x n_gpus_per_node GPUs: verl time-shares each between actor and rollout, here both run at "
         "once on G // 2 trainer workers and G - G // 2 engines, a GPU each (one GPU: half each; "
         "bench/simulate.py helps pick another split); a reward model takes one GPU out of the split (G >= 3) "
         "or half the engine's share (G <= 2); trainer.device cpu: one of each, no GPU", _gpus),
    Rule("trainer.device", ("trainer.device",), "cuda or cpu", _device),
    Rule("trainer.save_freq", ("trainer.save_interval",), "-1 = only at the end (0)",
         _never_is_zero("trainer.save_interval")),
    Rule("trainer.test_freq", ("explorer.eval_interval",), "-1 = never (0)", _never_is_zero("explorer.eval_interval")),
    Rule("trainer.val_before_train", NOTHING, "evaluation runs before the first step whenever eval_interval > 0",
         no_effect=True),
    Rule("trainer.critic_warmup", NOTHING, "critic-only warm-up steps", _only((0,), "critic warm-up steps")),
    Rule("trainer.default_local_dir", ("checkpoint_root_dir",), "<root>/<project>/<experiment> -> root",
         _default_local_dir),
    Rule("trainer.default_hdfs_dir", NOTHING, "HDFS copies", _hdfs),
    Rule("trainer.resume_mode", NOTHING, "resume with `trinity-like run --resume`", no_effect=True),
    Rule("trainer.resume_from_path", NOTHING, "resume with `trinity-like run --resume`",
         _only((None,), "resume_from_path: resume a run in its own run directory with --resume")),
    Rule("trainer.del_local_ckpt_after_load", NOTHING, "checkpoints are kept (trainer.keep_checkpoints)",
         no_effect=True),
    Rule("trainer.max_actor_ckpt_to_keep", ("trainer.keep_checkpoints",), "same (null = keep all = 0)"),
    Rule("trainer.max_critic_ckpt_to_keep", NOTHING, "the critic is saved with the actor", no_effect=True),
    Rule("trainer.balance_batch", NOTHING, "micro-batches are balanced by token budget when "
         "max_token_len_per_micro_batch is set", no_effect=True),
    Rule("trainer.ray_wait_register_center_timeout", NOTHING, "Ray start-up", no_effect=True),
    Rule("trainer.esi_redundant_time", NOTHING, "verl's elastic checkpointing", no_effect=True),
    Rule("trainer.async_weight_update", NOTHING, "weights are always pushed while the explorer runs (mode async)",
         no_effect=True),
    Rule("trainer.profile_steps", NOTHING, "verl's profiler", no_effect=True),
    Rule("trainer.controller_nsight_options.*", NOTHING, "verl's profiler", no_effect=True),
    Rule("trainer.worker_nsight_options.*", NOTHING, "verl's profiler", no_effect=True),
    Rule("trainer.npu_profile.*", NOTHING, "verl's profiler", no_effect=True),
    Rule("trainer.use_legacy_worker_impl", NOTHING, "verl's worker choice", no_effect=True),
    Rule("ray_init.*", NOTHING, "Ray is started (or joined with --address) by the launcher", no_effect=True),
    Rule("ray_kwargs.*", NOTHING, "Ray is started (or joined with --address) by the launcher", no_effect=True),
    Rule("global_profiler.*", NOTHING, "verl's profiler", no_effect=True),
)
"""verl key -> our keys. Exact keys win over section rules; among section rules the longest prefix wins."""

VERL_DEFAULTS: dict[str, Any] = {
    "data.train_batch_size": 1024,
    "data.max_response_length": 512,
    "data.max_prompt_length": 512,
    "algorithm.adv_estimator": "gae",
    "algorithm.gamma": 1.0,
    "algorithm.lam": 1.0,
    "algorithm.kl_penalty": "kl",
    "algorithm.kl_ctrl.kl_coef": 0.001,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.ppo_epochs": 1,
    "actor_rollout_ref.actor.clip_ratio": 0.2,
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.entropy_coeff": 0.0,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "actor_rollout_ref.actor.grad_clip": 1.0,
    "actor_rollout_ref.actor.optim.lr": 1e-06,
    "actor_rollout_ref.actor.optim.weight_decay": 0.01,
    "actor_rollout_ref.rollout.n": 1,
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.top_p": 1.0,
    "actor_rollout_ref.rollout.top_k": -1,
    "trainer.project_name": "verl_examples",
    "trainer.experiment_name": "gsm8k",
    "trainer.n_gpus_per_node": 8,
    "trainer.device": "cuda",
    "trainer.save_freq": -1,
    "trainer.test_freq": -1,
}
"""verl's defaults (verl/trainer/config/ppo_trainer.yaml) applied to the keys a file omits, so that a short verl
config trains as it would in verl."""
VERL_READ_DEFAULTS: dict[str, Any] = {
    "data.reward_fn_key": "data_source",
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_ctrl.type": "fixed",
    "algorithm.filter_groups.metric": "acc",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": None,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,
    "actor_rollout_ref.actor.clip_ratio_c": 3.0,
    "actor_rollout_ref.actor.optim.lr_warmup_steps": -1,
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.0,
    "actor_rollout_ref.actor.optim.warmup_style": "constant",
    "trainer.total_epochs": 30,
    "trainer.nnodes": 1,
    "reward_model.reward_manager": "naive",
    "custom_reward_function.name": "compute_score",
}
"""verl's defaults of keys that converters read beside the key they translate (not applied on their own)."""


@dataclass
class Translation:
    """The outcome of translating one verl config."""

    native: dict[str, Any] = field(default_factory=dict)
    """Our dotted keys -> values."""
    applied: list[tuple[str, Any, str]] = field(default_factory=list)
    """(verl key, its value, what it set), in file order; verl defaults the file omitted are marked as such."""
    no_effect: list[tuple[str, Any, str]] = field(default_factory=list)
    """(verl key, value, why it has no effect here)."""
    unmapped: list[tuple[str, Any, str]] = field(default_factory=list)
    """(verl key, value, reason): keys with no counterpart here."""

    def nested(self) -> dict[str, Any]:
        """``native`` as nested sections (what a YAML config of ours holds)."""
        out: dict[str, Any] = {}
        for key, value in self.native.items():
            node = out
            *parents, leaf = key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
        return out

    def report(self) -> dict[str, Any]:
        """What the run directory keeps (``verl_translation.yaml``)."""
        return {"applied": [{"verl": k, "value": v, "set": s} for k, v, s in self.applied],
                "no_effect": [{"verl": k, "value": v, "why": s} for k, v, s in self.no_effect],
                "ignored_unmapped": [{"verl": k, "value": v, "why": s} for k, v, s in self.unmapped]}


def is_verl_config(tree: Any) -> bool:
    """True when a config file's top level has a section only verl configs have."""
    return isinstance(tree, dict) and any(k in tree for k in VERL_ONLY_SECTIONS)


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix.rstrip("."), node


def find_rule(key: str) -> Rule | None:
    """The rule for verl key ``key``: its exact rule, else the section rule of the longest matching prefix."""
    exact = _EXACT.get(key)
    if exact is not None:
        return exact
    best = None
    for prefix, rule in _SECTIONS:
        if key == prefix or key.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, rule)
    return best[1] if best else None


_EXACT = {r.verl: r for r in RULES if not r.verl.endswith(".*")}
_SECTIONS = [(r.verl[:-2], r) for r in RULES if r.verl.endswith(".*")]
if len(_EXACT) + len(_SECTIONS) != len(RULES):
    raise RuntimeError("trinity_like.config.verl: a verl key has two rules")


def translate(tree: dict[str, Any], source: str | Path | None = None, allow_unmapped: bool = False) -> Translation:
    """Translate a verl config (its parsed YAML) into our dotted keys. Raises ConfigError naming every unmapped key
    (unless ``allow_unmapped``) and any two verl keys of the file that set one of ours to different values.

    Two layers: the keys the file leaves out (or null) at verl's defaults first, then the keys the file gives over
    them; so a key of the file wins over a default by order, and only two keys of the file can conflict."""
    src = Path(source) if source is not None else None
    leaves = {k: v for k, v in _leaves(tree) if k}
    view = View(leaves, src)
    out = Translation()
    defaults: dict[str, Any] = {}
    """Layer 1: what the keys the file leaves out (or null) set at verl's defaults."""
    given: dict[str, Any] = {}
    """Layer 2: what the keys the file gives set."""
    set_by: dict[str, str] = {}
    """Our key in ``given`` -> the file's key that set it (named when another one disagrees)."""
    for key in [*leaves, *(k for k in VERL_DEFAULTS if k not in leaves)]:  # the report keeps the file's order
        if not view.given(key):
            defaults.update(_convert(key, view.get(key), view, out, given=False))
            continue
        for nk, nv in _convert(key, leaves[key], view, out, given=True).items():
            if nk in given and given[nk] != nv:
                raise ConfigError(f"verl config: '{key}' ({leaves[key]!r}) and '{set_by[nk]}' "
                                  f"({leaves[set_by[nk]]!r}) both set '{nk}' to different values; keep one")
            given[nk], set_by[nk] = nv, key
    out.native = {**defaults, **given}
    _derive(out, view)
    if out.unmapped and not allow_unmapped:
        lines = "; ".join(f"{k} = {v!r} ({why})" for k, v, why in out.unmapped)
        raise ConfigError(f"verl config{f' {src}' if src else ''}: {len(out.unmapped)} key(s) have no counterpart "
                          f"here: {lines}. Remove them, or pass --allow-unmapped to run without them (they are "
                          "listed as ignored in the run directory); docs/verl.md lists every key")
    return out


def _convert(key: str, value: Any, view: View, out: Translation, given: bool) -> dict[str, Any]:
    """What verl key ``key`` at ``value`` sets alone (our dotted keys -> values), recorded in ``out``'s report:
    applied, no effect or unmapped. Derived keys and null (or {}) values set nothing here."""
    if value is None or (isinstance(value, dict) and not value):
        return {}  # null (or {}) in verl means unset
    rule = find_rule(key)
    if rule is None:
        out.unmapped.append((key, value, "no counterpart here"))
        return {}
    if rule.derived:
        return {}  # read where it counts: by another key's converter or by _derive
    if rule.no_effect:
        out.no_effect.append((key, value, rule.how))
        return {}
    try:
        values = rule.convert(value, view) if rule.convert else {rule.native[0]: value}
    except Unmapped as e:
        out.unmapped.append((key, value, str(e)))
        return {}
    except (TypeError, ValueError) as e:
        raise ConfigError(f"verl config: bad value for '{key}': {value!r} ({e})") from None
    if values:
        label = ", ".join(f"{k}={v!r}" for k, v in values.items())
        out.applied.append((key, value, label if given else f"{label} (verl's default)"))
    return values


def _derive(out: Translation, view: View) -> None:
    """Our keys set from several verl keys at once: total steps (and the warm-up ratio, which needs them)."""
    if view.given("trainer.total_training_steps"):
        steps = int(view.get("trainer.total_training_steps"))
        how = "trainer.total_training_steps"
    else:
        epochs = int(view.get("trainer.total_epochs"))
        rows = _rows(out.native.get("explorer.taskset.path"))
        if rows is None:
            raise ConfigError("verl config: the run's length comes from trainer.total_epochs x the training file's "
                              "rows / data.train_batch_size, and data.train_files names no readable file; set "
                              "trainer.total_training_steps or data.train_files")
        steps = epochs * max(1, rows // int(view.get("data.train_batch_size")))  # verl drops the last partial batch
        how = f"trainer.total_epochs {epochs} x {rows} rows // data.train_batch_size"
    out.native["trainer.total_steps"] = steps
    out.applied.append(("(derived)", steps, f"trainer.total_steps={steps} from {how}"))
    ratio = float(view.get("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio") or 0.0)
    if int(view.get("actor_rollout_ref.actor.optim.lr_warmup_steps")) < 0 and ratio > 0:
        warmup = int(ratio * steps)
        out.native["trainer.optimizer.warmup_steps"] = warmup
        out.applied.append(("(derived)", warmup, f"trainer.optimizer.warmup_steps={warmup} from "
                                                  f"lr_warmup_steps_ratio {ratio} x {steps} steps"))


def _rows(path: str | None) -> int | None:
    if not path or not Path(path).is_file():
        return None
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # not Parquet: load_taskset says why, later
        return None


def load_verl_file(path: str | Path) -> Any:
    """A verl YAML file as plain data (verl's ``${...}`` interpolations stay text)."""
    import yaml

    p = Path(path)
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"config file '{path}' is not valid YAML: {str(e).splitlines()[0]}") from None


def native_yaml(tr: Translation) -> str:
    """The translation as a config file of ours (``trinity-like config-convert``)."""
    import yaml

    return yaml.safe_dump(tr.nested(), sort_keys=False, default_flow_style=False)


# ---------------------------------------------------------------- docs/verl.md

DOCS_PATH = Path(__file__).resolve().parents[2] / "docs" / "verl.md"


def render_docs() -> str:
    """docs/verl.md: how to bring a verl config, data set and reward function, and the whole key table."""
    rows = []
    for r in RULES:
        ours = ", ".join(f"`{k}`" for k in r.native) or "-"
        default = VERL_DEFAULTS.get(r.verl, VERL_READ_DEFAULTS.get(r.verl))
        rows.append(f"| `{r.verl}` | {ours} | {r.kind} | {r.how}{f' (verl default {default!r})' if default is not None else ''} |")
    return "\n".join([
        "# Coming from verl",
        "",
        "<!-- Generated from trinity_like/config/verl.py by `python -m trinity_like.config.verl`; do not edit by hand. -->",
        "",
        "`trinity-like run verl_config.yaml` accepts a verl-shaped config (sections `data`, `algorithm`,",
        "`actor_rollout_ref`, `critic`, `trainer`, `reward_model`, `custom_reward_function`): it is translated key by",
        "key through the table below. `trinity-like config-convert verl_config.yaml` prints the equivalent config of",
        "ours, to keep and edit. A key with no counterpart here is refused, all of them named in one message; with",
        "`--allow-unmapped` the run goes on without them and lists them in the run directory",
        "(`verl_translation.yaml`, which also records every key applied and every key accepted without effect).",
        "",
        "Semantics kept: a key the file omits takes verl's default (right column), not ours; verl counts prompts where",
        "we count experiences (`ppo_mini_batch_size` x `rollout.n`); `-1` for never / off becomes `0`. What verl",
        "lacks keeps our defaults: `mode` (async), `synchronizer.*` (staleness bound, weight-sync method),",
        "`algorithm.off_policy.*`. Override any of ours after the file: `trinity-like run verl.yaml mode=sync`.",
        "",
        "Data: `data.train_files` / `val_files` in verl's Parquet format (a `prompt` column of chat messages,",
        "`data_source`, `reward_model.ground_truth`, `extra_info`) are read as task sets, the prompt rendered by the",
        "tokenizer's chat template. Rewards: `custom_reward_function.path` / `name` takes both signatures, verl's",
        "per-sample `compute_score(data_source, solution_str, ground_truth, extra_info)` and the batched",
        "`compute_score(responses, ground_truths, **kwargs) -> list[float]`. `reward_model.enable` with",
        "`reward_model.model.path` serves that sequence-classification model in its own actor; as in verl its score",
        "replaces the function's (`reward.model.combine: add` sums them instead).",
        "",
        "Kinds: *mapped* sets our keys; *checked* is accepted only at values that behave like ours (others are",
        "refused, with the reason); *derived* sets nothing alone: it is read with other keys (the how column says",
        "which) to compute the keys of ours named; *no effect* is accepted and recorded with the reason.",
        "",
        "| verl key | ours | kind | how |",
        "|---|---|---|---|",
        *rows,
        "",
    ])


if __name__ == "__main__":
    import sys

    text = render_docs()
    if "--check" in sys.argv:
        sys.exit(0 if DOCS_PATH.read_text() == text else 1)
    DOCS_PATH.write_text(text)
    print(f"wrote {DOCS_PATH}")
