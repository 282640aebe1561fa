"""bench/e2e_gpu.py's own logic, without a run: what it checks after ``trinity-like run`` (each check fails on the
figure that breaks it, and names it), and how it reads the metrics records. Its --smoke (a real run on the CPU)
is in tests/bench/test_smoke.py."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import e2e_gpu  # noqa: E402

GOOD = {"staleness_max": 1.0, "sync_bytes": 988_065_536.0, "cuda_ipc": 1.0, "grad_norm": 36.6, "reward_std": 0.3,
        "mismatch_mean": 0.036, "peak_device_gb": 27.4, "device_gb": 140.4, "released_s": 0.02}
"""The figures of the H200 run of 2026-11-28 (bench/RESULTS.md): every check holds."""
ARGS = Namespace(steps=4, mode="async", staleness=1, method="ipc", device="cuda")
SUMMARY = {"exit_reason": "completed", "final_version": 4}
EXPLORER = [{"sync/failures": 0.0, "sync/fingerprint_mismatches": 0.0}]
EXPECTED = 494_032_768 * 2


def test_the_recorded_gpu_run_passes_every_check():
    assert e2e_gpu.checks(ARGS, SUMMARY, EXPLORER, [], GOOD, EXPECTED) == []


@pytest.mark.parametrize("change, words", [
    ({"summary": {"exit_reason": "failed: EngineLost: ...", "final_version": 2}}, "not completed at 4"),
    ({"staleness_max": 2.0}, "2 versions stale, over the bound 1"),
    ({"explorer": [{"sync/failures": 1.0, "sync/fingerprint_mismatches": 0.0}]}, "sync failures 1.0"),
    ({"sync_bytes": 494_032_768 * 4.0}, "not the 988065536 of the model in bf16"),
    ({"cuda_ipc": 0.0}, "came not over CUDA IPC"),
    ({"reward_std": 0.0}, "reward spread 0.0 must both be > 0"),
    ({"grad_norm": float("nan")}, "gradient norm nan"),
    ({"mismatch_mean": 0.2}, "differ by 0.2 on average"),
    ({"mismatch_mean": float("nan")}, "differ by nan"),  # never measured is no pass
    ({"peak_device_gb": 130.0}, "peak GPU memory 130.0 GB of 140.4"),
    ({"released_s": float("nan")}, "not released within 30 s"),
])
def test_each_check_fails_on_the_figure_that_breaks_it(change, words):
    fig = {**GOOD, **{k: v for k, v in change.items() if k in GOOD}}
    bad = e2e_gpu.checks(ARGS, change.get("summary", SUMMARY), change.get("explorer", EXPLORER), [], fig, EXPECTED)
    assert len(bad) == 1 and words in bad[0], bad


def test_on_the_cpu_the_shared_memory_path_must_not_claim_cuda_ipc_and_gpu_checks_are_left_out():
    cpu = Namespace(steps=3, mode="async", staleness=1, method="ipc", device="cpu")
    fig = {**GOOD, "cuda_ipc": 0.0, "sync_bytes": 1000.0 * 4, "peak_device_gb": float("nan"),
           "released_s": float("nan")}
    assert e2e_gpu.checks(cpu, {"exit_reason": "completed", "final_version": 3}, EXPLORER, [], fig, 4000) == []
    assert "came over CUDA IPC" in e2e_gpu.checks(cpu, {"exit_reason": "completed", "final_version": 3}, EXPLORER,
                                                   [], {**fig, "cuda_ipc": 1.0}, 4000)[0]


def test_step_medians_leave_the_warm_up_step_out_and_the_loop_starts_at_the_first_step():
    assert e2e_gpu.median_from_step_2([8.81, 4.53, 7.82, 3.76]) == pytest.approx(4.53)
    assert e2e_gpu.median_from_step_2([5.0]) == 5.0
    assert e2e_gpu.median_from_step_2([float("nan")]) != e2e_gpu.median_from_step_2([float("nan")])  # nan
    explorer = [{"time": 110.0, "time/explore_step_s": 9.0, "sync/wait_s": 1.0}]
    assert e2e_gpu.loop_start(explorer) == 100.0
    streamed = [{"time": 110.0, "timeline/start_unix_s": 95.0}, {"time": 120.0, "timeline/start_unix_s": 99.0}]
    assert e2e_gpu.loop_start(streamed) == 95.0
    trainer = [{"time": 120.0, "train/batch_size": 64.0}, {"time": 140.0, "train/batch_size": 64.0}]
    assert e2e_gpu.loop_rows_per_s(explorer, trainer) == pytest.approx(128 / 40)
