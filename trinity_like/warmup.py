"""Warm-up, then RL: a short supervised stage on demonstrations, then the configured RL run from its result,
with held-out accuracy measured before the warm-up, between the stages and at the end.

    eval_initial   the model at ``model.path``
    warm-up        ``warmup.sft_steps`` offline SFT steps (``mode: offline``, ``algorithm.policy_loss: sft``)
                   on the demonstrations, in its own run directory ``<project>/<name>-warmup``
    eval_before    the warm-up's last checkpoint, which is where the RL run starts
    RL             the configured run (``sync``/``async``) with ``model.path`` = that checkpoint's model folder
    eval_after     the RL run's last checkpoint

Both stages go through the launcher's ordinary single-stage ``run`` (passed in as ``run_stage``), so the
warm-up is exactly an offline run whose ``buffer.replay_sources`` is the demonstrations file. Every evaluation
is :func:`trinity_like.explorer.evaluation.bench` on the same held-out task file (the RL run directory's
``eval-<name>.parquet``); the accuracy reported is the first eval task set's ``mean@k`` (greedy at
temperature 0).

Demonstrations are rendered the way the ``single_turn`` workflow prompts: the text of the turns before the
first assistant turn, as written (no chat template), is the prompt; the assistant's content and EOS are the
response. That is where this departs from ``buffer ingest``, which frames every turn with a role header:
a model warmed up on framed turns would not have learnt what the explorer asks it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trinity_like.common.errors import RunError, UserError
from trinity_like.common.experience import Experience
from trinity_like.common.fs import atomic_write_json, atomic_write_text
from trinity_like.config import BufferConfig, Config, WarmupConfig, validate
from trinity_like.runtime.checkpoints import latest_checkpoint
from trinity_like.runtime.paths import RunPaths
from trinity_like.runtime.run_dir import prepare_run_dir

DEMO_SEED_OFFSET = 104_729
"""Generated demonstrations use ``seed + DEMO_SEED_OFFSET``: apart from the training tasks (``seed``) and the
eval tasks (``seed + 7919 * (i + 1)``)."""

RunStage = Callable[..., dict[str, Any]]
"""``run_stage(cfg, resume=False) -> summary``: the launcher's plain single-stage run."""


def warmup_run_name(cfg: Config) -> str:
    """The warm-up's run name: a sibling of the RL run, so its namespace is as unique as the RL run's."""
    return f"{cfg.name}-warmup"


# ---------------------------------------------------------------- demonstrations


def demonstration_records(cfg: Config) -> list[tuple[int, Any]]:
    """(line number, record) pairs of the warm-up's demonstrations: the first ``warmup.num_demonstrations`` of
    ``warmup.demonstrations``, or as many generated ones (correct answers to tasks drawn like the training
    tasks)."""
    from trinity_like.buffer.ingest import read_records
    from trinity_like.common.tasks import demonstrations, generate_arithmetic

    w = cfg.warmup
    if w.demonstrations:
        return read_records(Path(w.demonstrations))[:w.num_demonstrations]
    max_operand = w.max_operand or cfg.explorer.taskset.max_operand
    tasks = generate_arithmetic(w.num_demonstrations, max_operand, cfg.seed + DEMO_SEED_OFFSET)
    return list(enumerate(demonstrations(tasks), start=1))


def single_turn_tokens(messages: Any, tokenizer) -> tuple[list[int], list[int]]:
    """(prompt_ids, response_ids) of a chat record as the ``single_turn`` workflow would see it: the turns
    before the first assistant turn, concatenated as written, are the prompt; that assistant turn's content
    and EOS are the response."""
    from trinity_like.buffer.ingest import RecordError

    if isinstance(messages, str):  # Parquet files keep messages as JSON text
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError:
            raise RecordError("messages is text that is not valid JSON") from None
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise RecordError("messages must be a list of {role, content} with string values")
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if not first:
        raise RecordError("messages need a prompt turn followed by an assistant turn")
    if first != len(messages) - 1:
        raise RecordError("a demonstration is single-turn: nothing may follow the first assistant turn")
    prompt = tokenizer.encode("".join(m["content"] for m in messages[:first]), add_special_tokens=False)
    response = tokenizer.encode(messages[first]["content"], add_special_tokens=False) + [tokenizer.eos_token_id]
    return prompt, response


def demonstration_experiences(records: list[tuple[int, Any]], tokenizer, source: str) -> list[Experience]:
    """Validate numbered demonstration records (chat records or Experience rows) and build their
    Experiences; a bad record raises UserError naming its line and the reason."""
    from trinity_like.buffer.ingest import RecordError, record_to_experience

    out = []
    for line, record in records:
        try:
            if isinstance(record, dict) and "prompt_ids" not in record and "messages" in record:
                prompt_ids, response_ids = single_turn_tokens(record["messages"], tokenizer)
                record = {**record, "prompt_ids": prompt_ids, "response_ids": response_ids}
            out.append(record_to_experience(record, "import", len(tokenizer)))
        except RecordError as e:
            raise UserError(f"demonstration on line {line} of {source} is not usable: {e}") from None
    if not out:
        raise UserError(f"{source} holds no demonstrations")
    return out


def write_demonstrations(cfg: Config, path: Path) -> int:
    """Write the warm-up's demonstrations to ``path`` as Experience rows (.jsonl); return how many."""
    from trinity_like.common.tokenizer import hf_tokenizer

    source = f"warmup.demonstrations '{cfg.warmup.demonstrations}'" if cfg.warmup.demonstrations else \
        "the generated demonstrations"
    exps = demonstration_experiences(demonstration_records(cfg), hf_tokenizer(cfg.model.path), source)
    atomic_write_text(path, "".join(e.to_json() + "\n" for e in exps))
    return len(exps)


# ---------------------------------------------------------------- stage configs


def warmup_stage_config(cfg: Config, demonstrations_path: Path) -> Config:
    """The warm-up as a plain offline SFT run: the RL config's model, seed and trainer layout, with the
    warm-up's steps, batch size and learning rate, and no RL terms (KL, entropy, off-policy correction);
    every demonstration is a group of one."""
    r = dataclasses.replace
    w, tr = cfg.warmup, cfg.trainer
    stage = r(
        cfg, name=warmup_run_name(cfg), mode="offline",
        # temperature 1: the trainer scales logits by the sampling temperature, and SFT fits the model itself
        explorer=r(cfg.explorer, repeat_times=1, eval_interval=0,
                   sampling=r(cfg.explorer.sampling, temperature=1.0)),
        trainer=r(tr, total_steps=w.sft_steps, batch_size=w.batch_size, mini_batch_size=None, ppo_epochs=1,
                  micro_batch_size=min(tr.micro_batch_size, w.batch_size), save_interval=0, keep_checkpoints=1,
                  optimizer=r(tr.optimizer, lr=w.lr, warmup_steps=0, lr_schedule="constant")),
        algorithm=r(cfg.algorithm, policy_loss="sft", use_kl_loss=False, use_kl_in_reward=False, entropy_coeff=0.0,
                    off_policy=r(cfg.algorithm.off_policy, correction="none")),
        buffer=BufferConfig(replay_sources=[str(demonstrations_path)]),
        warmup=WarmupConfig(),
    )
    validate(stage)
    return stage


def rl_stage_config(cfg: Config, model_path: Path) -> Config:
    """The RL run from the warmed-up model. Its saved config.yaml re-runs exactly this stage (no warm-up)."""
    model = dataclasses.replace(cfg.model, path=str(model_path), build_tiny_at=None)
    return dataclasses.replace(cfg, model=model, warmup=WarmupConfig())


def final_model(cfg: Config) -> Path:
    """The Hugging Face model folder of a finished run's last checkpoint."""
    ckpt = latest_checkpoint(RunPaths.of(cfg).checkpoint_dir)
    model = ckpt / "model" if ckpt is not None else None
    if model is None or not (model / "config.json").is_file():
        raise RunError(f"run '{RunPaths.of(cfg).run_dir}' left no final checkpoint to continue from")
    return model


# ---------------------------------------------------------------- evaluation


def held_out_eval(cfg: Config, model: str | Path | None) -> dict[str, Any]:
    """``bench``'s row for the first eval task set (``mean@k``, ``tasks``, ...) of ``model`` (None =
    ``model.path``). The task file lives in ``cfg``'s run directory, so calls with one run name see the same
    tasks."""
    from trinity_like.explorer.evaluation import bench

    first = dataclasses.replace(cfg.explorer, eval_tasksets=cfg.explorer.eval_tasksets[:1])
    return bench(dataclasses.replace(cfg, explorer=first), None if model is None else str(model))[0]


# ---------------------------------------------------------------- the two stages


def _check_free(cfg: Config) -> None:
    """Refuse before any work if a stage's run directory already holds a run (the launcher would, later)."""
    from trinity_like.buffer.segments import list_segments

    paths = RunPaths.of(cfg)
    if paths.summary.exists() or list_segments(paths.buffer_dir) or paths.checkpoint_dir.exists():
        raise RunError(f"run directory '{paths.run_dir}' already holds a run; pick another name (name=...) or "
                       "delete that folder")


def _loss_trend(cfg: Config) -> tuple[float | None, float | None]:
    """First and last SFT loss (mean NLL per response token) of a finished warm-up."""
    from trinity_like.common.metrics import read_metrics

    records, _ = read_metrics(RunPaths.of(cfg).metrics, 0)
    losses = [r["actor/pg_loss"] for r in records if r["role"] == "trainer"]
    return (round(losses[0], 4), round(losses[-1], 4)) if losses else (None, None)


def _say(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


def run_with_warmup(cfg: Config, run_stage: RunStage, resume: bool = False) -> dict[str, Any]:
    """Evaluate ``model.path``, warm it up with SFT, evaluate, run RL from the warmed-up model, evaluate.
    ``run_stage(cfg) -> summary`` is the plain single-stage run. Returns the RL run's summary with the
    evaluations and the warm-up's figures merged in, and writes that into the RL run's ``summary.json``.
    ``resume`` continues the RL stage of an interrupted run from the finished warm-up's model."""

    if resume:
        warm_cfg = dataclasses.replace(cfg, name=warmup_run_name(cfg))
        rl_cfg = rl_stage_config(cfg, final_model(warm_cfg))
        path = RunPaths.of(rl_cfg).summary
        earlier = json.loads(path.read_text()) if path.is_file() else {}  # the evaluations before the stop
        summary = run_stage(rl_cfg, True)
        after = held_out_eval(rl_cfg, final_model(rl_cfg))
        _say(f"eval after RL: {after['taskset']} mean@{after['k']} {after['mean@k']:.3f}")
        summary.update({k: v for k, v in earlier.items() if k.startswith(("eval_", "warmup_"))})
        summary["eval_after"] = round(after["mean@k"], 4)
        atomic_write_json(RunPaths.of(rl_cfg).summary, summary)
        return summary

    start = time.time()
    warm_dir = RunPaths.of(dataclasses.replace(cfg, name=warmup_run_name(cfg))).run_dir
    for stage in (cfg, dataclasses.replace(cfg, name=warmup_run_name(cfg))):
        _check_free(stage)
    prepare_run_dir(cfg, allow_existing=True)  # builds the tiny model if asked; the RL run writes its config

    initial = held_out_eval(cfg, None)
    _say(f"eval initial ({cfg.model.path}): {initial['taskset']} mean@{initial['k']} {initial['mean@k']:.3f} "
         f"on {initial['tasks']} tasks")

    demos = warm_dir / "demonstrations.jsonl"
    num_demos = write_demonstrations(cfg, demos)
    warm_cfg = warmup_stage_config(cfg, demos)
    _say(f"warm-up: {cfg.warmup.sft_steps} SFT steps on {num_demos} demonstrations ({warm_dir})")
    warm_summary = run_stage(warm_cfg)

    rl_cfg = rl_stage_config(cfg, final_model(warm_cfg))
    before = held_out_eval(rl_cfg, None)
    _say(f"eval before RL (warmed up): {before['taskset']} mean@{before['k']} {before['mean@k']:.3f}")

    summary = run_stage(rl_cfg)
    after = held_out_eval(rl_cfg, final_model(rl_cfg))
    _say(f"eval after RL: {after['taskset']} mean@{after['k']} {after['mean@k']:.3f}")

    loss_first, loss_last = _loss_trend(warm_cfg)
    summary.update({
        "eval_taskset": initial["taskset"],
        "eval_tasks": initial["tasks"],
        "eval_initial": round(initial["mean@k"], 4),
        "eval_before": round(before["mean@k"], 4),
        "eval_after": round(after["mean@k"], 4),
        "warmup_steps": warm_summary["trainer_steps"],
        "warmup_demonstrations": num_demos,
        "warmup_loss_first": loss_first,
        "warmup_loss_last": loss_last,
        "warmup_wall_time_s": warm_summary["wall_time_s"],
        "warmup_run_dir": str(warm_dir),
        "total_wall_time_s": round(time.time() - start, 2),
    })
    atomic_write_json(RunPaths.of(rl_cfg).summary, summary)
    _say("summary with evaluations: " + json.dumps(summary))
    return summary
