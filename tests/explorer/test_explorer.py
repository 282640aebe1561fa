"""The explorer fleet and workflows with real engine actors (Ray) and the real tiny model."""

import asyncio
import json
import os
import signal

import numpy as np
import pytest
import ray

from trinity_like.algorithms.rewards import load_reward_manager
from trinity_like.common.tasks import Task
from trinity_like.common.tokenizer import hf_tokenizer
from trinity_like.config import SamplingConfig, load_config
from trinity_like.explorer.fleet import EngineFleet
from trinity_like.explorer.role import ExplorerRole
from trinity_like.explorer.rollout import RolloutParts
from trinity_like.explorer.workflows import GuessNumberWorkflow, Workflow, WorkflowContext, load_workflow
from trinity_like.runtime.paths import RunPaths
from trinity_like.runtime.run_home import RunFiles

pytestmark = pytest.mark.slow


def _cfg(tmp_path, model_path, *overrides):
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}", "project=ex",
                              "explorer.sampling.max_new_tokens=6", *overrides])


def _prompts(model_path, n):
    tok = hf_tokenizer(model_path)
    return [tok.encode(f"{i}+{i}=") for i in range(n)]


def test_two_engines_serve_one_step_and_samples_do_not_depend_on_batching(tmp_path, tiny_model_path, ray_session):
    cfg = _cfg(tmp_path, tiny_model_path, "explorer.num_engines=2")
    prompts, seeds = _prompts(tiny_model_path, 8), list(range(100, 108))
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=6)

    async def main():
        fleet = EngineFleet(cfg)
        await fleet.ready()
        spread = await fleet.generate_spread(prompts, sampling, seeds)
        alone = [(await fleet.generate([p], sampling, [s]))[0] for p, s in zip(prompts, seeds, strict=True)]
        fleet.kill()
        return spread, alone

    spread, alone = asyncio.run(main())
    assert {s.engine_id for s in spread} == {"hf-0", "hf-1"}  # both engines took part of the step
    # each request's randomness is its own: batched or alone, on either engine, the same tokens
    assert [s.response_ids.tolist() for s in spread] == [s.response_ids.tolist() for s in alone]


def test_killing_an_engine_mid_step_still_completes_the_step(tmp_path, tiny_model_path, ray_session):
    cfg = _cfg(tmp_path, tiny_model_path, "explorer.num_engines=2")
    prompts = _prompts(tiny_model_path, 16) * 4
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=200)

    async def main():
        fleet = EngineFleet(cfg)
        await fleet.ready()
        victim = await fleet.slots[1].actor.pid.remote()
        call = asyncio.ensure_future(fleet.generate_spread(prompts, sampling, list(range(len(prompts)))))
        while fleet.slots[1].in_flight == 0:  # its part of the batch is sent (a fixed sleep let a quiet machine
            await asyncio.sleep(0.001)        # finish the whole batch before the kill)
        os.kill(victim, signal.SIGKILL)
        samples = await call
        for _ in range(100):  # wait until Ray has restarted the dead engine
            try:
                restarted_pid = await fleet.slots[1].actor.pid.remote()
                break
            except ray.exceptions.ActorUnavailableError:
                await asyncio.sleep(0.2)
        health = await fleet.health()
        fleet.kill()
        return samples, fleet.restarts, health, victim, restarted_pid

    samples, restarts, health, victim, restarted_pid = asyncio.run(main())
    assert len(samples) == len(prompts) and all(len(s.response_ids) > 0 for s in samples)
    assert restarts >= 1 and restarted_pid != victim  # Ray restarted the dead engine
    assert len(health) == 2


def test_multi_turn_episode_masks_exactly_the_model_tokens(tmp_path, tiny_model_path, ray_session):
    cfg = _cfg(tmp_path, tiny_model_path, "explorer.max_turns=3")
    tok = hf_tokenizer(tiny_model_path)
    ctx = WorkflowContext(sampling=SamplingConfig(temperature=1.0, max_new_tokens=4), repeat_times=2, seeds=[1, 2],
                          tokenizer=tok, reward_manager=load_reward_manager(cfg, tok), max_turns=3)

    async def main():
        fleet = EngineFleet(cfg)
        await fleet.ready()
        exps = await GuessNumberWorkflow().run(Task("t", "", "15"), fleet, ctx)
        fleet.kill()
        return exps

    exps = asyncio.run(main())
    assert len(exps) == 2  # one experience per episode, the whole conversation in it
    feedback = {" higher.", " lower.", " Say a number."}
    for e in exps:
        mask = e.action_mask
        assert len(mask) == len(e.response_ids) == len(e.logprobs)
        assert e.info["turns"] >= 1 and mask[0]
        # split the response into runs of equal mask: model runs (True) and environment runs (False)
        runs, start = [], 0
        for i in range(1, len(mask) + 1):
            if i == len(mask) or mask[i] != mask[start]:
                runs.append((bool(mask[start]), e.response_ids[start:i]))
                start = i
        env_runs = [tok.decode(ids.tolist()) for is_model, ids in runs if not is_model]
        assert all(text in feedback for text in env_runs)  # every unmasked token is the environment's
        assert len([r for r in runs if r[0]]) == e.info["turns"]  # one model run per turn
        assert np.all(e.logprobs[~mask] == 0.0) and np.all(e.logprobs[mask] < 0.0)
        if not e.info["solved"]:
            assert e.info["turns"] == 3 and len(env_runs) == 3


class BoomWorkflow(Workflow):
    """Raises on every call, counting them."""

    calls = 0

    async def run(self, task, engine, ctx):
        BoomWorkflow.calls += 1
        raise RuntimeError("boom")


def test_failing_task_is_retried_then_recorded_and_the_step_goes_on(tmp_path, tiny_model_path):
    cfg = _cfg(tmp_path, tiny_model_path, "explorer.max_retries=2", "explorer.task_timeout_s=5")
    paths = RunPaths.of(cfg)
    paths.run_dir.mkdir(parents=True)
    # the workflow fails before it would use an engine
    parts = RolloutParts(cfg, files=RunFiles(paths), workflow=BoomWorkflow(), fleet=None)
    ctx = WorkflowContext(sampling=cfg.explorer.sampling, repeat_times=1, seeds=[0], tokenizer=None,
                          reward_manager=None)
    assert asyncio.run(parts.run_task(Task("bad", "1+1=", "2"), ctx)) is None
    assert BoomWorkflow.calls == 3  # the first try and two retries
    record = json.loads((paths.run_dir / "failed_tasks.jsonl").read_text())
    assert record == {"task_id": "bad", "explore_step": 0, "error": "RuntimeError: boom", "attempts": 3}


def test_workflow_loading():
    assert isinstance(load_workflow("single_turn"), Workflow)
    assert isinstance(load_workflow("trinity_like.explorer.workflows:GuessNumberWorkflow"), GuessNumberWorkflow)
    with pytest.raises(KeyError, match="valid names: guess_number, single_turn"):
        load_workflow("nope")
    with pytest.raises(ValueError, match="cannot load workflow"):
        load_workflow("no.such.module:Thing")


def test_admission_holds_the_explorer_back_until_the_trainer_publishes(tmp_path, tiny_model_path, ray_session):
    from trinity_like.runtime.paths import namespace_of
    from trinity_like.runtime.run_dir import prepare_run_dir
    from trinity_like.synchronizer import get_synchronizer
    from trinity_like.weights.messages import WeightsInfo
    cfg = _cfg(tmp_path, tiny_model_path, "name=admission", "mode=async", "synchronizer.max_staleness=0",
               "explorer.batch_size=2", "explorer.repeat_times=2")
    prepare_run_dir(cfg)
    sync = get_synchronizer(namespace_of(cfg))
    explorer = ray.remote(num_cpus=0)(ExplorerRole).remote(cfg)
    try:
        ray.get(explorer.setup.remote())
        ray.get(explorer.step.remote(), timeout=60)  # step 0 needs version 0: admitted at once
        blocked = explorer.step.remote()  # step 1 needs version 1, which no trainer has published
        ready, _ = ray.wait([blocked], timeout=3)
        assert not ready, "the explorer ran ahead of the staleness bound"
        ray.get(sync.publish.remote(WeightsInfo(version=1, path=None, refs=[ray.put(_weights(tiny_model_path))])))
        metrics = ray.get(blocked, timeout=60)
        assert metrics["rollout/model_version"] == 1.0  # it loaded the new weights before generating
        assert metrics["rollout/admission_wait_s"] >= 2.5
    finally:
        ray.get(explorer.shutdown.remote())
        ray.kill(explorer)
        ray.kill(sync)


def _weights(model_path):
    from trinity_like.common.modeling import export_state_dict, load_causal_lm

    return export_state_dict(load_causal_lm(model_path))


def test_custom_workflow_example_and_eval_and_bench(tmp_path, tiny_model_path, ray_session):
    import subprocess
    import sys
    from pathlib import Path

    from trinity_like.launcher import run
    from trinity_like.runtime.paths import RunPaths

    example = Path(__file__).resolve().parents[2] / "examples" / "custom_workflow.py"
    evals = "explorer.eval_tasksets=[{name: add, size: 8, max_operand: 4}, {name: add4, size: 8, k: 2, temperature: 1.0}]"
    cfg = _cfg(tmp_path, tiny_model_path, "name=custom", "mode=sync", f"explorer.workflow={example}:ReverseWorkflow",
               "explorer.batch_size=2", "explorer.repeat_times=2", "trainer.total_steps=2",
               "explorer.eval_interval=1", evals)
    summary = run(cfg)
    assert summary["exit_reason"] == "completed"
    records = [json.loads(x) for x in RunPaths.of(cfg).metrics.read_text().splitlines()]
    explorer = [r for r in records if r["role"] == "explorer"]
    assert all("eval/add/accuracy/mean@1" in r and "eval/add4/accuracy/best@2" in r for r in explorer)
    assert all(0.0 <= r["eval/add4/accuracy/mean@2"] <= r["eval/add4/accuracy/best@2"] <= 1.0 for r in explorer)
    from trinity_like.buffer import query

    rows = query(RunPaths.of(cfg).buffer_dir).to_pylist()
    assert rows and all("target" in json.loads(r["info"]) for r in rows)  # written by the custom workflow

    ckpt = RunPaths.of(cfg).checkpoint_dir / "step_2"
    proc = subprocess.run([sys.executable, "-m", "trinity_like.cli", "bench", "--json", "--checkpoint", str(ckpt),
                           f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}", "name=custom-bench",
                           "project=ex", evals, "explorer.sampling.max_new_tokens=4", "none.yaml"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "does not exist" in proc.stderr  # a missing CONFIG file is one clear line
    cfg_file = tmp_path / "bench.yaml"
    cfg_file.write_text(f"checkpoint_root_dir: {tmp_path}\nproject: ex\nname: custom-bench\n"
                        f"model:\n  path: {tiny_model_path}\n")
    proc = subprocess.run([sys.executable, "-m", "trinity_like.cli", "bench", str(cfg_file), "--json",
                           "--checkpoint", str(ckpt), evals], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["taskset"] for r in rows] == ["add", "add4"] and rows[1]["k"] == 2
    assert all(0.0 <= r["mean@k"] <= r["best@k"] <= 1.0 for r in rows)


def test_dynamic_sampling_drops_groups_with_one_reward(tmp_path, tiny_model_path, ray_session):
    from trinity_like.buffer import count_rows
    from trinity_like.runtime.paths import RunPaths
    from trinity_like.runtime.run_dir import prepare_run_dir
    reward_file = tmp_path / "const.py"
    reward_file.write_text("def compute_score(responses, ground_truths, **kw):\n    return [0.5] * len(responses)\n")
    cfg = _cfg(tmp_path, tiny_model_path, "name=dyn", "mode=sync", "explorer.dynamic_sampling=true",
               f"reward.function_path={reward_file}", "explorer.batch_size=3", "explorer.repeat_times=2")
    prepare_run_dir(cfg)
    explorer = ray.remote(num_cpus=0)(ExplorerRole).remote(cfg)
    try:
        ray.get(explorer.setup.remote())
        metrics = ray.get(explorer.step.remote(), timeout=120)
    finally:
        ray.get(explorer.shutdown.remote())
        ray.kill(explorer)
    assert metrics["rollout/filtered_groups"] == 3.0 and metrics["rollout/experiences"] == 0.0
    assert count_rows(RunPaths.of(cfg).buffer_dir) == 0  # nothing without an advantage signal is written


def test_over_rollout_finishes_early_and_stragglers_join_later(tmp_path, tiny_model_path, ray_session):
    from trinity_like.buffer import query
    from trinity_like.runtime.paths import RunPaths
    from trinity_like.runtime.run_dir import prepare_run_dir
    slow = tmp_path / "slow.py"
    slow.write_text(
        "import asyncio\n"
        "from trinity_like.explorer.workflows import SingleTurnWorkflow\n"
        "class Slow(SingleTurnWorkflow):\n"
        "    run_batch = None  # task by task, so some tasks can finish later than others\n"
        "    async def run(self, task, engine, ctx):\n"
        "        await asyncio.sleep(3.0 if ctx.seeds[0] % 2 else 0.0)\n"
        "        return await super().run(task, engine, ctx)\n")
    cfg = _cfg(tmp_path, tiny_model_path, "name=over", "mode=sync", f"explorer.workflow={slow}:Slow",
               "explorer.over_rollout_frac=0.5", "explorer.batch_size=4", "explorer.repeat_times=1")
    prepare_run_dir(cfg)
    explorer = ray.remote(num_cpus=0)(ExplorerRole).remote(cfg)
    try:
        ray.get(explorer.setup.remote())
        first = ray.get(explorer.step.remote(), timeout=120)
        drained = ray.get(explorer.drain.remote(), timeout=120)
    finally:
        ray.get(explorer.shutdown.remote())
        ray.kill(explorer)
    # half of the 4 tasks (the fast ones) made the step; the slow half carried on and was written later
    assert first["rollout/experiences"] == 2.0 and first["rollout/stragglers"] == 2.0
    assert drained["rollout/experiences"] == 2.0 and drained["rollout/late_groups"] == 2.0
    rows = query(RunPaths.of(cfg).buffer_dir).to_pylist()
    assert len(rows) == 4 and len({r["group_id"] for r in rows}) == 4
    assert all(r["group_id"].startswith("s0-") and r["model_version"] == 0 for r in rows)  # original stamps
