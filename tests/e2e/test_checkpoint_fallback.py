"""A run whose latest checkpoint was damaged on disk resumes from the one before it, on a real `ray start`
cluster (the jobs and the ledger check of test_jobs.py): the damaged one is set aside, `latest` and the weight
versions go back to the fallback step, and every experience is still trained in exactly one committed step."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_jobs import BATCH, _driver, _no_leftovers, _write_cfg, check_ledger  # noqa: F401  (autouse)
from trinity_like.buffer.ledger import Ledger
from trinity_like.config import load_config
from trinity_like.runtime.checkpoints import read_pointer
from trinity_like.runtime.paths import RunPaths

pytestmark = pytest.mark.slow


def test_a_resume_over_a_damaged_latest_checkpoint_goes_on_from_the_previous_one(tmp_path, tiny_model_path,
                                                                                 ray_cluster):
    cfg_path = _write_cfg(tmp_path, tiny_model_path, "damaged-ckpt", trainer__total_steps=4,
                          trainer__save_interval=2)
    paths = RunPaths.of(load_config(cfg_path))
    first = _driver(ray_cluster, cfg_path, "all")
    assert first.wait(300) == 0, first.output
    root = paths.checkpoint_dir
    assert read_pointer(root / "latest") == 4 and (root / "step_2").is_dir()
    weights = root / "step_4" / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit in the weights
    weights.write_bytes(bytes(data))
    assert len(Ledger(paths.buffer_dir, "trainer", create=False).committed()) == 4 * BATCH

    again = _driver(ray_cluster, cfg_path, "all", "--resume", "trainer.total_steps=6")
    assert again.wait(300) == 0, again.output
    summary = json.loads(paths.summary.read_text())
    assert summary["resumed_from"] == 2 and summary["final_version"] == 6, summary
    assert "trainer  step    3/6" in again.output  # it went on right after the intact checkpoint
    assert (root / "damaged" / "step_4" / "trainer_state.json").is_file()
    assert read_pointer(root / "latest") == 6
    assert sorted(p.name for p in root.glob("step_*")) == ["step_2", "step_4", "step_6"]
    check_ledger(cfg_path)  # steps 3 and 4 trained again: each row in exactly one committed step, none lost
