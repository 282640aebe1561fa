"""A staleness bound that sets itself (``synchronizer.max_staleness: auto``).

The bound (``c - version`` an explorer step may generate with, see ``runtime.schedule``) moves within
``synchronizer.auto_staleness.[min, max]``, decided at the end of every window (``window`` trainer steps and at
least ``window_s`` seconds, so that one window's rows per second is not one step's noise) from what both roles
report:

- the off-policy signal of the batches trained in the window: the normalised effective sample size of the
  correction's weights (``off_policy/ess``, 1 = on-policy) and the PPO clip fraction (``actor/pg_clipfrac``);
- how long each role waited in the window: the trainer for data (``time/wait_data_s``), the explorers at
  admission, i.e. for the bound (``rollout/admission_wait_s``);
- the trained rows per second of the window.

Rules, in this order:

1. The signal degraded (ESS below ``ess_target`` or clip fraction above ``clip_target``): narrow by one (down
   to ``min``), ending any trial.
2. A widening is a trial: one window to settle (steps claimed under the old bound are still running), then the
   rows per second of the next ``patience`` windows together must beat those of the ``patience`` windows that
   asked for the widening by ``min_gain``; if not, the bound goes back down and does not widen for
   ``cooldown`` windows ("bought no throughput").
3. Both roles waited (each more than ``wait_frac`` of the window) in ``patience`` consecutive windows: the bound
   holds the explorers back while the trainer starves, so widen by one (a trial, rule 2). One window of
   waiting is not enough: on a busy machine a single slow step makes both roles wait once.
4. Otherwise hold.

Every change comes with its reason; the history is what ``sync/staleness_bound`` and the staleness plot show.
Pure and deterministic (times are passed in), so it is tested with synthetic signals, and the Synchronizer
actor holds the one instance of a run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Window:
    start_s: float | None = None
    end_s: float = 0.0
    steps: int = 0
    rows: int = 0
    ess: list[float] = field(default_factory=list)
    clipfrac: list[float] = field(default_factory=list)
    trainer_wait_s: float = 0.0
    explorer_wait_s: float = 0.0

    @property
    def seconds(self) -> float:
        return max(1e-9, self.end_s - (self.start_s if self.start_s is not None else self.end_s))


class StalenessController:
    """Holds the current bound of one run and moves it (see the module's rules)."""

    def __init__(self, params: dict[str, Any]) -> None:
        """``params``: the fields of ``AutoStalenessConfig`` (min, max, start, window, window_s, patience,
        ess_target, clip_target, wait_frac, min_gain, cooldown)."""
        self.p = dict(params)
        self.min, self.max = int(self.p["min"]), int(self.p["max"])
        if self.min > self.max:
            raise ValueError(f"auto_staleness.min={self.min} is above auto_staleness.max={self.max}")
        self.patience = max(1, int(self.p.get("patience", 1)))
        self.bound = min(self.max, max(self.min, int(self.p["start"])))
        self.history: list[dict[str, Any]] = [{"step": 0, "bound": self.bound, "reason": "start"}]
        self._window = Window()
        self._last_end_s: float | None = None
        """When the last window closed: the next one runs from there."""
        self._waiting: list[Window] = []
        """The latest consecutive windows in which both roles waited (the evidence for a widening)."""
        self._trial: _Trial | None = None
        self._cooldown = 0

    def observe_explore(self, wait_s: float) -> None:
        """An explorer step's admission wait (the time it was held back by the bound)."""
        self._window.explorer_wait_s += max(0.0, wait_s)

    def observe_train(self, step: int, now_s: float, rows: int, metrics: dict[str, float]) -> int:
        """A trainer step ended at ``now_s`` having trained ``rows`` rows, with its metrics; returns the bound
        (changed when this step closes a window)."""
        w = self._window
        if w.start_s is None:  # the window runs from the end of the step before it
            w.start_s = self._last_end_s if self._last_end_s is not None else now_s - (
                metrics.get("time/train_step_s", 0.0) + metrics.get("time/wait_data_s", 0.0))
        w.end_s, w.steps, w.rows = now_s, w.steps + 1, w.rows + rows
        if "off_policy/ess" in metrics:
            w.ess.append(metrics["off_policy/ess"])
        if "actor/pg_clipfrac" in metrics:
            w.clipfrac.append(metrics["actor/pg_clipfrac"])
        w.trainer_wait_s += max(0.0, metrics.get("time/wait_data_s", 0.0))
        if w.steps >= int(self.p["window"]) and w.seconds >= float(self.p.get("window_s", 0.0)):
            self._decide(step, w)
            self._last_end_s, self._window = w.end_s, Window()
        return self.bound

    def _set(self, step: int, bound: int, reason: str) -> None:
        self.bound = bound
        self.history.append({"step": step, "bound": bound, "reason": reason})

    def _decide(self, step: int, w: Window) -> None:
        p = self.p
        cooling, self._cooldown = self._cooldown > 0, max(0, self._cooldown - 1)
        ess = statistics.fmean(w.ess) if w.ess else None
        clip = statistics.fmean(w.clipfrac) if w.clipfrac else None
        degraded = []
        if ess is not None and ess < p["ess_target"]:
            degraded.append(f"ESS {ess:.3f} < {p['ess_target']:g}")
        if clip is not None and clip > p["clip_target"]:
            degraded.append(f"clip fraction {clip:.3f} > {p['clip_target']:g}")
        if degraded:  # rule 1, during a trial too (which it ends)
            self._trial, self._waiting = None, []
            if self.bound > self.min:
                self._set(step, self.bound - 1, "off-policy signal degraded: " + ", ".join(degraded))
            return
        if self._trial is not None:  # rule 2
            trial = self._trial
            if trial.settle > 0:  # the steps claimed under the old bound are still running
                trial.settle -= 1
                return
            trial.measured.append(w)
            if len(trial.measured) < self.patience:
                return
            self._trial, rate = None, _rate(trial.measured)
            if rate < trial.base_rate * (1 + p["min_gain"]):
                self._cooldown = int(p["cooldown"])
                self._set(step, max(self.min, self.bound - 1),
                          f"widening bought no throughput ({rate:.1f} rows/s against {trial.base_rate:.1f} "
                          f"before)")
                return
        trainer_waits = w.trainer_wait_s / w.seconds > p["wait_frac"]
        explorer_waits = w.explorer_wait_s / w.seconds > p["wait_frac"]
        self._waiting = self._waiting + [w] if trainer_waits and explorer_waits else []
        if len(self._waiting) >= self.patience and self.bound < self.max and not cooling:  # rule 3
            evidence, self._waiting = self._waiting[-self.patience:], []
            self._trial = _Trial(base_rate=_rate(evidence), settle=1)
            seconds = sum(e.seconds for e in evidence)
            self._set(step, self.bound + 1,
                      f"both roles waited in {len(evidence)} window(s) running (trainer "
                      f"{sum(e.trainer_wait_s for e in evidence) / seconds:.0%}, explorers "
                      f"{sum(e.explorer_wait_s for e in evidence) / seconds:.0%} of {seconds:.1f}s) with the signal "
                      f"within targets")

    def state(self) -> dict[str, Any]:
        return {"bound": self.bound, "min": self.min, "max": self.max, "history": list(self.history)}


@dataclass
class _Trial:
    """A widening on trial: ``settle`` windows ignored, then ``patience`` windows measured against ``base_rate``
    (the rows/s of the windows that asked for it)."""

    base_rate: float
    settle: int
    measured: list[Window] = field(default_factory=list)


def _rate(windows: list[Window]) -> float:
    """Rows per second over consecutive windows together."""
    return sum(w.rows for w in windows) / max(1e-9, sum(w.seconds for w in windows))
