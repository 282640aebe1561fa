"""Trinity-RFT's config keys, one rule each: what each sets here, or why it is refused or has no effect.

Every field of Trinity-RFT's ``Config`` (``trinity/common/config.py`` at 9051d63: every dataclass field reachable
from ``Config``) is named by a rule, exactly or under a section rule (``section.*``). Keys are written in a
normalised form: a list item is ``[]`` (``model.lora_configs[].lora_rank``), a named entry of a dict section is
``<name>``, and three families share their rules:

- ``<taskset>.KEY``: ``buffer.explorer_input.taskset.KEY``, ``buffer.explorer_input.tasksets[].KEY`` and
  ``buffer.explorer_input.eval_tasksets[].KEY`` (Trinity's ``TasksetConfig``);
- ``<buffer>.KEY``: ``buffer.trainer_input.experience_buffer.KEY`` and
  ``buffer.trainer_input.auxiliary_buffers.<name>.KEY`` (Trinity's ``ExperienceBufferConfig``);
- ``trainer.trainer_config.*``: verl keys, translated by ``trinity_like.config.verl``'s rules.

Kinds (as in docs/verl.md): *mapped* sets keys of ours; *checked* is accepted at the values that behave like ours
(any other is refused with the reason); *derived* is read with other keys by ``trinity.derive`` (modes, batch
sizes, the run's length, the GPU split, the task sets, the stages); *no effect* is accepted and recorded with the
reason. A converter raises ``Unmapped`` with the reason for a value that has no counterpart here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NOTHING: tuple[str, ...] = ()


class Unmapped(Exception):
    """Raised by a converter: this value has no counterpart here (the message says why and what would do)."""


Convert = Callable[[Any], dict[str, Any]]


@dataclass(frozen=True)
class Rule:
    key: str
    """A Trinity key in the normalised form (module docstring), or ``prefix.*`` for every key under it."""
    native: tuple[str, ...]
    """Our keys it sets or feeds (for the docs)."""
    how: str
    """One line for docs/trinity.md and the translation report."""
    convert: Convert | None = None
    """value -> {our dotted key: value} (may raise Unmapped); None with ``kind`` mapped = copy to ``native[0]``."""
    kind: str = "mapped"
    """mapped, checked, derived or no effect."""
    whole: bool = False
    """The value is read whole (a dict of arguments, a verl section), never split into keys."""

    def __post_init__(self) -> None:
        if self.kind not in ("mapped", "checked", "derived", "no effect"):
            raise RuntimeError(f"trinity_rules: {self.key} has an unknown kind {self.kind!r}")
        if self.kind in ("derived", "no effect") and self.convert is not None:
            raise RuntimeError(f"trinity_rules: {self.key} is {self.kind} and has a converter")


def _copy(key: str, cast: Callable[[Any], Any] = lambda v: v) -> Convert:
    return lambda v: {key: cast(v)}


def _only(allowed: tuple[Any, ...], why: str) -> Convert:
    """Accepted at ``allowed`` values only (sets nothing); any other value is refused with ``why``."""
    def convert(v: Any) -> dict[str, Any]:
        if v not in allowed and not (isinstance(v, (dict, list)) and not v and ({} in allowed or [] in allowed)):
            raise Unmapped(why)
        return {}
    return convert


def _no(key: str, how: str, native: tuple[str, ...] = NOTHING, whole: bool = False) -> Rule:
    return Rule(key, native, how, kind="no effect", whole=whole)


def _derived(key: str, native: tuple[str, ...], how: str, whole: bool = False) -> Rule:
    return Rule(key, native, how, kind="derived", whole=whole)


def _checked(key: str, how: str, allowed: tuple[Any, ...], why: str, whole: bool = False) -> Rule:
    return Rule(key, NOTHING, how, _only(allowed, why), kind="checked", whole=whole)


def _betas(v: Any) -> dict[str, Any]:
    b1, b2 = v
    return {"trainer.optimizer.beta1": float(b1), "trainer.optimizer.beta2": float(b2)}


def _schedule(v: Any) -> dict[str, Any]:
    if v is None:
        return {}
    if v not in ("constant", "cosine"):
        raise Unmapped(f"learning-rate schedule {v!r}: the schedules here are constant and cosine")
    return {"trainer.optimizer.lr_schedule": v}


def _optimizer_type(v: Any) -> dict[str, Any]:
    if str(v).lower() not in ("adam", "adamw"):
        raise Unmapped(f"optimizer {v!r}: the optimizer here is AdamW (Trinity's adam and adamw are AdamW)")
    return {}


def _warmup_steps(v: Any) -> dict[str, Any]:
    return {} if int(v) < 0 else {"trainer.optimizer.warmup_steps": int(v)}  # -1: the ratio decides (derived)


def _monitor(v: Any) -> dict[str, Any]:
    known = ("tensorboard", "wandb", "mlflow")
    if v not in known:
        raise Unmapped(f"monitor {v!r}: the backends here are {', '.join(known)} (metrics.jsonl is always written)")
    return {"monitor.backends": [v]}


def _sync_method(v: Any) -> dict[str, Any]:
    if str(v).lower() not in ("nccl", "online", "checkpoint", "offline", "memory"):
        raise Unmapped(f"sync_method {v!r}: Trinity's methods are nccl, checkpoint and memory")
    return {}  # derived: nccl becomes broadcast or ipc by where the engines are (trinity._sync)


def _sync_style(v: Any) -> dict[str, Any]:
    if str(v).lower() not in ("fixed", "trainer_driven", "explorer_driven", "dynamic_by_trainer",
                              "dynamic_by_explorer"):
        raise Unmapped(f"sync_style {v!r}: Trinity's styles are fixed, trainer_driven and explorer_driven")
    return {}


def _strategy(v: Any) -> dict[str, Any]:
    if v in ("fsdp", "fsdp2"):
        return {"trainer.strategy": "fsdp2"}  # our sharded strategy is FSDP2 (fully_shard)
    raise Unmapped(f"trainer_strategy {v!r}: the strategies here are ddp and fsdp2 (Trinity's fsdp and fsdp2 map "
                   "to fsdp2; Megatron is not supported)")


def _keep(v: Any) -> dict[str, Any]:
    return {"trainer.keep_checkpoints": 0 if v is None else int(v)}


def _engine_num(v: Any) -> dict[str, Any]:
    return {"explorer.num_engines": int(v)}


def _dtype(v: Any) -> dict[str, Any]:
    names = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16", "half": "float16",
             "float32": "float32", "fp32": "float32", "float": "float32", "auto": "auto"}
    if str(v) not in names:
        raise Unmapped(f"dtype {v!r}: the engines' dtypes here are auto, bfloat16, float16, float32")
    return {"explorer.dtype": names[str(v)]}


def _over_rollout(v: Any) -> dict[str, Any]:
    ratio = float(v)
    if not 0.0 <= ratio < 1.0:
        raise Unmapped(f"over_rollout.ratio {v!r} must be in [0, 1)")
    return {"explorer.over_rollout_frac": round(1.0 - ratio, 6)}


def _lora_rank(v: Any) -> dict[str, Any]:
    if int(v) <= 0:
        return {"trainer.lora.enabled": False}
    return {"trainer.lora.enabled": True, "trainer.lora.r": int(v)}


def _target_modules(v: Any) -> dict[str, Any]:
    if v == "all-linear":
        return {"trainer.lora.target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj"]}
    return {"trainer.lora.target_modules": [v] if isinstance(v, str) else list(v)}


def _eval_on_startup(v: Any) -> dict[str, Any]:
    if not v:
        raise Unmapped("eval_on_startup false: evaluation here always runs before the first step when "
                       "explorer.eval_interval > 0")
    return {}


def _selector(v: Any) -> dict[str, Any]:
    if v not in (None, "sequential", "shuffle", "random"):
        raise Unmapped(f"data selector {v!r}: tasks here are drawn in a seeded shuffled order (Trinity's "
                       "sequential, shuffle and random readers are accepted; difficulty-based selectors are not)")
    return {}


def _storage(what: str, allowed: tuple[str, ...]) -> Convert:
    def convert(v: Any) -> dict[str, Any]:
        if str(v).lower() not in allowed:
            raise Unmapped(f"{what} of storage_type {v!r}: here {' or '.join(allowed)}")
        return {}
    return convert


def _prompt_type(v: Any) -> dict[str, Any]:
    if str(v).lower() not in ("messages", "plaintext", "chatpair"):
        raise Unmapped(f"prompt_type {v!r}: the formats here are messages, plaintext and chatpair")
    return {}


RULES: tuple[Rule, ...] = (
    # ---- the run
    _derived("mode", ("mode",), "both -> sync (sync_interval 1, sync_offset 0, style fixed) or async (max_staleness "
             "= sync_interval - 1 + sync_offset); explore / train -> async with --role explorer / trainer (the two "
             "jobs meet in one run directory); train on a file of SFT or DPO data -> offline; bench -> `trinity-like "
             "bench`; serve -> `trinity-like serve`; colocate -> sync with trainer and engine sharing one GPU"),
    Rule("project", ("project",), "same"),
    _derived("group", ("run_dir",), "Trinity's job folder is <checkpoint_root_dir>/<project>/<group>/<name>: a group "
             "sets run_dir to it"),
    Rule("name", ("name",), "same"),
    _derived("checkpoint_root_dir", ("checkpoint_root_dir",), "same (empty: the working directory, as Trinity)"),
    _no("checkpoint_job_dir", "Trinity sets it (<checkpoint_root_dir>/<project>/<name>): the run directory here"),
    _checked("ray_namespace", "the Ray namespace here is <project>/<name>, Trinity's default",
             (None, ""), "a Ray namespace other than <project>/<name>: roles meet in <project>/<name> here"),
    _no("continue_from_checkpoint", "a run continues from its checkpoint with `trinity-like run --resume`; without "
        "it a run directory that holds a run is refused"),
    _no("ignore_validator_suggestions", "Trinity's GPU-memory estimate; start-up checks here refuse what cannot run"),
    # ---- algorithm
    _derived("algorithm.algorithm_type", ("algorithm.*",), "Trinity's algorithm table "
             "(trinity_like/algorithms/trinity_algorithms.py): its advantage, losses and defaults"),
    Rule("algorithm.repeat_times", ("explorer.repeat_times",), "samples per task (one group)", _copy(
        "explorer.repeat_times", int)),
    Rule("algorithm.optimizer.lr", ("trainer.optimizer.lr",), "same", _copy("trainer.optimizer.lr", float)),
    Rule("algorithm.optimizer.lr_warmup_steps", ("trainer.optimizer.warmup_steps",), "same (-1: from the ratio)",
         _warmup_steps),
    _derived("algorithm.optimizer.lr_warmup_steps_ratio", ("trainer.optimizer.warmup_steps",), "x the run's trainer "
             "steps, when lr_warmup_steps is -1"),
    Rule("algorithm.optimizer.min_lr_ratio", ("trainer.optimizer.min_lr_ratio",), "floor of the cosine schedule",
         _copy("trainer.optimizer.min_lr_ratio", float)),
    Rule("algorithm.optimizer.warmup_style", ("trainer.optimizer.lr_schedule",), "Trinity's deprecated name of "
         "lr_scheduler_type", _schedule),
    Rule("algorithm.optimizer.lr_scheduler_type", ("trainer.optimizer.lr_schedule",), "constant or cosine",
         _schedule),
    Rule("algorithm.optimizer.optimizer_type", NOTHING, "adam / adamw: AdamW, as Trinity's FSDP trainer uses",
         _optimizer_type, kind="checked"),
    Rule("algorithm.optimizer.betas", ("trainer.optimizer.beta1", "trainer.optimizer.beta2"), "same", _betas),
    Rule("algorithm.optimizer.weight_decay", ("trainer.optimizer.weight_decay",), "same (decoupled, AdamW)",
         _copy("trainer.optimizer.weight_decay", float)),
    _no("algorithm.optimizer.clip_grad", "Trinity's FSDP actor clips by trainer.grad_clip (clip_grad is read by "
        "Megatron only)"),
    *(_derived(f"algorithm.{k}", ("algorithm.*",), "Trinity's algorithm table "
               "(trinity_like/algorithms/trinity_algorithms.py)", whole=k.endswith("_args"))
      for k in ("sample_strategy", "sample_strategy_args", "advantage_fn", "advantage_fn_args", "kl_penalty_fn",
                "kl_penalty_fn_args", "policy_loss_fn", "policy_loss_fn_args", "kl_loss_fn", "kl_loss_fn_args",
                "entropy_loss_fn", "entropy_loss_fn_args", "loss_agg_mode")),
    # ---- model
    Rule("model.model_path", ("model.path",), "same"),
    _checked("model.trust_remote_code", "models load without remote code", (False,),
             "trust_remote_code: models load without remote code here"),
    _derived("model.critic_model_path", NOTHING, "must be empty or model_path: the critic here is the policy's "
             "backbone with a value head"),
    _derived("model.custom_chat_template", ("explorer.taskset.format.chat_template",), "every task set's "
             "format.chat_template that sets none (as Trinity)"),
    _derived("model.chat_template_path", ("explorer.taskset.format.chat_template",), "the file's text, as "
             "custom_chat_template"),
    _derived("model.temperature", ("explorer.sampling.temperature",), "a task set's rollout_args.temperature when "
             "it sets none"),
    _derived("model.top_p", ("explorer.sampling.top_p",), "a task set's rollout_args.top_p when it sets none"),
    _derived("model.top_k", ("explorer.sampling.top_k",), "a task set's rollout_args.top_k when it sets none (-1 = "
             "off = 0)"),
    _no("model.logprobs", "behaviour log-probs of the sampled tokens are always kept; no top-k alternatives"),
    _derived("model.max_model_len", ("explorer.vllm.max_model_len",), "with max_prompt_tokens and "
             "max_response_tokens, as Trinity completes them (the missing one = max_model_len minus the other; "
             "both missing: half each)"),
    _derived("model.max_prompt_tokens", ("explorer.max_prompt_tokens",), "longest prompt (see max_model_len)"),
    _derived("model.max_response_tokens", ("explorer.sampling.max_new_tokens",), "longest response (see "
             "max_model_len)"),
    _checked("model.min_response_tokens", "no minimum response length here", (0,),
             "min_response_tokens: responses here end at EOS, with no minimum length"),
    _derived("model.enable_prompt_truncation", ("explorer.filter_overlong_prompts", "explorer.max_prompt_tokens"),
             "true: a task whose prompt is over max_prompt_tokens is dropped when the task sets load (Trinity makes "
             "it a masked-out sample of reward 0: no gradient either way); false: no prompt limit"),
    _checked("model.repetition_penalty", "sampling is plain temperature / top-p / top-k", (1, 1.0),
             "repetition_penalty: the engines here sample without a repetition penalty"),
    _derived("model.enable_thinking", ("explorer.taskset.format.enable_thinking",), "every task set's "
             "format.enable_thinking that sets none"),
    Rule("model.lora_configs[].lora_rank", ("trainer.lora.enabled", "trainer.lora.r"), "LoRA on when > 0 (one "
         "adapter)", _lora_rank),
    Rule("model.lora_configs[].lora_alpha", ("trainer.lora.alpha",), "same", _copy("trainer.lora.alpha", int)),
    Rule("model.lora_configs[].target_modules", ("trainer.lora.target_modules",), "a list, or all-linear (the "
         "attention and MLP projections)", _target_modules),
    _checked("model.lora_configs[].path", "an adapter to start from", (None, ""),
             "lora path: training starts from fresh adapters here"),
    _checked("model.lora_configs[].exclude_modules", "modules left out of LoRA", (None, ""),
             "exclude_modules: list target_modules instead"),
    _no("model.lora_configs[].name", "one adapter, merged into the weights the engines get"),
    _no("model.lora_configs[].base_model_name", "one adapter, merged into the weights the engines get"),
    _no("model.lora_configs[].lora_dtype", "adapters train in the trainer's dtype"),
    _no("model.lora_configs[].is_dummy", "Trinity sets it"),
    _no("model.fully_sharded_loras", "vLLM's LoRA serving: the engines get merged weights here"),
    _no("model.max_cpu_loras", "vLLM's LoRA serving: the engines get merged weights here"),
    _checked("model.rope_scaling", "the model's own RoPE", (None, {}), "rope_scaling: edit the model's config.json",
             whole=True),
    _checked("model.rope_theta", "the model's own RoPE", (None,), "rope_theta: edit the model's config.json"),
    _checked("model.tinker.enable", "Tinker's hosted training", (False,),
             "Tinker (a hosted trainer) is not supported: training runs here"),
    _no("model.tinker.*", "read only with tinker.enable"),
    Rule("model.external_model.enable", ("explorer.engine",), "true: engine external (bench only)",
         lambda v: {"explorer.engine": "external"} if v else {}),
    Rule("model.external_model.base_url_env", ("explorer.external_model.base_url_env",), "same"),
    Rule("model.external_model.api_key_env", ("explorer.external_model.api_key_env",), "same"),
    Rule("model.external_model.model_name", ("explorer.external_model.model_name",), "same",
         lambda v: {"explorer.external_model.model_name": v or ""}),
    # ---- cluster
    _no("cluster.ray_address", "Ray is joined as ray.init() does (RAY_ADDRESS, the `ray start` cluster of this "
        "node), or at `run --address`"),
    _derived("cluster.node_num", ("trainer.num_workers", "explorer.num_engines", "trainer.gpus_per_worker",
                                  "explorer.gpus_per_engine"),
             "with gpu_per_node: the job's GPUs (0: the GPUs of this node, as Trinity detects them); the engines "
             "take engine_num x tensor_parallel_size, the trainer the rest (one worker per GPU); one GPU (or "
             "colocate): trainer and engine half each; none: all on the CPU"),
    _derived("cluster.gpu_per_node", ("trainer.num_workers",), "see cluster.node_num"),
    *(_no(f"cluster.{k}", "Trinity computes it from node_num and gpu_per_node")
      for k in ("total_gpu_num", "rollout_gpu_num", "auxiliary_model_gpu_num", "explorer_gpu_num",
                "trainer_gpu_num", "trainer_node_num", "trainer_gpu_num_per_node")),
    # ---- buffer: sizes and length
    _derived("buffer.batch_size", ("explorer.batch_size",), "tasks per explorer step (train mode without it: "
             "train_batch_size / repeat_times)"),
    _derived("buffer.train_batch_size", ("trainer.batch_size",), "experiences per trainer step (0: batch_size x "
             "repeat_times); SFT: records per step; DPO: pairs per step (x 2 experiences)"),
    _derived("buffer.total_epochs", ("trainer.total_steps",), "epochs x the task set's rows // batch_size explorer "
             "steps, in trainer steps (rows counted from the local file)"),
    _derived("buffer.total_steps", ("trainer.total_steps",), "explorer steps, in trainer steps (wins over "
             "total_epochs)"),
    # ---- task sets (<taskset>: taskset, tasksets[], eval_tasksets[])
    _derived("<taskset>.name", ("explorer.eval_tasksets.name",), "an eval set's name in the metrics"),
    Rule("<taskset>.storage_type", NOTHING, "file (task sets are read from files or Hugging Face data sets)",
         _storage("a task set", ("file",)), kind="checked"),
    _derived("<taskset>.path", ("explorer.taskset.path",), "same (a local file or folder, or a Hugging Face data "
             "set name)"),
    _derived("<taskset>.split", ("explorer.taskset.split",), "same"),
    _derived("<taskset>.subset_name", ("explorer.taskset.subset_name",), "same"),
    _derived("<taskset>.default_workflow_type", ("explorer.taskset.workflow",), "the set's workflow, by Trinity's "
             "name"),
    _derived("<taskset>.default_reward_fn_type", ("explorer.taskset.reward_fn",), "the set's reward function, by "
             "Trinity's name"),
    _derived("<taskset>.workflow_args", ("explorer.taskset.workflow_args",), "same", whole=True),
    _derived("<taskset>.reward_fn_args", ("explorer.taskset.reward_fn_args",), "same", whole=True),
    _derived("<taskset>.rollout_args.temperature", ("explorer.sampling.temperature",), "training set: the sampling "
             "temperature; eval set: its temperature"),
    _derived("<taskset>.rollout_args.top_p", ("explorer.sampling.top_p",), "training set only (an eval set samples "
             "with the training set's top_p)"),
    _derived("<taskset>.rollout_args.top_k", ("explorer.sampling.top_k",), "training set only (-1 = off = 0)"),
    _no("<taskset>.rollout_args.logprobs", "behaviour log-probs of the sampled tokens are always kept"),
    _derived("<taskset>.rollout_args.max_tokens", ("explorer.sampling.max_new_tokens",), "training set: the "
             "longest response (else model.max_response_tokens)"),
    _no("<taskset>.rollout_args.n", "Trinity sets it from algorithm.repeat_times / the eval set's repeat_times"),
    Rule("<taskset>.task_selector.selector_type", NOTHING, "Trinity's deprecated name of data_selector",
         _selector, kind="checked"),
    _no("<taskset>.task_selector.*", "read with task_selector.selector_type"),
    Rule("<taskset>.data_selector.selector_type", NOTHING, "sequential / shuffle / random: tasks are drawn in a "
         "seeded shuffled order here", _selector, kind="checked"),
    _no("<taskset>.data_selector.seed", "the run's seed orders the tasks"),
    _checked("<taskset>.data_selector.feature_keys", "difficulty features", (None, []),
             "data_selector.feature_keys: difficulty-based selection is not supported"),
    _checked("<taskset>.data_selector.kwargs", "difficulty features", (None, {}),
             "data_selector.kwargs: difficulty-based selection is not supported", whole=True),
    Rule("<taskset>.format.prompt_type", ("explorer.taskset.format.prompt_type",), "same names", _prompt_type,
         kind="checked"),
    *(_derived(f"<taskset>.format.{k}", (f"explorer.taskset.format.{k}",), "same")
      for k in ("prompt_key", "response_key", "system_prompt_key", "system_prompt", "messages_key", "tools_key",
                "reply_prefix", "workflow_key", "reward_fn_key", "chosen_key", "rejected_key", "chat_template",
                "enable_thinking")),
    _checked("<taskset>.format.image_key", "multi-modal rows", (None, ""),
             "image_key: multi-modal (vision) tasks are not supported"),
    _checked("<taskset>.format.video_key", "multi-modal rows", (None, ""),
             "video_key: multi-modal (video) tasks are not supported"),
    _checked("<taskset>.format.enable_concatenated_multi_turn", "multi-turn SFT rows", (False,),
             "enable_concatenated_multi_turn: multi-turn records train on their last assistant turn here"),
    _no("<taskset>.max_retry_times", "read only by Trinity's SQL storage"),
    _no("<taskset>.max_retry_interval", "read only by Trinity's SQL storage"),
    _no("<taskset>.enable_progress_bar", "task sets load without a progress bar"),
    _derived("<taskset>.repeat_times", ("explorer.eval_tasksets.k",), "eval set: samples per task (k); a training "
             "set's is algorithm.repeat_times, as in Trinity"),
    _no("<taskset>.index", "Trinity sets it (its reader's position): a resumed run continues its own order"),
    *(_no(f"<taskset>.{k}", "Trinity sets it") for k in ("is_eval", "batch_size", "total_epochs", "total_steps",
                                                         "ray_namespace")),
    _derived("buffer.explorer_input.default_workflow_type", ("explorer.workflow",), "the workflow of every set "
             "that names none"),
    _derived("buffer.explorer_input.default_eval_workflow_type", ("explorer.eval_tasksets.workflow",), "the "
             "workflow of every eval set that names none"),
    _derived("buffer.explorer_input.default_reward_fn_type", ("explorer.taskset.reward_fn",), "the reward "
             "function of every set that names none"),
    # ---- experience buffers (<buffer>: experience_buffer, auxiliary_buffers.<name>)
    _no("<buffer>.name", "the run's buffer is <run_dir>/buffer"),
    _derived("<buffer>.storage_type", ("buffer.replay_sources",), "queue / sql (the explorer's output): the run's "
             "buffer; file (train mode): the data trained on (mode offline, buffer.replay_sources)"),
    _derived("<buffer>.path", ("buffer.replay_sources", "buffer.ingest.path"), "SFT or DPO data (storage file: a "
             "file, a folder, a hub id): buffer.replay_sources (mode train), or written into the run's buffer as "
             "source human (an auxiliary buffer, mix's expert data: buffer.ingest); a queue's or SQL database's path "
             "means nothing here (the buffer is <run_dir>/buffer)"),
    _no("<buffer>.capacity", "Trinity's queue counts the batches put in it, not rows; here the staleness bound "
        "(synchronizer.max_staleness) holds explorers back, and buffer.capacity bounds rows if wanted"),
    Rule("<buffer>.max_read_timeout", ("synchronizer.timeout_s",), "how long the trainer waits for experiences",
         _copy("synchronizer.timeout_s", float)),
    Rule("<buffer>.replay_buffer.enable", ("buffer.read_policy",), "true: read_policy replay (rows reused)",
         lambda v: {"buffer.read_policy": "replay"} if v else {}),
    _derived("<buffer>.replay_buffer.priority_fn", NOTHING, "replayed rows are taken newest first, each up to "
             "buffer.replay_max_uses times (a meaning difference is listed)"),
    _derived("<buffer>.replay_buffer.reuse_cooldown_time", ("buffer.replay_cooldown_steps",), "seconds here become "
             "no cooldown (ours counts trainer steps; a meaning difference is listed)"),
    _derived("<buffer>.replay_buffer.priority_fn_args", NOTHING, "read with priority_fn", whole=True),
    _no("<buffer>.max_retry_times", "read only by Trinity's SQL storage"),
    _no("<buffer>.max_retry_interval", "read only by Trinity's SQL storage"),
    _derived("<buffer>.split", ("buffer.replay_split",), "SFT / DPO data (mode train): same"),
    _derived("<buffer>.subset_name", ("buffer.replay_subset_name",), "SFT / DPO data (mode train): same"),
    _derived("<buffer>.format.prompt_type", ("buffer.replay_format.prompt_type",), "SFT / DPO data: same names "
             "(Trinity's default messages)"),
    *(_derived(f"<buffer>.format.{k}", (f"buffer.replay_format.{k}",), "SFT / DPO data: same")
      for k in ("prompt_key", "response_key", "system_prompt_key", "system_prompt", "messages_key", "tools_key",
                "reply_prefix", "chosen_key", "rejected_key", "chat_template", "enable_thinking",
                "enable_concatenated_multi_turn")),
    _no("<buffer>.format.workflow_key", "experiences carry no workflow"),
    _no("<buffer>.format.reward_fn_key", "experiences carry no reward function"),
    _checked("<buffer>.format.image_key", "multi-modal rows", (None, ""), "image_key: multi-modal data is not "
             "supported"),
    _checked("<buffer>.format.video_key", "multi-modal rows", (None, ""), "video_key: multi-modal data is not "
             "supported"),
    _no("<buffer>.enable_progress_bar", "files load without a progress bar"),
    Rule("<buffer>.data_selector.selector_type", NOTHING, "sequential / shuffle / random: rows are read in the "
         "buffer's read_policy order", _selector, kind="checked"),
    _no("<buffer>.data_selector.seed", "the run's seed"),
    _checked("<buffer>.data_selector.feature_keys", "difficulty features", (None, []),
             "data_selector.feature_keys: difficulty-based selection is not supported"),
    _checked("<buffer>.data_selector.kwargs", "difficulty features", (None, {}),
             "data_selector.kwargs: difficulty-based selection is not supported", whole=True),
    *(_no(f"<buffer>.{k}", "Trinity sets it") for k in ("schema_type", "index", "batch_size", "tokenizer_path",
                                                        "total_epochs", "total_steps", "ray_namespace")),
    _no("buffer.explorer_output.*", "Trinity sets it: the explorer writes the run's buffer"),
    _no("buffer.tokenizer_path", "Trinity sets it: the model's tokenizer"),
    _no("buffer.cache_dir", "Trinity sets it: <run_dir>/buffer"),
    # ---- explorer
    _no("explorer.name", "the explorer role's name"),
    _no("explorer.runner_per_model", "tasks of a step run concurrently on the engines as they admit them"),
    Rule("explorer.max_timeout", ("explorer.task_timeout_s",), "longest a task's workflow may run",
         _copy("explorer.task_timeout_s", float)),
    Rule("explorer.max_retry_times", ("explorer.max_retries",), "same", _copy("explorer.max_retries", int)),
    _checked("explorer.env_vars", "environment of the workflow runners", (None, {}),
             "env_vars: set them in the environment of the explorer job", whole=True),
    _no("explorer.concurrent_mode", "how Trinity's runners run a group; groups run concurrently here"),
    _no("explorer.max_repeat_times_per_runner", "how Trinity's runners split a group"),
    _no("explorer.runner_num", "deprecated in Trinity (runner_per_model)"),
    _no("explorer.rollout_model.model_path", "Trinity sets it from model.model_path"),
    _no("explorer.rollout_model.name", "the engine's name"),
    _checked("explorer.rollout_model.trust_remote_code", "models load without remote code", (False,),
             "trust_remote_code: models load without remote code here"),
    _derived("explorer.rollout_model.engine_type", ("explorer.engine",), "vllm -> vllm where the job has GPUs (the "
             "hf engine on the CPU), external -> external (bench); tinker is refused"),
    Rule("explorer.rollout_model.engine_num", ("explorer.num_engines",), "same", _engine_num),
    _derived("explorer.rollout_model.tensor_parallel_size", ("explorer.gpus_per_engine",), "GPUs per engine"),
    _no("explorer.rollout_model.use_v1", "vLLM's engine version is the installed one's"),
    Rule("explorer.rollout_model.enforce_eager", ("explorer.vllm.enforce_eager",), "same",
         _copy("explorer.vllm.enforce_eager", bool)),
    _no("explorer.rollout_model.enable_prefix_caching", "vLLM's own default (a speed setting: same samples)"),
    _no("explorer.rollout_model.enable_chunked_prefill", "vLLM's own default (a speed setting: same samples)"),
    Rule("explorer.rollout_model.gpu_memory_utilization", ("explorer.vllm.gpu_memory_utilization",), "same",
         _copy("explorer.vllm.gpu_memory_utilization", float)),
    Rule("explorer.rollout_model.dtype", ("explorer.dtype",), "same names", _dtype),
    Rule("explorer.rollout_model.seed", ("seed",), "the run's seed (sampling and training)", _copy("seed", int)),
    *(_no(f"explorer.rollout_model.{k}", "Trinity sets it from model.*")
      for k in ("temperature", "top_p", "top_k", "logprobs")),
    *(_derived(f"explorer.rollout_model.{k}", (f"model.{k}",), f"wins over model.{k}, as in Trinity")
      for k in ("max_model_len", "max_prompt_tokens", "max_response_tokens", "enable_prompt_truncation",
                "chat_template", "enable_thinking")),
    _checked("explorer.rollout_model.min_response_tokens", "no minimum response length here", (None, 0),
             "min_response_tokens: responses here end at EOS, with no minimum length"),
    _checked("explorer.rollout_model.repetition_penalty", "sampling is plain temperature / top-p / top-k",
             (None, 1, 1.0), "repetition_penalty: the engines here sample without a repetition penalty"),
    _checked("explorer.rollout_model.ignore_eos", "responses end at EOS", (False,),
             "ignore_eos: responses here end at EOS"),
    _no("explorer.rollout_model.enable_history", "every call's experiences are recorded by the workflows"),
    _no("explorer.rollout_model.enable_openai_api", "`trinity-like serve` is the OpenAI-compatible endpoint"),
    _no("explorer.rollout_model.enable_log_requests", "vLLM's request log"),
    _no("explorer.rollout_model.enable_auto_tool_choice", "tool calls are parsed by the chat layer here "
        "(trinity_like.common.chat), for every model"),
    _checked("explorer.rollout_model.tool_call_parser", "vLLM's tool-call parser", (None, ""),
             "tool_call_parser: tool calls are parsed by the chat layer here (Hermes-style <tool_call> JSON), not "
             "by vLLM's parsers"),
    _checked("explorer.rollout_model.reasoning_parser", "vLLM's reasoning parser", (None, ""),
             "reasoning_parser: reasoning is kept in the response text here"),
    Rule("explorer.rollout_model.external_model_config.enable", ("explorer.engine",), "true: engine external",
         lambda v: {"explorer.engine": "external"} if v else {}),
    Rule("explorer.rollout_model.external_model_config.base_url_env", ("explorer.external_model.base_url_env",),
         "same"),
    Rule("explorer.rollout_model.external_model_config.api_key_env", ("explorer.external_model.api_key_env",),
         "same"),
    Rule("explorer.rollout_model.external_model_config.model_name", ("explorer.external_model.model_name",), "same",
         lambda v: {"explorer.external_model.model_name": v or ""}),
    *(_no(f"explorer.rollout_model.{k}", "Trinity sets it")
      for k in ("bundle_indices", "ray_namespace", "cuda_visible_devices", "enable_lora",
                "enable_runtime_lora_updating", "lora_modules")),
    _no("explorer.rollout_model.lora_kwargs", "Trinity sets it", whole=True),
    _checked("explorer.rollout_model.rope_scaling", "the model's own RoPE", (None, {}),
             "rope_scaling: edit the model's config.json", whole=True),
    _checked("explorer.rollout_model.rope_theta", "the model's own RoPE", (None,),
             "rope_theta: edit the model's config.json"),
    _checked("explorer.auxiliary_models", "models besides the policy", (None, []),
             "auxiliary_models: the explorer serves only the policy here (a judge or helper model is not served); "
             "a workflow may call an OpenAI-compatible server of its own", whole=True),
    _no("explorer.auxiliary_models[].*", "read with explorer.auxiliary_models (refused when set)"),
    Rule("explorer.eval_interval", ("explorer.eval_interval",), "same", _copy("explorer.eval_interval", int)),
    Rule("explorer.eval_on_startup", NOTHING, "evaluation runs before the first step whenever eval_interval > 0",
         _eval_on_startup, kind="checked"),
    Rule("explorer.bench_on_latest_checkpoint", ("explorer.bench_on_latest_checkpoint",), "same (mode bench: the "
         "run's latest checkpoint; without it, every checkpoint of the run, `bench --all-checkpoints`)",
         _copy("explorer.bench_on_latest_checkpoint", bool)),
    Rule("explorer.proxy_port", ("serve.port",), "the port of `trinity-like serve`", _copy("serve.port", int)),
    Rule("explorer.listen_address", ("serve.host",), "the address of `trinity-like serve` (not loopback: needs "
         "serve.api_key)", _copy("serve.host", str)),
    _no("explorer.service_status_check_interval", "Trinity's serve-mode health loop"),
    _no("explorer.min_running_model_num", "Trinity's serve-mode health loop"),
    _no("explorer.db_url", "serve records into the run's buffer"),
    Rule("explorer.over_rollout.ratio", ("explorer.over_rollout_frac",), "1 - ratio: a step ends when that share "
         "of its tasks is done", _over_rollout),
    _no("explorer.over_rollout.wait_after_min", "stragglers join a later step here rather than being waited for"),
    _no("explorer.dynamic_timeout.*", "explorer.task_timeout_s is fixed"),
    _no("explorer.runner_state_report_interval", "`trinity-like status` reports the roles"),
    # ---- trainer
    _no("trainer.name", "the trainer role's name"),
    _checked("trainer.trainer_type", "verl (the trainer here is this project's)", ("verl",),
             "trainer_type: the trainer here is this project's own (Trinity's verl trainer's meaning)"),
    Rule("trainer.trainer_strategy", ("trainer.strategy",), "fsdp and fsdp2 -> fsdp2", _strategy),
    Rule("trainer.save_interval", ("trainer.save_interval",), "same (0: only at the end)",
         _copy("trainer.save_interval", int)),
    _no("trainer.enable_preview", "W&B rollout preview"),
    _derived("trainer.total_steps", ("trainer.total_steps",), "the run's length in trainer steps (wins over "
             "buffer.total_steps / total_epochs when shorter)"),
    _no("trainer.save_hf_checkpoint", "every checkpoint here holds the Hugging Face model folder"),
    Rule("trainer.grad_clip", ("trainer.optimizer.max_grad_norm",), "same",
         _copy("trainer.optimizer.max_grad_norm", float)),
    _derived("trainer.use_dynamic_bsz", ("trainer.max_token_len_per_micro_batch",), "true: micro-batches by the "
             "token budget max_token_len_per_gpu (default 2 x max_model_len, as Trinity)"),
    _derived("trainer.max_token_len_per_gpu", ("trainer.max_token_len_per_micro_batch",), "read with "
             "use_dynamic_bsz"),
    _checked("trainer.ulysses_sequence_parallel_size", "sequence parallelism", (1,),
             "ulysses_sequence_parallel_size > 1: sequence parallelism is not supported"),
    _no("trainer.fix_actor_microbatch_loss_scale", "gradients accumulate over micro-batches so that the result "
        "does not depend on them"),
    _no("trainer.save_strategy", "checkpoints are written in parallel by the trainer ranks"),
    Rule("trainer.max_checkpoints_to_keep", ("trainer.keep_checkpoints",), "same (null = keep all = 0)", _keep),
    _derived("trainer.trainer_config", ("trainer.*", "algorithm.*"), "verl keys: translated by docs/verl.md's "
             "rules; those Trinity sets itself (the actor's optimizer from algorithm.optimizer, mini-batch = "
             "train_batch_size, rollout.n, run length, GPUs, paths) have no effect, as in Trinity", whole=True),
    _checked("trainer.trainer_config_path", "deprecated in Trinity", ("",),
             "trainer_config_path: deprecated in Trinity; put the keys under trainer.trainer_config"),
    # ---- monitor
    Rule("monitor.monitor_type", ("monitor.backends",), "tensorboard, wandb or mlflow (metrics.jsonl is always "
         "written)", _monitor),
    _no("monitor.monitor_args", "W&B / MLflow settings: monitor.wandb_* and monitor.mlflow_tracking_uri",
        whole=True),
    _no("monitor.detailed_stats", "eval metrics are mean@k and best@k"),
    _no("monitor.enable_ray_timeline", "`trinity-like plot` draws the roles' timeline"),
    _no("monitor.cache_dir", "Trinity sets it"),
    # ---- synchronizer
    _derived("synchronizer.sync_method", ("synchronizer.method",), "nccl -> broadcast (ipc where the engine shares "
             "the trainer's GPU), checkpoint -> checkpoint, memory -> memory"),
    _derived("synchronizer.sync_style", ("synchronizer.style",), "fixed -> fixed, trainer_driven -> "
             "trainer_driven, explorer_driven -> fixed (a meaning difference is listed)"),
    _derived("synchronizer.sync_interval", ("synchronizer.interval", "mode"), "same; with sync_offset it sets the "
             "mode (see mode)"),
    _derived("synchronizer.sync_offset", ("synchronizer.offset", "synchronizer.max_staleness"), "same; the "
             "explorer may run this many steps ahead"),
    Rule("synchronizer.sync_timeout", ("synchronizer.sync_timeout_s",), "deadline of one weight transfer",
         _copy("synchronizer.sync_timeout_s", float)),
    _no("synchronizer.wait_for_checkpoint", "unused by Trinity"),
    _no("synchronizer.explorer_world_size", "Trinity sets it"),
    _no("synchronizer.ray_namespace", "Trinity sets it"),
    # ---- service, log, data processing, stages
    _checked("service.data_juicer", "Data-Juicer service", (None, {}),
             "service.data_juicer: Data-Juicer processing is not supported", whole=True),
    _no("service.data_juicer.*", "read with service.data_juicer (refused when set)"),
    _no("log.level", "the console logs at INFO"),
    _no("log.group_by_node", "each role logs in its own job"),
    _no("log.save_dir", "Trinity sets it"),
    _checked("data_processor.task_pipeline", "Data-Juicer task pipeline", (None, {}),
             "data_processor.task_pipeline: task pipelines (Data-Juicer) are not supported; prepare the task file "
             "beforehand", whole=True),
    _no("data_processor.task_pipeline.*", "read with data_processor.task_pipeline (refused when set)"),
    _checked("data_processor.experience_pipeline.operators", "experience operators", (None, []),
             "experience_pipeline.operators: experience pipelines are not supported (filter rows with buffer.where)",
             whole=True),
    _no("data_processor.experience_pipeline.operators[].*", "read with experience_pipeline.operators (refused when "
        "set)"),
    _no("data_processor.experience_pipeline.inputs.*", "read with experience_pipeline.inputs (refused when set)"),
    _no("data_processor.experience_pipeline.output.*", "read with experience_pipeline.output (refused when set)"),
    _no("data_processor.experience_pipeline.save_input", "every experience is kept in the run's buffer"),
    _no("data_processor.experience_pipeline.input_save_path", "every experience is kept in the run's buffer"),
    _checked("data_processor.experience_pipeline.inputs", "extra pipeline inputs", (None, {}),
             "experience_pipeline.inputs: experience pipelines are not supported", whole=True),
    _checked("data_processor.experience_pipeline.output", "pipeline output", (None, {}),
             "experience_pipeline.output: experience pipelines are not supported", whole=True),
    _derived("stages", ("warmup.*",), "[an SFT stage (mode train, algorithm sft, a file of chat records), the RFT "
             "stage] -> warmup.sft_steps / demonstrations / batch_size / lr, then the run; any other list of stages "
             "is refused naming why", whole=True),
)
"""Trinity key -> our keys. Exact keys win over section rules; among section rules the longest prefix wins."""

EXACT = {r.key: r for r in RULES if not r.key.endswith(".*")}
SECTIONS = [(r.key[:-2], r) for r in RULES if r.key.endswith(".*")]
if len(EXACT) + len(SECTIONS) != len(RULES):
    raise RuntimeError("trinity_like.config.trinity_rules: a Trinity key has two rules")

TASKSET_PREFIXES = ("buffer.explorer_input.taskset.", "buffer.explorer_input.tasksets[].",
                    "buffer.explorer_input.eval_tasksets[].")
BUFFER_PREFIXES = ("buffer.trainer_input.experience_buffer.", "buffer.trainer_input.auxiliary_buffers.<name>.")


def normalise(key: str) -> str:
    """A concrete key (``buffer.explorer_input.eval_tasksets.0.path``) in the rules' form
    (``<taskset>.path``)."""
    parts = key.split(".")
    out: list[str] = []
    for i, p in enumerate(parts):
        if p.isdigit() and out:
            out[-1] += "[]"
        elif i == 3 and parts[:3] == ["buffer", "trainer_input", "auxiliary_buffers"]:
            out.append("<name>")
        else:
            out.append(p)
    norm = ".".join(out)
    for prefix in TASKSET_PREFIXES:
        if norm.startswith(prefix):
            return "<taskset>." + norm[len(prefix):]
    for prefix in BUFFER_PREFIXES:
        if norm.startswith(prefix):
            return "<buffer>." + norm[len(prefix):]
    if norm.startswith("trainer.trainer_config."):
        return "trainer.trainer_config"
    if norm.startswith("stages[]") or norm.startswith("stages."):
        return "stages"
    return norm


def find_rule(key: str) -> Rule | None:
    """The rule of a normalised key: its exact rule, else the section rule of the longest matching prefix."""
    exact = EXACT.get(key)
    if exact is not None:
        return exact
    best = None
    for prefix, rule in SECTIONS:
        if key == prefix or key.startswith(prefix + ".") or key.startswith(prefix + "["):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, rule)
    return best[1] if best else None
