"""bench/scale.py's figures from a run's records, worked by hand (its --smoke runs in test_smoke.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import scale  # noqa: E402


def test_run_figures_from_records_by_hand():
    explorer = [{"role": "explorer", "rollout/engine_busy_frac": f, "rollout/cancelled_groups": c}
                for f, c in ((0.5, 1.0), (0.9, 2.0))]
    trainer = [{"role": "trainer", "train/staleness_mean": s, "train/staleness_max": m, "time/wait_data_s": w,
                "buffer/skipped_stale": d, "train/masked_stale_tokens": k, "train/token_staleness_mean": s,
                "time": t, "train/batch_size": 160.0}
               for s, m, w, d, k, t in ((0.0, 0, 2.0, 0.0, 0.0, 104.0), (1.5, 2, 1.0, 3.0, 10.0, 106.0),
                                        (1.0, 1, 0.0, 5.0, 4.0, 110.0))]
    loop = {"loop_s": 10.0, "sps": 48.0, "trained": 480.0, "len_mean": 200.0, "len_max": 819.0}
    cpu = {"ray::ExplorerRo": (2.0, 0.1), "ray::EmulatedEn": (1.0, 0.0), "raylet": (0.5, 0.0)}
    f = scale.run_figures(explorer + trainer, True, cpu, loop)
    assert f["steady_rows_s"] == pytest.approx(320.0 / 6.0)  # steps 2 and 3's rows over 104 s -> 110 s
    assert f["rows_s"] == 48.0 and f["staleness_mean"] == pytest.approx(2.5 / 3) and f["staleness_max"] == 2
    assert f["dropped"] == 5.0 and f["cancelled"] == 3.0 and f["masked_tokens"] == 14.0  # drops are cumulative
    assert f["engine_busy"] == pytest.approx(0.7) and f["trainer_idle"] == pytest.approx(0.3)
    assert f["cpu_cores"] == pytest.approx(0.35)  # 3.5 on-CPU seconds over a 10 s loop
    assert f["top_process"] == "ray::ExplorerRo" and f["top_process_cores"] == pytest.approx(0.2)
    # two engine hosts under one title: the busiest single process is the explorer, not their sum
    per = {"ray::EmulatedEn:11": 1.5, "ray::EmulatedEn:12": 1.5, "ray::ExplorerRo:10": 2.0}
    g = scale.run_figures(explorer + trainer, True, {"ray::EmulatedEn": (3.0, 0.0), "ray::ExplorerRo": (2.0, 0.0)},
                          loop, per)
    assert g["top_process"] == "ray::ExplorerRo:10" and g["cpu_cores"] == pytest.approx(0.5)


def test_cpu_by_process_follows_each_thread_in_the_window():
    ns = 1_000_000_000
    samples = [(0.0, {7: ("ray::A", {1: (0, 0)})}),
               (1.0, {7: ("ray::A", {1: (ns, 0), 2: (5 * ns, 0)}), 8: ("ray::A", {3: (2 * ns, 0)})}),
               (2.0, {7: ("ray::A", {1: (3 * ns, 0), 2: (6 * ns, 0)}), 8: ("ray::A", {3: (2 * ns, 0)})}),
               (9.0, {7: ("ray::A", {1: (9 * ns, 0)})})]  # outside the window
    got = scale.cpu_by_process(samples, 0.0, 2.0)
    assert got == {"ray::A:7": pytest.approx(3.0 + 1.0), "ray::A:8": 0.0}  # a thread counts from its first sample


def test_summary_ratios_are_the_best_stream_mode_over_step_at_each_bound():
    args = scale.parse_args(["--bounds", "1", "2"])

    def run(rows_s):
        return {"rows_s": rows_s}

    best = {("step", 1): run(40.0), ("finish", 1): run(30.0), ("keep", 1): run(50.0),
            ("step", 2): run(50.0), ("finish", 2): run(45.0), ("resubmit", 2): run(80.0)}
    s = scale.summary_fields(args, best, n_runs=7, n_void=1, bench_s=600.0)
    assert s["headline_bound"] == 2 and s["ratio_headline"] == "1.600" and s["best_stream_headline"] == "resubmit"
    assert s["ratio_b1"] == "1.250" and s["best_stream_b1"] == "keep" and s["ratio_finish_b1"] == "0.750"
    assert s["ratio_finish_b2"] == "0.900" and "ratio_keep_b2" not in s and s["void_runs"] == 1
    assert set(scale.RESULT_FIELDS["scale"]) <= set(s)


def test_bad_engine_counts_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        scale.parse_args(["--gpus", "4", "--engines", "4"])
    assert "--engines must each be between 1 and --gpus - 1 (3)" in capsys.readouterr().err
