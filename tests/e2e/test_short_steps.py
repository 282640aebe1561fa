"""Explorer steps that write fewer rows than they plan (dynamic sampling, failed tasks) are made up by more
steps, in sync and async mode; steps that never write a row stop the run with a clear error."""

import json
from pathlib import Path

import pytest

from trinity_like.config import load_config
from trinity_like.launcher import run
from trinity_like.runtime.paths import RunPaths

pytestmark = pytest.mark.slow

WORKFLOWS = Path(__file__).resolve().parent / "flaky_workflow.py"


def _cfg(tmp_path, model_path, name, *overrides):
    return load_config(None, [
        f"checkpoint_root_dir={tmp_path}", "project=short", f"name={name}", f"model.path={model_path}",
        "explorer.batch_size=4", "explorer.repeat_times=2", "explorer.sampling.max_new_tokens=2",
        "explorer.taskset.size=32", "explorer.max_retries=0", "explorer.dynamic_sampling=true",
        "explorer.eval_tasksets=[]", "trainer.total_steps=2", "trainer.micro_batch_size=8", *overrides,
    ])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_short_steps_are_made_up_and_the_run_completes(tmp_path, tiny_model_path, ray_session, mode):
    """Each step plans 8 rows, one trainer batch; about half of them are dropped or fail. Counting planned rows,
    a sync run waited synchronizer.timeout_s for rows nobody would write, then died with a TimeoutError."""
    cfg = _cfg(tmp_path, tiny_model_path, mode, f"mode={mode}", f"explorer.workflow={WORKFLOWS}:FlakyWorkflow",
               "synchronizer.timeout_s=60")
    summary = run(cfg)
    assert summary["exit_reason"] == "completed" and summary["trainer_steps"] == 2
    records = [json.loads(x) for x in RunPaths.of(cfg).metrics.read_text().splitlines()]
    explorer = [r for r in records if r["role"] == "explorer"]
    assert sum(r["rollout/failed_tasks"] for r in explorer) > 0
    assert sum(r["rollout/filtered_groups"] for r in explorer) > 0
    assert len(explorer) > 2  # more explorer steps than the 2 planned
    assert sum(r["rollout/experiences"] for r in explorer) >= 16  # rows written cover both batches


def test_steps_that_never_write_stop_the_run_with_a_clear_error(tmp_path, tiny_model_path, ray_session):
    cfg = _cfg(tmp_path, tiny_model_path, "empty", "mode=sync", f"explorer.workflow={WORKFLOWS}:SameRewardWorkflow",
               "explorer.max_empty_steps=3")
    with pytest.raises(Exception, match="no experiences in 3 steps in a row") as err:
        run(cfg)
    assert "dynamic_sampling" in str(err.value)
