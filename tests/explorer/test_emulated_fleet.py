"""An EMULATED fleet under the real EngineFleet (issue 51): many emulated engines per Ray actor, each its own engine
to the fleet (slot, version, routing, admission, fingerprint check, health). Real Ray, real weight path (the object
store), the tiny model's vocabulary; emulation only, never a test of an engine."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import ray
import torch

from trinity_like.config import SamplingConfig, load_config
from trinity_like.explorer.engines.emulated import response_length
from trinity_like.explorer.fleet import EngineFleet, WeightsLoadFailed
from trinity_like.weights.fingerprint import weights_fingerprint
from trinity_like.weights.messages import WeightsInfo

pytestmark = [pytest.mark.ray]

SAMPLING = SamplingConfig(max_new_tokens=200)


def test_eight_emulated_engines_in_two_actors_are_eight_engines_to_the_fleet(tmp_path, tiny_model_path, ray_session):
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}", "project=emu",
                             "explorer.engine=emulated", "explorer.num_engines=8",
                             "explorer.emulated.engines_per_actor=5", "explorer.emulated.mean_response_tokens=20"])
    sd = {"w": torch.arange(4.0)}
    v1 = WeightsInfo(version=1, refs=[ray.put(sd)], fingerprint=weights_fingerprint(sd))
    damaged = WeightsInfo(version=2, refs=[ray.put({"w": torch.zeros(4)})], fingerprint=weights_fingerprint(sd))
    seeds = [11, 12, 13]

    async def main():
        fleet = EngineFleet(cfg)
        try:
            await fleet.ready()
            pids = [await s.actor.pid.remote() for s in fleet.slots]
            on_0 = await fleet.call("generate", [[1, 2]] * 3, SAMPLING, seeds, engine=0)
            on_6 = await fleet.call("generate", [[3]] * 3, SAMPLING, seeds, engine=6)
            await fleet.update_weights(v1)
            after = await fleet.at_least(1).generate([[1]] * 3, SAMPLING, seeds)
            with pytest.raises(WeightsLoadFailed, match="8 of 8 engines"):
                await fleet.update_weights(damaged)
            health = await fleet.health()
            return pids, on_0, on_6, after, fleet.engine_versions(), health, fleet.busy_s(), fleet.newest_version
        finally:
            fleet.kill()

    pids, on_0, on_6, after, versions, health, busy_s, newest = asyncio.run(main())
    assert len(set(pids[:5])) == 1 and len(set(pids[5:])) == 1 and pids[0] != pids[5]  # 5 + 3 engines, 2 actors
    assert [h["engine_id"] for h in health] == [f"emulated-{i}" for i in range(8)]
    for a, b, seed in zip(on_0, on_6, seeds, strict=True):  # the same seed: the same response on any engine
        assert np.array_equal(a.response_ids, b.response_ids)
        assert len(a.response_ids) == min(response_length(seed, 20.0, cfg.explorer.emulated.max_response_tokens)[0],
                                          SAMPLING.max_new_tokens)
    assert [s.engine_id for s in on_0] == ["emulated-0"] * 3 and on_6[0].engine_id == "emulated-6"
    assert all(s.model_version == 1 for s in after) and newest == 1
    assert len(versions) == 8 and all(v["version"] == 1 and v["verified"] for v in versions)
    assert all(v["mismatches"] == 1 for v in versions)  # the damaged version 2: refused by every engine
    assert all(h["model_version"] == 1 and h["loads"] == 1 for h in health) and busy_s > 0


def test_a_cancelled_call_stops_in_the_engine_and_a_finish_load_does_not_wait_for_it(tmp_path, tiny_model_path,
                                                                                       ray_session):
    """Streaming rollout cancels late groups (``StreamRollout._cancel_late``); the fleet cancels the engine's request
    too (``EngineFleet._cancel_remote``), so it leaves the batch and a ``finish`` load (which drains the requests
    running) takes ``load_s``, not the rest of a long response."""
    import time

    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}", "project=emu",
                             "explorer.engine=emulated", "explorer.num_engines=1",
                             "explorer.emulated.mean_response_tokens=5000", "explorer.emulated.max_response_tokens=1000"])
    sd = {"w": torch.arange(4.0)}
    v1 = WeightsInfo(version=1, refs=[ray.put(sd)], fingerprint=weights_fingerprint(sd))
    long = SamplingConfig(max_new_tokens=1000)  # ~1000 x 6 ms = 6 s on the 7b_h100 curve

    async def main():
        fleet = EngineFleet(cfg)
        try:
            await fleet.ready()
            call = asyncio.ensure_future(fleet.call("generate", [[1, 2]], long, [5], engine=0))
            await asyncio.sleep(0.5)
            busy = (await fleet.health())[0]["in_flight"]
            call.cancel()
            start = time.perf_counter()
            await fleet.update_weights(v1)
            load_s = time.perf_counter() - start
            return busy, (await fleet.health())[0], load_s
        finally:
            fleet.kill()

    busy, health, load_s = asyncio.run(main())
    assert busy == 1 and health["in_flight"] == 0 and health["model_version"] == 1
    assert load_s < 3.0  # load_s 0.67 plus Ray calls; waiting for the cancelled request would take ~5 s more
