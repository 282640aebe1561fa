"""verl-shaped configs: one table from verl's keys to ours, and the translation that applies it.

A verl config (``verl/trainer/config/ppo_trainer.yaml``: sections ``data``, ``algorithm``, ``actor_rollout_ref``,
``critic``, ``trainer``, ``reward_model``, ``custom_reward_function``) is read as YAML and translated into this
project's config, key by key, through ``RULES``: each rule names a verl key (or a whole section, ``section.*``),
the keys of ours it sets and how. A verl key no rule names is *unmapped*: the translation names every one of them
in one message and refuses the file unless ``allow_unmapped`` (then they are listed as ignored). Rules of kind
``no_effect`` accept a key whose job is done differently here (memory layouts of verl's workers, its log-prob
micro-batches, ...) and say why; rules of kind ``derived`` name a key that means nothing alone and is read where
it counts (by another key's converter, or by ``_derive`` for the keys of ours set from several verl keys at once).

The config translated is the one verl would run (``verl_compose``): verl's composed defaults (its
``ppo_trainer.yaml`` with the groups of its ``defaults:`` list merged), the file over them, verl's command-line
overrides, then its ``${...}`` interpolations resolved. The translation is two layers: what the keys at verl's
defaults set, then what the keys the file or overrides change set over it, so a short verl config means what it
means to verl, its fully composed form means the same, and two changed keys that set one of ours to different
values are refused. Then verl's meaning where our defaults differ (``_verl_meaning``): ``mode: sync`` (verl's
PPO is on-policy), old log-probs recomputed, checkpoints kept as verl keeps them; one override of ours after the
file changes each (``mode=async``).

Units differ in three places, converted here: verl's ``data.train_batch_size`` and ``ppo_mini_batch_size`` count
prompts (ours count experiences: x ``rollout.n``); ``save_freq`` / ``test_freq`` of -1 mean never (ours 0);
``top_k`` -1 means off (ours 0).

The table is also rendered into ``docs/verl.md`` (``render_docs``; tests/config/test_verl.py keeps it current).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trinity_like.common.errors import ConfigError
from trinity_like.config.trees import nest
from trinity_like.config.verl_compose import (
    DEFAULT_ENTRY,
    compose_raw,
    default_leaves,
    default_raw_leaves,
    resolve,
)
from trinity_like.config.verl_compose import leaves as tree_leaves

VERL_SECTIONS = ("data", "algorithm", "actor_rollout_ref", "critic", "trainer", "reward_model",
                 "custom_reward_function", "ray_init", "ray_kwargs", "global_profiler")
"""Top-level sections of a verl config."""
VERL_ONLY_SECTIONS = ("data", "actor_rollout_ref", "critic", "reward_model", "custom_reward_function")
"""Sections no config of ours has: a file with any of them is read as verl-shaped."""


class Unmapped(Exception):
    """Raised by a converter: this value has no counterpart here (the reason says what would be needed)."""


class View:
    """Read access to the verl config as verl would run it (``verl_compose.compose``: the composed defaults, the
    file and the overrides, resolved) by dotted key; ``defaults`` are verl's composed defaults, resolved."""

    def __init__(self, leaves: dict[str, Any], source: Path | None, defaults: dict[str, Any] | None = None,
                 changed: set[str] | None = None) -> None:
        self.leaves = leaves
        self.source = source
        self.defaults = defaults if defaults is not None else {}
        self.changed = changed
        """Keys the file or overrides wrote other than verl's defaults write them (interpolations compared as
        written: a key that follows another through ``${...}`` is not changed by changing that other key);
        None = compare values."""

    def get(self, key: str, default: Any = None) -> Any:
        value = self.leaves.get(key)
        if value is None:
            value = self.defaults.get(key, VERL_READ_DEFAULTS.get(key, default))
        return value

    def given(self, key: str) -> bool:
        """Set by the file or an override to other than verl's default."""
        value = self.leaves.get(key)
        if value is None:
            return False
        if self.changed is not None:
            return key in self.changed
        return key not in self.defaults or value != self.defaults[key]

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
        raise Unmapped(f"rollout engine {v!r}: the engines here are {', '.join(engines)}; use "
                       "actor_rollout_ref.rollout.name=vllm (same sampling, continuous batching and weight "
                       "updates as sglang gives verl)")
    return {"explorer.engine": engines[v]}


def _clip_ratio(v: Any, view: View) -> dict[str, Any]:
    """verl's symmetric clip_ratio sets a side only where clip_ratio_low / clip_ratio_high is null (verl's policy
    losses read ``clip_ratio_low if clip_ratio_low is not None else clip_ratio``; its defaults set both to 0.2)."""
    out = {}
    if view.get("actor_rollout_ref.actor.clip_ratio_low") is None:
        out["algorithm.clip_ratio_low"] = float(v)
    if view.get("actor_rollout_ref.actor.clip_ratio_high") is None:
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
    if not files:
        raise Unmapped("no training file: name one or more Parquet files")
    if len(files) == 1:
        return {"explorer.taskset.path": view.path(files[0])}
    return {"explorer.taskset.files": [view.path(f) for f in files]}  # concatenated as verl does, into tasks.parquet


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


@dataclass(frozen=True)
class GpuSplit:
    """How a verl job's GPUs are used here (``gpu_split``)."""

    total: int
    """nnodes x n_gpus_per_node (0 on the CPU)."""
    workers: int
    worker_gpus: float
    engines: int
    engine_gpus: float
    """GPUs of one engine: rollout.tensor_model_parallel_size (a fraction where it shares a GPU)."""
    reward_gpus: float = 0.0
    shared: bool = False
    """One GPU shared by a trainer worker and an engine (and a reward model)."""
    note: str = ""
    """What differs from the verl config's own numbers (a tensor-parallel size lowered)."""

    @property
    def native(self) -> dict[str, Any]:
        out = {"trainer.num_workers": self.workers, "explorer.num_engines": self.engines}
        if self.total:
            out.update({"trainer.gpus_per_worker": self.worker_gpus, "explorer.gpus_per_engine": self.engine_gpus})
        if self.reward_gpus:
            out["reward.model.num_gpus"] = self.reward_gpus
        return out

    def describe(self) -> str:
        if not self.total:
            return "on the CPU: one trainer worker and one engine, no GPU"
        used = self.workers * self.worker_gpus + self.engines * self.engine_gpus + self.reward_gpus
        parts = [f"trainer {self.workers} worker(s) x {self.worker_gpus:g} GPU",
                 f"{self.engines} engine(s) x {self.engine_gpus:g} GPU"
                 + (f" (tensor parallel {int(self.engine_gpus)})" if self.engine_gpus > 1 else "")]
        if self.reward_gpus:
            parts.append(f"reward model {self.reward_gpus:g} GPU")
        how = "sharing one GPU" if self.shared else "side by side"
        note = f"; {self.note}" if self.note else ""
        return f"GPUs: {self.total} ({', '.join(parts)}; {how}; {used:g} of {self.total} used{note})"


def gpu_split(view: View) -> GpuSplit:
    """verl's GPUs as verl means them: ``nnodes x n_gpus_per_node`` for the whole job, each rollout engine over
    ``tensor_model_parallel_size`` of them. verl time-shares every GPU between actor and rollout (its hybrid
    engine, one phase at a time); here trainer and engines are separate processes that keep their GPUs, so the
    job's G GPUs are split: engines of TP GPUs each in the larger half (at least one engine), the rest to
    trainer workers, a GPU each. One GPU is shared (half each). A reward model (``reward_model.enable``), which verl also
    time-shares, takes one GPU out of the split (G >= 3) or half the engine's share (one GPU). On the CPU
    (``trainer.device: cpu``) one worker and one engine. Where an engine would take more than half the job's
    GPUs, the tensor-parallel size (a speed setting: it does not change what is computed) is lowered to the
    largest power of two of at most half of them, and the split says so."""
    total = _job_gpus(view)
    tp = max(1, int(view.get("actor_rollout_ref.rollout.tensor_model_parallel_size") or 1))
    if str(view.get("trainer.device")) == "cpu" or total <= 0:
        return GpuSplit(0, 1, 0.0, 1, 0.0)
    reward_model = bool(view.get("reward_model.enable"))
    lowered = "" if tp == 1 else (f"tensor_model_parallel_size {tp} lowered to 1: verl time-shares its {total} "
                                  "GPU(s) between actor and rollout, here the trainer keeps GPUs of its own")
    if total == 1:  # one GPU shared: half to the trainer worker, half to the engine (or a quarter each with a RM)
        if reward_model:
            return GpuSplit(1, 1, 0.5, 1, 0.25, reward_gpus=0.25, shared=True, note=lowered)
        return GpuSplit(1, 1, 0.5, 1, 0.5, shared=True, note=lowered)
    if total == 2 and reward_model:  # the trainer's GPU, and one shared by the engine and the reward model
        return GpuSplit(2, 1, 1.0, 1, 0.5, reward_gpus=0.5, note=lowered)
    pool = total - 1 if reward_model else total
    note = ""
    half = (pool + 1) // 2
    if tp > half:  # an engine of tp GPUs would take more than half: lower it (a speed setting)
        lowered = 1 << (half.bit_length() - 1)
        note = (f"tensor_model_parallel_size {tp} lowered to {lowered}: verl time-shares its {total} GPUs between "
                "actor and rollout, here the trainer keeps GPUs of its own")
        tp = lowered
    engines = max(1, half // tp)
    workers = pool - engines * tp
    return GpuSplit(total, workers, 1.0, engines, float(tp), reward_gpus=1.0 if reward_model else 0.0, note=note)


def _device(v: Any, view: View) -> dict[str, Any]:
    """verl's default ``cuda`` follows the GPUs the job asks for: a job of ``nnodes x n_gpus_per_node`` = 0 GPUs
    asks for none, so its trainer is on the CPU (verl itself would not start it; here a job that asks for no GPU
    runs on the CPU rather than being refused for the default it did not write). ``cpu`` is always kept. (A file
    that writes ``cuda`` says what verl's default says: the composed view cannot tell the two apart.)"""
    if v not in ("cuda", "cpu"):
        raise Unmapped(f"device {v!r}: the devices here are cuda and cpu")
    if not view.given("trainer.device") and _job_gpus(view) <= 0:
        return {"trainer.device": "cpu"}
    return {"trainer.device": v}


def _job_gpus(view: View) -> int:
    """``nnodes x n_gpus_per_node``: the GPUs of the whole job."""
    return int(view.get("trainer.n_gpus_per_node") or 0) * int(view.get("trainer.nnodes") or 0)


def _default_local_dir(v: Any, view: View) -> dict[str, Any]:
    """verl writes checkpoints to ``default_local_dir`` (by default ``checkpoints/<project>/<experiment>``). Here
    that folder is the run directory: ``<root>/<project>/<experiment>`` keeps our layout (``checkpoint_root_dir``
    = root); any other folder is the run directory itself (``run_dir``)."""
    p = Path(str(v)).expanduser()
    project, experiment = str(view.get("trainer.project_name")), str(view.get("trainer.experiment_name"))
    if len(p.parts) >= 3 and p.parts[-2:] == (project, experiment):
        return {"checkpoint_root_dir": str(Path(*p.parts[:-2]))}
    return {"run_dir": str(p)}


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
    Rule("data.train_files", ("explorer.taskset.path", "explorer.taskset.files"), "Parquet files in verl's format "
         "(chat-message `prompt`, `data_source`, `reward_model.ground_truth`, `extra_info`) or ours: one file is "
         "`path`; a list of several is `files`, concatenated in order into the run's `tasks.parquet` as verl "
         "concatenates them (task ids prefixed by their file: `gsm8k/train:train-0`)", _train_files),
    Rule("data.val_files", ("explorer.eval_tasksets",), "one evaluation task set per file (`val`), its k and "
         "temperature from `rollout.val_kwargs`", _val_files),
    Rule("data.train_batch_size", ("explorer.batch_size",), "prompts per step (each sampled `rollout.n` times)"),
    Rule("data.gen_batch_size", ("explorer.batch_size", "trainer.batch_size"), "DAPO's generation batch: prompts "
         "generated per explorer step; the trainer then trains train_batch_size x rollout.n experiences a step "
         "(what dynamic sampling kept)", derived=True),
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
         "the sides whose clip_ratio_low / clip_ratio_high is null (as in verl, whose defaults set both: clip_ratio "
         "alone then changes nothing)", _clip_ratio),
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
         _only((1,), "Ulysses sequence parallelism is not here: long rows fit by gradient checkpointing, "
                     "trainer.max_token_len_per_micro_batch (use_dynamic_bsz) and FSDP2 sharding "
                     "(actor.strategy fsdp); set it to 1")),
    Rule("actor_rollout_ref.actor.fsdp_config.*", NOTHING, "memory layout of verl's FSDP workers: "
         "trainer.strategy and trainer.dtype decide ours", no_effect=True),
    Rule("actor_rollout_ref.actor.checkpoint.*", NOTHING, "checkpoints always hold the model, optimizer and "
         "extra state", no_effect=True),
    Rule("actor_rollout_ref.actor.use_torch_compile", NOTHING, "not compiled here", no_effect=True),
    Rule("actor_rollout_ref.actor.entropy_from_logits_with_chunking", NOTHING, "a memory layout of verl's entropy: "
         "log-probs and entropy are chunked by trainer.logprob_chunk_tokens here", no_effect=True),
    Rule("actor_rollout_ref.actor.entropy_checkpointing", NOTHING, "a memory layout of verl's entropy",
         no_effect=True),
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
         "engine (vLLM tensor parallelism); read with trainer.n_gpus_per_node for the GPU split", derived=True),
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
    Rule("trainer.nnodes", ("trainer.num_workers", "explorer.num_engines"), "with n_gpus_per_node: the job's GPUs",
         derived=True),
    Rule("trainer.n_gpus_per_node", ("trainer.num_workers", "explorer.num_engines", "trainer.gpus_per_worker",
                                     "explorer.gpus_per_engine", "reward.model.num_gpus"),
         "G = nnodes x n_gpus_per_node GPUs for the whole job, engines of tensor_model_parallel_size GPUs each: "
         "verl time-shares every GPU between actor and rollout; here both run at once, so about half the GPUs "
         "go to engines (at least one) and the rest to trainer workers, a GPU each (one GPU: half each); a reward "
         "model takes one GPU out of the split (G >= 3) or a quarter of the one GPU; trainer.device cpu: one of "
         "each, no GPU. `config-convert` prints the split", derived=True),
    Rule("trainer.device", ("trainer.device",), "cuda or cpu; verl's default cuda is cpu for a job of no GPUs "
         "(nnodes x n_gpus_per_node = 0)", _device),
    Rule("trainer.save_freq", ("trainer.save_interval",), "-1 = only at the end (0)",
         _never_is_zero("trainer.save_interval")),
    Rule("trainer.test_freq", ("explorer.eval_interval",), "-1 = never (0)", _never_is_zero("explorer.eval_interval")),
    Rule("trainer.val_before_train", NOTHING, "evaluation runs before the first step whenever eval_interval > 0",
         no_effect=True),
    Rule("trainer.critic_warmup", NOTHING, "critic-only warm-up steps", _only((0,), "critic warm-up steps")),
    Rule("trainer.default_local_dir", ("checkpoint_root_dir", "run_dir"), "the run directory: "
         "<root>/<project>/<experiment> -> checkpoint_root_dir root; any other folder -> run_dir", _default_local_dir),
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

VERL_READ_DEFAULTS: dict[str, Any] = {
    "algorithm.filter_groups.metric": "acc",
    "actor_rollout_ref.actor.optim.warmup_style": "constant",
}
"""Fallbacks for the keys converters read that verl's composed defaults leave out or null (``filter_groups`` is
DAPO's; ``warmup_style`` gave way to ``lr_scheduler_type``); every other default is verl's composed config's
(``verl_compose.default_leaves``)."""


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
    """(verl key, value, reason): keys set to other than verl's default with no counterpart here."""
    at_default: list[tuple[str, Any, str]] = field(default_factory=list)
    """(verl key, value, reason): keys at verl's default with no counterpart here (recorded, not refused)."""
    entry: str = DEFAULT_ENTRY
    """The verl entry point whose composed defaults were used."""
    split: GpuSplit | None = None
    """How the job's GPUs are used here."""

    def nested(self) -> dict[str, Any]:
        """``native`` as nested sections (what a YAML config of ours holds)."""
        return nest(self.native)

    def report(self) -> dict[str, Any]:
        """What the run directory keeps (``verl_translation.yaml``)."""
        return {"applied": [{"verl": k, "value": v, "set": s} for k, v, s in self.applied],
                "no_effect": [{"verl": k, "value": v, "why": s} for k, v, s in self.no_effect],
                "ignored_unmapped": [{"verl": k, "value": v, "why": s} for k, v, s in self.unmapped],
                "at_default_without_counterpart": [{"verl": k, "value": v, "why": s}
                                                   for k, v, s in self.at_default]}


def is_verl_config(tree: Any) -> bool:
    """True when a config file's top level has a section only verl configs have."""
    return isinstance(tree, dict) and any(k in tree for k in VERL_ONLY_SECTIONS)


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


def translate(tree: dict[str, Any] | None, source: str | Path | None = None, allow_unmapped: bool = False,
              overrides: list[str] | tuple[str, ...] = (), entry: str = DEFAULT_ENTRY) -> Translation:
    """Translate a verl config into our dotted keys: the config verl would run (``entry``'s composed defaults, the
    file's ``tree`` over them, the Hydra ``overrides``, interpolations resolved: ``verl_compose.compose``), key by
    key through ``RULES``. Raises ConfigError naming every key set to other than verl's default that has no
    counterpart here (unless ``allow_unmapped``), and any two such keys that set one of ours to different values.

    Two layers: what the keys at verl's defaults set, then what the keys the file or overrides change set over
    it; so a changed key wins over a default, and only two changed keys can conflict. A key at verl's default
    with no counterpart here is recorded (``at_default``), not refused: verl's defaults are not the user's
    choice. Then verl's meaning (``_verl_meaning``): on-policy ``sync``, old log-probs recomputed, checkpoints
    kept as verl keeps them."""
    src = Path(source) if source is not None else None
    raw, composed = compose_raw(tree, overrides, entry, str(src) if src else "")
    leaves = {k: v for k, v in tree_leaves(composed) if k}
    view = View(leaves, src, default_leaves(entry), _changed(raw, leaves, entry))
    out = Translation(entry=entry)
    defaults: dict[str, Any] = {}
    """Layer 1: what the keys at verl's defaults set."""
    given: dict[str, Any] = {}
    """Layer 2: what the keys the file or overrides change set."""
    set_by: dict[str, str] = {}
    """Our key in ``given`` -> the verl key that set it (named when another one disagrees)."""
    for key, value in leaves.items():
        if not view.given(key):
            defaults.update(_convert(key, value, view, out, given=False))
            continue
        for nk, nv in _convert(key, value, view, out, given=True).items():
            if nk in given and given[nk] != nv:
                raise ConfigError(f"verl config: '{key}' ({value!r}) and '{set_by[nk]}' "
                                  f"({leaves[set_by[nk]]!r}) both set '{nk}' to different values; keep one")
            given[nk], set_by[nk] = nv, key
    out.native = {**defaults, **given}
    _derive(out, view)
    _verl_meaning(out, view)
    if out.unmapped and not allow_unmapped:
        lines = "; ".join(f"{k} = {v!r} ({why})" for k, v, why in out.unmapped)
        raise ConfigError(f"verl config{f' {src}' if src else ''}: {len(out.unmapped)} key(s) have no counterpart "
                          f"here: {lines}. Remove them, or pass --allow-unmapped to run without them (they are "
                          "listed as ignored in the run directory); docs/verl.md lists every key")
    return out


def _changed(raw: dict[str, Any], leaves: dict[str, Any], entry: str) -> set[str]:
    """The keys the file or overrides changed: written other than verl's defaults write them. A key whose default
    is an interpolation (``actor.rollout_n: ${actor_rollout_ref.rollout.n}``) is changed only where its value is
    not what the interpolation gives in this config, so a config written out resolved (verl's ``--cfg job``)
    means the same as the short one it came from."""
    raw_defaults = default_raw_leaves(entry)
    following = [k for k, v in raw_defaults.items() if _is_interpolation(v)]
    tree = copy.deepcopy(raw)
    for key in following:
        node = tree
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node:
            node[leaf] = raw_defaults[key]
    as_following = dict(tree_leaves(resolve(tree, "verl config")))
    follows = set(following)
    changed = set()
    for key, value in tree_leaves(raw):
        if not key or (key in raw_defaults and raw_defaults[key] == value):
            continue
        parts = key.split(".")
        interpolated = any(".".join(parts[:i]) in follows for i in range(1, len(parts) + 1))  # a whole subtree too
        if interpolated and leaves.get(key) == as_following.get(key):
            continue
        changed.add(key)
    return changed


def _is_interpolation(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def _convert(key: str, value: Any, view: View, out: Translation, given: bool) -> dict[str, Any]:
    """What verl key ``key`` at ``value`` sets alone (our dotted keys -> values), recorded in ``out``'s report:
    applied, no effect, unmapped (``given``) or at verl's default without a counterpart. Derived keys and null
    (or {}) values set nothing here."""
    if value is None or value == "???" or (isinstance(value, dict) and not value):
        return {}  # null (or {}) in verl means unset; ??? is Hydra's "must be given"
    missing = out.unmapped if given else out.at_default
    rule = find_rule(key)
    if rule is None:
        missing.append((key, value, "no counterpart here"))
        return {}
    if rule.derived:
        return {}  # read where it counts: by another key's converter or by _derive
    if rule.no_effect:
        out.no_effect.append((key, value, rule.how))
        return {}
    try:
        values = rule.convert(value, view) if rule.convert else {rule.native[0]: value}
    except Unmapped as e:
        missing.append((key, value, str(e)))
        return {}
    except (TypeError, ValueError) as e:
        raise ConfigError(f"verl config: bad value for '{key}': {value!r} ({e})") from None
    if values:
        label = ", ".join(f"{k}={v!r}" for k, v in values.items())
        out.applied.append((key, value, label if given else f"{label} (verl's default)"))
    return values


def _derive(out: Translation, view: View) -> None:
    """Our keys set from several verl keys at once: total steps (and the warm-up ratio, which needs them), the GPU
    split, DAPO's generation batch."""
    if view.get("trainer.total_training_steps") is not None:
        steps = int(view.get("trainer.total_training_steps"))
        how = "trainer.total_training_steps"
    else:
        epochs = int(view.get("trainer.total_epochs"))
        files = out.native.get("explorer.taskset.files") or [out.native.get("explorer.taskset.path")]
        rows = _rows(files)
        if rows is None:
            raise ConfigError("verl config: the run's length comes from trainer.total_epochs x the training files' "
                              "rows / data.train_batch_size, and data.train_files names no readable file "
                              f"({', '.join(str(f) for f in files)}); set trainer.total_training_steps or "
                              "data.train_files")
        steps = epochs * max(1, rows // int(view.get("data.train_batch_size")))  # verl drops the last partial batch
        of = f" of {len(files)} files" if len(files) > 1 else ""
        how = f"trainer.total_epochs {epochs} x {rows} rows{of} // data.train_batch_size"
    out.native["trainer.total_steps"] = steps
    out.applied.append(("(derived)", steps, f"trainer.total_steps={steps} from {how}"))
    ratio = float(view.get("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio") or 0.0)
    if int(view.get("actor_rollout_ref.actor.optim.lr_warmup_steps")) < 0 and ratio > 0:
        warmup = int(ratio * steps)
        out.native["trainer.optimizer.warmup_steps"] = warmup
        out.applied.append(("(derived)", warmup, f"trainer.optimizer.warmup_steps={warmup} from "
                                                  f"lr_warmup_steps_ratio {ratio} x {steps} steps"))
    try:
        split = gpu_split(view)
    except Unmapped as e:
        (out.unmapped if view.given("trainer.n_gpus_per_node") or view.given("trainer.nnodes") or
         view.given("actor_rollout_ref.rollout.tensor_model_parallel_size") else out.at_default).append(
            ("trainer.n_gpus_per_node", view.get("trainer.n_gpus_per_node"), str(e)))
    else:
        out.native.update(split.native)
        out.split = split
        out.applied.append(("(derived)", split.total, split.describe()))
    if out.native.get("trainer.lora.enabled") and out.native.get("trainer.strategy") == "fsdp2":
        out.native["trainer.strategy"] = "ddp"
        out.applied.append(("(derived)", "ddp", "trainer.strategy='ddp': LoRA trains with DDP here (the frozen base "
                                                "replicated, only the small adapters reduced); FSDP2 with LoRA is "
                                                "not supported"))
    gen = view.get("data.gen_batch_size")
    train = int(view.get("data.train_batch_size"))
    if gen is not None and int(gen) != train:
        n = int(view.get("actor_rollout_ref.rollout.n"))
        out.native["explorer.batch_size"] = int(gen)
        out.native["trainer.batch_size"] = train * n
        out.applied.append(("data.gen_batch_size", gen, f"explorer.batch_size={gen} prompts generated per step, "
                                                         f"trainer.batch_size={train * n} (train_batch_size {train}"
                                                         f" x rollout.n {n}) experiences trained per step"))


def _verl_meaning(out: Translation, view: View) -> None:
    """What verl does that our defaults do otherwise: verl's PPO is on-policy (generate, then train on exactly that
    batch: ``mode: sync``), recomputes the old policy's log-probs with the actor, and keeps every checkpoint when
    ``max_actor_ckpt_to_keep`` is null. A config without ``rollout.name`` (which verl requires) gets vLLM on GPUs,
    the hf engine on the CPU. An override of ours after the file changes any of them
    (``mode=async``)."""
    meaning: dict[str, Any] = {"mode": "sync", "algorithm.off_policy.recompute_old_log_probs": True}
    if "explorer.engine" not in out.native:  # verl requires rollout.name (???): its scripts name vllm on GPUs
        meaning["explorer.engine"] = "vllm" if out.split is not None and out.split.total else "hf"
    if view.get("trainer.max_actor_ckpt_to_keep") is None:
        meaning["trainer.keep_checkpoints"] = 0
    for key, value in meaning.items():
        out.native[key] = value
        out.applied.append(("(verl)", value, f"{key}={value!r} as in verl"))


def _rows(paths: list[str | None]) -> int | None:
    """The rows of the training files together (verl trains on their concatenation); None when one of them cannot
    be read."""
    import pyarrow.parquet as pq

    total = 0
    for path in paths:
        if not path or not Path(path).is_file():
            return None
        try:
            total += pq.ParquetFile(path).metadata.num_rows
        except Exception:  # not Parquet: load_taskset says why, later
            return None
    return total


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

EXAMPLE_SUMMARY = ("# mode sync, as verl's PPO (generate, then train on exactly that batch; old log-probs recomputed); "
                   "mode=async lets the explorer generate while the trainer trains, up to synchronizer.max_staleness=1 "
                   "version(s) behind; GPUs: 8 (trainer 4 worker(s) x 1 GPU, 2 engine(s) x 2 GPU (tensor parallel 2); "
                   "side by side; 8 of 8 used)")
"""What ``config-convert --verl`` says of verl's run_qwen2-7b.sh (docs/verl.md's example; tests/config/
test_verl_launch.py checks it against the conversion)."""


def render_docs() -> str:
    """docs/verl.md: how to bring a verl config, data set and reward function, and the whole key table."""
    defaults = default_leaves()
    rows = []
    for r in RULES:
        ours = ", ".join(f"`{k}`" for k in r.native) or "-"
        default = defaults.get(r.verl, VERL_READ_DEFAULTS.get(r.verl))
        rows.append(f"| `{r.verl}` | {ours} | {r.kind} | {r.how}{f' (verl default {default!r})' if default is not None else ''} |")
    return "\n".join([
        "# Coming from verl",
        "",
        "<!-- Generated from trinity_like/config/verl.py by `python -m trinity_like.config.verl`; do not edit by hand. -->",
        "",
        "`trinity-like run verl_config.yaml` accepts a verl-shaped config (sections `data`, `algorithm`,",
        "`actor_rollout_ref`, `critic`, `trainer`, `reward_model`, `custom_reward_function`), and `trinity-like run",
        "--verl [FILE] [verl.trainer.main_ppo | recipe.dapo.main_dapo] key=value ...` a verl launch command line as",
        "verl's example scripts write it (replace `python3 -m` with `trinity-like run --verl`). The config is built",
        "as verl builds it: verl's composed defaults (its `ppo_trainer.yaml` with its `defaults:` groups merged;",
        "DAPO's `dapo_trainer.yaml` over it for `recipe.dapo.main_dapo`), the file, the overrides in Hydra's grammar",
        "(`key=value`, `+key=value` adds, `~key` deletes), then the `${...}` interpolations (`oc.select`, `oc.env`)",
        "resolved; it is then translated key by key through the table below. Overrides whose key only our config",
        "has (`mode=async`, `synchronizer.max_staleness=2`, `explorer.*`) apply after the translation.",
        "`trinity-like config-convert [--verl] ...` prints the equivalent config of ours, the mode and how the GPUs",
        "are split. A key set to other than verl's default with no counterpart here is refused, all of them named",
        "in one message; with `--allow-unmapped` the run goes on without them and lists them in the run directory",
        "(`verl_translation.yaml`, which also records every key applied, every key accepted without effect and",
        "verl's defaults that have no counterpart).",
        "",
        "Same meaning as in verl: every key the file omits takes verl's default (right column); verl counts prompts",
        "where we count experiences (`ppo_mini_batch_size` x `rollout.n`); `-1` for never / off becomes `0`. verl's",
        "PPO is on-policy, so a verl config runs `mode: sync` (generate, then train on exactly that batch) with the",
        "old policy's log-probs recomputed by the trainer (`algorithm.off_policy.recompute_old_log_probs`), and",
        "`trainer.max_actor_ckpt_to_keep: null` keeps every checkpoint. Going async is one override:",
        "`mode=async` (the explorer then generates while the trainer trains, at most `synchronizer.max_staleness`",
        "versions behind). GPUs: `nnodes x n_gpus_per_node` for the whole job, each engine over",
        "`tensor_model_parallel_size` of them; verl time-shares every GPU between actor and rollout, here the two",
        "keep GPUs of their own, split as the `trainer.n_gpus_per_node` row says (`run` and `config-convert` print",
        "the split). `trainer.default_local_dir` is the run directory (any folder).",
        "",
        "Data: `data.train_files` / `val_files` in verl's Parquet format (a `prompt` column of chat messages,",
        "`data_source`, `reward_model.ground_truth`, `extra_info`) are read as task sets, the prompt rendered by the",
        "tokenizer's chat template. Rewards: without `custom_reward_function.path`, each sample is scored by the",
        "rule of its `data_source` as verl dispatches it (`openai/gsm8k`, the MATH sets, `math_dapo`, `aime*`, ...;",
        "a data source with no rule stops the run at start-up, saying so). `custom_reward_function.path` / `name`",
        "takes verl's per-sample `compute_score(data_source, solution_str, ground_truth, extra_info)` (or any subset",
        "such as verl's own `gsm8k.compute_score(solution_str, ground_truth)`: it gets the arguments it names) and",
        "the batched `compute_score(responses, ground_truths, **kwargs) -> list[float]`. `reward_model.enable` with",
        "`reward_model.model.path` serves that sequence-classification model in its own actor; as in verl its score",
        "replaces the function's (`reward.model.combine: add` sums them instead). A reward that fails on every",
        "sample of a step, or on more than `reward.max_failure_frac` of them, stops the run with the reason.",
        "",
        "## One of verl's scripts, here",
        "",
        "verl's `examples/grpo_trainer/run_qwen2-7b.sh` (GRPO on gsm8k, Qwen2-7B-Instruct, 8 GPUs) runs",
        "",
        "```bash",
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \\",
        "    data.train_files=$HOME/data/gsm8k/train.parquet data.val_files=$HOME/data/gsm8k/test.parquet \\",
        "    data.train_batch_size=1024 data.max_prompt_length=512 data.max_response_length=1024 \\",
        "    actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct actor_rollout_ref.actor.optim.lr=1e-6 \\",
        "    ... (37 overrides in all) ... \\",
        "    actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=vllm \\",
        "    actor_rollout_ref.rollout.n=5 trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.total_epochs=15",
        "```",
        "",
        "Here the same line runs with `python3 -m` replaced (the data files are those of verl's",
        "`examples/data_preprocess/gsm8k.py`; `data_source: openai/gsm8k` is scored by verl's gsm8k rule):",
        "",
        "```bash",
        "trinity-like run --verl verl.trainer.main_ppo algorithm.adv_estimator=grpo ... trainer.total_epochs=15",
        "trinity-like config-convert --verl verl.trainer.main_ppo algorithm.adv_estimator=grpo ...   # what it becomes",
        "```",
        "",
        "`config-convert` prints the config of ours (`explorer.batch_size: 1024` prompts x `repeat_times: 5`,",
        "`trainer.mini_batch_size: 1280` experiences, `total_steps: 105` = 15 epochs x 7,473 rows // 1,024,",
        "`engine: vllm`, `vllm.max_num_seqs: 256` and `gpu_memory_utilization: 0.6` as verl has them, `mode: sync`,",
        "`keep_checkpoints: 0`) and ends:",
        "",
        "```",
        EXAMPLE_SUMMARY,
        "# 126 of verl's defaults have no counterpart here (none changed by this config; a run lists them in "
        "verl_translation.yaml)",
        "```",
        "",
        "`trinity-like run --verl verl.trainer.main_ppo ... mode=async` runs it async instead (`mode` is a key only",
        "ours has, so it applies after the translation).",
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
