"""Streaming rollout under ``explorer.stream.on_new_version: finish`` when the engine is busy with a response longer
than ``synchronizer.sync_timeout_s`` (issue 49, R6): a load waits for the engine's running requests (an hf engine
serves one call at a time; vLLM's gate drains), and that wait is the drain, not a stalled transfer. Real Ray, the
real Synchronizer actor, a real hf engine actor, the real tiny model and real buffer segments; the trainer's part
(publishing a version) is played by the test."""

import json
import time

import pytest
import ray

from trinity_like.buffer import query
from trinity_like.config import load_config
from trinity_like.explorer.role import ExplorerRole
from trinity_like.runtime.paths import RunPaths, namespace_of
from trinity_like.runtime.run_dir import prepare_run_dir
from trinity_like.synchronizer import get_synchronizer
from trinity_like.weights.messages import WeightsInfo

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_a_load_waiting_for_a_drain_longer_than_sync_timeout_is_not_a_stalled_engine(tmp_path, tiny_model_path,
                                                                                    ray_session):
    """One hf engine; each step is 16 groups x 4 samples of up to 480 tokens (the tiny model's context is 512),
    merged into engine calls of seconds (2.5 s for 32 such samples alone on one core), against a load deadline
    ``sync_timeout_s`` of 1 s. Bound 1, trainer batch 64: steps 0 and 1 run on version 0, step 2 needs version 1,
    published while step 0's call runs, so its load waits for the drain. The run must end with every row, every
    step-2 row on version 1, the version loaded once, and no failed load or stalled engine (before the fix the
    load timed out at 1 s: the engine was taken out of service as stalled, the load counted as a sync failure,
    and the version was loaded again once the engine answered)."""
    from trinity_like.common.modeling import export_state_dict, load_causal_lm

    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}", "project=ex",
                             "name=drain", "mode=async", "explorer.rollout=stream", "explorer.stream.flush_s=0",
                             "explorer.stream.on_new_version=finish", "explorer.sampling.max_new_tokens=480",
                             "explorer.sampling.temperature=1.0", "explorer.num_threads=1",
                             "explorer.batch_size=16", "explorer.repeat_times=4", "trainer.batch_size=64",
                             "synchronizer.max_staleness=1", "synchronizer.sync_timeout_s=1"])
    prepare_run_dir(cfg)
    sync = get_synchronizer(namespace_of(cfg))
    explorer = ray.remote(num_cpus=0)(ExplorerRole).remote(cfg)
    weights = ray.put(export_state_dict(load_causal_lm(tiny_model_path)))
    try:
        ray.get(explorer.setup.remote())
        run = explorer.run.remote(3)
        time.sleep(1.0)  # step 0's groups are in the engine's call
        ray.get(sync.publish.remote(WeightsInfo(version=1, path=None, refs=[weights], method="memory")))
        assert ray.get(run, timeout=120) == 3
    finally:
        ray.get(explorer.shutdown.remote())
        ray.kill(explorer)
        ray.kill(sync)
    buffer = RunPaths.of(cfg).buffer_dir
    rows = query(buffer).to_pylist()
    assert len(rows) == 3 * 64
    step_of = {r["eid"]: json.loads(r["info"])["explore_step"] for r in rows}
    assert {r["model_version"] for r in rows if step_of[r["eid"]] == 2} == {1}
    assert max(len(r["response_ids"]) for r in rows) >= 400  # long responses were drained
    records = [json.loads(x) for x in RunPaths.of(cfg).metrics.read_text().splitlines()]
    explorer_records = [r for r in records if r["role"] == "explorer"]
    assert [r["step"] for r in explorer_records] == [1, 2, 3]
    assert sum(r["rollout/failed_tasks"] for r in explorer_records) == 0
    assert explorer_records[-1]["sync/failures"] == 0, "a load waiting for the drain counted as failed"
    assert sum(r["sync/loads"] for r in explorer_records) == 1, "the version was loaded more than once"
    assert explorer_records[-1]["sync/version"] == 1.0
    # the one load carried the weights and waited for the drain, longer than sync_timeout_s
    assert sum(r["sync/bytes"] for r in explorer_records) > 0
    assert sum(r["sync/seconds"] for r in explorer_records) > 1.0
