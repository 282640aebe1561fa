"""explorer -> buffer -> trainer -> synchronizer, end to end on a real Ray instance with the tiny model."""

import json

import pytest
import torch
from conftest import e2e_config as _cfg  # tests/ is on sys.path (rootdir conftest, no package)
from safetensors.torch import load_file

from trinity_like.buffer import query
from trinity_like.buffer.sql import consumption_table
from trinity_like.launcher import run
from trinity_like.runtime.paths import RunPaths

pytestmark = pytest.mark.slow


LENGTH_REWARD = "def compute_score(responses, ground_truths, **kw):\n    return [float(len(r) % 3) for r in responses]\n"
"""A reward that varies with the response, so every group has an advantage signal and the weights move."""


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory, tiny_model_path, ray_session):
    """One sync run (checkpoint method, max_staleness 0, the length reward) that several tests read: each run
    costs ~15 s of actor start-up, and what they assert differs, not the run."""
    tmp_path = tmp_path_factory.mktemp("sync-run")
    reward_file = tmp_path / "length_reward.py"
    reward_file.write_text(LENGTH_REWARD)
    cfg = _cfg(tmp_path, tiny_model_path, "sync", "mode=sync", "synchronizer.max_staleness=0",
               f"reward.function_path={reward_file}")
    return cfg, run(cfg)


def _final_weights(cfg):
    return load_file(str(RunPaths.of(cfg).checkpoint_dir / "step_3" / "model" / "model.safetensors"))


def _records(cfg):
    lines = RunPaths.of(cfg).metrics.read_text().splitlines()
    return [json.loads(x) for x in lines]


def _check_run(cfg, summary):
    paths = RunPaths.of(cfg)
    assert summary["exit_reason"] == "completed"
    assert summary["trainer_steps"] == 3 and summary["final_version"] == 3
    assert json.loads(paths.summary.read_text()) == summary
    assert "mode: " + cfg.mode in paths.config.read_text()
    records = _records(cfg)
    trainer = [r for r in records if r["role"] == "trainer"]
    assert [r["step"] for r in trainer] == [1, 2, 3]
    assert all(r["train/batch_size"] == 8 for r in trainer)
    # every explorer row was trained exactly once, in exactly one committed step
    ledger = consumption_table(paths.buffer_dir).to_pylist()
    assert all(r["committed"] and r["consumer"] == "trainer" for r in ledger)
    eids = [r["eid"] for r in ledger]
    assert len(eids) == len(set(eids)) == 24
    assert sorted({r["step"] for r in ledger}) == [1, 2, 3]
    stored = set(query(paths.buffer_dir).column("eid").to_pylist())
    assert set(eids) <= stored
    return records


@pytest.mark.xdist_group("e2e_sync_run")  # one run per group, not one per xdist worker
def test_sync_three_steps(sync_run):
    cfg, summary = sync_run
    records = _check_run(cfg, summary)
    assert summary["staleness_max"] == 0
    explorer = [r for r in records if r["role"] == "explorer"]
    # strict on-policy: explorer step k generated with version k
    assert [r["rollout/model_version"] for r in explorer] == [0, 1, 2]


@pytest.mark.xdist_group("e2e_async_run")  # one run per group, not one per xdist worker
def test_async_three_steps_respects_staleness(async_run):
    cfg, summary = async_run
    _check_run(cfg, summary)
    assert summary["staleness_max"] <= 1
    # the trainer role held the half GPU it asked for, and trained where `auto` put it
    assert summary["trainer_gpus"] == 0.5
    assert summary["trainer_device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")
    versions = query(RunPaths.of(cfg).buffer_dir).column("model_version").to_pylist()
    assert min(versions) == 0 and max(versions) <= 2


@pytest.mark.xdist_group("e2e_sync_run")  # one run per group, not one per xdist worker
def test_async_with_zero_staleness_equals_sync(tmp_path, tiny_model_path, sync_run):
    from trinity_like.common.modeling import export_state_dict, load_causal_lm

    sync_cfg, _ = sync_run  # with the length reward
    reward_file = tmp_path / "length_reward.py"
    reward_file.write_text(LENGTH_REWARD)
    varied = f"reward.function_path={reward_file}"
    async_cfg = _cfg(tmp_path, tiny_model_path, "eq-async", "mode=async", "synchronizer.max_staleness=0", varied)
    run(async_cfg)
    a, b = _final_weights(sync_cfg), _final_weights(async_cfg)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # a self-setting bound whose max is 0 is sync too (window 1: it decides after every step, and stays at 0)
    # (and streaming rollout at bound 0 runs the step path: the same batches)
    auto_cfg = _cfg(tmp_path, tiny_model_path, "eq-auto", "mode=async", "synchronizer.max_staleness=auto",
                    "synchronizer.auto_staleness.max=0", "synchronizer.auto_staleness.window=1",
                    "explorer.rollout=stream", varied)
    run(auto_cfg)
    d = _final_weights(auto_cfg)
    assert all(torch.equal(a[k], d[k]) for k in a)
    bounds = [r["sync/staleness_bound"] for r in _records(auto_cfg) if "sync/staleness_bound" in r]
    assert len(bounds) >= 6 and set(bounds) == {0.0}  # every trainer and explorer step logged it
    initial = export_state_dict(load_causal_lm(tiny_model_path))
    assert any(not torch.equal(a[k], initial[k]) for k in a)  # training did move the weights
    # and a different seed gives different weights, so the equality above is not vacuous
    other = _cfg(tmp_path, tiny_model_path, "eq-other", "mode=sync", "seed=7", varied)
    run(other)
    c = _final_weights(other)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_a_streaming_async_run_trains_every_row_once_within_the_bound(tmp_path, tiny_model_path, ray_session):
    reward_file = tmp_path / "length_reward.py"
    reward_file.write_text(LENGTH_REWARD)
    # responses of up to 4 tokens in pieces of 2: a version published mid-response makes the rest of it
    cfg = _cfg(tmp_path, tiny_model_path, "stream", "mode=async", "synchronizer.max_staleness=1",
               "explorer.rollout=stream", "explorer.stream.flush_s=0", "explorer.stream.on_new_version=resubmit",
               "explorer.stream.chunk_tokens=2", f"reward.function_path={reward_file}")
    summary = run(cfg)
    records = _check_run(cfg, summary)
    assert summary["staleness_max"] <= 1
    explorer = [r for r in records if r["role"] == "explorer"]
    assert explorer and all("rollout/groups_written" in r for r in explorer)  # the stream wrote them
    assert sum(r["rollout/engine_calls"] for r in explorer) > 6  # more calls than groups: responses were cut
    rows = query(RunPaths.of(cfg).buffer_dir).to_pylist()
    trained = {r["eid"]: r["step"] for r in consumption_table(RunPaths.of(cfg).buffer_dir).to_pylist()}
    # no trained token is staler than the bound: trained at trainer step k (version k - 1) from version v, the
    # row's oldest token's
    assert all(trained[r["eid"]] - 1 - r["model_version"] <= 1 for r in rows if r["eid"] in trained)
    for r in rows:  # a row of several versions: its oldest is model_version, and they only rise
        versions = r["token_versions"]
        assert versions is None or (min(versions) == r["model_version"] and versions == sorted(versions))


def _check_sync_without_files(cfg, records, method, failures: bool = False):
    """No weight files: the state dicts travelled through the object store / the process group / shared memory.
    ``failures``: the run stalled an engine on purpose, so failed rounds are expected."""
    assert not (RunPaths.of(cfg).checkpoint_dir / "state_dict").exists()
    explorer = [r for r in records if r["role"] == "explorer"]
    trainer = [r for r in records if r["role"] == "trainer"]
    assert all(r["sync/bytes"] > 0 and r["sync/version"] == r["step"] for r in trainer)
    assert explorer[-1]["sync/version"] >= 1 and (failures or explorer[-1]["sync/failures"] == 0)
    assert any(r.get("sync/bytes", 0) > 0 for r in explorer)  # the engines received weights
    if method == "ipc":  # the shared-memory buffers went with the trainer
        from trinity_like.runtime.paths import namespace_of
        from trinity_like.weights.shared import shared_root

        assert not (shared_root() / f"trinity_like-{namespace_of(cfg).replace('/', '_')}").exists()


@pytest.mark.xdist_group("e2e_sync_run")  # one run per group, not one per xdist worker
def test_checkpoint_method_prunes_old_versions(sync_run):
    cfg, _ = sync_run  # checkpoint method, max_staleness 0: two versions kept
    root = RunPaths.of(cfg).checkpoint_dir / "state_dict"
    assert sorted(f.name for f in root.iterdir()) == ["latest", "version-00000002", "version-00000003"]
    assert (root / "latest").read_text() == "3\n"
    assert sorted(f.name for f in (root / "version-00000003").iterdir()) == [
        "manifest.json", "part-00000-of-00001.safetensors"]


@pytest.mark.xdist_group("e2e_sync_run")  # one run per group, not one per xdist worker
def test_existing_run_directory_is_refused(sync_run):
    from trinity_like.common.errors import RunError

    cfg, _ = sync_run
    before = RunPaths.of(cfg).summary.read_text()
    with pytest.raises(RunError, match="already holds a run"):
        run(cfg)
    assert RunPaths.of(cfg).summary.read_text() == before  # nothing of the first run was touched


@pytest.mark.xdist_group("e2e_async_run")  # one run per group, not one per xdist worker
def test_async_with_correction_and_custom_reward(async_run):
    cfg, summary = async_run  # decoupled correction, a reward function that fails on empty responses, `memory`
    _check_sync_without_files(cfg, _check_run(cfg, summary), "memory")
    trainer = [r for r in _records(cfg) if r["role"] == "trainer"]
    assert all(0 < r["off_policy/ess"] <= 1 for r in trainer)
    rows = query(RunPaths.of(cfg).buffer_dir).to_pylist()
    for row in rows:
        text = row["response_text"]
        expected = -1.0 if text == "" else 1.0 / len(text)
        assert row["reward"] == pytest.approx(expected, rel=1e-6)  # float32 storage


def test_async_over_the_redis_transport_with_two_data_parallel_trainer_workers_publishing_by_ipc(
        tmp_path, tiny_model_path, ray_session, redis_server):
    """Two things one run proves (each run is ~20 worker-seconds of start-up): the Redis transport, and two
    data-parallel trainer workers publishing by `ipc`, whose broadcaster (the shared buffer) lives in rank 0's
    worker. Each sync method runs end to end once: `memory` in the shared async run, `broadcast` (gloo) in the
    stalled-engine run below, `checkpoint` in the shared sync run; two workers writing one version's parts by
    `checkpoint`: tests/synchronizer/test_synchronizer.py."""
    cfg = _cfg(tmp_path, tiny_model_path, "redis-dp", "mode=async", "buffer.transport=redis",
               f"buffer.redis_url={redis_server.url}", "trainer.num_workers=2", "synchronizer.method=ipc")
    records = _check_run(cfg, run(cfg))
    segments = [p.name for p in (RunPaths.of(cfg).buffer_dir / "segments").iterdir()]
    assert segments and all("-redis-" in name for name in segments)  # written by the ingester only
    _check_sync_without_files(cfg, records, "ipc")


@pytest.mark.xdist_group("e2e_async_run")  # one run per group, not one per xdist worker
def test_offline_replays_an_earlier_run_without_touching_it(tmp_path, tiny_model_path, async_run):
    source, _ = async_run
    src = RunPaths.of(source)
    stored = sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in src.run_dir.rglob("*") if p.is_file())

    # PPO/GRPO on the stored behaviour log-probs with truncated IS: 3 batches of 8 per epoch, 4 steps
    cfg = _cfg(tmp_path, tiny_model_path, "offline-ppo", "mode=offline", f"buffer.replay_sources=[{src.run_dir}]",
               "algorithm.off_policy.correction=tis", "trainer.total_steps=4")
    summary = run(cfg)
    assert summary["exit_reason"] == "completed" and summary["mode"] == "offline"
    assert summary["trainer_steps"] == 4 and summary["explorer_steps"] == 0
    trainer = [r for r in _records(cfg) if r["role"] == "trainer"]
    assert [r["replay/epoch"] for r in trainer] == [0, 0, 0, 1]
    assert all(r["train/batch_size"] == 8 and "off_policy/weight_mean" in r for r in trainer)
    paths = RunPaths.of(cfg)
    assert (paths.checkpoint_dir / "step_4" / "model" / "model.safetensors").is_file()
    assert not paths.buffer_dir.exists()  # an offline run consumes nothing and keeps no ledger

    # SFT on the same rows, the whole set per step: its NLL falls step after step
    cfg = _cfg(tmp_path, tiny_model_path, "offline-sft", "mode=offline", f"buffer.replay_sources=[{src.run_dir}]",
               "algorithm.policy_loss=sft", "trainer.batch_size=24", "trainer.micro_batch_size=8")
    run(cfg)
    nll = [r["actor/pg_loss"] for r in _records(cfg) if r["role"] == "trainer"]
    assert len(nll) == 3 and nll[0] > nll[1] > nll[2]

    after = sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in src.run_dir.rglob("*") if p.is_file())
    assert after == stored  # the source run is read, never written


def test_async_run_on_a_mix_of_explorer_rows_and_ingested_demonstrations(tmp_path, tiny_model_path, ray_session):
    """Human demonstrations ingested into a fresh run's buffer, then an async run with buffer.mix 50/50 and the
    SFT loss on the human rows: each batch holds the configured shares while the demonstrations last, and every
    row trained is in the ledger once."""
    from trinity_like.buffer.ingest import ingest_files

    cfg = _cfg(tmp_path, tiny_model_path, "mix", "mode=async", "buffer.mix={explorer:0.5,human:0.5}",
               "algorithm.sft_sources=[human]", "trainer.total_steps=2")
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"{a}+{a}="},
                                                      {"role": "assistant", "content": str(2 * a)}]}) + "\n"
                             for a in range(8)))
    report = ingest_files([demos], RunPaths.of(cfg).buffer_dir, source="human", tokenizer_path=tiny_model_path)
    assert report.accepted == 8
    summary = run(cfg)
    assert summary["exit_reason"] == "completed" and summary["trainer_steps"] == 2
    trainer = [r for r in _records(cfg) if r["role"] == "trainer"]
    assert [r["buffer/mix_human"] for r in trainer] == [0.5, 0.5]
    assert [r["buffer/mix_explorer"] for r in trainer] == [0.5, 0.5]
    assert all(r["actor/sft_rows"] == 4 and r["train/batch_size"] == 8 for r in trainer)
    ledger = consumption_table(RunPaths.of(cfg).buffer_dir).to_pylist()
    sources = dict(zip(query(RunPaths.of(cfg).buffer_dir).column("eid").to_pylist(),
                       query(RunPaths.of(cfg).buffer_dir).column("source").to_pylist(), strict=True))
    assert sorted(sources[r["eid"]] for r in ledger) == ["explorer"] * 8 + ["human"] * 8
    assert len({r["eid"] for r in ledger}) == 16 and all(r["committed"] for r in ledger)


def test_a_run_whose_engine_is_stopped_mid_sync_completes_on_the_other_engine(tmp_path, tiny_model_path,
                                                                               ray_session):
    """SIGSTOP one of two engines as soon as both wait for a broadcast round: the round (or the engine's next
    call) fails at its deadline, the engine is left out, and the run completes with every experience trained
    once; the trainer is never held up by the stalled engine. The run is also the end-to-end one of `broadcast` (gloo
    here) with two trainer workers: the broadcaster lives in rank 0's worker, and no weight file is written."""
    import os
    import signal
    import threading
    import time

    from trinity_like.runtime.paths import namespace_of
    from trinity_like.synchronizer import get_synchronizer

    cfg = _cfg(tmp_path, tiny_model_path, "sigstop", "mode=async", "explorer.num_engines=2",
               "synchronizer.method=broadcast", "synchronizer.sync_timeout_s=3", "explorer.call_timeout_s=8",
               "explorer.task_timeout_s=60", "trainer.num_workers=2")
    ns = namespace_of(cfg)
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.update(summary=run(cfg)), daemon=True)
    runner.start()
    stopped = None
    try:
        until = time.monotonic() + 240
        while stopped is None and runner.is_alive():
            assert time.monotonic() < until, "the engines never waited for a round together"
            try:
                waiting = ray_session.get(get_synchronizer(ns).status.remote(), timeout=5)["collective"]["waiting"]
            except Exception:  # the synchronizer not up yet
                waiting = []
            if len(waiting) >= 2:
                job = ray_session.get_runtime_context().get_job_id()  # the run's actors are this driver's
                engines = [a for a in ray_session._private.state.actors().values()  # (the GCS: no dashboard)
                           if a["ActorClassName"] == "EngineActor" and a["State"] == "ALIVE" and a["JobID"] == job]
                assert len(engines) == 2
                stopped = int(engines[-1]["Pid"])
                os.kill(stopped, signal.SIGSTOP)
            time.sleep(0.05)
        runner.join(timeout=300)
        assert not runner.is_alive(), "the run did not complete with one engine stopped"
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
    assert stopped is not None, "the run ended before the engines waited for a round together"
    summary = outcome["summary"]
    _check_sync_without_files(cfg, _check_run(cfg, summary), "broadcast", failures=True)
    explorer = [r for r in _records(cfg) if r["role"] == "explorer"]
    assert max(r.get("rollout/engine_restarts", 0) for r in explorer) == 0  # left out, not restarted
    assert max(r.get("sync/failures", 0) for r in explorer) >= 1  # the round with the stopped engine failed


def test_a_self_setting_bound_falls_when_the_off_policy_signal_degrades(tmp_path, tiny_model_path, ray_session):
    """``max_staleness: auto`` starting at its max of 3, a learning rate high enough that the decoupled
    correction's ESS collapses within a few steps (measured: 1.0, 0.84, 0.65, 0.36 over steps 1-4 at lr 0.05; at
    lr 0.001 it stays above 0.9 and so does the bound): the bound comes down, and the rows trained follow it."""
    reward_file = tmp_path / "length_reward.py"
    reward_file.write_text(LENGTH_REWARD)
    cfg = _cfg(tmp_path, tiny_model_path, "auto-falls", "mode=async", "trainer.total_steps=6",
               "trainer.optimizer.lr=0.05", "algorithm.off_policy.correction=decoupled",
               f"reward.function_path={reward_file}", "synchronizer.max_staleness=auto",
               "synchronizer.auto_staleness.start=3", "synchronizer.auto_staleness.max=3",
               "synchronizer.auto_staleness.window=1",
               "synchronizer.auto_staleness.window_s=0")
    summary = run(cfg)
    assert summary["exit_reason"] == "completed"
    trainer = [r for r in _records(cfg) if r["role"] == "trainer"]
    bounds = [r["sync/staleness_bound"] for r in trainer]
    assert max(bounds) <= 3 and min(bounds) < 3  # never above its max; down once the ESS fell
    fell_at = bounds.index(min(bounds))
    assert trainer[fell_at]["off_policy/ess"] < 0.9  # the step that brought it down had a degraded signal
    assert summary["staleness_max"] <= 3
