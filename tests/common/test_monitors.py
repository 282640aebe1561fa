"""Monitors (trinity_like/common/monitors.py) and the writer that feeds them: each backend writes real files that
its own reader reads back, under the role's prefix; a failing backend is dropped without stopping the writer;
``monitor.backends`` is validated."""

import logging
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from trinity_like.common import monitors as mon
from trinity_like.common.metrics import MetricsWriter, read_metrics
from trinity_like.config import ConfigError, load_config
from trinity_like.runtime.metrics import open_metrics_writer
from trinity_like.runtime.paths import RunPaths

RECORDS = [  # (role, step, metrics)
    ("trainer", 1, {"actor/pg_loss": 0.5, "train/batch_size": 8}),
    ("explorer", 1, {"rollout/reward_mean": 0.25, "eval/heldout/accuracy/mean@4": 0.5}),
    ("trainer", 2, {"actor/pg_loss": 0.25, "train/batch_size": 8}),
]
SETTINGS = SimpleNamespace(wandb_mode="offline", wandb_project="", mlflow_tracking_uri="")


def _log_all(monitor):
    for i, (role, step, metrics) in enumerate(RECORDS):
        monitor.log(role, step, metrics, 1_700_000_000.0 + i)
    monitor.close()
    monitor.close()  # twice is safe


def test_tensorboard_scalars_under_role_prefixes(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_all(mon.MONITOR_BACKENDS["tensorboard"](tmp_path, "p/n", SETTINGS))
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert tags == {"trainer/actor/pg_loss", "trainer/train/batch_size", "explorer/rollout/reward_mean",
                    "explorer/eval/heldout/accuracy/mean@4"}
    pg = acc.Scalars("trainer/actor/pg_loss")
    assert [(e.step, e.value) for e in pg] == [(1, 0.5), (2, 0.25)]
    assert [e.wall_time for e in pg] == [1_700_000_000.0, 1_700_000_002.0]  # the record's time


def test_wandb_offline_run_per_role(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _log_all(mon.MONITOR_BACKENDS["wandb"](tmp_path, "p/n", SETTINGS))
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 2  # one per role, no network
    keys = (b"trainer/actor/pg_loss", b"explorer/rollout/reward_mean", b"trainer/step", b"explorer/step")
    deadline = time.monotonic() + 20  # W&B's own service process writes the files: on a busy machine, after
    while True:                       # finish() has returned (seen once in make test)
        files = [f for run in runs for f in run.glob("*.wandb")]
        assert len(files) == 2
        blobs = b"".join(f.read_bytes() for f in files)
        if all(key in blobs for key in keys) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [key for key in keys if key not in blobs] == []


def test_mlflow_file_store_run_per_role(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # the backend sets it for its process
    monitor = mon.MONITOR_BACKENDS["mlflow"](tmp_path, "p/n", SETTINGS)
    _log_all(monitor)
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    exp = client.get_experiment_by_name("p/n")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"trainer", "explorer"}
    assert all(r.info.status == "FINISHED" for r in runs.values())
    history = client.get_metric_history(runs["trainer"].info.run_id, "trainer/actor/pg_loss")
    assert [(m.step, m.value, m.timestamp) for m in history] == [(1, 0.5, 1_700_000_000_000),
                                                                 (2, 0.25, 1_700_000_002_000)]
    explorer = runs["explorer"].data.metrics
    assert explorer == {"explorer/rollout/reward_mean": 0.25, "explorer/eval/heldout/accuracy/mean_at_4": 0.5}


class _Recording:
    def __init__(self):
        self.logged, self.closed = [], 0

    def log(self, role, step, metrics, walltime):
        self.logged.append((role, step, dict(metrics), walltime))

    def close(self):
        self.closed += 1


class _Failing(_Recording):
    def log(self, role, step, metrics, walltime):
        raise ConnectionError("dashboard down")


def test_writer_forwards_and_drops_a_failing_backend(tmp_path, caplog):
    good, bad = _Recording(), _Failing()
    writer = MetricsWriter(tmp_path / "metrics.jsonl", "trainer", [bad, good])
    with caplog.at_level(logging.ERROR, logger="trinity_like.common.metrics"):
        writer.write(1, {"actor/pg_loss": 0.5})
        writer.write(2, {"actor/pg_loss": 0.25})
    assert [m for m in caplog.records if "disabled" in m.getMessage()] and len(caplog.records) == 1  # once
    assert writer.monitors == [good] and bad.closed == 1
    records, _ = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["role"], r["step"], r["actor/pg_loss"]) for r in records] == [("trainer", 1, 0.5), ("trainer", 2, 0.25)]
    assert [(role, step, m) for role, step, m, _ in good.logged] == [("trainer", 1, {"actor/pg_loss": 0.5}),
                                                                     ("trainer", 2, {"actor/pg_loss": 0.25})]
    assert [t for *_, t in good.logged] == [r["time"] for r in records]  # the monitors get the record's time
    writer.close()
    writer.close()
    assert good.closed == 1


def test_a_roles_writer_opens_the_configured_backends(tmp_path):
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", "project=p", "name=n"])
    assert cfg.monitor.backends == ["tensorboard"]  # the default
    writer = open_metrics_writer(cfg, RunPaths.of(cfg), role="explorer")
    writer.write(3, {"rollout/accuracy": 1.0})
    writer.close()
    run_dir = RunPaths.of(cfg).run_dir
    assert read_metrics(run_dir / "metrics.jsonl")[0][0]["rollout/accuracy"] == 1.0
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", "project=p", "name=m", "monitor.backends=[]"])
    assert open_metrics_writer(cfg, RunPaths.of(cfg), role="trainer").monitors == []


@pytest.mark.parametrize("override, message", [
    ("monitor.backends=[tensorbord]", "valid backends: tensorboard, wandb, mlflow"),
    ("monitor.backends=[tensorboard,tensorboard]", "twice"),
    ("monitor.wandb_mode=sometimes", "allowed values: offline, online, disabled"),
])
def test_config_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_missing_package_names_the_extra(monkeypatch):
    real = mon.importlib.util.find_spec
    monkeypatch.setattr(mon.importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name))
    with pytest.raises(ConfigError, match=r"pip install 'trinity_like\[wandb\]'"):
        load_config(None, ["monitor.backends=[wandb]"])


def test_registry_rejects_a_second_registration():
    with pytest.raises(ValueError, match="twice"):
        mon.register_monitor("tensorboard", "tensorboard", "")(object)


def test_importing_monitors_stays_light():
    code = ("import sys, trinity_like.common.metrics, trinity_like.common.monitors; "
            "print([m for m in ('torch', 'tensorboard', 'wandb', 'mlflow') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_timestamps_stay_in_metrics_jsonl_and_out_of_the_monitors(tmp_path):
    """timeline/* are instants for `trinity-like plot`, not quantities to chart against steps."""
    from trinity_like.common.metrics import MetricsWriter, read_metrics

    class Recorder:
        def __init__(self):
            self.seen = []

        def log(self, role, step, metrics, walltime):
            self.seen.append(dict(metrics))

        def close(self):
            pass

    recorder = Recorder()
    writer = MetricsWriter(tmp_path / "metrics.jsonl", "trainer", [recorder])
    writer.write(1, {"train/reward_mean": 0.5, "timeline/start_unix_s": 1.7e9})
    assert recorder.seen == [{"train/reward_mean": 0.5}]
    (record,), _ = read_metrics(tmp_path / "metrics.jsonl")
    assert record["timeline/start_unix_s"] == 1.7e9 and record["train/reward_mean"] == 0.5
