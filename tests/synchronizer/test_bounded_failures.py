"""Failures that used to hide become loud and bounded: weight files say which of incomplete, unreadable or
damaged they are, and the weight broadcaster gives up on an unreachable Synchronizer after its deadline."""

import time

import pytest
import torch

from trinity_like.weights.files import (
    MANIFEST,
    CorruptWeightsError,
    IncompleteWeightsError,
    WeightsAccessError,
    read_weights,
    version_dir,
    write_manifest,
    write_part,
)
from trinity_like.weights.messages import WeightsInfo


def _version(tmp_path, version=1):
    vdir = version_dir(tmp_path, version)
    parts = [write_part(vdir, r, 2, {f"w{r}": torch.arange(4, dtype=torch.float32) + r}) for r in range(2)]
    write_manifest(vdir, version, parts)
    return vdir, parts


def test_weight_file_errors_say_what_is_wrong(tmp_path):
    vdir, parts = _version(tmp_path)
    assert set(read_weights(vdir)[0]) == {"w0", "w1"}
    # never completed: no manifest
    (vdir / MANIFEST).rename(vdir / "manifest.away")
    with pytest.raises(IncompleteWeightsError, match="never completed"):
        read_weights(vdir)
    # unreadable (here: the manifest is a folder; in life a permission or disk error)
    (vdir / MANIFEST).mkdir()
    with pytest.raises(WeightsAccessError, match="cannot be read"):
        read_weights(vdir)
    (vdir / MANIFEST).rmdir()
    (vdir / "manifest.away").rename(vdir / MANIFEST)
    # a part gone after the manifest was written
    (vdir / parts[1]["file"]).unlink()
    with pytest.raises(IncompleteWeightsError, match="missing"):
        read_weights(vdir)
    # damaged bytes are corruption, and only they
    other, parts = _version(tmp_path, 2)
    data = bytearray((other / parts[0]["file"]).read_bytes())
    data[-1] ^= 0xFF
    (other / parts[0]["file"]).write_bytes(bytes(data))
    with pytest.raises(CorruptWeightsError, match="damaged"):
        read_weights(other)
    assert not issubclass(WeightsAccessError, CorruptWeightsError)
    assert not issubclass(IncompleteWeightsError, CorruptWeightsError)


@pytest.mark.slow
def test_broadcaster_gives_up_on_an_unreachable_synchronizer_after_its_deadline(ray_session):
    """It used to retry forever, logging a warning every second."""
    from trinity_like.synchronizer import get_synchronizer
    from trinity_like.weights.broadcast import BroadcasterStopped, WeightBroadcaster

    sync = get_synchronizer("bounded/broadcast", run_id="run-b")
    broadcaster = WeightBroadcaster(sync, bucket_mb=1.0, timeout_s=2.0)
    try:
        ray_session.kill(sync)
        broadcaster.offer(1, {"w": torch.zeros(8)})
        deadline = time.monotonic() + 30
        while broadcaster.error is None:
            assert time.monotonic() < deadline, "the broadcaster kept retrying past its deadline"
            time.sleep(0.2)
        assert "could not reach the Synchronizer for 2s" in str(broadcaster.error)
        with pytest.raises(BroadcasterStopped, match="synchronizer.timeout_s"):
            broadcaster.offer(2, {"w": torch.ones(8)})
    finally:
        broadcaster.close()


@pytest.mark.slow
def test_an_engine_stopped_in_a_broadcast_round_fails_it_within_the_deadline_and_leaves_service_until_it_answers(
        tmp_path, tiny_model_path, ray_session, batch_exps):
    """SIGSTOP, not SIGKILL: the stopped engine's sockets stay open, so only the deadline ends the round. The
    other engine keeps its version and serves alone; the next round forms without the stopped engine; the trainer
    is never held up; after SIGCONT the engine answers, comes back and is brought up to date before it serves."""
    import asyncio
    import os
    import signal

    from trinity_like.config import SamplingConfig, load_config
    from trinity_like.explorer.fleet import EngineFleet, WeightsLoadFailed
    from trinity_like.runtime.paths import namespace_of
    from trinity_like.synchronizer import get_synchronizer
    from trinity_like.trainer.ppo import PPOTrainer
    from trinity_like.weights.fingerprint import weights_fingerprint

    deadline_s = 4.0
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}",
                             "trainer.device=cpu", "explorer.device=cpu",
                             "project=bounded",
                             "name=sigstop", "explorer.sampling.max_new_tokens=4", "explorer.batch_size=2",
                             "explorer.repeat_times=3", "explorer.num_engines=2", "trainer.optimizer.lr=0.01",
                             "synchronizer.method=broadcast", f"synchronizer.sync_timeout_s={deadline_s}",
                             "synchronizer.timeout_s=60"])
    sync = get_synchronizer(namespace_of(cfg))
    trainer = PPOTrainer(cfg, sync)
    trainer.prepare()

    async def waiting(n):
        until = time.monotonic() + 30
        while len((await sync.status.remote())["collective"]["waiting"]) < n:
            assert time.monotonic() < until
            await asyncio.sleep(0.1)

    async def main():
        fleet = EngineFleet(cfg)
        await fleet.ready()
        stopped = fleet.slots[1]
        pid = await stopped.actor.pid.remote()
        try:
            trainer.train_step(batch_exps)
            trainer.sync_weight()
            await fleet.update_weights(await sync.latest.remote())
            v1 = await fleet.slots[0].actor.weights_fingerprint.remote()

            # both engines wait for version 2; engine 1 is stopped: it becomes a member that never joins
            update = asyncio.ensure_future(fleet.update_weights(WeightsInfo(version=2, method="broadcast")))
            await waiting(2)
            os.kill(pid, signal.SIGSTOP)
            trainer.train_step(batch_exps)
            start = time.monotonic()
            trainer.sync_weight()  # offers version 2 and returns: the round runs in the broadcaster's thread
            assert time.monotonic() - start < 2.0
            # engine 1 stalls; engine 0 fails with it, at the group's deadline, when the round needed a new group
            # (the version-1 round split in two under load: the stopped engine never joins the new one)
            with pytest.raises(WeightsLoadFailed, match=r"engines could not load version 2: (EngineStalled: "
                               r"engine 1 did not finish loading version 2|DistStoreError: wait timeout)"):
                await update
            elapsed = time.monotonic() - start
            assert elapsed < fleet._load_deadline(WeightsInfo(version=2, method="broadcast")) + 10
            assert trainer.publisher.broadcaster.failures == 1  # the round failed at its deadline, not later
            assert stopped.stalled and fleet.version == 1
            assert fleet.engine_versions()[1]["stalled"] is True
            # engine 0 holds an intact version: the old one, or the new one if gloo sent it all its bytes before
            # blocking on the stopped member (it applies a version only when complete and fingerprint-checked)
            want = weights_fingerprint(trainer.policy_state_dict())
            held = {v1: 1, want: 2}[await fleet.slots[0].actor.weights_fingerprint.remote()]
            assert fleet.slots[0].version == held
            samples = await asyncio.wait_for(fleet.generate_spread([[1, 2, 3]] * 4, SamplingConfig(max_new_tokens=3),
                                                                   [0, 1, 2, 3]), 30)
            assert {s.engine_id for s in samples} == {"hf-0"} and {s.model_version for s in samples} == {held}

            await asyncio.wait_for(fleet.update_weights(await sync.latest.remote()), 30)  # without engine 1
            assert fleet.version == 2 and await fleet.slots[0].actor.weights_fingerprint.remote() == want
            if held == 1:  # engine 0 needed a round: a new group, without the stopped engine
                assert len((await sync.status.remote())["collective"]["members"]) == 1

            os.kill(pid, signal.SIGCONT)
            until = time.monotonic() + 60
            while stopped.stalled:
                assert time.monotonic() < until, "the engine never came back after SIGCONT"
                await asyncio.sleep(0.5)
                fleet._check_stalled()
            await asyncio.wait_for(fleet.call("health", engine=1), 60)  # brought to version 2 before the call
            assert stopped.version == 2 and await stopped.actor.weights_fingerprint.remote() == want
        finally:
            os.kill(pid, signal.SIGCONT)
            fleet.kill()

    try:
        asyncio.run(main())
    finally:
        trainer.shutdown()
        ray_session.kill(sync)


@pytest.mark.slow
def test_an_engine_that_stops_answering_calls_is_left_out_and_its_calls_retried_elsewhere(tmp_path, tiny_model_path,
                                                                                         ray_session):
    import asyncio
    import os
    import signal

    from trinity_like.config import SamplingConfig, load_config
    from trinity_like.explorer.fleet import EngineFleet

    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}",
                             "trainer.device=cpu", "explorer.device=cpu",
                             "project=bounded",
                             "name=callstall", "explorer.num_engines=2", "explorer.call_timeout_s=3",
                             "explorer.task_timeout_s=30"])

    async def main():
        fleet = EngineFleet(cfg)
        await fleet.ready()
        pid = await fleet.slots[1].actor.pid.remote()
        try:
            os.kill(pid, signal.SIGSTOP)
            start = time.monotonic()
            samples = await fleet.generate_spread([[1, 2, 3]] * 4, SamplingConfig(max_new_tokens=3), [0, 1, 2, 3])
            elapsed = time.monotonic() - start
            assert {s.engine_id for s in samples} == {"hf-0"} and len(samples) == 4
            assert 3 <= elapsed < 3 + 20  # one call deadline, then served by engine 0
            assert fleet.slots[1].stalled
            again = await asyncio.wait_for(fleet.generate_spread([[1, 2, 3]] * 4, SamplingConfig(max_new_tokens=3),
                                                                 [0, 1, 2, 3]), 10)  # no wait: left out at once
            assert {s.engine_id for s in again} == {"hf-0"}
            assert [s.response_ids.tolist() for s in again] == [s.response_ids.tolist() for s in samples]
            os.kill(pid, signal.SIGCONT)
            until = time.monotonic() + 60
            while fleet.slots[1].stalled:
                assert time.monotonic() < until, "the engine never came back after SIGCONT"
                await asyncio.sleep(0.2)
                fleet._check_stalled()
            back = await fleet.generate_spread([[1, 2, 3]] * 4, SamplingConfig(max_new_tokens=3), [0, 1, 2, 3])
            assert {s.engine_id for s in back} == {"hf-0", "hf-1"}
        finally:
            os.kill(pid, signal.SIGCONT)
            fleet.kill()

    asyncio.run(main())
