"""A role's metrics writer in a run: the run directory's ``metrics.jsonl`` plus the monitors the config names.
Here rather than in ``common.metrics``, which knows neither the config nor the run's paths."""

from __future__ import annotations

from collections.abc import Callable

from trinity_like.common.metrics import MetricsWriter
from trinity_like.config import Config
from trinity_like.runtime.paths import RunPaths


def open_metrics_writer(cfg: Config, paths: RunPaths, role: str,
                        relay: Callable[[str], None] | None = None) -> MetricsWriter:
    """The writer of ``role`` in the run: ``paths.metrics`` plus the monitors of ``cfg.monitor.backends``
    (``relay``: see :class:`MetricsWriter`)."""
    from trinity_like.common.monitors import open_monitors

    monitors = open_monitors(cfg.monitor.backends, paths.run_dir, f"{cfg.project}/{cfg.name}", cfg.monitor)
    return MetricsWriter(paths.metrics, role, monitors, relay)
