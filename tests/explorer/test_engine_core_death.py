"""An engine whose inference engine died inside a live process (vLLM's ``EngineDeadError`` after an out-of-memory
or an illegal memory access in a forward): the fleet restarts that engine's actor and reloads the current
version, or, with its restarts used up, stops at once in one line. Real Ray, real tiny model, real ``hf``
engines; the device fault is a FAKE (``FakeEngineDeadError``, ``FaultyDeviceActor``): no GPU here to fault.
The same with real vLLM (killing its engine-core process): tests/explorer/test_vllm_engine.py."""

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest
import ray
import torch

from trinity_like.common.errors import RunError
from trinity_like.common.modeling import export_state_dict, load_causal_lm
from trinity_like.common.tokenizer import hf_tokenizer
from trinity_like.config import SamplingConfig, load_config
from trinity_like.explorer.engines.base import EngineCoreDied, engine_core_death
from trinity_like.explorer.fleet import EngineActor, EngineFleet, EngineLost
from trinity_like.weights.messages import WeightsInfo

pytestmark = [pytest.mark.slow, pytest.mark.ray]
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the fake actor below, in Ray's workers

GREEDY = SamplingConfig(temperature=0, max_new_tokens=4)


class FakeEngineDeadError(Exception):
    """FAKE: stands in for vLLM's ``vllm.v1.engine.exceptions.EngineDeadError`` (vLLM is not installed here), with
    its name and module, which is all the fleet goes by."""


FakeEngineDeadError.__name__ = FakeEngineDeadError.__qualname__ = "EngineDeadError"
FakeEngineDeadError.__module__ = "vllm.v1.engine.exceptions"


class FaultyDeviceActor(EngineActor):
    """FAKE device fault around the real ``hf`` engine: after ``fault()``, or from the start when the file
    ``FAULT_FILE`` names exists (a device that faults again after every restart), every call into the engine
    raises ``FakeEngineDeadError`` while the process lives on, as vLLM's engine does once its core died."""

    def __init__(self, cfg, index):
        super().__init__(cfg, index)
        if Path(cfg.checkpoint_root_dir, "device-faults").exists():
            self.fault()

    def fault(self) -> None:
        def dead(*args, **kwargs):
            raise FakeEngineDeadError("EngineCore encountered an issue. See stack trace (above) for the root cause.")

        self.engine.generate = self.engine.chat = self.engine.update_weights = dead


def _cfg(tmp_path, model_path, *overrides):
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}", "project=core",
                              "explorer.num_engines=1", *overrides])


def test_a_dead_engine_error_is_recognised_by_name_without_vllm():
    assert engine_core_death(FakeEngineDeadError()) is not None
    wrapped = RuntimeError("generate failed")
    wrapped.__cause__ = FakeEngineDeadError()
    assert isinstance(engine_core_death(wrapped), FakeEngineDeadError)  # found in the chain
    assert engine_core_death(RuntimeError("CUDA out of memory")) is None
    assert engine_core_death(type("EngineDeadError", (Exception,), {})()) is None  # not vLLM's


def test_an_engine_whose_core_died_is_restarted_and_reloads_the_current_version(tmp_path, tiny_model_path,
                                                                              ray_session):
    cfg = _cfg(tmp_path, tiny_model_path, "explorer.max_engine_restarts=1")
    prompts = [hf_tokenizer(tiny_model_path).encode(p) for p in ("1+2=", "7+8=")]
    weights = export_state_dict(load_causal_lm(tiny_model_path))
    # version 1 zeroes the final norm: every greedy response is token 0 (tells it from the initial model)
    v1 = dict(weights, **{"model.norm.weight": torch.zeros_like(weights["model.norm.weight"])})

    async def main():
        fleet = EngineFleet(cfg, engine_actor=FaultyDeviceActor)
        try:
            await fleet.ready()
            await fleet.update_weights(WeightsInfo(version=1, refs=[ray.put(v1)]))
            before = await fleet.slots[0].actor.pid.remote()
            await fleet.slots[0].actor.fault.remote()
            samples = await fleet.generate(prompts, GREEDY, [1, 2])  # fails, restarts, reloads, retried
            after = await fleet.slots[0].actor.pid.remote()
            return samples, before, after, fleet.engine_versions()[0], fleet.restarts
        finally:
            fleet.kill()

    samples, before, after, state, restarts = asyncio.run(main())
    assert after != before and restarts == 1 and state["core_deaths"] == 1
    assert all(s.model_version == 1 and s.response_ids.tolist() == [0] for s in samples)  # version 1, reloaded
    assert state["version"] == 1


def test_with_its_restarts_used_up_the_fleet_stops_at_once_in_one_line(tmp_path, tiny_model_path, ray_session):
    cfg = _cfg(tmp_path, tiny_model_path, "explorer.max_engine_restarts=1", "explorer.max_retries=5")
    (tmp_path / "device-faults").touch()  # the fake device faults again in every restarted engine
    prompt = hf_tokenizer(tiny_model_path).encode("1+2=")

    async def main():
        fleet = EngineFleet(cfg, engine_actor=FaultyDeviceActor)
        try:
            await fleet.ready()
            start = time.perf_counter()
            with pytest.raises(EngineLost) as lost:
                await fleet.generate([prompt], GREEDY, [1])
            elapsed = time.perf_counter() - start
            with pytest.raises(EngineLost):  # and every later call, at once, without trying an engine
                await fleet.generate([prompt], GREEDY, [1])
            return lost.value, elapsed, fleet.engine_versions()[0]
        finally:
            fleet.kill()

    err, elapsed, state = asyncio.run(main())
    message = str(err)
    assert isinstance(err, RunError) and "\n" not in message  # the command line prints it as one line
    assert "engine 0 (hf-0)" in message and "EngineDeadError" in message and "max_engine_restarts: 1" in message
    assert state["core_deaths"] == 2  # the first death restarted it, the second stopped the fleet
    assert elapsed < 60


def test_the_explorer_does_not_retry_a_task_past_a_lost_engine(tmp_path, tiny_model_path):
    """The task loop records ordinary failures and goes on; a lost engine ends the step (and the run) instead."""
    from trinity_like.common.tasks import Task
    from trinity_like.explorer.rollout import RolloutParts
    from trinity_like.explorer.workflows import Workflow, WorkflowContext
    from trinity_like.runtime.paths import RunPaths
    from trinity_like.runtime.run_home import RunFiles

    class OnLostEngine(Workflow):
        calls = 0

        async def run(self, task, engine, ctx):
            OnLostEngine.calls += 1
            raise EngineLost("engine 0 (vllm-0) is lost")

    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}", "project=core",
                             "explorer.max_retries=2"])
    paths = RunPaths.of(cfg)
    paths.run_dir.mkdir(parents=True)
    parts = RolloutParts(cfg, files=RunFiles(paths), workflow=OnLostEngine(), fleet=None)
    ctx = WorkflowContext(sampling=cfg.explorer.sampling, repeat_times=1, seeds=[0], tokenizer=None,
                          reward_manager=None)
    with pytest.raises(EngineLost):
        asyncio.run(parts.run_task(Task("t", "1+1=", "2"), ctx))
    assert OnLostEngine.calls == 1 and not (paths.run_dir / "failed_tasks.jsonl").exists()


def test_engine_core_died_crosses_ray_whole():
    import pickle

    err = pickle.loads(pickle.dumps(EngineCoreDied("EngineDeadError: gone", "vllm-0", os.getpid())))
    assert (str(err), err.engine_id, err.pid) == ("EngineDeadError: gone", "vllm-0", os.getpid())
