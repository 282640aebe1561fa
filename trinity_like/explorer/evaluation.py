"""Evaluation on held-out task sets: greedy or k samples per task, each task run by the explorer's workflow (its
tools, turns and reward model included), so a multi-turn or tool-using policy is measured as it is trained.

Each eval set is read and scored by its own Trinity-shaped keys where it gives them (``format``, ``workflow``,
``reward_fn`` and their args: ``eval_setup``), else by the training set's and the explorer's workflow.

A sample counts as correct when its reward is at least 1.0 (full credit). Per task set:

    eval/<name>/accuracy/mean@k   mean over tasks of the fraction of its k samples that are correct
    eval/<name>/accuracy/best@k   mean over tasks of "at least one of its k samples is correct"
    eval/<name>/reward_mean       mean reward over all samples
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from trinity_like.common.tasks import Task, limit_prompts
from trinity_like.config import Config, EvalTasksetConfig, SamplingConfig
from trinity_like.explorer.engines.external import ExternalEngine, external_endpoint
from trinity_like.explorer.workflow_base import Workflow, WorkflowContext, explorer_context
from trinity_like.explorer.workflows import PerTaskWorkflow, SingleTurnWorkflow, load_workflow, workflow_for
from trinity_like.weights.messages import WeightsInfo


def apply_prompt_limit(cfg: Config, tokenizer, tasks: list[Task], source: str) -> list[Task]:
    """``tasks`` under ``explorer.max_prompt_tokens`` with ``prompt_truncation`` and ``filter_overlong_prompts``
    (``trinity_like.common.tasks.limit_prompts``): applied to every task set (training and eval) where it is
    loaded for rollouts, so training, evaluation and ``bench`` see the same prompts. ``source`` names the set."""
    ex = cfg.explorer
    return limit_prompts(tasks, tokenizer, ex.max_prompt_tokens, ex.prompt_truncation, ex.filter_overlong_prompts,
                         source)


async def evaluate(fleet, ctx: WorkflowContext, name: str, tasks: list[Task], ev: EvalTasksetConfig,
                   seed: int = 0, workflow: Workflow | None = None) -> dict[str, float]:
    """Accuracy (reward >= 1) mean@k and best@k and the mean reward of ``ev.k`` samples per task, each task run
    by ``workflow`` (the explorer's; default ``single_turn``, whose whole set is one spread call) with ``ctx``
    (the explorer's: tokenizer, reward manager and model, tools, turns, ``max_new_tokens``) at the set's
    temperature, seeded by ``seed`` and the task's position alone (no remax greedy baseline)."""
    workflow = workflow or SingleTurnWorkflow()
    sampling = SamplingConfig(temperature=ev.temperature, max_new_tokens=ctx.sampling.max_new_tokens)
    k = ev.k
    ctxs = [replace(ctx, sampling=sampling, repeat_times=k, greedy_baseline=False,
                    seeds=[seed * 1_000_003 + i * k + j for j in range(k)]) for i in range(len(tasks))]
    run_batch = getattr(workflow, "run_batch", None)
    if run_batch is not None:
        groups = await run_batch(tasks, fleet, ctxs)
    else:
        groups = await asyncio.gather(*(workflow.run(t, fleet, c) for t, c in zip(tasks, ctxs, strict=True)))
    rewards = [[e.reward for e in group] for group in groups]
    flat = [r for group in rewards for r in group]
    return {
        f"eval/{name}/accuracy/mean@{k}": sum(sum(r >= 1.0 for r in g) / len(g) for g in rewards) / len(tasks),
        f"eval/{name}/accuracy/best@{k}": sum(any(r >= 1.0 for r in g) for g in rewards) / len(tasks),
        f"eval/{name}/reward_mean": sum(flat) / len(flat),
    }


def eval_setup(cfg: Config, ev: EvalTasksetConfig, ctx: WorkflowContext,
               workflow: Workflow) -> tuple[WorkflowContext, Workflow]:
    """The context and workflow that run eval set ``ev``: its own ``format`` (which read its rows, and whose
    ``response_key`` a Trinity reward function reads the truth by), its ``workflow`` (else ``workflow``, the
    explorer's), its ``reward_fn`` and args (else the training set's), as a Trinity eval task set has its own."""
    train = cfg.explorer.taskset
    own_reward = bool(ev.reward_fn)
    view = replace(train, format=ev.format, workflow=ev.workflow or train.workflow,
                   reward_fn=ev.reward_fn or train.reward_fn,
                   reward_fn_args=ev.reward_fn_args if own_reward else (ev.reward_fn_args or train.reward_fn_args),
                   workflow_args=ev.workflow_args or train.workflow_args)
    if ev.format.workflow_key:
        workflow = PerTaskWorkflow(view.workflow or cfg.explorer.workflow)
    elif ev.workflow:
        workflow = load_workflow(ev.workflow)
    return replace(ctx, taskset=view), workflow


def _resolve_checkpoint(cfg: Config, checkpoint: str | None) -> tuple[Config, str | None]:
    """(config with model.path, safetensors file to load on top) for ``checkpoint``: a state-dict file, a
    trainer checkpoint folder (``checkpoints/step-N``), or a Hugging Face model folder."""
    import dataclasses

    from trinity_like.common.errors import UserError

    if checkpoint is None:
        return cfg, None
    p = Path(checkpoint)
    if p.is_file() and p.suffix == ".safetensors":
        return cfg, str(p)
    if (p / "model" / "config.json").is_file():  # a trainer checkpoint folder
        p = p / "model"
    if (p / "config.json").is_file():
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(p))), None
    raise UserError(f"checkpoint '{checkpoint}' is neither a .safetensors file, a trainer checkpoint folder nor "
                    "a Hugging Face model folder")


class _Bench:
    """What every model a ``bench`` evaluates shares: the run directory (opened read-only), the eval task sets
    under the prompt limit, the tokenizer and the reward manager; ``open`` starts the engines (or reaches the
    external server), ``rows`` evaluates what they hold, ``load`` puts a checkpoint's weights into them."""

    def __init__(self, cfg: Config) -> None:
        import dataclasses

        from trinity_like.algorithms.rewards import load_reward_manager
        from trinity_like.common.plugins import import_plugins
        from trinity_like.common.tokenizer import hf_tokenizer
        from trinity_like.runtime.ray_cluster import init_ray
        from trinity_like.runtime.run_dir import prepare_eval_tasksets, prepare_run_dir

        self.external = cfg.explorer.engine == "external"
        if self.external:
            external_endpoint(cfg)  # a missing variable is refused before anything starts
        if not cfg.explorer.eval_tasksets:
            cfg = dataclasses.replace(cfg, explorer=dataclasses.replace(cfg.explorer,
                                                                        eval_tasksets=[EvalTasksetConfig()]))
        self.cfg = cfg
        import_plugins(cfg.explorer.plugin_dirs)  # before any workflow or reward function is looked up
        self.workflow = workflow_for(cfg)
        self.paths = prepare_run_dir(cfg, allow_existing=True)
        if not self.external or cfg.reward.model.path:  # engine actors, a reward model actor
            init_ray(cfg)
        self.tokenizer = hf_tokenizer(cfg.model.path)
        self.tasksets = {name: apply_prompt_limit(cfg, self.tokenizer, tasks, f"eval task set '{name}'")
                         for name, tasks in prepare_eval_tasksets(cfg).items()}
        self.reward_manager = load_reward_manager(cfg, self.tokenizer)
        self.fleet = None
        self.reward_model = None
        self.loaded = 0
        """Versions loaded into the fleet so far (each load takes the next number)."""

    async def open(self, cfg: Config | None = None) -> None:
        """Start the engines on ``cfg``'s model (default: the bench's ``model.path``), or reach the external
        server."""
        from trinity_like.explorer.fleet import EngineFleet
        from trinity_like.explorer.reward_model import start_reward_model

        cfg = cfg or self.cfg
        self.fleet = ExternalEngine.from_config(cfg, self.tokenizer) if self.external else EngineFleet(cfg)
        self.reward_model = start_reward_model(cfg)
        await self.fleet.ready()

    async def load(self, weights: str) -> None:
        """Put the state dict in the safetensors file ``weights`` into every engine (WeightsLoadFailed if one
        cannot read it: then nothing is benched on it)."""
        self.loaded += 1
        await self.fleet.update_weights(WeightsInfo(version=self.loaded, path=weights))

    async def rows(self) -> list[dict]:
        """One row per eval task set for the model the engines hold."""
        cfg, rows = self.cfg, []
        ctx = explorer_context(cfg, self.tokenizer, self.reward_manager, self.reward_model)
        workflow = self.workflow
        for ev in cfg.explorer.eval_tasksets:
            tasks = self.tasksets[ev.name]
            ev_ctx, ev_workflow = eval_setup(cfg, ev, ctx, workflow)
            m = await evaluate(self.fleet, ev_ctx, ev.name, tasks, ev, seed=cfg.seed, workflow=ev_workflow)
            prefix = f"eval/{ev.name}/"
            rows.append({"taskset": ev.name, "tasks": len(tasks), "k": ev.k, "temperature": ev.temperature,
                         "mean@k": m[f"{prefix}accuracy/mean@{ev.k}"], "best@k": m[f"{prefix}accuracy/best@{ev.k}"],
                         "reward_mean": m[f"{prefix}reward_mean"]})
        return rows

    async def close(self) -> None:
        fleet, reward_model, self.fleet, self.reward_model = self.fleet, self.reward_model, None, None
        if fleet is not None:
            if self.external:
                await fleet.aclose()
            else:
                fleet.kill()
        if reward_model is not None:
            reward_model.stop()

    async def rows_of(self, checkpoint: str | None) -> list[dict]:
        """Start the engines on ``checkpoint`` (a state-dict file, a trainer checkpoint folder or a Hugging Face
        model folder; None = ``model.path``, or the external model), evaluate, stop them."""
        if checkpoint is not None and self.external:
            _refuse_checkpoints_of_external()
        cfg, weights = _resolve_checkpoint(self.cfg, checkpoint)
        try:
            await self.open(cfg)
            if weights is not None:
                await self.load(weights)
            return await self.rows()
        finally:
            await self.close()


def bench(cfg: Config, checkpoint: str | None = None) -> list[dict]:
    """Evaluate a model on the config's eval task sets (a greedy arithmetic set when none is given): ``checkpoint``,
    else the run's newest checkpoint with ``explorer.bench_on_latest_checkpoint``, else ``model.path`` (or, with
    ``explorer.engine: external``, the server's model)."""
    if cfg.explorer.engine == "external" and (checkpoint is not None or cfg.explorer.bench_on_latest_checkpoint):
        _refuse_checkpoints_of_external()
    if checkpoint is None and cfg.explorer.bench_on_latest_checkpoint:
        checkpoint = str(_latest_or_refuse(cfg))
    runner = _Bench(cfg)
    return asyncio.run(runner.rows_of(checkpoint))


def _refuse_checkpoints_of_external() -> None:
    from trinity_like.common.errors import UserError

    raise UserError("explorer.engine external evaluates the server's model: it takes no checkpoint (--checkpoint, "
                    "--all-checkpoints, --follow, explorer.bench_on_latest_checkpoint)")


def _latest_or_refuse(cfg: Config) -> Path:
    from trinity_like.common.errors import UserError
    from trinity_like.runtime.checkpoints import latest_checkpoint
    from trinity_like.runtime.paths import RunPaths

    checkpoint_dir = RunPaths.of(cfg).checkpoint_dir
    latest = latest_checkpoint(checkpoint_dir)
    if latest is None:
        raise UserError(f"explorer.bench_on_latest_checkpoint: the run has no checkpoint yet ({checkpoint_dir}/latest "
                        "is missing); bench it once the trainer has saved one, or bench model.path without it")
    return latest


# ---------------------------------------------------------------------- every checkpoint of a run
RESULTS_FILE = "bench_results.jsonl"
"""Default results file of ``bench --all-checkpoints`` / ``--follow``, in the run directory."""
FOLLOW_POLL_S = 2.0
"""How often ``bench --follow`` looks for a new checkpoint."""


def bench_checkpoints(cfg: Config, follow: bool = False, timeout_s: float = 0.0, results: str | None = None,
                      say=print) -> list[dict]:
    """Evaluate each complete checkpoint of the run (``checkpoints/step_<k>``) in step order, one row per
    checkpoint and eval task set (``step``, ``checkpoint`` first), each written at once to ``results`` (default
    ``<run_dir>/bench_results.jsonl``; rewritten atomically, so a reader never sees half a row). Steps the
    results file holds rows of already are not evaluated again (a second call goes on where the first stopped,
    as Trinity's bench does from its explorer's step). With ``follow``, then wait for new checkpoints and
    evaluate each as it lands (``checkpoints/latest`` moving on), until the run ends (its ``summary.json`` written
    and no trainer of it alive) or ``timeout_s`` passes (0 = no limit). A checkpoint the trainer prunes before its turn is skipped, said in a
    line. Returns the rows of this call."""
    import json
    import time

    from trinity_like.common.errors import RunError
    from trinity_like.common.fs import atomic_write_text
    from trinity_like.explorer.fleet import WeightsLoadFailed
    from trinity_like.runtime.checkpoints import checkpoint_damage, complete_steps
    from trinity_like.runtime.ray_cluster import live_roles

    if cfg.explorer.engine == "external":
        _refuse_checkpoints_of_external()
    if timeout_s < 0:
        from trinity_like.common.errors import UserError

        raise UserError(f"--timeout takes seconds >= 0 (0 = no limit), got {timeout_s:g}")
    runner = _Bench(cfg)
    paths = runner.paths
    out = Path(results) if results else paths.run_dir / RESULTS_FILE
    try:
        kept = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.is_file() else []
    except ValueError as e:
        from trinity_like.common.errors import UserError

        raise UserError(f"results file '{out}' is not JSON lines ({e}); move it away or name another with "
                        "--results") from None
    names = {ev.name for ev in runner.cfg.explorer.eval_tasksets}
    sets_of_step: dict[int, set[str]] = {}
    for r in kept:
        sets_of_step.setdefault(r.get("step"), set()).add(r.get("taskset"))
    done = {step for step, sets in sets_of_step.items() if isinstance(step, int) and names <= sets}
    new_rows: list[dict] = []
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None

    def run_ended() -> bool:
        """Its summary is written and no trainer of it is alive (a resumed run keeps the summary of its earlier
        part until it ends again)."""
        return paths.summary.is_file() and not any(r.get("role") in ("all", "trainer")
                                                   for r in live_roles(paths.run_dir))

    async def bench_step(folder: Path) -> list[dict]:
        """One checkpoint: its weights loaded into the engines kept from the step before (one start for every
        checkpoint; a Hugging Face folder with several weight files gets engines of its own)."""
        weights = folder / "model" / "model.safetensors"
        if not weights.is_file():
            await runner.close()
            return await runner.rows_of(str(folder))
        if runner.fleet is None:
            await runner.open()
        await runner.load(str(weights))
        return await runner.rows()

    async def main() -> None:
        nonlocal kept
        while True:
            ended = run_ended()  # read before listing: a checkpoint saved before the end is seen below
            for step in sorted(complete_steps(paths.checkpoint_dir)):
                if step in done:
                    continue
                folder = paths.checkpoint_dir / f"step_{step}"
                try:
                    rows = await bench_step(folder)
                except Exception as e:
                    if folder.is_dir():
                        if not isinstance(e, WeightsLoadFailed):
                            raise
                        damage = checkpoint_damage(folder)
                        raise RunError(f"checkpoint {folder} could not be loaded"
                                       f"{f' ({damage})' if damage else ''}: {str(e).splitlines()[0][:300]}; "
                                       f"move it away to bench the others") from None
                    say(f"step {step}: pruned by the trainer before it was benched; skipped")
                    done.add(step)
                    continue
                rows = [{"step": step, "checkpoint": str(folder), **r} for r in rows]
                kept = [r for r in kept if r.get("step") != step] + rows
                atomic_write_text(out, "".join(json.dumps(r) + "\n" for r in kept))
                new_rows.extend(rows)
                done.add(step)
                for r in rows:
                    say(f"step {step} {r['taskset']}: mean@{r['k']} {r['mean@k']:.4f} best@{r['k']} "
                        f"{r['best@k']:.4f} reward_mean {r['reward_mean']:.4f}")
            if not follow or ended:
                return
            if deadline is not None and time.monotonic() >= deadline:
                say(f"stopped following after {timeout_s:g}s (--timeout); the run goes on: bench again to go on")
                return
            await asyncio.sleep(FOLLOW_POLL_S)

    async def guarded() -> None:
        try:
            await main()
        finally:
            await runner.close()

    asyncio.run(guarded())
    if not done and not follow:
        say(f"the run has no complete checkpoint yet in {paths.checkpoint_dir}")
    say(f"results: {out}")
    return new_rows


def bench_checkpoints_command(cfg: Config, args) -> int:
    """``trinity-like bench --all-checkpoints | --follow``: ``bench_checkpoints`` with the command's flags; progress
    lines on stdout (on stderr with ``--json``, which prints the rows)."""
    import json
    import sys

    from trinity_like.common.errors import UserError

    if args.checkpoint:
        raise UserError("--checkpoint names one model; --all-checkpoints and --follow bench the run's checkpoints: "
                        "give one or the other")
    if args.timeout and not args.follow:
        raise UserError("--timeout goes with --follow (how long to wait for new checkpoints)")

    def say(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    rows = bench_checkpoints(cfg, follow=args.follow, timeout_s=args.timeout, results=args.results, say=say)
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0
