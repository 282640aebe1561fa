"""What ``run`` shows while it works: it tails ``metrics.jsonl`` and keeps the step records of this job's roles.

On a terminal it draws a live bar per role (rich): steps done of the total, reward, held-out eval, staleness,
policy versions, elapsed time and ETA. Otherwise (a log file, ``ray job logs``, CI) it prints one plain line
per step, so logs stay greppable. Lines printed by other parts while the bar is live appear above it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from trinity_like.common.metrics import read_metrics


def _eval_of(record: dict[str, Any]) -> tuple[str, float] | None:
    """The first held-out accuracy in an evaluation record (``eval/<set>/accuracy/mean@k``), if any."""
    for key, value in record.items():
        if key.startswith("eval/") and "/accuracy/mean@" in key:
            name = key.split("/")[1]
            return f"{name} {key.rsplit('/', 1)[1]}", float(value)
    return None


class RunProgress:
    """Tails ``metrics.jsonl`` from where it stood when created; ``records`` keeps the step records of
    ``kinds`` (the job's summary is computed from them). ``live``: None = a bar when ``stream`` is a terminal."""

    def __init__(self, metrics: Path, totals: dict[str, int], kinds: tuple[str, ...], stream=None,
                 live: bool | None = None) -> None:
        self.metrics = Path(metrics)
        self.totals = totals
        """Steps each role will run (its bar's length)."""
        self.kinds = kinds
        self.stream = stream or sys.stdout
        self.offset = self.metrics.stat().st_size if self.metrics.is_file() else 0
        self.records: list[dict[str, Any]] = []
        self.eval: tuple[str, float] | None = None
        """The latest held-out accuracy seen: (label, value)."""
        self.live = self.stream.isatty() if live is None else live
        self._bar = None
        self._tasks: dict[str, Any] = {}

    # ------------------------------------------------------------------ records
    def poll(self) -> None:
        new, self.offset = read_metrics(self.metrics, self.offset)
        for r in new:
            ev = _eval_of(r)
            if ev is not None:
                self.eval = ev
                if not self.live:
                    print(f"eval     step {r['step']:>4}       {ev[0]} {ev[1]:.3f}", file=self.stream, flush=True)
            if r.get("role") not in self.kinds or not self._is_step(r):
                continue
            if r.get("rollout/reward_failed"):  # below reward.max_failure_frac (above it the run stops)
                failed, of = int(r["rollout/reward_failed"]), int(r.get("rollout/experiences", 0))
                print(f"warning: explorer step {r['step']}: the reward failed on {failed} of {of} samples, trained "
                      "with reward.failure_value (why: the explorer's log)", file=sys.stderr, flush=True)
            self.records.append(r)
            if self.live:
                self._update_bar(r)
            else:
                print(self.line(r), file=self.stream, flush=True)

    @staticmethod
    def _is_step(r: dict[str, Any]) -> bool:
        return "train/reward_mean" in r or "rollout/reward_mean" in r

    def line(self, r: dict[str, Any]) -> str:
        """The plain one-line form of a step record."""
        if r["role"] == "trainer":
            return (f"trainer  step {r['step']:>4}/{self.totals.get('trainer', 0)}  reward {r['train/reward_mean']:.3f}  "
                    f"staleness {r['train/staleness_mean']:.2f}  pg_loss {r.get('actor/pg_loss', float('nan')):+.4f}  "
                    f"{r['time/train_step_s']:.2f}s")
        return (f"explorer step {r['step']:>4}       reward {r['rollout/reward_mean']:.3f}  "
                f"version {int(r['rollout/model_version'])}  {r['time/explore_step_s']:.2f}s{_groups(r)}")

    # ------------------------------------------------------------------ the live bar
    def _stats(self, r: dict[str, Any]) -> str:
        if r["role"] == "trainer":
            text = (f"reward {r['train/reward_mean']:.3f}  staleness {r['train/staleness_mean']:.2f}"
                    f"/{r['train/staleness_max']:.0f}  version {int(r.get('trainer/version', r['step']))}")
        else:
            text = (f"reward {r['rollout/reward_mean']:.3f}  generating with version {int(r['rollout/model_version'])}"
                    f"{_groups(r)}")
        if self.eval is not None:
            text += f"  eval {self.eval[0]} {self.eval[1]:.3f}"
        return text

    def _update_bar(self, r: dict[str, Any]) -> None:
        if self._bar is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(TextColumn("{task.description:<8}"), BarColumn(bar_width=20), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                 TextColumn("{task.fields[stats]}"),
                                 console=Console(file=self.stream, force_terminal=True), refresh_per_second=4,
                                 redirect_stdout=self.stream is sys.stdout, redirect_stderr=False)
            self._bar.start()
        role = r["role"]
        if role not in self._tasks:
            self._tasks[role] = self._bar.add_task(role, total=self.totals.get(role) or None, stats="")
        self._bar.update(self._tasks[role], completed=r["step"], stats=self._stats(r))

    def close(self) -> None:
        """Stop the live bar (its last state stays on screen)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _groups(r: dict[str, Any]) -> str:
    """Streaming rollout's groups (``explorer.rollout: stream``): written so far, and generating now."""
    if "rollout/groups_written" not in r:
        return ""
    return f"  groups {int(r['rollout/groups_written'])} written, {int(r['rollout/groups_in_flight'])} in flight"
