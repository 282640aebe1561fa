"""A staleness bound that sets itself (``synchronizer.max_staleness: auto``).

The bound (``c - version`` an explorer step may generate with, see ``runtime.schedule``) moves within
``synchronizer.auto_staleness.[min, max]``, decided every ``window`` trainer steps from what both roles report:

- the off-policy signal of the batches trained in the window: the normalised effective sample size of the
  correction's weights (``off_policy/ess``, 1 = on-policy) and the PPO clip fraction (``actor/pg_clipfrac``);
- how long each role waited in the window: the trainer for data (``time/wait_data_s``), the explorers at
  admission, i.e. for the bound (``rollout/admission_wait_s``);
- the trained rows per second of the window.

Rules, first match wins:

1. A widening is a trial: one window to settle (steps claimed under the old bound are still running), then, if
   the rows per second of the next window did not rise by ``min_gain`` over the window before the widening, the
   bound goes back down and does not widen for ``cooldown`` windows ("bought no throughput"). The off-policy
   check (rule 2) applies during a trial too.
2. The signal degraded (ESS below ``ess_target`` or clip fraction above ``clip_target``): narrow by one.
3. Both roles waited (each more than ``wait_frac`` of the window): the bound holds the explorers back while the
   trainer starves, so widen by one (a trial, rule 1).
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

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


class StalenessController:
    """Holds the current bound of one run and moves it (see the module's rules)."""

    def __init__(self, params: dict[str, Any]) -> None:
        """``params``: the fields of ``AutoStalenessConfig`` (min, max, start, window, ess_target, clip_target,
        wait_frac, min_gain, cooldown)."""
        self.p = dict(params)
        self.min, self.max = int(self.p["min"]), int(self.p["max"])
        if self.min > self.max:
            raise ValueError(f"auto_staleness.min={self.min} is above auto_staleness.max={self.max}")
        self.bound = min(self.max, max(self.min, int(self.p["start"])))
        self.history: list[dict[str, Any]] = [{"step": 0, "bound": self.bound, "reason": "start"}]
        self._window = Window()
        self._last_end_s: float | None = None
        """When the last window closed: the next one runs from there."""
        self._trial: float | None = None
        """Rows/s of the window before a widening, while that widening is on trial."""
        self._cooldown = 0
        self._trial_windows = 0

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
        if w.steps >= int(self.p["window"]):
            self._decide(step, w)
            self._last_end_s, self._window = w.end_s, Window()
        return self.bound

    def _set(self, step: int, bound: int, reason: str) -> None:
        self.bound = bound
        self.history.append({"step": step, "bound": bound, "reason": reason})

    def _decide(self, step: int, w: Window) -> None:
        p = self.p
        cooling, self._cooldown = self._cooldown > 0, max(0, self._cooldown - 1)
        if self._trial is not None:
            self._trial_windows += 1
            if self._trial_windows == 1:  # the steps claimed under the old bound are still running: settle
                return
            base, self._trial = self._trial, None
            if w.rate < base * (1 + p["min_gain"]):
                self._cooldown = int(p["cooldown"])
                self._set(step, max(self.min, self.bound - 1),
                          f"widening bought no throughput ({w.rate:.1f} rows/s against {base:.1f} before)")
                return
        ess = statistics.fmean(w.ess) if w.ess else None
        clip = statistics.fmean(w.clipfrac) if w.clipfrac else None
        degraded = []
        if ess is not None and ess < p["ess_target"]:
            degraded.append(f"ESS {ess:.3f} < {p['ess_target']:g}")
        if clip is not None and clip > p["clip_target"]:
            degraded.append(f"clip fraction {clip:.3f} > {p['clip_target']:g}")
        if degraded:
            if self.bound > self.min:
                self._set(step, self.bound - 1, "off-policy signal degraded: " + ", ".join(degraded))
            return
        trainer_waits = w.trainer_wait_s / w.seconds > p["wait_frac"]
        explorer_waits = w.explorer_wait_s / w.seconds > p["wait_frac"]
        if trainer_waits and explorer_waits and self.bound < self.max and not cooling:
            self._trial, self._trial_windows = w.rate, 0
            self._set(step, self.bound + 1,
                      f"both roles waited (trainer {w.trainer_wait_s / w.seconds:.0%}, explorers "
                      f"{w.explorer_wait_s / w.seconds:.0%} of {w.seconds:.1f}s) with the signal within targets")

    def state(self) -> dict[str, Any]:
        return {"bound": self.bound, "min": self.min, "max": self.max, "history": list(self.history)}
