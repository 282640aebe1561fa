"""``trinity-like plot RUN_DIR``: PNG figures of a run from its ``metrics.jsonl`` and ``summary.json``.

Figures (each a function ``<name>_figure(run) -> (Figure, data)`` whose ``data`` holds the plotted arrays, so
tests can check them against the records):

    reward       explorer rollout reward and trainer batch reward, and the eval points, against trainer step
                 and against wall time
    staleness    the share of each trained batch that was k versions stale, per trainer step, with mean and max
    off_policy   importance-weight mean / max, masked share and normalised ESS per trainer step (only when the
                 run had a correction; the CLI says when it is skipped)
    timeline     a Gantt chart of explorer steps, trainer steps and weight syncs over wall time: the whole run,
                 and a zoom on a few steps in its middle where the overlap of generation and training shows
    throughput   tokens/s of each role, rows generated and trained over time, and each role's time split into
                 working and waiting

Phase start times come from the ``timeline/*_unix_s`` keys that the explorer and trainer write; records of
older runs without them are laid out backwards from the record's ``time`` (its end) with the ``time/*``
durations, which loses the explorer's evaluation phase but nothing else.

matplotlib is imported here only, with the Agg backend (no display needed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from trinity_like.common.errors import UserError

FIGURES = ("reward", "staleness", "off_policy", "timeline", "throughput")

# one colour per meaning, used in every figure
C_EXPLORER = "#1f77b4"
C_TRAINER = "#d62728"
C_EVAL = "#9467bd"
C_SYNC = "#2ca02c"
C_WAIT = "#c7c7c7"
C_BUFFER_WAIT = "#8c8c8c"


@dataclass
class Run:
    """The records of one run directory, each role's sorted by step."""

    run_dir: Path
    explorer: list[dict[str, Any]]
    trainer: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def setting(self, dotted: str, default: Any = None) -> Any:
        """A value of the run's resolved ``config.yaml`` (``default`` when absent)."""
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def name(self) -> str:
        return f"{self.run_dir.parent.name}/{self.run_dir.name}"

    @cached_property
    def t0(self) -> float:
        """Wall-clock origin: the earliest phase start of any record."""
        starts = [s for lane in timeline_segments(self).values() for s, *_ in lane]
        return min(starts) if starts else 0.0


def load_run(run_dir: str | Path) -> Run:
    """Read ``metrics.jsonl`` (and ``summary.json`` when present); UserError when there is nothing to plot."""
    from trinity_like.common.metrics import read_metrics

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a folder: give a run directory <checkpoint_root_dir>/<project>/<name>")
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{run_dir} has no metrics.jsonl: is it a run directory <checkpoint_root_dir>/<project>/<name>?")
    records, _ = read_metrics(path)
    if not records:
        raise UserError(f"{path} holds no records yet: plot the run after its first step")
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    config_path = run_dir / "config.yaml"
    config = yaml.safe_load(config_path.read_text()) if config_path.is_file() else {}

    def of(role: str) -> list[dict[str, Any]]:
        return sorted((r for r in records if r.get("role") == role), key=lambda r: (r["step"], r["time"]))

    return Run(run_dir, of("explorer"), of("trainer"), summary, config or {})


def series(records: list[dict[str, Any]], key: str, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
    """(x, value) of the records that have ``key``."""
    rows = [(r[x], r[key]) for r in records if r.get(key) is not None]
    if not rows:
        return np.zeros(0), np.zeros(0)
    xs, ys = zip(*rows, strict=True)
    return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over ``window`` points (shorter at the start)."""
    if window <= 1 or len(values) == 0:
        return values
    c = np.cumsum(np.insert(values, 0, 0.0))
    n = np.arange(1, len(values) + 1)
    lo = np.maximum(n - window, 0)
    return (c[n] - c[lo]) / (n - lo)


def _window(n: int) -> int:
    """Smoothing window: about a twentieth of the run, none for short runs."""
    return max(1, n // 20) if n >= 40 else 1


# ---------------------------------------------------------------- timeline segments (pure, testable)
# A segment is (start_unix_s, end_unix_s, kind, label).
def _explorer_segments(r: dict[str, Any]) -> list[tuple[float, float, str, str]]:
    end = r["time"]
    buffer_wait = r.get("time/wait_buffer_s", 0.0)
    wait, load = r.get("sync/wait_s", 0.0), r.get("sync/seconds", 0.0)
    step = f"E{r['step'] - 1}"  # the record of explorer step k is written as step k + 1
    if "timeline/rollout_start_unix_s" in r:
        start, rollout = r["timeline/start_unix_s"], r["timeline/rollout_start_unix_s"]
        eval_start = r.get("timeline/eval_start_unix_s", rollout)
    else:  # older records: backwards from the end with the durations
        rollout = eval_start = end - buffer_wait - r.get("time/explore_step_s", 0.0)
        start = rollout - wait - load
    out = [(start, start + wait, "admission wait", step)]
    if load:
        out.append((start + wait, start + wait + load, "load weights", f"L{int(r.get('sync/version', 0))}"))
    if rollout - eval_start > 1e-3:
        out.append((eval_start, rollout, "evaluation", step))
    out.append((rollout, end - buffer_wait, "generation", step))
    if buffer_wait:
        out.append((end - buffer_wait, end, "buffer full", step))
    return out


def _trainer_segments(r: dict[str, Any]) -> list[tuple[float, float, str, str]]:
    end = r["time"]
    train_s, sync_s, wait = r.get("time/train_step_s", 0.0), r.get("time/sync_s"), r.get("time/wait_data_s", 0.0)
    step = f"T{r['step']}"
    if "timeline/train_start_unix_s" in r:
        start, train = r["timeline/start_unix_s"], r["timeline/train_start_unix_s"]
        sync = r.get("timeline/sync_start_unix_s")
    else:
        sync = end - sync_s if sync_s is not None else None
        train = (sync if sync is not None else end) - train_s
        start = train - wait
    out = [(start, train, "data wait", step), (train, train + train_s, "training", step)]
    if sync is not None and sync_s is not None:
        out.append((sync, sync + sync_s, "publish weights", f"P{r['step']}"))
    return out


def timeline_segments(run: Run) -> dict[str, list[tuple[float, float, str, str]]]:
    """Per lane, the segments over wall time: explorer (admission wait, weight load, evaluation, generation,
    buffer-full wait), trainer (data wait, training, publishing), and the sync lane (publishes and loads)."""
    explorer = [s for r in run.explorer for s in _explorer_segments(r)]
    trainer = [s for r in run.trainer for s in _trainer_segments(r)]
    sync = [s for s in trainer if s[2] == "publish weights"] + [s for s in explorer if s[2] == "load weights"]
    return {"explorer": explorer, "trainer": trainer, "sync": sorted(sync)}


# ---------------------------------------------------------------- figures
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 100, "axes.grid": True, "grid.alpha": 0.3, "axes.titlesize": 11,
                         "axes.labelsize": 10, "legend.fontsize": 8, "xtick.labelsize": 9, "ytick.labelsize": 9})
    return plt


def _integer_steps(*axes) -> None:
    """Step axes get whole-number ticks (a two-step run otherwise shows 1.2, 1.4, ...)."""
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _time_unit(span_s: float) -> tuple[float, str]:
    return (60.0, "min") if span_s > 300 else (1.0, "s")


def _wall(run: Run, times: np.ndarray) -> np.ndarray:
    return times - run.t0


def _line(ax, x, y, color, label, lw: float = 1.8, **kwargs):
    """A raw series in a light line and its moving average on top; markers when there are few points."""
    if len(x) == 0:
        return
    w = _window(len(x))
    if w > 1:
        ax.plot(x, y, color=color, alpha=0.25, lw=0.8)
        ax.plot(x, smooth(y, w), color=color, lw=lw, label=f"{label} ({w}-step mean)", **kwargs)
    else:
        ax.plot(x, y, color=color, lw=lw, marker="o" if len(x) <= 30 else None, ms=4, label=label, **kwargs)


def reward_figure(run: Run):
    """Rewards (and eval accuracy when there are eval points) against trainer step and against wall time."""
    plt = _plt()
    eval_keys = sorted({k for r in run.explorer for k in r if k.startswith("eval/") and "/accuracy/mean@" in k})
    has_eval = bool(eval_keys) or "eval_after" in run.summary
    rows = 2 if has_eval else 1
    fig, axes = plt.subplots(rows, 2, figsize=(13, 4.2 * rows), squeeze=False)
    data: dict[str, Any] = {}

    ex_step, ex_reward = series(run.explorer, "rollout/reward_mean")
    ex_time = series(run.explorer, "rollout/reward_mean", x="time")[0]
    tr_step, tr_reward = series(run.trainer, "train/reward_mean")
    tr_time = series(run.trainer, "train/reward_mean", x="time")[0]
    data.update(explorer_step=ex_step, explorer_reward=ex_reward, trainer_step=tr_step, trainer_reward=tr_reward)
    span = max([*ex_time, *tr_time, run.t0]) - run.t0
    unit, uname = _time_unit(span)
    for col, (xe, xt, xlabel) in enumerate((
            (ex_step, tr_step, "step (explorer step k is drawn at k + 1: the trainer step that trains its rows)"),
            (_wall(run, ex_time) / unit, _wall(run, tr_time) / unit, f"wall time since the run started ({uname})"))):
        ax = axes[0, col]
        # one explorer step's rows are often exactly one trainer batch: the wide line stays visible under the thin
        _line(ax, xt, tr_reward, C_TRAINER, "trainer: reward of the trained batch", lw=3.2, alpha=0.55)
        _line(ax, xe, ex_reward, C_EXPLORER, "explorer: rollout reward (mean of the step's samples)", lw=1.4)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("reward")
        ax.set_title("Reward " + ("per step" if col == 0 else "over wall time"))
        ax.legend(loc="best")

    if has_eval:
        markers = iter(("o", "s", "^", "D", "v"))
        for key in eval_keys:
            xs = np.asarray([r["rollout/model_version"] for r in run.explorer if key in r], dtype=np.float64)
            ts = np.asarray([r.get("timeline/eval_start_unix_s", r["time"]) for r in run.explorer if key in r])
            ys = np.asarray([r[key] for r in run.explorer if key in r], dtype=np.float64)
            data[f"{key}@version"] = (xs, ys)
            name = key.split("/")[1] + " " + key.split("/")[-1]
            m = next(markers, "o")
            for col, x in enumerate((xs, _wall(run, ts) / unit)):
                axes[1, col].plot(x, ys, marker=m, ms=5, lw=1.5, color=C_EVAL, label=f"during the run: {name}")
        last_step = max([*tr_step, 0.0])
        end_t = (max([*tr_time, *ex_time, run.t0]) - run.t0) / unit
        s = run.summary
        points = [("eval_initial", 0.0, 0.0, "X", "#7f7f7f", "before the warm-up (summary)"),
                  ("eval_before", 0.0, 0.0, "P", "#ff7f0e", "RL start, after the warm-up (summary)"),
                  ("eval_after", last_step, end_t, "*", "#000000", "after RL (summary)")]
        for key, x_step, x_time, m, color, label in points:
            if key in s:
                data[key] = s[key]
                for col, x in enumerate((x_step, x_time)):
                    axes[1, col].scatter([x], [s[key]], marker=m, s=90, color=color, zorder=5,
                                         label=f"{label}: {s[key]:.3f}")
        for col, xlabel in enumerate(("policy version (trainer step) evaluated",
                                      f"wall time since the run started ({uname})")):
            ax = axes[1, col]
            ax.set_xlabel(xlabel)
            ax.set_ylabel("held-out accuracy (greedy)")
            ax.set_ylim(-0.03, 1.03)
            ax.set_title("Evaluation " + ("per policy version" if col == 0 else "over wall time"))
            ax.legend(loc="best")
    _integer_steps(axes[0, 0], *([axes[1, 0]] if has_eval else []))
    fig.suptitle(f"{run.name}: reward and evaluation", fontsize=12)
    fig.tight_layout()
    return fig, data


def staleness_figure(run: Run):
    """Per trainer step, the shares of the batch at each staleness (stacked bars), with mean and max."""
    plt = _plt()
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(13, 6.5), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    steps = np.asarray([r["step"] for r in run.trainer], dtype=np.float64)
    ks = sorted({int(k.rsplit("/", 1)[1]) for r in run.trainer for k in r if k.startswith("train/staleness_frac/")})
    fracs = {k: np.asarray([r.get(f"train/staleness_frac/{k}", 0.0) for r in run.trainer]) for k in ks}
    if not ks and all(r.get("train/staleness_max", 9) <= 1 for r in run.trainer):
        # older records without the shares: with staleness 0 or 1 only, the mean is the share at 1
        ks = [0, 1]
        mean = np.asarray([r["train/staleness_mean"] for r in run.trainer])
        fracs = {0: 1.0 - mean, 1: mean}
    data: dict[str, Any] = {"step": steps, "fractions": fracs}
    cmap = plt.get_cmap("viridis")
    if ks:
        bottom = np.zeros(len(steps))
        width = 1.0 if len(steps) > 60 else 0.8
        for i, k in enumerate(ks):
            color = cmap(i / max(len(ks) - 1, 1) * 0.85)
            ax.bar(steps, fracs[k], bottom=bottom, width=width, color=color, linewidth=0,
                   label="0 (on-policy)" if k == 0 else f"{k} version{'s' if k != 1 else ''}")
            bottom += fracs[k]
        ax.set_ylim(0, 1.0)
        ax.set_ylabel("share of the batch's rows")
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), title="staleness")
        rows = np.asarray([r.get("train/batch_size", 1.0) for r in run.trainer])
        overall = ", ".join(f"{k}: {100 * float((fracs[k] * rows).sum() / rows.sum()):.1f}%" for k in ks)
        ax.set_title(f"Staleness distribution of each trained batch (all rows: {overall})")
    else:
        ax.text(0.5, 0.5, "this run's records carry no staleness distribution\n(train/staleness_frac/*): "
                "see mean and max below", ha="center", va="center", transform=ax.transAxes)
        ax.set_title("Staleness distribution of each trained batch")
    for key, color, lw, ls, label in (("train/staleness_mean", "#1f77b4", 3.0, "-", "mean"),
                                      ("train/staleness_max", "#d62728", 1.2, "--", "max")):
        x, y = series(run.trainer, key)
        data[key] = y
        ax2.plot(x, y, color=color, lw=lw, ls=ls, marker="o" if len(x) <= 30 else None, ms=4, label=label,
                 drawstyle="steps-mid")
    bound = run.setting("synchronizer.max_staleness")
    bx, by = series(run.trainer, "sync/staleness_bound")
    if len(bx):  # max_staleness: auto: the bound as it moved, and its hard max
        ax2.plot(bx, by, color="black", lw=1.2, drawstyle="steps-post", label="bound (auto)")
        ax2.axhline(bound, color="grey", lw=0.8, ls=":", label=f"auto_staleness.max = {bound}")
    elif bound is not None and run.setting("mode") == "async":
        ax2.axhline(bound, color="black", lw=0.8, ls=":", label=f"bound (max_staleness = {bound})")
    ax2.set_xlabel("trainer step")
    ax2.set_ylabel("staleness (versions)")
    ax2.set_title("Staleness mean and max per batch")
    ax2.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0))
    top = max([0.0, *data["train/staleness_max"], bound or 0])
    ax2.set_ylim(-0.1, top + 0.5)
    ax2.yaxis.get_major_locator().set_params(integer=True)
    _integer_steps(ax2)
    fig.suptitle(f"{run.name}: staleness (trainer version - the row's model_version)", fontsize=12)
    fig.tight_layout()
    return fig, data


def off_policy_figure(run: Run):
    """IS-weight statistics and normalised ESS per trainer step; None when the run had no correction."""
    if not any("off_policy/ess" in r for r in run.trainer):
        return None, {}
    plt = _plt()
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(13, 7), sharex=True)
    data: dict[str, Any] = {}
    n = len(run.trainer)
    for key, color, label in (("off_policy/weight_mean", C_EXPLORER, "mean weight"),
                              ("off_policy/weight_max", C_TRAINER, "max weight")):
        x, y = series(run.trainer, key)
        data[key] = (x, y)
        ax.plot(x, y, color=color, lw=1.3, marker="o" if n <= 30 else None, ms=4, label=label)
    ax.axhline(1.0, color="black", lw=0.8, ls="--", label="1 (on-policy)")
    top = max([1.0, *data["off_policy/weight_max"][1]])
    if top > 10:  # a few huge weights would flatten everything else
        ax.set_yscale("log")
        ax.set_ylabel("importance weight\n(log scale)")
    else:
        ax.set_ylim(0, top * 1.08)
        ax.set_ylabel("importance weight")
    ax.set_title("Importance weights: current (proximal) policy / behaviour policy, per response token")
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0))
    for key, color, label in (("off_policy/ess", C_SYNC, "normalised ESS = (sum w)^2 / (n sum w^2)"),
                              ("off_policy/masked_frac", "#7f7f7f", "share of tokens with weight 0 (masked)")):
        x, y = series(run.trainer, key)
        data[key] = (x, y)
        ax2.plot(x, y, color=color, lw=1.3, marker="o" if n <= 30 else None, ms=4, label=label)
    ax2.set_ylim(-0.03, 1.03)
    ax2.set_xlabel("trainer step")
    ax2.set_ylabel("fraction")
    ax2.set_title("Effective sample size and masked tokens")
    ax2.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0))
    _integer_steps(ax2)
    correction = run.setting("algorithm.off_policy.correction", "?")
    fig.suptitle(f"{run.name}: off-policy correction ({correction})", fontsize=12)
    fig.tight_layout()
    return fig, data


_KIND_COLOR = {"generation": C_EXPLORER, "evaluation": C_EVAL, "admission wait": C_WAIT, "buffer full": C_BUFFER_WAIT,
               "load weights": C_SYNC, "training": C_TRAINER, "data wait": C_WAIT, "publish weights": "#98df8a",
               "outside steps": "#f2f2f2"}
_LANES = ("explorer", "sync", "trainer")


def _zoom_window(run: Run, segments, steps: int = 6) -> tuple[float, float]:
    """A window of about ``steps`` trainer steps in the middle of the run (the whole run when it is short)."""
    train = [s for s in segments["trainer"] if s[2] == "data wait"]
    if len(train) <= steps + 2:
        lo = min(s[0] for lane in segments.values() for s in lane)
        hi = max(s[1] for lane in segments.values() for s in lane)
        return lo, hi
    mid = len(train) // 2
    first, last = train[mid - steps // 2], train[mid + (steps + 1) // 2]
    return first[0], last[0]


def _draw_lanes(ax, segments, t0: float, unit: float, labels: bool, lo: float | None = None, hi: float | None = None):
    for y, lane in enumerate(_LANES):
        for start, end, kind, label in segments[lane]:
            if hi is not None and (end < lo or start > hi):
                continue
            ax.broken_barh([((start - t0) / unit, max(end - start, 0.0) / unit)], (y - 0.38, 0.76),
                           facecolors=_KIND_COLOR[kind], edgecolor="white" if labels else "none", linewidth=0.6)
            if labels and lane == "sync" and hi is not None and lo <= (start + end) / 2 <= hi:
                # sync bars are narrow: publish labels above the lane, load labels below, so neighbours never collide
                above = kind == "publish weights"
                ax.text((start + end) / 2 / unit - t0 / unit, y + (-0.42 if above else 0.42), label, ha="center",
                        va="bottom" if above else "top", fontsize=7, color="#1a6b1a")
            elif labels and kind in ("generation", "training") and hi is not None:
                width = min(end, hi) - max(start, lo)
                if width > (hi - lo) * 0.035:
                    ax.text((max(start, lo) + min(end, hi)) / 2 / unit - t0 / unit, y, label, ha="center",
                            va="center", fontsize=8, color="white" if kind in ("generation", "training") else "black",
                            clip_on=True)
    ax.set_yticks(range(len(_LANES)), ["explorer", "weight sync", "trainer"])
    ax.set_ylim(-0.6, len(_LANES) - 0.4)
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)


def timeline_figure(run: Run):
    """Gantt chart over wall time: whole run on top, a few steps from the middle below."""
    from matplotlib.patches import Patch

    plt = _plt()
    segments = timeline_segments(run)
    t0 = run.t0
    end = max(s[1] for lane in segments.values() for s in lane)
    unit, uname = _time_unit(end - t0)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(14, 7))
    _draw_lanes(ax, segments, t0, unit, labels=False)
    ax.set_xlim(0, (end - t0) / unit * 1.01)
    ax.set_xlabel(f"wall time since the run started ({uname})")
    ax.set_title(f"Whole run: {len(run.explorer)} explorer steps, {len(run.trainer)} trainer steps")
    lo, hi = _zoom_window(run, segments)
    pad = (hi - lo) * 0.01
    zoomed = (lo, hi) != (t0, end)
    if zoomed:
        ax.axvspan((lo - t0) / unit, (hi - t0) / unit, color="orange", alpha=0.3, lw=0)
    _draw_lanes(ax2, segments, t0, 1.0, labels=True, lo=lo, hi=hi)
    ax2.set_xlim(lo - t0 - pad, hi - t0 + pad)
    ax2.set_xlabel("wall time since the run started (s)")
    ax2.set_title(("Zoom on the orange band: " if zoomed else "")
                  + "E k = explorer step k, T k = trainer step k, P v = version v published, L v = version v loaded")
    kinds = ["generation", "evaluation", "admission wait", "buffer full", "load weights", "training", "data wait",
             "publish weights"]
    present = {s[2] for lane in segments.values() for s in lane}
    names = {"admission wait": "waiting (admission / data)", "data wait": None}
    handles = [Patch(color=_KIND_COLOR[k], label=names.get(k, k)) for k in kinds
               if k in present and names.get(k, k) is not None]
    if "data wait" in present and "admission wait" not in present:
        handles.insert(0, Patch(color=C_WAIT, label="waiting (data)"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize=9)
    fig.suptitle(f"{run.name}: timeline of generation, training and weight syncs", fontsize=12)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    counts = {lane: {k: sum(1 for s in segs if s[2] == k) for k in present} for lane, segs in segments.items()}
    return fig, {"segments": segments, "counts": counts, "zoom": (lo, hi)}


def time_split(run: Run) -> dict[str, dict[str, float]]:
    """Seconds per role and activity over the run's wall time, from the timeline segments; ``outside steps`` is
    the rest of the wall time (start-up, bookkeeping between steps, a role that finished before the other)."""
    segs = timeline_segments(run)
    span = max(s[1] for lane in segs.values() for s in lane) - run.t0
    out: dict[str, dict[str, float]] = {}
    for lane in ("explorer", "trainer"):
        totals: dict[str, float] = {}
        for start, end, kind, _ in segs[lane]:
            totals[kind] = totals.get(kind, 0.0) + max(end - start, 0.0)
        totals["outside steps"] = max(span - sum(totals.values()), 0.0)
        out[lane] = totals
    return out


def rows_per_s(times: np.ndarray, rows: np.ndarray, t0: float) -> np.ndarray:
    """Wall-clock rate at each record: rows of the last ``w`` records over the time they took (from ``t0`` for
    the first records), so waiting counts; ``w`` is a twentieth of the records for long runs, else 1."""
    order = np.argsort(times)
    t, y = times[order], np.cumsum(rows[order])
    w = _window(len(t))
    t_prev = np.concatenate([np.full(w, t0), t])[: len(t)]
    y_prev = np.concatenate([np.zeros(w), y])[: len(t)]
    return (y - y_prev) / np.maximum(t - t_prev, 1e-9)


def throughput_figure(run: Run):
    """tokens/s of each role while working, rows/s of wall time, and each role's wall time split."""
    plt = _plt()
    fig = plt.figure(figsize=(13, 9))
    gs = fig.add_gridspec(3, 1, height_ratios=[1.1, 1.1, 0.8])
    ax, ax2, ax3 = (fig.add_subplot(gs[i]) for i in range(3))
    t0 = run.t0
    end = max(s[1] for lane in timeline_segments(run).values() for s in lane)
    unit, uname = _time_unit(end - t0)
    data: dict[str, Any] = {}
    for records, key, color, label in ((run.explorer, "rollout/tokens_per_s", C_EXPLORER, "explorer: generated"),
                                       (run.trainer, "train/tokens_per_s", C_TRAINER, "trainer: trained")):
        t, y = series(records, key, x="time")
        data[key] = (t, y)
        _line(ax, (t - t0) / unit, y, color, f"{label} response tokens")
    ax.set_ylabel("tokens / s")
    ax.set_title("While working: response tokens per second of generation or training time")
    for records, key, color, label in ((run.explorer, "rollout/experiences", C_EXPLORER, "explorer: generated"),
                                       (run.trainer, "train/batch_size", C_TRAINER, "trainer: trained")):
        t, y = series(records, key, x="time")
        if not len(t):
            continue
        rate = rows_per_s(t, y, t0)
        data[f"{key} per s"] = (np.sort(t), rate)
        w = _window(len(t))
        overall = y.sum() / max(t.max() - t0, 1e-9)
        ax2.plot((np.sort(t) - t0) / unit, rate, color=color, lw=1.6, marker="o" if len(t) <= 30 else None, ms=4,
                 label=f"{label} ({'' if w == 1 else f'over {w} steps; '}{overall:.1f} rows / s overall)")
    ax2.set_ylabel("rows / s")
    ax2.set_title("Over wall time, waiting included: rows (samples) per second")
    for a in (ax, ax2):
        a.set_xlabel(f"wall time since the run started ({uname})")
        a.set_xlim(0, (end - t0) / unit * 1.01)
        a.set_ylim(bottom=0)
        a.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0))

    split = time_split(run)
    data["time_split"] = split
    order = {"explorer": ["generation", "evaluation", "load weights", "admission wait", "buffer full",
                          "outside steps"],
             "trainer": ["training", "publish weights", "data wait", "outside steps"]}
    for y, lane in enumerate(("explorer", "trainer")):
        total = sum(split[lane].values()) or 1.0
        left = 0.0
        for kind in order[lane]:
            sec = split[lane].get(kind, 0.0)
            if not sec:
                continue
            ax3.barh(y, sec / unit, left=left / unit, color=_KIND_COLOR[kind], edgecolor="white", height=0.6,
                     hatch="//" if kind == "outside steps" else None)
            if sec / total > 0.11:  # narrower ones are named by the legend only
                ax3.text((left + sec / 2) / unit, y, f"{kind}\n{100 * sec / total:.0f}%", ha="center", va="center",
                         fontsize=8, color="white" if kind in ("generation", "training", "evaluation") else "black")
            left += sec
    from matplotlib.patches import Patch

    present = [k for k in dict.fromkeys(order["explorer"] + order["trainer"])  # a microsecond of "buffer full" is noise
               if any(split[lane].get(k, 0.0) > 1e-3 * (end - t0) for lane in split)]
    ax3.legend(handles=[Patch(facecolor=_KIND_COLOR[k], hatch="//" if k == "outside steps" else None, label=k)
                        for k in present], loc="upper left", bbox_to_anchor=(1.005, 1.0))
    ax3.set_yticks([0, 1], ["explorer", "trainer"])
    ax3.invert_yaxis()
    ax3.set_xlim(0, (end - t0) / unit * 1.01)
    ax3.set_xlabel(f"wall time ({uname}), summed per activity")
    ax3.set_title("Where each role's wall time went: working (colours) vs waiting (greys)")
    ax3.grid(axis="y", visible=False)
    fig.suptitle(f"{run.name}: throughput", fontsize=12)
    fig.tight_layout()
    return fig, data


def _save_png(fig, path: Path) -> None:
    """PNG with a 256-colour palette: a third of the size of the RGBA file (noisy curves of long runs made
    that 250+ KB), with no visible difference on these flat-coloured plots."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    buf.seek(0)
    with Image.open(buf) as im:
        im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


_BUILDERS = {"reward": reward_figure, "staleness": staleness_figure, "off_policy": off_policy_figure,
             "timeline": timeline_figure, "throughput": throughput_figure}


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> tuple[list[Path], list[str]]:
    """Write the figures of ``run_dir`` as PNGs into ``out_dir`` (default ``<run_dir>/plots``); return the
    paths written and a note for each figure that was skipped."""
    run = load_run(run_dir)
    plt = _plt()
    out = Path(out_dir) if out_dir is not None else run.run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    paths, skipped = [], []
    for name in FIGURES:
        if name in ("staleness", "off_policy") and not run.trainer:
            skipped.append(f"{name}: the run has no trainer records")
            continue
        if name == "timeline" and not (run.trainer or run.explorer):
            continue
        fig, _ = _BUILDERS[name](run)
        if fig is None:
            skipped.append(f"{name}: the run had no off-policy correction (algorithm.off_policy.correction: none)")
            continue
        path = out / f"{name}.png"
        _save_png(fig, path)
        plt.close(fig)
        paths.append(path)
    return paths, skipped
