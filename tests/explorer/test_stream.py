"""Streaming rollout (``explorer.rollout: stream``) with a real Synchronizer actor, real engine actors, the real
tiny model and real buffer segments; the trainer's part (publishing versions) is played by the test."""

import json
import time

import pytest
import ray

from trinity_like.buffer import query
from trinity_like.config import ConfigError, load_config
from trinity_like.explorer.role import ExplorerRole
from trinity_like.runtime.paths import RunPaths, namespace_of
from trinity_like.runtime.run_dir import prepare_run_dir
from trinity_like.synchronizer import get_synchronizer
from trinity_like.weights.messages import WeightsInfo

pytestmark = pytest.mark.slow


def _cfg(tmp_path, model_path, *overrides):
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}", "project=ex",
                              "explorer.sampling.max_new_tokens=6", "mode=async", "explorer.rollout=stream",
                              "explorer.stream.flush_s=0", *overrides])


def _weights(model_path):
    from trinity_like.common.modeling import export_state_dict, load_causal_lm

    return export_state_dict(load_causal_lm(model_path))


def _rows(cfg):
    buffer = RunPaths.of(cfg).buffer_dir
    return query(buffer).to_pylist() if any(buffer.glob("**/*.arrow")) else []


def _wait_rows(cfg, n, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = _rows(cfg)
        if len(rows) >= n:
            return rows
        time.sleep(0.2)
    raise AssertionError(f"{n} rows were not written within {timeout}s (have {len(_rows(cfg))})")


def test_stream_admits_each_group_by_the_staleness_rule(tmp_path, tiny_model_path, ray_session):
    # batch 4 x repeat 2, train batch 4, S = 1: group p of step s has r = 8s + 2p rows before it, feeds trainer
    # step c = r // 4 = 2s + p // 2 and needs version c - 1: step 0's groups need 0, 0, 0, 0; step 1's need
    # 1, 1, 2, 2. So half of step 1 runs on version 1 and its other half waits for version 2.
    cfg = _cfg(tmp_path, tiny_model_path, "name=stream-admit", "synchronizer.max_staleness=1",
               "explorer.batch_size=4", "explorer.repeat_times=2", "trainer.batch_size=4")
    prepare_run_dir(cfg)
    sync = get_synchronizer(namespace_of(cfg))
    explorer = ray.remote(num_cpus=0)(ExplorerRole).remote(cfg)
    weights = ray.put(_weights(tiny_model_path))
    try:
        ray.get(explorer.setup.remote())
        run = explorer.run.remote(2)
        assert len(_wait_rows(cfg, 8)) == 8  # step 0, on version 0
        time.sleep(3)
        assert len(_rows(cfg)) == 8, "a group ran ahead of the staleness bound"
        ray.get(sync.publish.remote(WeightsInfo(version=1, path=None, refs=[weights])))
        assert len(_wait_rows(cfg, 12)) == 12  # step 1's first two groups
        time.sleep(3)
        assert len(_rows(cfg)) == 12, "step 1's last groups need version 2"
        ray.get(sync.publish.remote(WeightsInfo(version=2, path=None, refs=[weights])))
        assert ray.get(run, timeout=90) == 2
    finally:
        ray.get(explorer.shutdown.remote())
        ray.kill(explorer)
        ray.kill(sync)
    rows = _rows(cfg)
    by_group = {}
    for r in rows:
        by_group.setdefault(r["group_id"], set()).add(r["model_version"])
    positions = {g: (int(g.split("-")[0][1:]), int(g.rsplit("-", 1)[1])) for g in by_group}
    versions = {positions[g]: v for g, v in by_group.items()}
    assert versions == {(0, 0): {0}, (0, 1): {0}, (0, 2): {0}, (0, 3): {0},
                        (1, 0): {1}, (1, 1): {1}, (1, 2): {2}, (1, 3): {2}}
    assert all(json.loads(r["info"])["explore_step"] == positions[r["group_id"]][0] for r in rows)
    # one metrics record per explorer step, in groups
    records = [json.loads(x) for x in RunPaths.of(cfg).metrics.read_text().splitlines()]
    explorer_records = [r for r in records if r["role"] == "explorer"]
    assert [r["step"] for r in explorer_records] == [1, 2]
    assert [r["rollout/experiences"] for r in explorer_records] == [8.0, 8.0]
    assert explorer_records[1]["rollout/groups_written"] == 8.0
    assert explorer_records[1]["sync/loads"] >= 1.0 and explorer_records[1]["rollout/admission_wait_s"] >= 2.5
    # the engine held work for part of each step's span; the second one waited seconds for versions
    assert all(0.0 < r["rollout/engine_busy_frac"] <= 1.0 for r in explorer_records)
    assert explorer_records[1]["rollout/engine_busy_frac"] < explorer_records[0]["rollout/engine_busy_frac"]


def test_stream_writes_a_group_as_soon_as_it_ends(tmp_path, tiny_model_path, ray_session):
    slow = tmp_path / "slow.py"
    slow.write_text(
        "import asyncio\n"
        "from trinity_like.explorer.workflows import SingleTurnWorkflow\n"
        "class Slow(SingleTurnWorkflow):\n"
        "    async def run(self, task, engine, ctx):\n"
        "        base = (42 * 1_000_003 + ctx.explore_step) * 10_007  # the explorer's seed of position 0\n"
        "        await asyncio.sleep(8.0 if ctx.seeds[0] != base else 0.0)  # position 1 of each step is slow\n"
        "        return await super().run(task, engine, ctx)\n")
    cfg = _cfg(tmp_path, tiny_model_path, "name=stream-write", "synchronizer.max_staleness=2",
               f"explorer.workflow={slow}:Slow", "explorer.batch_size=2", "explorer.repeat_times=2",
               "trainer.batch_size=4")
    prepare_run_dir(cfg)
    sync = get_synchronizer(namespace_of(cfg))
    explorer = ray.remote(num_cpus=0)(ExplorerRole).remote(cfg)
    try:
        ray.get(explorer.setup.remote())
        run = explorer.run.remote(3)
        # S = 2 admits steps 0..2 on version 0; their fast groups are written while the slow ones still run
        start = time.monotonic()
        fast = _wait_rows(cfg, 6, timeout=60)
        assert time.monotonic() - start < 7.5
        assert {r["group_id"].rsplit("-", 1)[1] for r in fast} == {"0"}
        status = ray.get(sync.status.remote())
        assert status["explore_steps"]["claimed"] == [0, 1, 2]  # no step is finished before its last group
        for _ in range(30):  # the heartbeat (every second) says what runs: the three slow groups
            status = ray.get(sync.status.remote())
            role = next(r for r in status["roles"].values() if r["kind"] == "explorer")
            if role.get("groups_in_flight") == 3:
                break
            time.sleep(0.1)
        assert role.get("groups_in_flight") == 3
        assert ray.get(run, timeout=90) == 3
    finally:
        ray.get(explorer.shutdown.remote())
        ray.kill(explorer)
        ray.kill(sync)
    assert len(_rows(cfg)) == 12


def test_stream_at_bound_0_runs_the_step_path(tmp_path, tiny_model_path, ray_session):
    cfg = _cfg(tmp_path, tiny_model_path, "name=stream-zero", "synchronizer.max_staleness=0")
    prepare_run_dir(cfg)
    sync = get_synchronizer(namespace_of(cfg))
    explorer = ray.remote(num_cpus=0)(ExplorerRole).remote(cfg)
    try:
        ray.get(explorer.setup.remote())
        assert ray.get(explorer.run.remote(1), timeout=90) == 1
        assert ray.get(explorer.role_info.remote())["next_step"] == 1
    finally:
        ray.get(explorer.shutdown.remote())
        ray.kill(explorer)
        ray.kill(sync)
    assert "rollout/groups_written" not in RunPaths.of(cfg).metrics.read_text()  # the step path wrote it


def test_stream_refuses_what_it_cannot_mean(tmp_path):
    with pytest.raises(ConfigError, match="over_rollout_frac=0.5 ends a step"):
        _cfg(tmp_path, "m", "explorer.over_rollout_frac=0.5")
    with pytest.raises(ConfigError, match="synchronizer.offset=1 delays"):
        _cfg(tmp_path, "m", "synchronizer.offset=1")


def _first_explorer(cfg):
    """A Synchronizer that declares a silent explorer dead within 3 s, and a first explorer running step 0 (not
    awaited); returns (synchronizer, the explorer actor class, the explorer)."""
    prepare_run_dir(cfg)
    sync = get_synchronizer(namespace_of(cfg), heartbeat_timeout_s=3.0)
    role_cls = ray.remote(num_cpus=0)(ExplorerRole)
    first = role_cls.remote(cfg)
    ray.get(first.setup.remote())
    first.run.remote(1)
    return sync, role_cls, first


def _kill_and_take_over(first, sync, role_cls, cfg, flag):
    """SIGKILL explorer ``first``; once the Synchronizer hands its step 0 back, release the held groups (``flag``)
    and let a new explorer run the step; return the new one."""
    import os
    import signal

    os.kill(ray.get(first.__ray_call__.remote(lambda self: os.getpid())), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while ray.get(sync.status.remote())["explore_steps"]["returned"] != [0]:
        assert time.monotonic() < deadline, "the killed explorer's step was never handed back"
        time.sleep(0.5)
    flag.unlink()
    second = role_cls.remote(cfg)
    ray.get(second.setup.remote())
    assert ray.get(second.run.remote(1), timeout=120) == 1
    return second


def test_a_step_whose_explorer_is_killed_mid_step_is_finished_by_another_without_repeating_a_group(
        tmp_path, tiny_model_path, ray_session):

    from trinity_like.buffer import BufferConsumer
    flag = tmp_path / "slow-flag"
    flag.write_text("")
    slow = tmp_path / "slow.py"
    slow.write_text(
        "import asyncio, os\n"
        "from trinity_like.explorer.workflows import SingleTurnWorkflow\n"
        "class Slow(SingleTurnWorkflow):\n"
        "    async def run(self, task, engine, ctx):\n"
        "        base = (42 * 1_000_003 + ctx.explore_step) * 10_007\n"
        f"        while (ctx.seeds[0] - base) // 2 >= 2 and os.path.exists({str(flag)!r}):  # positions 2, 3 hang\n"
        "            await asyncio.sleep(0.2)\n"
        "        return await super().run(task, engine, ctx)\n")
    cfg = _cfg(tmp_path, tiny_model_path, "name=stream-takeover", "synchronizer.max_staleness=1",
               f"explorer.workflow={slow}:Slow", "explorer.batch_size=4", "explorer.repeat_times=2",
               "trainer.batch_size=8")
    sync, role_cls, first = _first_explorer(cfg)
    second = None
    try:
        assert len(_wait_rows(cfg, 4)) == 4  # groups 0 and 1 written; 2 and 3 hang
        second = _kill_and_take_over(first, sync, role_cls, cfg, flag)
        status = ray.get(sync.status.remote())
    finally:
        for actor in (first, second):
            if actor is not None:
                ray.kill(actor)
        ray.kill(sync)
    rows = _rows(cfg)
    groups = {}
    for r in rows:
        groups.setdefault(r["group_id"], []).append(json.loads(r["info"])["explore_position"])
    assert sorted(p for ps in groups.values() for p in set(ps)) == [0, 1, 2, 3]  # each group once
    assert all(len(ps) == 2 for ps in groups.values()) and len(rows) == 8
    assert status["explore_steps"]["rows_written"] == 8  # the step counts the first explorer's rows too
    record = [json.loads(x) for x in RunPaths.of(cfg).metrics.read_text().splitlines() if '"explorer"' in x][-1]
    assert record["rollout/groups_taken_over"] == 2.0 and record["rollout/experiences"] == 4.0
    consumer = BufferConsumer(RunPaths.of(cfg).buffer_dir)
    assert len(consumer.read(8, step=1, timeout_s=5)) == 8 and consumer.stats()["buffer/quarantined"] == 0


def test_an_explorer_killed_mid_group_has_its_journaled_calls_taken_up_by_the_next(tmp_path, tiny_model_path,
                                                                                   ray_session):
    """Group 1's responses are all generated (and journaled) when its explorer is SIGKILLed before writing it; the
    explorer that takes the step over does not generate them again, and the journal is gone once it is written."""

    from trinity_like.buffer.partial import PartialStore
    flag = tmp_path / "hold"
    flag.write_text("")
    hold = tmp_path / "hold.py"
    hold.write_text(
        "import asyncio, os\n"
        "from trinity_like.explorer.workflows import SingleTurnWorkflow\n"
        "class Hold(SingleTurnWorkflow):\n"
        "    async def run(self, task, engine, ctx):\n"
        "        out = await super().run(task, engine, ctx)\n"
        "        base = (42 * 1_000_003 + ctx.explore_step) * 10_007\n"
        f"        while ctx.seeds[0] != base and os.path.exists({str(flag)!r}):  # group 1 waits, generated\n"
        "            await asyncio.sleep(0.1)\n"
        "        return out\n")
    cfg = _cfg(tmp_path, tiny_model_path, "name=stream-journal", "synchronizer.max_staleness=1",
               f"explorer.workflow={hold}:Hold", "explorer.batch_size=2", "explorer.repeat_times=2",
               "trainer.batch_size=4", "explorer.sampling.max_new_tokens=12",
               "explorer.stream.on_new_version=resubmit", "explorer.stream.chunk_tokens=4")
    sync, role_cls, first = _first_explorer(cfg)
    store = PartialStore(RunPaths.of(cfg).buffer_dir)
    second = None
    try:
        assert len(_wait_rows(cfg, 2)) == 2  # group 0 written; group 1 generated and held
        journal = store.load(0, 1)
        assert journal is not None and journal.num_rows == 2 and store.steps() == [0]
        assert store.load(0, 0) is None  # written: its journal went
        second = _kill_and_take_over(first, sync, role_cls, cfg, flag)
    finally:
        for actor in (first, second):
            if actor is not None:
                ray.kill(actor)
        ray.kill(sync)
    rows = [r for r in _rows(cfg) if r["group_id"].endswith("-1")]
    assert sorted(r["response_ids"] for r in rows) == sorted(journal.column("response_ids").to_pylist())
    record = [json.loads(x) for x in RunPaths.of(cfg).metrics.read_text().splitlines() if '"explorer"' in x][-1]
    resumed = sum(len(ids) for ids in journal.column("response_ids").to_pylist())
    assert record["rollout/partial_resumed_tokens"] == resumed > 0 and record["rollout/engine_calls"] == 0
    assert store.steps() == [] and len(_rows(cfg)) == 4


def test_streaming_merges_the_group_calls_waiting_for_an_hf_engine_into_one(tmp_path, tiny_model_path, ray_session):
    """Per-group calls to an engine that serves one call at a time, arriving together: they go as one engine call,
    and every request gets the tokens it gets alone."""
    import asyncio

    from trinity_like.common.tokenizer import hf_tokenizer
    from trinity_like.config import SamplingConfig
    from trinity_like.explorer.fleet import EngineFleet
    cfg = _cfg(tmp_path, tiny_model_path, "name=pool", "synchronizer.max_staleness=1")
    tok = hf_tokenizer(tiny_model_path)
    groups = [[tok.encode(f"{g}+{g}=")] * 2 for g in range(8)]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=8)

    async def main():
        fleet = EngineFleet(cfg)
        await fleet.ready()
        assert fleet.pooled
        pooled = await asyncio.gather(*(fleet.generate(p, sampling, [10 * g, 10 * g + 1])
                                        for g, p in enumerate(groups)))
        calls = fleet.pooled_calls
        fleet.pooled = False
        alone = [await fleet.generate(p, sampling, [10 * g, 10 * g + 1]) for g, p in enumerate(groups)]
        fleet.kill()
        return pooled, calls, alone

    pooled, calls, alone = asyncio.run(main())
    assert calls == 1
    assert [[s.response_ids.tolist() for s in g] for g in pooled] == [[s.response_ids.tolist() for s in g]
                                                                      for g in alone]


@pytest.mark.parametrize("pooled", [True, False])
def test_a_group_needing_a_new_version_starts_on_an_engine_that_loaded_it_before_the_others_do(
        tmp_path, tiny_model_path, ray_session, pooled):
    """Per-engine admission. (1) While engine 1 is busy with a long call (a load waits behind it, as under
    `finish` it waits for the engine's drain), engine 0 loads version 1 at once; a group that needs version 1 runs
    there (`at_least(1)`) before the whole fleet holds it, and its samples carry version 1. (2) The routing: with
    only engine 0 holding version 2 and busy, a call that needs version 2 waits for engine 0, while one that does
    not goes to idle engine 1 (pooled: it joins the other)."""
    import asyncio

    from trinity_like.common.tokenizer import hf_tokenizer
    from trinity_like.config import SamplingConfig
    from trinity_like.explorer.fleet import EngineFleet
    cfg = _cfg(tmp_path, tiny_model_path, f"name=ahead-{pooled}", "explorer.num_engines=2",
               "synchronizer.max_staleness=1")
    tok = hf_tokenizer(tiny_model_path)
    prompts = [tok.encode(f"{i}+{i}=") for i in range(4)]
    short, long = SamplingConfig(max_new_tokens=6), SamplingConfig(max_new_tokens=300)
    v1 = ray.put(_weights(tiny_model_path))

    async def busy(fleet, engine):
        call = asyncio.ensure_future(fleet.call("generate", prompts * 8, long, list(range(32)), None, False,
                                                engine=engine))
        while fleet.slots[engine].in_flight == 0:
            await asyncio.sleep(0.001)
        return call

    async def main():
        fleet = EngineFleet(cfg)
        await fleet.ready()
        fleet.pooled = pooled
        # (1) admission ahead of the fleet's version
        first = await busy(fleet, 1)
        load = asyncio.ensure_future(fleet.update_weights(WeightsInfo(version=1, refs=[v1], method="memory")))
        while fleet.slots[0].version < 1:
            await asyncio.sleep(0.001)
        seen = (fleet.version, fleet.newest_version)
        ahead = await fleet.at_least(1).generate(prompts, short, [1, 2, 3, 4])
        still_loading = not load.done()
        await load
        await first
        loaded = (fleet.version, fleet.newest_version)
        # (2) routing: engine 0 alone gets version 2, then is kept busy
        await fleet._sync_slot(fleet.slots[0], WeightsInfo(version=2, refs=[v1], method="memory"))
        second = await busy(fleet, 0)
        needs_2, any_version = await asyncio.gather(fleet.at_least(2).generate(prompts, short, [1, 2, 3, 4]),
                                                    fleet.generate(prompts, short, [1, 2, 3, 4]))
        await second
        fleet.kill()
        return seen, ahead, still_loading, loaded, needs_2, any_version

    seen, ahead, still_loading, loaded, needs_2, any_version = asyncio.run(main())
    assert seen == (0, 1) and loaded == (1, 1)
    assert still_loading  # the group did not wait for engine 1's load
    assert {s.model_version for s in ahead} == {1} and {s.engine_id for s in ahead} == {"hf-0"}
    assert {s.model_version for s in needs_2} == {2} and {s.engine_id for s in needs_2} == {"hf-0"}
    # unpooled, the other call goes to the idle engine; pooled, it joins the waiting call (one engine call, on an
    # engine holding the newest version any of the merged calls needs)
    expected = ({2}, {"hf-0"}) if pooled else ({1}, {"hf-1"})
    assert ({s.model_version for s in any_version}, {s.engine_id for s in any_version}) == expected


def test_a_group_that_can_no_longer_be_trained_is_cancelled_when_a_version_is_published(tmp_path, tiny_model_path,
                                                                                         ray_session):
    # batch 2 x repeat 1, train batch 2, S = 1, train_slack 1: step 0's groups need version 0. Group 1 generates on
    # version 0, then its workflow works on for a minute. Version 3 published: every row left is trained at version
    # >= 3, where a token older than 3 - 1 - 1 = 1 is masked, so group 1 (all version 0) is cancelled and step 0
    # ends with group 0's row alone.
    slow = tmp_path / "slow.py"
    slow.write_text(
        "import asyncio\n"
        "from trinity_like.explorer.workflows import SingleTurnWorkflow\n"
        "class Slow(SingleTurnWorkflow):\n"
        "    async def run(self, task, engine, ctx):\n"
        "        group = await super().run(task, engine, ctx)\n"
        "        base = (42 * 1_000_003 + ctx.explore_step) * 10_007  # the explorer's seed of position 0\n"
        "        await asyncio.sleep(0.0 if ctx.seeds[0] == base else 60.0)\n"
        "        return group\n")
    cfg = _cfg(tmp_path, tiny_model_path, "name=stream-late", "synchronizer.max_staleness=1",
               "synchronizer.train_slack=1", "explorer.stream.on_new_version=finish", f"explorer.workflow={slow}:Slow",
               "explorer.batch_size=2", "explorer.repeat_times=1", "trainer.batch_size=2")
    prepare_run_dir(cfg)
    sync = get_synchronizer(namespace_of(cfg))
    explorer = ray.remote(num_cpus=0)(ExplorerRole).remote(cfg)
    try:
        ray.get(explorer.setup.remote())
        run = explorer.run.remote(1)
        assert len(_wait_rows(cfg, 1)) == 1  # group 0, on version 0
        start = time.monotonic()
        ray.get(sync.publish.remote(WeightsInfo(version=3, path=None, refs=[ray.put(_weights(tiny_model_path))])))
        assert ray.get(run, timeout=60) == 1
        assert time.monotonic() - start < 30  # group 1 did not run its minute out
    finally:
        ray.get(explorer.shutdown.remote())
        ray.kill(explorer)
        ray.kill(sync)
    assert [r["group_id"].rsplit("-", 1)[1] for r in _rows(cfg)] == ["0"]
    (record,) = [json.loads(x) for x in RunPaths.of(cfg).metrics.read_text().splitlines()
                 if json.loads(x)["role"] == "explorer"]
    assert record["rollout/cancelled_groups"] == 1.0 and record["rollout/experiences"] == 1.0
    assert record["rollout/failed_tasks"] == 0.0  # cancelled, not failed
    assert record["rollout/group_latency_versions"] == 0.0  # group 0 was written at version 0, its own
    assert not (RunPaths.of(cfg).run_dir / "failed_tasks.jsonl").exists()
