"""`trinity-like plot`: the figures of a synthetic metrics.jsonl (checked against the records that made them),
of old records without phase timestamps, of a two-step run, of a real three-step async run; and the errors."""

import json

import numpy as np
import pytest
from PIL import Image

from trinity_like.cli import main
from trinity_like.plot import (
    FIGURES,
    load_run,
    plot_run,
    reward_figure,
    rows_per_s,
    smooth,
    staleness_figure,
    time_split,
    timeline_figure,
    timeline_segments,
)

T0 = 1_700_000_000.0
SIZES = {"reward": {(1300, 840), (1300, 420)}, "staleness": {(1300, 650)}, "off_policy": {(1300, 700)},
         "timeline": {(1400, 700)}, "throughput": {(1300, 900)}}  # reward: one row more with evaluations


def _records(steps: int, timestamps: bool = True, off_policy: bool = True, eval_every: int = 0) -> list[dict]:
    """An async run with a one-version lead: explorer step k (record step k + 1) generates from t = 1.0 k for
    0.6 s after 0.1 s admission wait; trainer step k + 1 waits 0.1 s, trains 0.5 s, publishes 0.1 s."""
    out = []
    for k in range(steps):
        start = T0 + 1.0 * k
        ex = {"role": "explorer", "step": k + 1, "time": start + 0.7, "rollout/reward_mean": 0.1 * k,
              "rollout/model_version": float(max(k - 1, 0)), "rollout/experiences": 8.0,
              "rollout/tokens_per_s": 100.0 + k, "time/explore_step_s": 0.6, "time/wait_buffer_s": 0.0,
              "sync/wait_s": 0.1, "sync/version": float(max(k - 1, 0))}
        if eval_every and k % eval_every == 0:
            ex["eval/heldout/accuracy/mean@1"] = 0.5 + 0.01 * k
        tstart = start + 0.7
        tr = {"role": "trainer", "step": k + 1, "time": tstart + 0.7, "train/reward_mean": 0.1 * k,
              "train/staleness_mean": 0.75 if k else 0.0, "train/staleness_max": 1.0 if k else 0.0,
              "train/batch_size": 8.0, "train/tokens_per_s": 50.0, "time/train_step_s": 0.5, "time/sync_s": 0.1,
              "time/wait_data_s": 0.1, **({"train/staleness_frac/0": 0.25, "train/staleness_frac/1": 0.75} if k
                                         else {"train/staleness_frac/0": 1.0})}
        if off_policy:
            tr.update({"off_policy/weight_mean": 1.0, "off_policy/weight_max": 1.5 + 0.1 * k,
                       "off_policy/masked_frac": 0.0, "off_policy/ess": 0.9})
        if timestamps:
            ex.update({"timeline/start_unix_s": start, "timeline/eval_start_unix_s": start + 0.1,
                       "timeline/rollout_start_unix_s": start + 0.1})
            tr.update({"timeline/start_unix_s": tstart, "timeline/train_start_unix_s": tstart + 0.1,
                       "timeline/sync_start_unix_s": tstart + 0.6})
        out += [ex, tr]
    return out


def _run_dir(tmp_path, records, summary=None):
    run_dir = tmp_path / "proj" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "config.yaml").write_text("mode: async\nsynchronizer:\n  max_staleness: 1\n"
                                         "algorithm:\n  off_policy:\n    correction: tis\n")
    if summary:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def _check_pngs(paths, names):
    assert [p.stem for p in paths] == list(names)
    for p in paths:
        with Image.open(p) as im:
            assert im.format == "PNG" and im.size in SIZES[p.stem], (p, im.size)
        assert p.stat().st_size < 300_000


def test_synthetic_run_figures_match_records(tmp_path):
    n = 60
    run_dir = _run_dir(tmp_path, _records(n, eval_every=25), {"eval_before": 0.5, "eval_after": 0.9})
    paths, skipped = plot_run(run_dir)
    _check_pngs(paths, FIGURES)
    assert skipped == [] and paths[0].parent == run_dir / "plots"

    run = load_run(run_dir)
    assert run.t0 == T0
    _, data = reward_figure(run)
    np.testing.assert_allclose(data["explorer_reward"], 0.1 * np.arange(n))
    np.testing.assert_array_equal(data["trainer_step"], np.arange(1, n + 1))
    xs, ys = data["eval/heldout/accuracy/mean@1@version"]
    np.testing.assert_allclose(ys, [0.5, 0.75, 1.0])
    np.testing.assert_array_equal(xs, [0, 24, 49])  # the version evaluated, not the step number
    assert data["eval_after"] == 0.9 and "eval_initial" not in data

    _, data = staleness_figure(run)
    np.testing.assert_allclose(data["fractions"][1], [0.0] + [0.75] * (n - 1))
    np.testing.assert_allclose(data["fractions"][0] + data["fractions"][1], 1.0)

    # one generation bar per explorer step, one training and one publish bar per trainer step, at the times written
    _, data = timeline_figure(run)
    assert data["counts"]["explorer"]["generation"] == n and data["counts"]["trainer"]["training"] == n
    assert data["counts"]["sync"]["publish weights"] == n
    gen = [s for s in data["segments"]["explorer"] if s[2] == "generation"]
    assert gen[3][:2] == pytest.approx((T0 + 3.1, T0 + 3.7)) and gen[3][3] == "E3"
    lo, hi = data["zoom"]
    assert T0 < lo < hi < T0 + n  # a window in the middle of a long run

    split = time_split(run)
    assert split["trainer"]["training"] == pytest.approx(0.5 * n)
    assert split["explorer"]["admission wait"] == pytest.approx(0.1 * n)
    assert sum(split["trainer"].values()) == pytest.approx(n + 0.4)  # the run's wall span, from T0 to the last end


def test_old_records_are_laid_out_from_their_durations(tmp_path):
    """Records without timeline/* keys: each phase ends where the next begins, the last at the record's time."""
    run = load_run(_run_dir(tmp_path, _records(5, timestamps=False)))
    with_ts = timeline_segments(load_run(_run_dir(tmp_path / "b", _records(5))))
    segs = timeline_segments(run)
    for lane in ("explorer", "trainer", "sync"):
        assert [s[2:] for s in segs[lane]] == [s[2:] for s in with_ts[lane]]
        np.testing.assert_allclose([s[:2] for s in segs[lane]], [s[:2] for s in with_ts[lane]], atol=1e-6)


def test_two_step_run_without_correction(tmp_path):
    run_dir = _run_dir(tmp_path, _records(2, off_policy=False))
    paths, skipped = plot_run(run_dir, tmp_path / "out")
    _check_pngs(paths, [f for f in FIGURES if f != "off_policy"])
    assert len(skipped) == 1 and skipped[0].startswith("off_policy: the run had no off-policy correction")
    _, data = timeline_figure(load_run(run_dir))
    assert data["zoom"] == pytest.approx((T0, T0 + 2.4))  # a short run is shown whole


@pytest.mark.parametrize("role, figures", [
    ("trainer", FIGURES),  # an offline run (the warm-up): an empty explorer lane
    ("explorer", ("reward", "timeline", "throughput")),  # an explorer job's records alone
])
def test_one_role_only(tmp_path, role, figures):
    paths, skipped = plot_run(_run_dir(tmp_path, [r for r in _records(3) if r["role"] == role]))
    _check_pngs(paths, figures)
    assert len(skipped) == len(FIGURES) - len(figures)


def test_helpers():
    np.testing.assert_allclose(smooth(np.array([1.0, 3.0, 5.0, 7.0]), 2), [1.0, 2.0, 4.0, 6.0])
    # 8 rows per second of wall time, waiting included
    np.testing.assert_allclose(rows_per_s(np.array([2.0, 1.0]), np.array([8.0, 8.0]), 0.0), [8.0, 8.0])


def test_cli(tmp_path, capsys):
    run_dir = _run_dir(tmp_path, _records(3))
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "png")]) == 0
    out = capsys.readouterr().out.split()
    assert out == [str(tmp_path / "png" / f"{f}.png") for f in FIGURES]


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "is not a folder"),
    (lambda p: p, "has no metrics.jsonl"),
    (lambda p: ((p / "metrics.jsonl").write_text("\n"), p)[1], "holds no records yet"),
])
def test_cli_errors(tmp_path, capsys, make, message):
    assert main(["plot", str(make(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.mark.slow
@pytest.mark.xdist_group("e2e_async_run")  # the shared run (tests/conftest.py): one per group, not per xdist worker
def test_real_async_run_with_correction(async_run, tmp_path):
    from trinity_like.runtime.paths import RunPaths

    cfg, summary = async_run  # async, bound 1, the decoupled correction, 3 steps
    assert summary["exit_reason"] == "completed" and cfg.algorithm.off_policy.correction == "decoupled"
    run_dir = RunPaths.of(cfg).run_dir
    paths, skipped = plot_run(run_dir, tmp_path / "plots")  # the shared run's directory is only read
    _check_pngs(paths, FIGURES)
    assert skipped == []
    data = load_run(run_dir)
    assert all("timeline/rollout_start_unix_s" in r for r in data.explorer)
    _, tl = timeline_figure(data)
    assert tl["counts"]["trainer"]["training"] == 3 and tl["counts"]["explorer"]["generation"] == len(data.explorer)
    # the phases of a step are in order and inside the step's record
    for r in data.trainer:
        assert r["timeline/start_unix_s"] <= r["timeline/train_start_unix_s"] <= r["time"]
    _, st = staleness_figure(data)
    for r, *shares in zip(data.trainer, *st["fractions"].values(), strict=True):
        assert sum(shares) == pytest.approx(1.0)
        assert sum(k * s for k, s in zip(st["fractions"], shares, strict=True)) == pytest.approx(
            r["train/staleness_mean"], abs=1e-6)
