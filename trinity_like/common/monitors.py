"""Monitors: where a role's metrics go besides ``metrics.jsonl``.

Every backend has one constructor signature, ``cls(run_dir, experiment, settings)``, and one protocol,
:class:`Monitor`: ``log(role, step, metrics, walltime)`` and ``close()``. ``metrics.jsonl`` is not a backend:
:class:`trinity_like.common.metrics.MetricsWriter` always writes it (the launcher, ``status`` and the warm-up
read it) and forwards each record to the monitors the config names.

Each role logs under its own prefix, so one run's roles never overwrite each other's curves:

    tensorboard   ``<run_dir>/tensorboard/``, scalar tags ``<role>/<area>/<metric>`` (``trainer/actor/pg_loss``)
    wandb         one run per role, named ``<role>``, grouped as ``<project>/<name>``; offline by default,
                  files under ``<run_dir>/wandb/`` (``wandb sync`` uploads them later)
    mlflow        one run per role, named ``<role>``, in the experiment ``<project>/<name>``; a local file
                  store ``<run_dir>/mlruns`` by default

The backends import their package when constructed, never at module import (``import trinity_like.common.monitors``
stays as light as the config that validates the names). A backend whose ``log`` raises is disabled by the
writer after one loud error; the role goes on (its metrics are still in ``metrics.jsonl``).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol


class Monitor(Protocol):
    def log(self, role: str, step: int, metrics: dict[str, float], walltime: float) -> None:
        """Record ``metrics`` (flat ``area/metric`` keys, numbers) of ``role`` at ``step``; ``walltime`` is
        the record's Unix time, the same as in ``metrics.jsonl``."""

    def close(self) -> None:
        """Flush and release files, runs and background processes; safe to call twice."""


class MonitorSettings(Protocol):
    """The part of ``MonitorConfig`` the backends read (duck-typed: ``common`` imports no config)."""

    wandb_mode: str
    wandb_project: str
    mlflow_tracking_uri: str


MonitorFactory = Callable[[Path, str, MonitorSettings], Monitor]

MONITOR_BACKENDS: dict[str, MonitorFactory] = {}
"""Backend name -> class; filled by :func:`register_monitor`."""

MONITOR_PACKAGES: dict[str, tuple[str, str]] = {}
"""Backend name -> (importable package it needs, the install hint when it is missing)."""


def register_monitor(name: str, package: str, install: str) -> Callable[[MonitorFactory], MonitorFactory]:
    """Register a backend under ``name``; ``package`` is what it imports, ``install`` how to get it."""

    def deco(cls: MonitorFactory) -> MonitorFactory:
        if name in MONITOR_BACKENDS:
            raise ValueError(f"monitor backend {name!r} is registered twice")
        MONITOR_BACKENDS[name] = cls
        MONITOR_PACKAGES[name] = (package, install)
        return cls

    return deco


def monitor_problem(name: str) -> str | None:
    """Why backend ``name`` cannot be used here (unknown, or its package is not installed), or None."""
    if name not in MONITOR_BACKENDS:
        return f"unknown monitor backend {name!r}; valid backends: {', '.join(MONITOR_BACKENDS)}"
    package, install = MONITOR_PACKAGES[name]
    if importlib.util.find_spec(package) is None:
        return f"monitor backend {name!r} needs the package '{package}', which is not installed; run `{install}`"
    return None


def open_monitors(names: list[str], run_dir: Path, experiment: str, settings: MonitorSettings) -> list[Monitor]:
    """The backends ``names`` for the run in ``run_dir`` (``experiment`` = ``<project>/<name>``)."""
    monitors = []
    for name in names:
        problem = monitor_problem(name)
        if problem:
            raise ValueError(problem)
        monitors.append(MONITOR_BACKENDS[name](Path(run_dir), experiment, settings))
    return monitors


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries (bools and ints as floats); anything else is left to metrics.jsonl."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}


@register_monitor("tensorboard", "tensorboard", "pip install tensorboard")
class TensorBoardMonitor:
    """Scalars in ``<run_dir>/tensorboard/``, tagged ``<role>/<area>/<metric>``, at the record's step and time;
    each process writes its own event file there (TensorBoard reads them all as one run).

    Written with the ``tensorboard`` package's own event writer, the one ``torch.utils.tensorboard`` wraps, with
    the same records (one ``simple_value`` summary per scalar): a role that needs no torch (the explorer, with a
    fast tokenizer) does not import it for its metrics (about 1.3 s of CPU at each start)."""

    def __init__(self, run_dir: Path, experiment: str, settings: MonitorSettings) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = Event, Summary
        self.log_dir = run_dir / "tensorboard"
        self.writer = EventFileWriter(str(self.log_dir))  # file name has host and pid: one per process

    def log(self, role: str, step: int, metrics: dict[str, float], walltime: float) -> None:
        for key, value in _scalars(metrics).items():
            summary = self._summary(value=[self._summary.Value(tag=f"{role}/{key}", simple_value=value)])
            self.writer.add_event(self._event(summary=summary, step=step, wall_time=walltime))
        self.writer.flush()  # one flush per step: a role killed between steps loses nothing

    def close(self) -> None:
        self.writer.close()


@register_monitor("wandb", "wandb", "pip install 'trinity_like[wandb]'")
class WandbMonitor:
    """One W&B run per role (named after it, grouped as ``<project>/<name>``), files under ``<run_dir>/wandb``.
    Each role's curves are keyed ``<role>/<area>/<metric>`` against their own step axis ``<role>/step``, so
    steps that arrive out of order (several explorers) are kept rather than dropped as W&B's own step would."""

    def __init__(self, run_dir: Path, experiment: str, settings: MonitorSettings) -> None:
        import wandb

        self._wandb = wandb
        self.run_dir = run_dir
        self.experiment = experiment
        self.project = settings.wandb_project or experiment.split("/")[0]
        self.mode = settings.wandb_mode
        self.runs: dict[str, Any] = {}
        """Role -> its wandb run, started on the role's first record."""

    def _run(self, role: str):
        if role not in self.runs:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            run = self._wandb.init(project=self.project, group=self.experiment, name=role, job_type=role,
                                   dir=str(self.run_dir), mode=self.mode, reinit="create_new",
                                   settings=self._wandb.Settings(silent=True, console="off"))
            run.define_metric(f"{role}/step")
            run.define_metric(f"{role}/*", step_metric=f"{role}/step")
            self.runs[role] = run
        return self.runs[role]

    def log(self, role: str, step: int, metrics: dict[str, float], walltime: float) -> None:
        data = {f"{role}/{k}": v for k, v in _scalars(metrics).items()}
        self._run(role).log({f"{role}/step": step, **data})

    def close(self) -> None:
        runs, self.runs = self.runs, {}
        for run in runs.values():
            run.finish()


def _mlflow_key(key: str) -> str:
    """MLflow allows only letters, digits, ``_-. :/`` in metric names: ``eval/x/accuracy/mean@4`` is logged
    as ``eval/x/accuracy/mean_at_4``."""
    return re.sub(r"[^\w\-. :/]", "_", key.replace("@", "_at_"))


@register_monitor("mlflow", "mlflow", "pip install 'trinity_like[mlflow]'")
class MlflowMonitor:
    """One MLflow run per role (named after it) in the experiment ``<project>/<name>``; metrics keyed
    ``<role>/<area>/<metric>`` (``@`` spelt ``_at_``, see :func:`_mlflow_key`). The default store is the file
    store ``<run_dir>/mlruns`` (no server, no database; MLflow 3 keeps it behind ``MLFLOW_ALLOW_FILE_STORE``,
    which this backend sets for its process)."""

    def __init__(self, run_dir: Path, experiment: str, settings: MonitorSettings) -> None:
        self.tracking_uri = settings.mlflow_tracking_uri or (run_dir / "mlruns").absolute().as_uri()
        if self.tracking_uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.experiment = experiment
        self.experiment_id: str | None = None
        self.runs: dict[str, str] = {}
        """Role -> its MLflow run id, started on the role's first record."""

    def _experiment_id(self) -> str:
        if self.experiment_id is None:
            found = self.client.get_experiment_by_name(self.experiment)
            if found is None:
                try:
                    self.experiment_id = self.client.create_experiment(self.experiment)
                except Exception:  # another role created it first
                    found = self.client.get_experiment_by_name(self.experiment)
                    if found is None:
                        raise
            if found is not None:
                self.experiment_id = found.experiment_id
        return self.experiment_id

    def _run_id(self, role: str) -> str:
        if role not in self.runs:
            run = self.client.create_run(self._experiment_id(), run_name=role, tags={"role": role})
            self.runs[role] = run.info.run_id
        return self.runs[role]

    def log(self, role: str, step: int, metrics: dict[str, float], walltime: float) -> None:
        from mlflow.entities import Metric

        ms = int(walltime * 1000)
        batch = [Metric(_mlflow_key(f"{role}/{k}"), v, ms, step) for k, v in _scalars(metrics).items()]
        self.client.log_batch(self._run_id(role), metrics=batch)

    def close(self) -> None:
        runs, self.runs = self.runs, {}
        for run_id in runs.values():
            self.client.set_terminated(run_id)
