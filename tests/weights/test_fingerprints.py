"""Verified delivery: every published version carries the fingerprint the trainer computed from its bytes, every
engine checks what it received and what it serves against it, and a transfer damaged on the way (a test hook
flips one byte after the transfer, before the check) is refused on each CPU path (checkpoint files, the object
store, the gloo broadcast, a shared-memory buffer) while the previous version keeps serving. Real Ray, real engines, the tiny model."""

import asyncio
import logging

import pytest
import ray
import torch

from trinity_like.config import SamplingConfig, load_config
from trinity_like.runtime.paths import namespace_of
from trinity_like.status import format_status
from trinity_like.weights.fingerprint import weights_fingerprint


@pytest.mark.slow
@pytest.mark.parametrize("method", ["checkpoint", "memory", "broadcast", "ipc"])
def test_a_byte_flipped_in_transfer_is_refused_counted_shown_and_the_previous_version_keeps_serving(
        tmp_path, tiny_model_path, ray_session, batch_exps, method, caplog):
    from trinity_like.explorer.fleet import EngineFleet, WeightsLoadFailed
    from trinity_like.synchronizer import CheckpointMonitor, get_synchronizer
    from trinity_like.trainer.ppo import PPOTrainer

    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}",
                             "trainer.device=cpu", "explorer.device=cpu",
                             "project=fp",
                             f"name=flip-{method}", "explorer.sampling.max_new_tokens=4", "explorer.batch_size=2",
                             "explorer.repeat_times=3", "trainer.optimizer.lr=0.01",
                             f"synchronizer.method={method}", "synchronizer.timeout_s=30"])
    sync = get_synchronizer(namespace_of(cfg))
    trainer = PPOTrainer(cfg, sync)
    trainer.prepare()

    # defined here: Ray sends a nested function by value (this test module is not importable in the actor)
    def _flip_one_byte_of_the_next_transfer(actor):
        """Runs inside the engine actor: its engine's next update has one byte of one tensor flipped (the dict's
        tensor is replaced, since tensors from the object store are read-only), once."""
        engine = actor.engine

        def flip(state_dict):
            name = sorted(state_dict)[len(state_dict) // 2]
            damaged = state_dict[name].clone()
            damaged.view(-1).view(torch.uint8)[3] ^= 0x10
            state_dict[name] = damaged
            engine.on_received = None

        engine.on_received = flip

    async def publish():
        trainer.train_step(batch_exps)
        trainer.sync_weight()
        info = await sync.latest.remote()
        assert info.version == trainer.train_step_num and info.method == method
        assert info.transport == {"checkpoint": "files", "memory": "object store", "broadcast": "gloo",
                                  "ipc": "shared memory"}[method]  # what it ran over here, on the CPU
        assert info.fingerprint == weights_fingerprint(trainer.policy_state_dict())  # of what was published
        return info

    async def main():
        fleet = EngineFleet(cfg)
        await fleet.ready()
        actor = fleet.slots[0].actor
        try:
            v1 = await publish()
            await fleet.update_weights(v1)
            assert fleet.engine_versions() == [{"engine": 0, "version": 1, "fingerprint": v1.fingerprint,
                                                "verified": True, "mismatches": 0, "stalled": False,
                                                "core_deaths": 0}]
            assert await actor.weights_fingerprint.remote() == v1.fingerprint  # recomputed from the served model

            await actor.__ray_call__.remote(_flip_one_byte_of_the_next_transfer)
            v2 = await publish()
            with caplog.at_level(logging.ERROR, logger="trinity_like.explorer.fleet"):
                with pytest.raises(WeightsLoadFailed, match="fingerprint"):
                    await fleet.update_weights(v2)
            assert "could not load version 2" in caplog.text and f"trainer published {v2.fingerprint}" in caplog.text
            assert fleet.version == 1 and fleet.fingerprint_mismatches == 1
            assert await actor.weights_fingerprint.remote() == v1.fingerprint  # nothing of version 2 applied
            samples = await fleet.generate([[1, 2, 3]], SamplingConfig(max_new_tokens=3), [0])
            assert samples[0].model_version == 1
            health = await actor.health.remote()
            assert health["verified"] and health["fingerprint"] == v1.fingerprint
            report = {"namespace": "fp", "cluster": "connected", "synchronizer": True, "roles": [
                {"kind": "explorer", "role_id": "explorer-x", "state": "running", "version": 1,
                 "seconds_since_heartbeat": 0.2, "engine_versions": fleet.engine_versions()}]}
            assert (f"engine 0  version 1     fingerprint matches ({v1.fingerprint}), 1 load(s) refused by the check"
                    in format_status(report))

            await fleet.update_weights(v2)  # the next transfer is intact: version 2 loads and verifies
            assert fleet.version == 2 and await actor.weights_fingerprint.remote() == v2.fingerprint
            assert fleet.engine_versions()[0]["verified"] is True
        finally:
            fleet.kill()

    try:
        asyncio.run(main())
    finally:
        trainer.shutdown()
        if method == "checkpoint":
            ray.kill(CheckpointMonitor.get_actor(namespace_of(cfg)))
        ray.kill(sync)


def test_status_names_an_engine_whose_weights_do_not_match():
    report = {"namespace": "fp", "cluster": "connected", "synchronizer": True, "roles": [
        {"kind": "explorer", "role_id": "explorer-x", "state": "running", "version": 3, "seconds_since_heartbeat": 0.5,
         "engine_versions": [{"engine": 0, "version": 3, "fingerprint": "aa", "verified": True, "mismatches": 0},
                             {"engine": 1, "version": 3, "fingerprint": "bb", "verified": False, "mismatches": 2},
                             {"engine": 2, "version": 0, "fingerprint": "", "verified": None, "mismatches": 0},
                             {"engine": 3, "version": -1, "fingerprint": "cc", "verified": None, "mismatches": 0,
                              "stalled": True}]}]}
    text = format_status(report)
    assert "engine 0  version 3     fingerprint matches (aa)\n" in text + "\n"
    assert "engine 1  version 3     FINGERPRINT MISMATCH (bb), 2 load(s) refused by the check" in text
    assert "engine 2  version 0     fingerprint not checked (-)" in text
    assert "engine 3  version -1    fingerprint not checked (cc); STALLED: out of service until it answers" in text


@pytest.mark.gpu
def test_a_gpu_fingerprint_stays_on_the_gpu_and_equals_the_cpus_for_the_same_bytes():
    """Scheme s1 on CUDA (integer reductions on the device) gives what the CPU gives for the same bytes, for each
    dtype a model holds; a version fingerprinted on the trainer's GPU is what a CPU engine computes for it."""
    import torch

    from trinity_like.weights.fingerprint import (
        scheme_of,
        tensor_fingerprint,
        tensor_fingerprints,
        weights_fingerprint,
    )

    g = torch.Generator().manual_seed(0)
    sd = {f"t.{d}": (torch.randn(1000, 37, generator=g) * 100).to(d)
          for d in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.bool)}
    sd["odd"] = torch.randn(4099 * 8 + 3, generator=g).to(torch.bfloat16)  # rows, a tail and leftover bytes
    on_gpu = {k: v.cuda() for k, v in sd.items()}
    for k in sd:
        assert tensor_fingerprint(on_gpu[k], scheme="s1") == tensor_fingerprint(sd[k], scheme="s1"), k
    published = weights_fingerprint(on_gpu)  # the one-wait path on the device
    assert tensor_fingerprints(on_gpu) == tensor_fingerprints(sd)
    assert scheme_of(published) == "s1" and weights_fingerprint(sd, like=published) == published
