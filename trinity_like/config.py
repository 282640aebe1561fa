"""Configuration: one typed dataclass per part, loaded from YAML with ``key=value`` overrides.

The dataclasses are the single source of truth for every setting: each field carries its description as a
docstring right under it, and its allowed values in ``field(metadata=...)`` (``choices``, ``choices_from`` a
registry, ``min``, ``max``). ``docs/config.md`` is generated from them (``trinity-like config-docs``).
OmegaConf turns them into structured configs, so an unknown key or a value of the wrong type is caught on
load; ``validate`` then checks choices, ranges and the rules that tie fields together.

Every problem raises :class:`ConfigError` with one sentence that names the key and says how to fix it; the
command line prints it and exits with status 2.

Runtime state derived from a config (resolved paths) lives in :class:`RunPaths`, never in user fields.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trinity_like.common.errors import UserError

MODES = ("sync", "async", "offline")
ENGINES = ("hf", "vllm")
SYNC_METHODS = ("checkpoint", "nccl", "memory")
WANDB_MODES = ("offline", "online", "disabled")
TASKSET_GENERATORS = ("arithmetic",)


RENAMED_KEYS = {
    "model.build_tiny_if_missing": "use model.build_tiny_at: FOLDER (the tiny model is built only into the folder "
                                   "named there, which model.path must name too)",
    "monitor.type": "use monitor.backends, a list (e.g. [tensorboard]; [] = metrics.jsonl only, which is always "
                    "written)",
}
"""Keys of earlier versions and what took their place, so an old config gets a hint rather than a key list."""


class ConfigError(UserError):
    """A user mistake in the configuration; the message is one sentence saying what to change."""


def _choices(default: str, choices: tuple[str, ...]) -> Any:
    return field(default=default, metadata={"choices": choices})


def _at_least(default: Any, minimum: float) -> Any:
    return field(default=default, metadata={"min": minimum})


def _registered(default: str, registry: str) -> Any:
    """A name from ``trinity_like.algorithms.<registry>``: the allowed values are whatever is registered, looked
    up only when a config is validated (importing the algorithms pulls in torch)."""
    return field(default=default, metadata={"choices_from": registry})


def allowed_values(meta: Any) -> tuple[str, ...] | None:
    """The allowed values a field's metadata names (``choices``, or a registry in ``trinity_like.algorithms``)."""
    if "choices" in meta:
        return tuple(meta["choices"])
    if "choices_from" in meta:
        import trinity_like.algorithms as algorithms

        names = getattr(algorithms, meta["choices_from"])
        return tuple(names.names() if hasattr(names, "names") else names)
    return None


@dataclass
class ModelConfig:
    path: str = "runs/models/tiny"
    """Folder of a Hugging Face causal LM and its tokenizer (loaded offline)."""
    build_tiny_at: str | None = None
    """Build the project's tiny model into this folder when it holds no model yet; `model.path` must name the same
    folder (a model.path that is missing anywhere else is an error, never a new random model)."""


@dataclass
class SamplingConfig:
    temperature: float = _at_least(1.0, 0.0)
    """Softmax temperature; behaviour log-probs come from this scaled distribution. 0 = greedy."""
    top_p: float = field(default=1.0, metadata={"min": 0.0, "max": 1.0})
    """Nucleus sampling mass; 1.0 keeps the whole distribution."""
    top_k: int = _at_least(0, 0)
    """Keep only the k most likely tokens; 0 disables."""
    max_new_tokens: int = _at_least(16, 1)
    """Longest response, in tokens; a response cut here is marked `truncated`."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Token ids that end a response besides the tokenizer's EOS (kept in the response)."""


@dataclass
class TasksetConfig:
    path: str = ""
    """Parquet file of tasks with columns `task_id`, `prompt`, `answer`. Empty: `<run_dir>/tasks.parquet`."""
    generate: str = _choices("arithmetic", TASKSET_GENERATORS)
    """Built-in generator that writes the task file when `path` does not exist."""
    size: int = _at_least(512, 1)
    """Number of tasks the generator writes."""
    max_operand: int = _at_least(20, 1)
    """Largest operand of the generated arithmetic tasks."""


@dataclass
class EvalTasksetConfig:
    name: str = "eval"
    """Name in the metrics: `eval/<name>/accuracy/mean@k`."""
    path: str = ""
    """Parquet task file; empty = generated into `<run_dir>/eval-<name>.parquet`."""
    generate: str = _choices("arithmetic", TASKSET_GENERATORS)
    """Generator of the eval tasks when `path` is empty (seeded apart from the training tasks)."""
    size: int = _at_least(64, 1)
    """Number of generated eval tasks."""
    max_operand: int = _at_least(20, 1)
    """Largest operand of generated arithmetic tasks."""
    k: int = _at_least(1, 1)
    """Samples per task: `mean@k` averages them, `best@k` takes the best."""
    temperature: float = _at_least(0.0, 0.0)
    """Sampling temperature of the eval; 0 = greedy (then k should be 1)."""


@dataclass
class VLLMConfig:
    dtype: str = _choices("float32", ("float32", "bfloat16", "float16"))
    """Weights and activations of the vLLM engine; float32 matches the trainer's log-probs within 1e-6,
    bfloat16 within ~5e-3."""
    max_model_len: int | None = field(default=None, metadata={"min": 1})
    """Longest prompt + response; empty = the model's own limit, capped at 4096."""
    max_num_seqs: int = _at_least(64, 1)
    """Most sequences vLLM batches at once."""
    gpu_memory_utilization: float = field(default=0.3, metadata={"min": 0.01, "max": 1.0})
    """Share of GPU memory one engine may take (ignored on CPU)."""
    enforce_eager: bool | None = None
    """Disable graph capture; empty = on for CPU, vLLM's default on GPU."""


@dataclass
class ExplorerConfig:
    engine: str = _choices("hf", ENGINES)
    """Rollout engine: `hf` (transformers, CPU) or `vllm` (GPU)."""
    num_engines: int = _at_least(1, 1)
    """Rollout engines in the explorer fleet."""
    batch_size: int = _at_least(4, 1)
    """Tasks per explorer step."""
    repeat_times: int = _at_least(4, 1)
    """Samples per task; the samples of one task form one group (GRPO/RLOO)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling settings for rollouts."""
    taskset: TasksetConfig = field(default_factory=TasksetConfig)
    """Where the training tasks come from."""
    num_threads: int = _at_least(1, 1)
    """torch threads per engine, so that engines and trainer share the cores sensibly."""
    workflow: str = "single_turn"
    """How a task becomes experiences: a registered workflow (`single_turn`, `guess_number`) or an import path
    `package.module:ClassName` of a `Workflow` subclass."""
    max_retries: int = _at_least(2, 0)
    """Retries of a task whose workflow raised or timed out (and of a call whose engine died) before the task
    is recorded as failed."""
    task_timeout_s: float = _at_least(600.0, 0.001)
    """Longest a task's workflow may run before it counts as failed (and is retried)."""
    max_turns: int = _at_least(4, 1)
    """Most model turns of a multi-turn workflow episode."""
    max_empty_steps: int = _at_least(100, 0)
    """Explorer steps in a row that write no experience (every group filtered by `dynamic_sampling`, every task
    failed) before the explorer stops with an error; 0 = never. Steps that write fewer rows than planned are
    made up by more steps."""
    dynamic_sampling: bool = False
    """Drop groups whose samples all got the same reward (no advantage signal), as DAPO does; counted in
    `rollout/filtered_groups`."""
    over_rollout_frac: float = field(default=1.0, metadata={"min": 0.01, "max": 1.0})
    """Finish a step once this fraction of its tasks is done; the stragglers carry on and join a later
    step's write with their original version stamp. 1.0 waits for every task."""
    eval_interval: int = _at_least(0, 0)
    """Evaluate on `eval_tasksets` every N explorer steps (and before the first); 0 = never."""
    eval_tasksets: list[EvalTasksetConfig] = field(default_factory=list)
    """Held-out task sets for evaluation."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """Settings of the `vllm` engine."""


@dataclass
class OptimizerConfig:
    lr: float = _at_least(1e-4, 0.0)
    """AdamW learning rate."""
    weight_decay: float = _at_least(0.0, 0.0)
    """AdamW decoupled weight decay."""
    beta1: float = field(default=0.9, metadata={"min": 0.0, "max": 1.0})
    """AdamW first-moment decay."""
    beta2: float = field(default=0.999, metadata={"min": 0.0, "max": 1.0})
    """AdamW second-moment decay."""
    eps: float = _at_least(1e-8, 0.0)
    """AdamW epsilon."""
    max_grad_norm: float = _at_least(1.0, 0.0)
    """Clip the global gradient norm to this value; 0 disables clipping."""
    warmup_steps: int = _at_least(0, 0)
    """Optimizer updates with a linearly rising learning rate (from lr / warmup_steps up to lr)."""
    lr_schedule: str = _choices("constant", ("constant", "cosine"))
    """After warm-up: `constant`, or `cosine` decay to `min_lr_ratio * lr` at the last update."""
    min_lr_ratio: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})
    """Floor of the cosine schedule, as a fraction of `lr`."""


@dataclass
class CriticConfig:
    lr: float = _at_least(1e-4, 0.0)
    """AdamW learning rate of the critic (used with algorithm.adv_estimator gae)."""
    cliprange_value: float = _at_least(0.5, 0.0)
    """Value clipping: new values stay within this distance of the values before the update."""
    max_grad_norm: float = _at_least(1.0, 0.0)
    """Gradient clipping of the critic; 0 disables it."""


@dataclass
class LoraConfig:
    enabled: bool = False
    """Train low-rank adapters (peft) instead of all weights; the reference model is the base with adapters
    disabled, and the weights published to explorers are the merged ones."""
    r: int = _at_least(8, 1)
    """Adapter rank."""
    alpha: int = _at_least(16, 1)
    """Adapter scaling numerator (scale = alpha / r)."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Names of the linear layers that get adapters."""
    dropout: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})
    """Dropout on the adapter input."""


@dataclass
class TrainerConfig:
    total_steps: int = _at_least(3, 1)
    """Trainer steps to run; each makes one new policy version."""
    batch_size: int | None = field(default=None, metadata={"min": 1})
    """Experiences per trainer step (a multiple of `explorer.repeat_times`); empty = one explorer step's
    output, `explorer.batch_size * explorer.repeat_times`."""
    micro_batch_size: int = _at_least(8, 1)
    """Experiences per forward/backward pass; gradients accumulate so the result does not depend on it."""
    max_token_len_per_micro_batch: int = _at_least(0, 0)
    """Form micro-batches by a token budget (prompt + response tokens) instead of `micro_batch_size`;
    0 = by count."""
    ppo_epochs: int = _at_least(1, 1)
    """Passes over each batch, reshuffled each time (seeded)."""
    mini_batch_size: int | None = field(default=None, metadata={"min": 1})
    """Experiences per optimizer update; empty = the whole batch (one update per epoch)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, more compute."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters (needs the `peft` package)."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model trained beside the policy when the advantage estimator is gae."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer settings."""
    save_interval: int = _at_least(0, 0)
    """Write a full checkpoint (weights + optimizer) every N steps and at the end; 0 = only at the end."""
    keep_checkpoints: int = _at_least(3, 0)
    """Full checkpoints kept (the newest); 0 = keep all."""
    num_threads: int = _at_least(1, 1)
    """torch threads for the trainer (per worker)."""
    type: str = _choices("ppo", ("ppo",))
    """TrainEngineWrapper implementation (registry `trinity_like.trainer.ppo.TRAINERS`)."""
    num_workers: int = _at_least(1, 1)
    """Data-parallel trainer workers (a torch.distributed group: gloo on CPU, NCCL on GPU)."""
    strategy: str = _choices("ddp", ("ddp", "fsdp2"))
    """How workers share the model when `num_workers` > 1: `ddp` (a full replica each, gradients
    all-reduced) or `fsdp2` (`torch.distributed.fsdp.fully_shard`: parameters, gradients and optimizer
    state sharded per transformer block; for models that do not fit one device)."""


@dataclass
class SynchronizerConfig:
    method: str = _choices("checkpoint", SYNC_METHODS)
    """How new weights reach the explorers: `checkpoint` (version folders of safetensors parts, written in
    parallel by the trainer ranks), `nccl` (collective broadcast from trainer rank 0 to every engine: NCCL
    on GPU, gloo on CPU), `memory` (Ray object store)."""
    interval: int = _at_least(1, 1)
    """Publish new weights every N trainer steps; the explorer loads new weights before step k (k = steps
    done) when `(k - offset) % interval == 0` (style `fixed`)."""
    offset: int = _at_least(0, 0)
    """Explorer steps before the first scheduled load (see `interval`); the explorer always loads the newest
    version before its first step."""
    style: str = _choices("fixed", ("fixed", "trainer_driven"))
    """`fixed`: explorers load on the interval/offset schedule; `trainer_driven`: explorers load whatever
    the trainer published, at every step boundary. Either way an explorer that would break
    `max_staleness` waits for and loads a newer version."""
    max_staleness: int = _at_least(1, 0)
    """Largest allowed `trainer version - model_version` of a trained experience (async mode). The explorer
    waits rather than produce data that would exceed it; 0 makes async behave exactly like sync."""
    timeout_s: float = _at_least(600.0, 0.0)
    """How long a role waits for the other (new weights, new data; a role started alone waits this long for
    the other to join) before giving up."""
    heartbeat_timeout_s: float = _at_least(30.0, 1.0)
    """A role silent for this long is reported dead; the explorer steps it had claimed are redone by another
    explorer."""
    bucket_mb: float = _at_least(64.0, 0.001)
    """Method `nccl`: size of the slices the flat weight buffer is broadcast in (MiB)."""


@dataclass
class OffPolicyConfig:
    correction: str = _registered("none", "OFF_POLICY_CORRECTIONS")
    """Importance correction for stale data (`trinity_like.algorithms.off_policy`): none, tis, seq_tis,
    icepop, seq_mis, geo_mask, decoupled. Anything but `none` recomputes the proximal log-probs."""
    cap: float = _at_least(2.0, 0.0)
    """C: truncation bound (tis, seq_tis), sequence-ratio bound (seq_mis), token drop bound (decoupled)."""
    low: float = _at_least(0.5, 0.0)
    """Lower bound of the kept ratio range (icepop, geo_mask)."""
    high: float = _at_least(2.0, 0.0)
    """Upper bound of the kept ratio range (icepop, geo_mask)."""


@dataclass
class KLControlConfig:
    type: str = _choices("fixed", ("fixed", "adaptive"))
    """`fixed` beta, or `adaptive` (Ziegler et al.): beta moves to keep the KL near `target_kl`."""
    kl_coef: float = _at_least(0.001, 0.0)
    """Initial (or fixed) beta."""
    target_kl: float = field(default=0.1, metadata={"min": 1e-9})
    """Target KL of the adaptive controller."""
    horizon: int = _at_least(10000, 1)
    """Horizon (in samples) of the adaptive controller."""


@dataclass
class AlgorithmConfig:
    adv_estimator: str = _registered("grpo", "ADV_ESTIMATORS")
    """Advantage estimator, from the registry in `trinity_like.algorithms`."""
    policy_loss: str = _registered("vanilla", "POLICY_LOSSES")
    """Policy loss, from the registry in `trinity_like.algorithms`."""
    clip_ratio_low: float = _at_least(0.2, 0.0)
    """PPO lower clip range: the ratio is clipped below at 1 - clip_ratio_low."""
    clip_ratio_high: float = _at_least(0.2, 0.0)
    """PPO upper clip range: the ratio is clipped above at 1 + clip_ratio_high."""
    clip_ratio_c: float = field(default=3.0, metadata={"min": 1.000001})
    """Dual-clip bound for negative advantages (> 1)."""
    loss_agg_mode: str = _registered("token-mean", "LOSS_AGG_MODES")
    """How a (B, L) loss matrix becomes a scalar (see `agg_loss`)."""
    gamma: float = field(default=1.0, metadata={"min": 0.0, "max": 1.0})
    """Discount factor (gae, reinforce_plus_plus)."""
    lam: float = field(default=1.0, metadata={"min": 0.0, "max": 1.0})
    """GAE lambda."""
    norm_adv_by_std_in_grpo: bool = True
    """GRPO divides by the group's std; false gives Dr. GRPO."""
    opmd_baseline: str = _choices("mean", ("mean", "logavgexp"))
    """Group baseline of the opmd estimator."""
    tau: float = field(default=1.0, metadata={"min": 1e-6})
    """Temperature of the opmd `logavgexp` baseline."""
    dpo_beta: float = _at_least(0.1, 0.0)
    """DPO inverse temperature."""
    dpo_label_smoothing: float = field(default=0.0, metadata={"min": 0.0, "max": 0.5})
    """Conservative DPO label smoothing."""
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)
    """Staleness-aware importance correction."""
    entropy_coeff: float = _at_least(0.0, 0.0)
    """Weight of the entropy bonus subtracted from the policy loss."""
    use_kl_loss: bool = False
    """Add `kl_loss_coef * KL(policy || reference)` to the loss (the reference is the initial model)."""
    kl_loss_coef: float = _at_least(0.001, 0.0)
    """Weight of the KL loss."""
    kl_loss_type: str = _choices("low_var_kl", ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k3+",
                                                "low_var_kl+"))
    """KL estimator of the KL loss (`+` = straight-through: value of the estimator, gradient of k2)."""
    use_kl_in_reward: bool = False
    """Subtract `beta * KL(behaviour || reference)` from the token rewards before the advantages."""
    kl_penalty: str = _choices("kl", ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"))
    """KL estimator of the in-reward penalty."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """Controller of the in-reward KL coefficient beta."""
    sft_sources: list[str] = field(default_factory=list)
    """Experience sources (`explorer`, `human`, `agent`, `import`) whose rows are trained with the SFT negative
    log-likelihood instead of the policy loss, e.g. `[human]` for demonstrations: the loss is
    `pg_loss(other rows) + sft_loss_coef * sft_loss(these rows)` (Trinity-RFT's MIX). Empty = every row
    takes the policy loss."""
    sft_loss_coef: float = _at_least(1.0, 0.0)
    """Weight of the SFT loss of the `sft_sources` rows."""


@dataclass
class OverlongBufferConfig:
    enable: bool = False
    """Apply DAPO's linear penalty to responses longer than `max_resp_len - len` (manager dapo)."""
    len: int = _at_least(0, 0)
    """Tokens before `max_resp_len` where the penalty starts."""
    penalty_factor: float = _at_least(1.0, 0.0)
    """Penalty at `max_resp_len`."""


@dataclass
class RewardConfig:
    manager: str = _choices("naive", ("naive", "dapo"))
    """Reward manager: `naive` (score only) or `dapo` (score plus overlong penalty)."""
    function_path: str = ""
    """Python file with a custom reward function `fn(responses, ground_truths, **kwargs) -> list[float]`;
    empty = the built-in scorers, chosen by each task's data source."""
    function_name: str = "compute_score"
    """Name of the function in `function_path`."""
    reward_fn_key: str = "data_source"
    """Key of the experience info that names the data source."""
    failure_value: float = 0.0
    """Score given to a sample whose reward function raised or returned NaN."""
    max_resp_len: int | None = None
    """Longest response for the overlong penalty; empty = `explorer.sampling.max_new_tokens`."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO's soft overlong punishment."""


@dataclass
class BufferConfig:
    path: str = ""
    """Folder of the experience buffer. Empty: `<run_dir>/buffer`."""
    capacity: int = _at_least(0, 0)
    """Most unconsumed rows before explorers wait (back-pressure); 0 = unbounded."""
    read_policy: str = _choices("fifo", ("fifo", "newest", "priority", "replay"))
    """Order in which the trainer takes rows: oldest first, newest first, by `priority`, or `replay`
    (rows reused up to `replay_max_uses` times)."""
    priority: str = ""
    """SQL expression over the Experience columns, highest first (read_policy priority), e.g. `created_at`
    or `var_samp(reward) OVER (PARTITION BY _seg, group_id)`."""
    where: str = ""
    """SQL filter over the Experience columns that the trainer's reads apply, e.g. `reward IS NOT NULL`."""
    replay_max_uses: int = _at_least(1, 1)
    """How often a row may be trained on (read_policy replay)."""
    replay_cooldown_steps: int = _at_least(0, 0)
    """Trainer steps between two uses of the same row (read_policy replay)."""
    replay_sources: list[str] = field(default_factory=list)
    """What `mode: offline` trains on: buffer folders or run directories of earlier runs, `.arrow` segments,
    `.parquet` / `.jsonl` files of Experience rows (`buffer export`, `buffer ingest`), filtered by
    `buffer.where`. Read only; batches are whole groups, shuffled per epoch (seeded)."""
    transport: str = _choices("file", ("file", "redis"))
    """How explorers hand experiences over: `file` (write segments into the buffer folder) or `redis` (a
    Redis Stream, for explorers on hosts that share no filesystem with the trainer)."""
    redis_url: str = "redis://127.0.0.1:6380/0"
    """Redis server of the `redis` transport (run it with `appendonly yes` to survive its restarts)."""
    redis_stream: str = ""
    """Stream name of the `redis` transport; empty = `<project>/<name>/experiences`."""
    mix: dict[str, float] = field(default_factory=dict)
    """Share of each experience source in a training batch, e.g. `{explorer: 0.75, agent: 0.25}`; sources
    `explorer`, `human`, `agent`, `import`, shares > 0, normalised to sum to 1 (`{explorer: 3, human: 1}` is
    `{explorer: 0.75, human: 0.25}`). A source left out is not trained on. Each source's quota (rows per batch,
    by largest remainder) is filled with whole groups in read-policy order. Mode `async` only (rows an explorer
    step writes beyond its quota wait for later batches, bounded by `max_staleness`). Empty = no quotas. Set it whole
    (`buffer.mix={explorer: 0.5, human: 0.5}`) or one share (`buffer.mix.human=0.5`)."""
    mix_fill: bool = True
    """With `mix`: a source written out of band (`human`, `agent`, `import`) that cannot fill its quota right
    now gives the rest to the other sources, so training never stalls waiting for scarce rows; the `explorer`
    quota is always waited for (the run keeps writing it). false = wait until every quota is filled."""


@dataclass
class MonitorConfig:
    backends: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Where each role's metrics go besides `metrics.jsonl` (always written): any of `tensorboard` (files in
    `<run_dir>/tensorboard/`), `wandb` and `mlflow` (extras: `pip install .[wandb]`, `.[mlflow]`); `[]` = only
    `metrics.jsonl`. Every role logs under its own prefix (`trainer/actor/pg_loss`); names in docs/metrics.md."""
    wandb_mode: str = _choices("offline", WANDB_MODES)
    """`offline` writes the W&B runs under `<run_dir>/wandb/` without a network (upload later with `wandb sync`);
    `online` streams them to the W&B server (needs `WANDB_API_KEY`)."""
    wandb_project: str = ""
    """W&B project; empty = the run's `project`. The runs (one per role) are grouped as `<project>/<name>`."""
    mlflow_tracking_uri: str = ""
    """MLflow tracking store; empty = the local file store `<run_dir>/mlruns`. The runs (one per role) go into
    the experiment `<project>/<name>`."""


@dataclass
class WarmupConfig:
    sft_steps: int = _at_least(0, 0)
    """Supervised fine-tuning steps on demonstrations before the RL run (`trinity_like.warmup`); 0 = no
    warm-up. The warm-up trains in its own run directory `<project>/<name>-warmup`, and the RL run starts
    from its last checkpoint; `summary.json` then holds `eval_initial`, `eval_before` and `eval_after`."""
    demonstrations: str = ""
    """Demonstrations to imitate: a .jsonl or .parquet file of chat records (`{"messages": [...]}`, the
    turns before the first assistant turn are the prompt, as the `single_turn` workflow sends it) or of
    Experience rows (`prompt_ids`, `response_ids`). Empty = correct answers to tasks generated like
    `explorer.taskset` (seeded apart from the training and eval tasks)."""
    num_demonstrations: int = _at_least(64, 1)
    """Demonstrations to generate, or the first N records of `demonstrations`."""
    max_operand: int | None = field(default=None, metadata={"min": 1})
    """Largest operand of generated arithmetic demonstrations; empty = `explorer.taskset.max_operand`."""
    batch_size: int = _at_least(16, 1)
    """Demonstrations per warm-up step."""
    lr: float = _at_least(1e-3, 0.0)
    """AdamW learning rate of the warm-up (the other optimizer settings are `trainer.optimizer`'s)."""


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    """Address `trinity-like serve` listens on. Anything but loopback needs `api_key`."""
    port: int = field(default=8000, metadata={"min": 0, "max": 65535})
    """Port of `trinity-like serve`; 0 = any free port (printed at start)."""
    api_key: str = ""
    """Bearer key clients must send (`Authorization: Bearer <key>`); empty = no check (loopback only). The
    environment variable `TRINITY_SERVE_API_KEY` is used when this is empty."""
    model_name: str = ""
    """The model id `/v1/models` lists and answers carry; empty = `<project>/<name>`."""
    max_body_bytes: int = _at_least(1_048_576, 1024)
    """Largest request body; larger ones get 413."""
    max_messages: int = _at_least(256, 1)
    """Most messages in one chat request."""
    max_tokens: int = _at_least(1024, 1)
    """Largest `max_tokens` a request may ask for; a request without one gets
    `min(explorer.sampling.max_new_tokens, serve.max_tokens)`."""
    max_prompt_tokens: int = _at_least(8192, 1)
    """Longest conversation (all turns of a session, in tokens) the server generates from."""


@dataclass
class Config:
    project: str = "trinity_like"
    """Project name: the first part of the run directory and of the Ray namespace."""
    name: str = "run"
    """Run name: the second part of the run directory and of the Ray namespace."""
    checkpoint_root_dir: str = "runs"
    """Root of all run directories: `<checkpoint_root_dir>/<project>/<name>/`."""
    mode: str = _choices("async", MODES)
    """`sync` (strict on-policy lock-step), `async` (explorer leads by up to `max_staleness` versions) or
    `offline` (replay a stored buffer)."""
    seed: int = 42
    """Seed for task order, sampling and training; the same seed gives the same run."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy's starting weights and tokenizer."""
    explorer: ExplorerConfig = field(default_factory=ExplorerConfig)
    """The explorer fleet: engines, tasks, sampling, workflows, evaluation."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The trainer: steps, batching, optimizer, checkpoints, data-parallel workers."""
    synchronizer: SynchronizerConfig = field(default_factory=SynchronizerConfig)
    """How weights reach the explorers and how far they may lag behind the trainer."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages, policy loss, KL terms and the off-policy correction."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """How responses are scored."""
    buffer: BufferConfig = field(default_factory=BufferConfig)
    """The experience buffer: where rows are stored, how the trainer reads them, how explorers hand them over."""
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    """Where metrics go besides `metrics.jsonl`."""
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    """Optional supervised warm-up on demonstrations before the RL run."""
    serve: ServeConfig = field(default_factory=ServeConfig)
    """The OpenAI-compatible recording endpoint (`trinity-like serve`)."""

    @property
    def train_batch_size(self) -> int:
        """Experiences per trainer step, with the default resolved."""
        if self.trainer.batch_size is not None:
            return self.trainer.batch_size
        return self.explorer.batch_size * self.explorer.repeat_times


# ---------------------------------------------------------------- loading


def load_config(path: str | os.PathLike | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load ``path`` (YAML; None = defaults), apply ``key=value`` overrides, validate, return a Config."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    schema = OmegaConf.structured(Config)
    layers = []
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file '{path}' does not exist; pass the path of a YAML file such as "
                              "configs/quickstart.yaml")
        try:
            layers.append(OmegaConf.load(p))
        except Exception as e:  # yaml.YAMLError and OmegaConf's own errors share no base class
            raise ConfigError(f"config file '{path}' is not valid YAML: {str(e).splitlines()[0]}") from None
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value (for example trainer.total_steps=5)")
    try:
        merged = OmegaConf.merge(schema, *layers)
        for whole, items in _override_runs(overrides):
            if whole:  # key={...} on a dict field replaces the dict (a merge would keep the keys it does not name)
                key, _, value = items[0].partition("=")
                OmegaConf.update(merged, key.strip(), _flow_mapping(items[0], value), merge=False)
            else:
                layers.append(OmegaConf.from_dotlist(items))
                merged = OmegaConf.merge(merged, layers[-1])
        cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        raise ConfigError(_explain_omegaconf_error(e, schema, layers)) from None
    except (TypeError, AttributeError) as e:  # e.g. a list index in a dotted override (OmegaConf's own error)
        raise ConfigError(f"cannot apply the overrides {' '.join(overrides) or '(none)'}: {str(e).splitlines()[0]}; "
                          "set a list as a whole (key=[...]) rather than one element") from None
    validate(cfg)
    return cfg


def _override_runs(overrides) -> list[tuple[bool, list[str]]]:
    """The overrides in order, as runs of plain ``key=value`` items (merged as one layer) and single whole-dict
    items ``key={...}`` on a dict field such as ``buffer.mix`` (which replace the dict)."""
    runs: list[tuple[bool, list[str]]] = []
    for item in overrides:
        key, _, value = item.partition("=")
        whole = _is_dict_field(key.strip()) and value.lstrip().startswith("{")
        if whole or not runs or runs[-1][0]:
            runs.append((whole, [item]))
        else:
            runs[-1][1].append(item)
    return runs


def _is_dict_field(key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = _dataclass_at(parent)
    ftype = _field_type(node, leaf) if node is not None else None
    return ftype is not None and ftype.startswith("dict[")


def _flow_mapping(item: str, value: str) -> dict:
    """``{explorer:0.5,human:0.5}`` (the shell-friendly form, no spaces) or ``{explorer: 0.5, human: 0.5}`` as a
    dict. YAML alone reads ``explorer:0.5`` as one key, so a colon gets its space first."""
    import re

    import yaml

    try:
        parsed = yaml.safe_load(re.sub(r":(?!\s)", ": ", value))
    except yaml.YAMLError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ConfigError(f"override '{item}' is not a mapping; write it as key={{name: value, ...}}, for "
                          "example buffer.mix={explorer: 0.75, agent: 0.25}")
    return parsed


def _explain_omegaconf_error(e: Exception, schema: Any, layers: list[Any]) -> str:
    key = getattr(e, "full_key", None)
    msg = str(getattr(e, "msg", None) or e).splitlines()[0]
    if not key:
        # Some merge errors (a scalar where a section belongs) carry no key: find it by trying each leaf.
        key = _locate_bad_key(schema, layers) or "?"
        section = _dataclass_at(key) if key != "?" else None
        if section is not None:
            keys = ", ".join(f.name for f in dataclasses.fields(section))
            return f"'{key}' is a section, not a value; set its keys instead ({keys})"
    parent, _, leaf = key.rpartition(".")
    node = _dataclass_at(parent)
    if type(e).__name__ == "ConfigKeyError" or "not in" in msg:
        if key in RENAMED_KEYS:
            return f"config key '{key}' was replaced: {RENAMED_KEYS[key]}"
        if node is None:
            return f"unknown config key '{key}'"
        valid = ", ".join(f.name for f in dataclasses.fields(node))
        where = f"under '{parent}'" if parent else "at the top level"
        return f"unknown config key '{key}'; valid keys {where}: {valid}"
    ftype = _field_type(node, leaf) if node is not None else None
    expected = f" (expected {ftype})" if ftype else ""
    return f"bad value for '{key}'{expected}: {msg}"


def _leaves(node: Any, prefix: str = ""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix.rstrip("."), node


def _locate_bad_key(schema: Any, layers: list[Any]) -> str | None:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for layer in layers:
        for key, value in _leaves(OmegaConf.to_container(layer)):
            try:
                OmegaConf.update(schema.copy(), key, value, merge=True)
            except OmegaConfBaseException:
                return key
    return None


def _dataclass_at(dotted: str) -> type | None:
    """The config dataclass of section ``dotted`` ("" = the top level), or None if it names no section."""
    node: type = Config
    for part in filter(None, dotted.split(".")):
        sub = {f.name: f for f in dataclasses.fields(node)}.get(part)
        factory = sub.default_factory if sub is not None else None
        if not (isinstance(factory, type) and dataclasses.is_dataclass(factory)):
            return None
        node = factory
    return node


def _field_type(node: type, name: str) -> str | None:
    for f in dataclasses.fields(node):
        if f.name == name:
            return str(f.type)
    return None


def validate(cfg: Config) -> None:
    """Check choices, ranges and cross-field rules; raise ConfigError naming the key on the first problem."""
    _check_fields(cfg, "")
    _validate_algorithm(cfg)
    _validate_monitor(cfg)
    _validate_trainer(cfg)
    _validate_explorer_and_buffer(cfg)
    _validate_sources(cfg)
    if cfg.train_batch_size % cfg.explorer.repeat_times:
        raise ConfigError(
            f"trainer.batch_size={cfg.train_batch_size} is not a multiple of explorer.repeat_times="
            f"{cfg.explorer.repeat_times}; groups are never split across batches, so make it one")
    if cfg.mode == "async" and cfg.synchronizer.max_staleness < cfg.synchronizer.interval - 1:
        raise ConfigError(
            f"synchronizer.max_staleness={cfg.synchronizer.max_staleness} is smaller than "
            f"synchronizer.interval - 1 = {cfg.synchronizer.interval - 1}: the explorer would wait for weights "
            "that are never published; raise max_staleness or lower interval")
    if cfg.mode == "offline" and not cfg.buffer.replay_sources:
        raise ConfigError("mode 'offline' needs buffer.replay_sources: the stored experiences to train on (an "
                          "earlier run's directory, a buffer folder, .arrow/.parquet/.jsonl files)")
    if cfg.warmup.sft_steps and cfg.mode == "offline":
        raise ConfigError("warmup.sft_steps > 0 warms a model up for an RL run, which mode 'offline' is not; set "
                          "mode=async or mode=sync, or warmup.sft_steps=0")
    if cfg.warmup.sft_steps and not cfg.explorer.eval_tasksets:
        raise ConfigError("warmup.sft_steps > 0 measures the warm-up and the RL run on explorer.eval_tasksets, "
                          "which is empty; add one (e.g. explorer.eval_tasksets=[{name: heldout, size: 64}])")
    demos = cfg.warmup.demonstrations
    if demos and not (Path(demos).is_file() and Path(demos).suffix in (".jsonl", ".parquet")):
        raise ConfigError(f"warmup.demonstrations '{demos}' is not an existing .jsonl or .parquet file; give a file "
                          "of chat records or Experience rows, or leave it empty to generate demonstrations")
    for key in ("project", "name"):
        value = getattr(cfg, key)
        if not value or "/" in value or value in (".", ".."):
            raise ConfigError(f"bad value for '{key}': {value!r}; use a non-empty name without '/'")


def _validate_algorithm(cfg: Config) -> None:
    algo, tr = cfg.algorithm, cfg.trainer
    missing_input = {"remax": "greedy baseline rollouts (not produced by the explorer yet)"}
    if algo.adv_estimator in missing_input:
        raise ConfigError(f"algorithm.adv_estimator '{algo.adv_estimator}' needs {missing_input[algo.adv_estimator]}, "
                          "not available yet; use gae, grpo, rloo, opmd, reinforce_plus_plus or reinforce_plus_plus_baseline")
    if algo.policy_loss == "dpo":
        if cfg.explorer.repeat_times != 2:
            raise ConfigError("algorithm.policy_loss 'dpo' trains on (chosen, rejected) pairs: set "
                              "explorer.repeat_times=2 (each group is one pair, ordered by reward)")
        if tr.micro_batch_size % 2 or (tr.mini_batch_size or 2) % 2 or tr.max_token_len_per_micro_batch:
            raise ConfigError("algorithm.policy_loss 'dpo' needs even trainer.micro_batch_size and "
                              "trainer.mini_batch_size and count micro-batches (max_token_len_per_micro_batch=0), "
                              "so that pairs are never split")
        if algo.off_policy.correction != "none":
            raise ConfigError("algorithm.policy_loss 'dpo' compares the policy with the reference model, not with "
                              "the policy that generated the data: set algorithm.off_policy.correction=none")
    rc = cfg.reward
    if rc.function_path and not Path(rc.function_path).is_file():
        raise ConfigError(f"reward.function_path '{rc.function_path}' does not exist; give the path of a Python "
                          "file that defines the reward function")
    if rc.manager == "dapo" and rc.overlong_buffer.enable:
        max_len = rc.max_resp_len or cfg.explorer.sampling.max_new_tokens
        if not 0 < rc.overlong_buffer.len <= max_len:
            raise ConfigError(f"reward.overlong_buffer.len={rc.overlong_buffer.len} must be in (0, {max_len}] "
                              "(the longest response)")


def _validate_monitor(cfg: Config) -> None:
    from trinity_like.common.monitors import monitor_problem

    backends = cfg.monitor.backends
    for name in backends:
        problem = monitor_problem(name)
        if problem:
            raise ConfigError(f"bad value in 'monitor.backends': {problem}")
    if len(set(backends)) != len(backends):
        raise ConfigError(f"monitor.backends names a backend twice: {list(backends)}; list each once")


def _validate_trainer(cfg: Config) -> None:
    tr = cfg.trainer
    rows = tr.mini_batch_size or cfg.train_batch_size
    units = rows // 2 if cfg.algorithm.policy_loss == "dpo" else rows
    if tr.strategy == "fsdp2" and tr.lora.enabled:
        raise ConfigError("trainer.strategy 'fsdp2' with trainer.lora.enabled is not supported: LoRA trains a "
                          "few small adapters, which DDP replicates cheaply; set trainer.strategy=ddp")
    if units < tr.num_workers:
        raise ConfigError(f"trainer.num_workers={tr.num_workers} is more than the {units} "
                          f"{'pairs' if cfg.algorithm.policy_loss == 'dpo' else 'rows'} of a mini-batch: every worker "
                          "needs a share; lower num_workers or raise trainer.mini_batch_size")


def _validate_sources(cfg: Config) -> None:
    import math

    from trinity_like.common.experience import SOURCES

    for key, names in (("buffer.mix", list(cfg.buffer.mix)), ("algorithm.sft_sources", cfg.algorithm.sft_sources)):
        unknown = [n for n in names if n not in SOURCES]
        if unknown:
            raise ConfigError(f"bad source {unknown[0]!r} in '{key}'; use experience sources: {', '.join(SOURCES)}")
    for source, share in cfg.buffer.mix.items():
        if not (share > 0 and math.isfinite(share)):
            raise ConfigError(f"bad value for 'buffer.mix.{source}': {share!r}; shares must be > 0 (they are "
                              f"normalised to sum to 1): leave a source out of buffer.mix to train on none of it")
    if cfg.buffer.mix and cfg.mode == "offline":
        raise ConfigError("buffer.mix sets quotas on the trainer's buffer reads, which mode 'offline' does not make "
                          "(it replays buffer.replay_sources); select sources with buffer.where, e.g. "
                          "\"source IN ('human', 'explorer')\", or leave buffer.mix empty")
    if cfg.buffer.mix and cfg.mode == "sync":
        raise ConfigError("buffer.mix needs mode 'async': sync's lock-step schedule has the explorer write a whole "
                          "trainer batch per step, so quotas for other sources would leave explorer rows behind to "
                          "be trained ever staler; set mode=async (synchronizer.max_staleness bounds their age)")
    if cfg.algorithm.sft_sources and cfg.algorithm.policy_loss == "dpo":
        raise ConfigError("algorithm.sft_sources with algorithm.policy_loss 'dpo' would break DPO's (chosen, "
                          "rejected) pairs; leave algorithm.sft_sources empty")


def _validate_explorer_and_buffer(cfg: Config) -> None:
    b = cfg.buffer
    if b.read_policy == "priority" and not b.priority:
        raise ConfigError("buffer.read_policy 'priority' needs buffer.priority, a SQL expression such as created_at")
    if b.read_policy != "replay" and b.replay_max_uses != 1:
        raise ConfigError("buffer.replay_max_uses > 1 needs buffer.read_policy=replay")
    for i, ev in enumerate(cfg.explorer.eval_tasksets):
        if ev.k > 1 and ev.temperature == 0:
            raise ConfigError(f"explorer.eval_tasksets[{i}] ('{ev.name}') asks for k={ev.k} samples at temperature 0; "
                              "greedy samples are all the same: set temperature > 0 or k=1")
    names = [ev.name for ev in cfg.explorer.eval_tasksets]
    if len(names) != len(set(names)):
        raise ConfigError(f"explorer.eval_tasksets names must be unique, got {names}")


def _check_fields(obj: Any, prefix: str) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            _check_fields(value, key + ".")
            continue
        if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):  # e.g. explorer.eval_tasksets
            for i, item in enumerate(value):
                _check_fields(item, f"{key}[{i}].")
            continue
        meta = f.metadata
        allowed = allowed_values(meta)
        if allowed is not None and value not in allowed:
            raise ConfigError(f"bad value for '{key}': {value!r}; allowed values: {', '.join(allowed)}")
        if value is None:
            continue
        if "min" in meta and value < meta["min"]:
            raise ConfigError(f"bad value for '{key}': {value!r}; it must be at least {meta['min']}")
        if "max" in meta and value > meta["max"]:
            raise ConfigError(f"bad value for '{key}': {value!r}; it must be at most {meta['max']}")


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML, the form saved into the run directory."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
