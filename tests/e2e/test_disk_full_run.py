"""A run whose run directory sits on a real small tmpfs that fills up mid-run (issue 38): the run stops with one
line naming the path, what was being written and what to do; after space is freed, `--resume` completes and the
ledger shows every experience trained exactly once. (Each write site on its own: tests/common/test_disk_full.py.)"""

from __future__ import annotations

import json

import pytest
from test_jobs import BATCH, _driver, _write_cfg, check_ledger

from trinity_like.config import load_config
from trinity_like.runtime.paths import RunPaths

pytestmark = pytest.mark.slow


def test_a_run_that_fills_its_disk_stops_in_one_line_and_resumes_once_space_is_freed(tiny_model_path, ray_cluster,
                                                                                       small_disk_of):
    disk = small_disk_of("24m")
    # ~6 MB left: a full checkpoint of the tiny model with its optimizer is ~5 MB, a weights version ~1.7 MB
    disk.fill(leave=6_000_000)
    total = 8
    cfg_path = _write_cfg(disk.path, tiny_model_path, "disk-full", trainer__total_steps=total,
                          trainer__save_interval=2, trainer__keep_checkpoints=1)
    paths = RunPaths.of(load_config(cfg_path))
    first = _driver(ray_cluster, cfg_path, "all")
    assert first.wait(300) == 2, first.output
    errors = [line for line in first.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no space left on the device writing" in errors[0], first.output
    assert str(paths.run_dir) in errors[0] and "--resume" in errors[0]
    assert "Traceback" not in first.output
    assert not [p for p in paths.run_dir.rglob("*") if ".tmp-" in p.name]  # nothing half-written is kept

    disk.free()
    again = _driver(ray_cluster, cfg_path, "all", "--resume")
    assert again.wait(300) == 0, again.output
    summary = json.loads(paths.summary.read_text())
    assert summary["exit_reason"] == "completed" and summary["trainer_steps"] + (summary["resumed_from"] or 0) \
        == total
    assert len(check_ledger(cfg_path)) == total * BATCH  # every experience trained exactly once
