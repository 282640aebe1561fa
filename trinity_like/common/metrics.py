"""metrics.jsonl: one JSON object per step and role, with flat ``area/metric`` keys; and the monitors.

:class:`MetricsWriter` is the one place a role logs through: it appends each record to ``metrics.jsonl``
(always; the launcher, ``status`` and the warm-up tail it) and forwards it to the configured monitors
(``monitor.backends``: TensorBoard, W&B, MLflow; see :mod:`trinity_like.common.monitors`);
:func:`trinity_like.runtime.metrics.open_metrics_writer` opens a role's writer for a run. The metric names are
listed in ``docs/metrics.md``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity_like.common.fs import append_line

if TYPE_CHECKING:
    from trinity_like.common.monitors import Monitor

logger = logging.getLogger(__name__)

TIMESTAMP_PREFIX = "timeline/"
"""Keys that hold when a phase of the step began (unix seconds): kept in metrics.jsonl, not sent to monitors."""


class MetricsWriter:
    def __init__(self, path: str | Path, role: str, monitors: list[Monitor] | None = None,
                 relay: Callable[[str], None] | None = None) -> None:
        """``relay``: also called with each line written (an explorer off the run's filesystem sends its
        records to the trainer's ``metrics.jsonl`` this way)."""
        self.path = Path(path)
        self.relay = relay
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.role = role
        self.monitors: list[Monitor] = list(monitors or [])
        """Backends still logging; one that raises is logged once and dropped from here."""

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"role": self.role, "step": step, "time": time.time(), **metrics}
        line = json.dumps(record, sort_keys=False)
        append_line(self.path, line)
        if self.relay is not None:
            self.relay(line)
        # timeline/* are wall-clock instants (for `trinity-like plot`), not quantities to chart against steps
        scalars = {k: v for k, v in metrics.items() if not k.startswith(TIMESTAMP_PREFIX)}
        for monitor in list(self.monitors):
            try:
                monitor.log(self.role, step, scalars, record["time"])
            except Exception:
                # a dashboard must not stop training: say so loudly, once, and keep metrics.jsonl going
                logger.exception("monitor %s of role %s failed at step %d and is disabled for the rest of this "
                                 "run; the metrics are still in %s", type(monitor).__name__, self.role, step,
                                 self.path)
                self.monitors.remove(monitor)
                self._close(monitor)

    def close(self) -> None:
        """Flush and close the monitors; safe to call twice (metrics.jsonl needs no closing)."""
        monitors, self.monitors = self.monitors, []
        for monitor in monitors:
            self._close(monitor)

    def _close(self, monitor: Monitor) -> None:
        try:
            monitor.close()
        except Exception:
            logger.exception("monitor %s of role %s failed to close", type(monitor).__name__, self.role)


def read_metrics(path: str | Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Records from byte ``offset`` on, and the offset after the last complete line (a torn last line from
    a crashed writer is left for the next call)."""
    path = Path(path)
    if not path.is_file():
        return [], offset
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read()
    end = data.rfind(b"\n") + 1
    records = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return records, offset + end
