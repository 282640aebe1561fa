"""Weight sync: schedule, CheckpointMonitor, version folders, fleets of engines, faults (real Ray, real processes,
SIGKILL, the real tiny model)."""

import asyncio
import logging
import os
import signal
import time

import pytest
import ray

from trinity_like.common.modeling import export_state_dict, load_causal_lm
from trinity_like.config import SamplingConfig, load_config
from trinity_like.runtime.paths import namespace_of
from trinity_like.weights.files import CorruptWeightsError, read_weights, split_for_writers, write_part
from trinity_like.weights.fingerprint import weights_fingerprint
from trinity_like.weights.messages import WeightsInfo


def _cfg(tmp_path, model_path, name, *overrides):
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}",
                              "trainer.device=cpu", "explorer.device=cpu",
                              "project=sync",
                              f"name={name}", "explorer.sampling.max_new_tokens=4", "explorer.batch_size=2",
                              "explorer.repeat_times=2", *overrides])


def test_version_files_split_over_writers_and_refuse_damage(tmp_path, tiny_model_path):
    sd = export_state_dict(load_causal_lm(tiny_model_path))
    shares = split_for_writers(sd, 3)
    assert sorted(n for s in shares for n in s) == sorted(sd)  # every tensor exactly once
    sizes = [sum(sd[n].numel() for n in s) for s in shares]
    assert max(sizes) - min(sizes) <= max(t.numel() for t in sd.values())  # balanced within one tensor
    from trinity_like.weights.files import complete_version

    parts = [write_part(tmp_path / "version-00000001", r, 3, {n: sd[n] for n in s}) for r, s in enumerate(shares)]
    with pytest.raises(FileNotFoundError, match="never completed"):
        read_weights(tmp_path / "version-00000001")  # no manifest yet: not a version
    vdir = complete_version(tmp_path, 1, parts, keep=2)
    loaded, size = read_weights(vdir)
    assert weights_fingerprint(loaded) == weights_fingerprint(sd) and size == sum(p["bytes"] for p in parts)
    part = vdir / parts[1]["file"]
    data = bytearray(part.read_bytes())
    data[-3] ^= 0xFF  # one flipped bit pattern in the tensor data: safetensors itself would not notice
    part.write_bytes(bytes(data))
    with pytest.raises(CorruptWeightsError, match="damaged"):
        read_weights(vdir)
    part.write_bytes(bytes(data[:100]))  # torn
    with pytest.raises(CorruptWeightsError):
        read_weights(vdir)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["checkpoint", "broadcast"])
def test_two_explorers_with_two_engines_receive_versions(tmp_path, tiny_model_path, ray_session, batch_exps, method):
    from trinity_like.explorer.fleet import EngineFleet
    from trinity_like.synchronizer import CheckpointMonitor, get_synchronizer
    from trinity_like.trainer.ppo import PPOTrainer

    # broadcast here is gloo (no GPU): the same rounds, groups and slicing
    cfg = _cfg(tmp_path, tiny_model_path, f"fleets-{method}", "explorer.num_engines=2", "explorer.repeat_times=3",
               "trainer.optimizer.lr=0.01", f"synchronizer.method={method}", "synchronizer.bucket_mb=0.25")
    sync = get_synchronizer(namespace_of(cfg))
    trainer = PPOTrainer(cfg, sync)
    trainer.prepare()

    async def main():
        fleets = [EngineFleet(cfg), EngineFleet(cfg)]
        await asyncio.gather(*(f.ready() for f in fleets))
        try:
            digests = []
            for _ in range(2):
                trainer.train_step(batch_exps)
                metrics = trainer.sync_weight()
                assert metrics["sync/version"] == trainer.train_step_num and metrics["sync/bytes"] > 0
                info = await sync.latest.remote()
                assert info.version == trainer.train_step_num and info.method == method
                loaded = await asyncio.gather(*(f.update_weights(info)
                                                for f in fleets))
                assert loaded == [2 * info.bytes] * 2
                want = weights_fingerprint(trainer.policy_state_dict())
                for f in fleets:
                    got = await asyncio.gather(*(s.actor.weights_fingerprint.remote() for s in f.slots))
                    assert got == [want, want]
                    assert [h["model_version"] for h in await f.health()] == [info.version] * 2
                digests.append(want)
            assert digests[0] != digests[1]
            if method == "broadcast":
                collective = (await sync.status.remote())["collective"]
                # one round per version with all four engines; the same members reuse the first group
                assert collective["rounds"] == 2 and collective["generation"] == 1
                assert len(collective["members"]) == 4
                assert trainer.publisher.broadcaster.failures == 0
        finally:
            for f in fleets:
                f.kill()

    try:
        asyncio.run(main())
    finally:
        trainer.shutdown()
        ray.kill(CheckpointMonitor.get_actor(namespace_of(cfg)))
        ray.kill(sync)


@pytest.mark.slow
def test_corrupted_version_is_refused_logged_and_the_old_one_keeps_serving(tmp_path, tiny_model_path, ray_session,
                                                                          batch_exps, caplog):
    from trinity_like.explorer.fleet import EngineFleet, WeightsLoadFailed
    from trinity_like.trainer.ppo import PPOTrainer

    cfg = _cfg(tmp_path, tiny_model_path, "corrupt", "explorer.num_engines=2", "explorer.repeat_times=3",
               "trainer.optimizer.lr=0.01")
    trainer = PPOTrainer(cfg)  # standalone: it completes its versions itself
    trainer.prepare()
    initial = weights_fingerprint(trainer.policy_state_dict())
    trainer.train_step(batch_exps)
    good = trainer.save_state_dict()
    bad_dir = good.parent / "version-00000002"
    bad_dir.mkdir()
    for f in good.iterdir():
        (bad_dir / f.name).write_bytes(f.read_bytes())
    part = next(bad_dir.glob("part-*.safetensors"))
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x55
    part.write_bytes(bytes(data))

    async def main():
        fleet = EngineFleet(cfg)
        await fleet.ready()
        try:
            with caplog.at_level(logging.ERROR, logger="trinity_like.explorer.fleet"):
                with pytest.raises(WeightsLoadFailed, match="could not load version 2"):
                    await fleet.update_weights(WeightsInfo(version=2, path=str(bad_dir)))
            assert "could not load version 2" in caplog.text and "damaged" in caplog.text
            assert fleet.version == 0
            assert await asyncio.gather(*(s.actor.weights_fingerprint.remote() for s in fleet.slots)) == [initial] * 2
            samples = await fleet.generate([[1, 2, 3]], SamplingConfig(max_new_tokens=3), [0])
            assert samples[0].model_version == 0  # still serving, with the version it really used
            await fleet.update_weights(WeightsInfo(version=1, path=str(good)))  # a good version loads
            assert fleet.version == 1
        finally:
            fleet.kill()

    asyncio.run(main())


def _pid(actor) -> int:
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))


@pytest.mark.slow
def test_trainer_killed_mid_publish_leaves_every_explorer_on_the_previous_version(tmp_path, tiny_model_path,
                                                                                  ray_session, batch_exps):
    from trinity_like.explorer.fleet import EngineFleet
    from trinity_like.synchronizer import CheckpointMonitor, get_synchronizer
    from trinity_like.trainer.workers import DataParallelTrainer

    cfg = _cfg(tmp_path, tiny_model_path, "killed", "explorer.num_engines=2", "explorer.repeat_times=3",
               "trainer.num_workers=2", "trainer.micro_batch_size=2", "trainer.optimizer.lr=0.01")
    ns = namespace_of(cfg)
    sync = get_synchronizer(ns)
    trainer = DataParallelTrainer(cfg, sync)
    trainer.prepare()
    monitor = CheckpointMonitor.get_actor(ns)

    async def main():
        fleet = EngineFleet(cfg)
        await fleet.ready()
        try:
            trainer.train_step(batch_exps)
            trainer.sync_weight()  # version 1, both ranks' parts, published by the monitor
            info = await sync.latest.remote()
            await fleet.update_weights(info)
            v1 = await fleet.slots[0].actor.weights_fingerprint.remote()

            trainer.train_step(batch_exps)
            rank0, rank1 = trainer.group.workers
            ray.get(rank0.call.remote("save_state_dict"))  # rank 0 wrote its part of version 2 ...
            os.kill(_pid(rank1), signal.SIGKILL)  # ... and rank 1 dies before writing its own
            time.sleep(1.0)
            vdir = tmp_path / "sync" / "killed" / "checkpoints" / "state_dict" / "version-00000002"
            assert [p.name for p in vdir.iterdir()] == ["part-00000-of-00002.safetensors"]
            assert not await monitor.monitor_step.remote(2, True, 2.0)  # never completed
            info = await sync.latest.remote()
            assert info.version == 1  # nothing half-written was published
            await fleet.update_weights(info)  # explorers sync: still version 1
            assert fleet.version == 1
            assert await asyncio.gather(*(s.actor.weights_fingerprint.remote() for s in fleet.slots)) == [v1, v1]
            samples = await fleet.generate([[1, 2, 3]], SamplingConfig(max_new_tokens=3), [0])
            assert samples[0].model_version == 1

            # a restarted (single-writer) trainer publishes version 3; the torn version 2 folder is swept away
            sd = export_state_dict(load_causal_lm(tiny_model_path))
            await monitor.register_thread_count.remote(3, state_dict_thread_count=1)
            part = write_part(vdir.parent / "version-00000003", 0, 1, sd)
            await monitor.notify_finished.remote(3, is_state_dict=True, part=part)
            info = await sync.latest.remote()
            assert info.version == 3 and not vdir.exists()
            await fleet.update_weights(info)
            assert fleet.version == 3
        finally:
            fleet.kill()

    try:
        asyncio.run(main())
    finally:
        trainer.shutdown()
        ray.kill(monitor)
        ray.kill(sync)


@pytest.mark.slow
def test_explorer_restarted_mid_run_rejoins_with_the_latest_version_and_the_dead_one_is_reported(
        tmp_path, tiny_model_path, ray_session):
    from trinity_like.explorer.role import ExplorerRole
    from trinity_like.runtime.run_dir import prepare_run_dir
    from trinity_like.synchronizer import get_synchronizer
    from trinity_like.weights.messages import WeightsInfo
    cfg = _cfg(tmp_path, tiny_model_path, "rejoin", "mode=async", "synchronizer.max_staleness=4",
               "synchronizer.interval=2", "synchronizer.method=memory")
    prepare_run_dir(cfg)
    sync = get_synchronizer(namespace_of(cfg), heartbeat_timeout_s=3.0, exit_grace_s=10.0)
    sd = export_state_dict(load_causal_lm(tiny_model_path))
    role_cls = ray.remote(num_cpus=0)(ExplorerRole)
    first = role_cls.remote(cfg)
    try:
        ray.get(first.setup.remote())
        versions = []
        for v in range(1, 5):  # a new version before every step: the fixed schedule loads at steps 0, 2
            bumped = {k: t + v * 1e-3 for k, t in sd.items()}
            ray.get(sync.publish.remote(WeightsInfo(version=v, refs=[ray.put(bumped)], method="memory")))
            versions.append(ray.get(first.step.remote(), timeout=60)["sync/version"])
        assert versions == [1.0, 1.0, 3.0, 3.0]
        first_id = [rid for rid in ray.get(sync.status.remote())["roles"]][0]
        os.kill(_pid(first), signal.SIGKILL)  # the explorer process dies mid-run

        second = role_cls.remote(cfg)
        ray.get(second.setup.remote())
        metrics = ray.get(second.step.remote(), timeout=60)
        assert metrics["sync/version"] == 4.0 and metrics["rollout/model_version"] == 4.0  # the latest, at once
        deadline = time.monotonic() + 20
        while ray.get(sync.status.remote())["roles"][first_id]["state"] != "dead":
            assert time.monotonic() < deadline, "the killed explorer was never reported dead"
            time.sleep(0.5)
        status = ray.get(sync.status.remote())
        alive = [r for rid, r in status["roles"].items() if rid != first_id]
        assert [(r["kind"], r["state"], r["version"]) for r in alive] == [("explorer", "running", 4)]
        ray.get(second.shutdown.remote())
        ray.get(sync.mark_ended.remote("explorer", "finished", [rid for rid in status["roles"] if rid != first_id][0]))
        deadline = time.monotonic() + 30  # no role left: the synchronizer exits on its own
        while True:
            try:
                ray.get(sync.status.remote(), timeout=5)
            except ray.exceptions.RayActorError:
                break
            assert time.monotonic() < deadline, "the synchronizer outlived every role"
            time.sleep(0.5)
    finally:
        for actor in (first, sync):
            ray.kill(actor)


@pytest.mark.slow
def test_broadcast_cut_off_by_a_killed_engine_keeps_the_previous_version_and_recovers(tmp_path, tiny_model_path,
                                                                                      ray_session, batch_exps):
    from trinity_like.explorer.fleet import EngineActor, EngineFleet, WeightsLoadFailed
    from trinity_like.synchronizer import get_synchronizer
    from trinity_like.trainer.ppo import PPOTrainer

    cfg = _cfg(tmp_path, tiny_model_path, "cutoff", "explorer.num_engines=2", "explorer.repeat_times=3",
               "trainer.optimizer.lr=0.01", "synchronizer.method=broadcast", "synchronizer.timeout_s=8",
               "synchronizer.sync_timeout_s=15")  # the cut-off round fails at this deadline (default 120 s)
    sync = get_synchronizer(namespace_of(cfg))
    trainer = PPOTrainer(cfg, sync)
    trainer.prepare()

    async def waiting(n):
        deadline = time.monotonic() + 30
        while len((await sync.status.remote())["collective"]["waiting"]) < n:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)

    async def main():
        fleet = EngineFleet(cfg)
        await fleet.ready()
        doomed = ray.remote(num_cpus=0)(EngineActor).remote(cfg, 9)
        try:
            trainer.train_step(batch_exps)
            trainer.sync_weight()
            await fleet.update_weights(WeightsInfo(version=1, method="broadcast"))
            v1 = await fleet.slots[0].actor.weights_fingerprint.remote()

            # a third engine waits for version 2 and its process is killed: it becomes a member of the round
            # that never receives, so the transfer is cut off for everyone
            doomed_pid = _pid(doomed)  # asked first: the actor runs one call at a time
            doomed_engine = ray.get(doomed.health.remote())["engine_id"]
            doomed.receive_weights.remote(2)
            await waiting(1)
            os.kill(doomed_pid, signal.SIGKILL)
            update = asyncio.ensure_future(fleet.update_weights(WeightsInfo(version=2, method="broadcast")))
            await waiting(3)
            trainer.train_step(batch_exps)
            trainer.sync_weight()  # offers version 2
            with pytest.raises(WeightsLoadFailed):
                await update
            assert fleet.version == 1
            assert await asyncio.gather(*(s.actor.weights_fingerprint.remote() for s in fleet.slots)) == [v1, v1]
            samples = await fleet.generate([[1, 2, 3]], SamplingConfig(max_new_tokens=3), [0])
            assert samples[0].model_version == 1  # still serving the intact previous version

            await fleet.update_weights(WeightsInfo(version=2, method="broadcast"))  # retried: a new group without the dead engine
            want = weights_fingerprint(trainer.policy_state_dict())
            assert await asyncio.gather(*(s.actor.weights_fingerprint.remote() for s in fleet.slots)) == [want, want]
            assert trainer.publisher.broadcaster.failures == 1
            # a new group (generation 3 or later: under load the two engines may join the retry in separate
            # rounds) whose members are the two live engines only
            collective = (await sync.status.remote())["collective"]
            assert collective["generation"] >= 3
            assert all(not m.startswith(doomed_engine + "-") for m in collective["members"])
        finally:
            fleet.kill()

    try:
        asyncio.run(main())
    finally:
        trainer.shutdown()
        ray.kill(sync)


def _schedule(total_steps: int):
    from trinity_like.runtime.schedule import Schedule

    # 4 planned rows per explorer step, 4 rows per trainer step: one explorer step per trainer step
    return Schedule(mode="async", rows_per_step=4, train_batch_size=4, total_steps=total_steps, interval=1,
                    offset=0, max_staleness=1)


def test_explorer_steps_form_one_sequence_and_a_dead_explorers_steps_are_redone(ray_session):
    from trinity_like.synchronizer import get_synchronizer

    sync = get_synchronizer("sync/steps", heartbeat_timeout_s=1.0, exit_grace_s=60.0, run_id="run-a")
    seven = _schedule(7)  # 28 rows needed
    try:
        # the buffer already holds steps 0, 1 and 3 (4 rows each): step 2 was lost (its explorer died) and goes first
        ray.get(sync.init_explore_steps.remote({0: 4, 1: 4, 3: 4}))
        ray.get(sync.init_explore_steps.remote({}))  # only the first explorer's view counts
        for rid in ("e1", "e2"):
            ray.get(sync.register.remote("explorer", rid))
        claims = [ray.get(sync.claim_explore_step.remote(rid, seven)) for rid in ("e1", "e2", "e1", "e2")]
        assert claims == [2, 4, 5, 6]
        # 12 rows written + 4 steps running x 4 planned rows = 28: covered
        assert ray.get(sync.claim_explore_step.remote("e1", seven)) is None
        ray.get([sync.finish_explore_step.remote(s, 4) for s in (2, 4, 5)])
        assert not ray.get(sync.explore_finished.remote(seven))  # step 6 is still running
        # e2 stops heartbeating: it is reported dead and its step 6 is handed out again
        deadline = time.monotonic() + 20
        while ray.get(sync.status.remote())["roles"]["e2"]["state"] != "dead":
            ray.get(sync.heartbeat.remote("e1"))
            assert time.monotonic() < deadline
            time.sleep(0.3)
        assert ray.get(sync.status.remote())["explore_steps"]["returned"] == [6]
        assert ray.get(sync.claim_explore_step.remote("e3", seven)) == 6
        ray.get(sync.finish_explore_step.remote(6, 4))
        assert ray.get(sync.explore_finished.remote(seven))
        assert ray.get(sync.status.remote())["explore_steps"]["rows_written"] == 28
        # a stopped explorer gives its claims back at once
        assert ray.get(sync.claim_explore_step.remote("e1", _schedule(8))) == 7
        ray.get(sync.mark_ended.remote("explorer", "stopped", "e1"))
        assert ray.get(sync.status.remote())["explore_steps"]["returned"] == [7]
    finally:
        ray.kill(sync)


def test_steps_cut_off_mid_way_are_taken_up_again_and_known_as_redone(ray_session):
    """Streaming rollout: a step whose ``buffer/partial`` folder survived a crash is part-written whatever rows
    the buffer holds of it; it is handed out first, its rows are not counted, and its explorer is told it is a redo
    (it then runs only the groups not written)."""
    from trinity_like.synchronizer import get_synchronizer

    sync = get_synchronizer("sync/cut", heartbeat_timeout_s=5.0, exit_grace_s=60.0, run_id="run-c")
    try:
        ray.get(sync.init_explore_steps.remote({0: 4, 1: 2, 2: 1}, [1, 3]))  # 1 part-written, 3 had nothing yet
        st = ray.get(sync.status.remote())["explore_steps"]
        assert st["next"] == 4 and st["returned"] == [1, 3] and st["rows_written"] == 5
        ray.get(sync.register.remote("explorer", "e1"))
        assert [ray.get(sync.claim_explore_step.remote("e1", _schedule(9))) for _ in range(3)] == [1, 3, 4]
        assert [ray.get(sync.explore_step_redone.remote(s)) for s in (1, 3, 4)] == [True, True, False]
        assert ray.get(sync.rows_before.remote(3, 4)) == 4 + 4 + 1  # step 1 counts its plan until finished
    finally:
        ray.kill(sync)


def test_short_steps_and_dropped_rows_are_explored_again(ray_session):
    """Exploring ends on rows written, not on steps run: a step that writes fewer rows than it planned
    (dynamic sampling, failed tasks), or rows the trainer drops (too stale, quarantined), make more steps."""
    from trinity_like.synchronizer import get_synchronizer

    sync = get_synchronizer("sync/short", heartbeat_timeout_s=30.0, exit_grace_s=60.0, run_id="run-b")
    two = _schedule(2)  # 8 rows needed
    try:
        ray.get(sync.init_explore_steps.remote({}))
        assert [ray.get(sync.claim_explore_step.remote("e1", two)) for _ in range(3)] == [0, 1, None]
        ray.get(sync.finish_explore_step.remote(0, 4))
        ray.get(sync.finish_explore_step.remote(1, 1))  # 3 of its 4 rows were filtered out
        assert not ray.get(sync.explore_finished.remote(two))
        assert ray.get(sync.claim_explore_step.remote("e1", two)) == 2
        # admission counts rows written before a step, and planned rows for earlier steps still running
        assert ray.get(sync.rows_before.remote(2, 4)) == 5
        assert ray.get(sync.rows_before.remote(3, 4)) == 9  # step 2 is running: 4 planned
        ray.get(sync.finish_explore_step.remote(2, 0))  # an empty step
        assert ray.get(sync.claim_explore_step.remote("e1", two)) == 3
        ray.get(sync.finish_explore_step.remote(3, 4))
        assert ray.get(sync.explore_finished.remote(two))  # 9 rows >= 8
        ray.get(sync.report_dropped.remote(2))  # the trainer will never train 2 of them
        assert not ray.get(sync.explore_finished.remote(two))
        # and admission no longer counts them: step 4's rows come after 4 + 1 + 0 + 4 - 2 = 7 trained rows
        assert ray.get(sync.rows_before.remote(4, 4)) == 7
        assert ray.get(sync.claim_explore_step.remote("e1", two)) == 4
        assert ray.get(sync.claim_explore_step.remote("e1", two, 5)) is None  # max_steps caps the sequence
    finally:
        ray.kill(sync)


def test_resumed_trainer_may_go_back_once_and_a_stale_synchronizer_is_replaced(ray_session):
    from trinity_like.synchronizer import get_synchronizer
    from trinity_like.weights.messages import WeightsInfo
    sync = get_synchronizer("sync/resume", run_id="run-a")
    try:
        for v in (1, 2, 3):
            ray.get(sync.publish.remote(WeightsInfo(version=v)))
        with pytest.raises(ray.exceptions.RayTaskError, match="older than the published 3"):
            ray.get(sync.publish.remote(WeightsInfo(version=2)))
        ray.get(sync.trainer_resumed.remote(2))  # restarted from checkpoint 2
        with pytest.raises(ray.exceptions.RayTaskError, match="older"):
            ray.get(sync.publish.remote(WeightsInfo(version=1)))  # never below the checkpoint
        ray.get(sync.publish.remote(WeightsInfo(version=2, path="/new/2")))
        assert ray.get(sync.latest.remote()).path == "/new/2"
        with pytest.raises(ray.exceptions.RayTaskError, match="older"):
            ray.get(sync.publish.remote(WeightsInfo(version=1)))  # the window closed with that publish
        # the same namespace, a new run (another id): the old synchronizer is replaced, not joined
        assert get_synchronizer("sync/resume", run_id="run-a") is not None
        fresh = get_synchronizer("sync/resume", run_id="run-b")
        assert ray.get(fresh.latest.remote()).version == 0
        assert ray.get(fresh.status.remote())["run_id"] == "run-b"
    finally:
        for name in ("sync/resume",):
            try:
                ray.kill(ray.get_actor("synchronizer", namespace=name))
            except ValueError:
                pass
