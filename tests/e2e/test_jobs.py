"""Explorer and trainer as independent Ray jobs on a real `ray start --head` cluster, and their faults.

Jobs are real processes: submitted with `ray job submit`, or drivers started with `trinity-like run --role ...
--address ...` (a driver connected to a cluster is a Ray job too) so that a test can SIGKILL or SIGTERM it.
Every test ends with the ledger check: each experience trained in exactly one committed step, nothing trained
twice, and what was written but not trained still in the buffer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from trinity_like.buffer import query
from trinity_like.buffer.ledger import Ledger
from trinity_like.buffer.sql import consumption_table, group_consumption
from trinity_like.common.metrics import read_metrics
from trinity_like.config import load_config
from trinity_like.runtime.paths import RunPaths

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
BATCH = 8  # 2 tasks x 4 samples: one explorer step is one trainer batch


def _write_cfg(tmp_path, model_path, name, **over) -> Path:
    cfg = {
        "project": "jobs", "name": name, "checkpoint_root_dir": str(tmp_path / "runs"), "mode": "async",
        "model": {"path": model_path},
        "explorer": {"batch_size": 2, "repeat_times": 4, "sampling": {"max_new_tokens": 4},
                     "taskset": {"size": 16, "max_operand": 9}},
        "trainer": {"total_steps": 5, "micro_batch_size": 8, "optimizer": {"lr": 0.01}},
        "synchronizer": {"max_staleness": 1, "timeout_s": 180, "heartbeat_timeout_s": 3},
    }
    for dotted, value in over.items():
        node = cfg
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Proc:
    """A child process whose output is collected by a thread (so it never blocks on a full pipe)."""

    started: list[Proc] = []
    """Every process a test started, killed after the test if still running (see ``_no_leftovers``)."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        Proc.started.append(self)
        self.args = args
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float = 300) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            raise AssertionError(f"{self.args} did not end within {timeout}s; output:\n{self.output}") from None
        self._reader.join(timeout=10)
        return rc

    def signal(self, sig: int) -> None:
        """Signal the driver only (SIGTERM/SIGINT as a user's ^C or `kill` would)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self, role_pid: int | None = None) -> None:
        """SIGKILL the job: its role's process at once (``role_pid``), and the driver, whose other actors
        (engines, trainer workers) Ray then ends too."""
        if role_pid is not None:
            os.kill(role_pid, signal.SIGKILL)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture(autouse=True)
def _no_leftovers():
    yield
    while Proc.started:
        Proc.started.pop().kill()


def _role_pid(job: Proc, kind: str) -> int:
    """The process of the job's role of ``kind``: the driver prints its id (which ends with the pid)."""
    marker = f"{kind} {kind}-"
    _wait_until(lambda: marker in job.output, 240, f"the {kind} to join", [job], poll_s=0.05)
    line = next(x for x in job.output.splitlines() if x.startswith(marker))
    return int(line.split()[1].rsplit("-", 1)[1])


def _driver(cluster, cfg_path: Path, role: str, *extra: str) -> Proc:
    return Proc([str(BIN / "trinity-like"), "run", str(cfg_path), "--role", role, "--address", cluster.address,
                 *extra], cluster.env)


def _submit(cluster, cfg_path: Path, role: str) -> Proc:
    """`ray job submit` (blocking: streams the job's log, exits with the job's status)."""
    return Proc([str(BIN / "ray"), "job", "submit", "--", str(BIN / "trinity-like"), "run", str(cfg_path),
                 "--role", role], cluster.env)


def _records(cfg_path: Path, role: str | None = None) -> list[dict]:
    records, _ = read_metrics(RunPaths.of(load_config(cfg_path)).metrics)
    return [r for r in records if role is None or r["role"] == role]


def _wait_until(predicate, timeout: float, what: str, procs=(), poll_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for p in procs:
            if p.proc.poll() is not None:
                raise AssertionError(f"{p.args[-3:]} ended ({p.proc.returncode}) while waiting for {what}:\n{p.output}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)


def _status(cluster, cfg_path: Path) -> dict:
    out = subprocess.run([str(BIN / "trinity-like"), "status", str(cfg_path), "--json", "--address", cluster.address],
                         env=cluster.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def check_ledger(cfg_path: Path) -> list[dict]:
    """Each trained experience in exactly one committed step, every step a full batch, nothing pending; every
    experience written is still in the buffer (trained or not). Returns the ledger rows."""
    paths = RunPaths.of(load_config(cfg_path))
    cfg = load_config(paths.config)  # the run's own config: a `--role all --resume` may have changed it
    ledger = consumption_table(paths.buffer_dir).to_pylist()
    assert ledger and all(r["committed"] and r["consumer"] == "trainer" for r in ledger)
    eids = [r["eid"] for r in ledger]
    assert len(eids) == len(set(eids)) == cfg.trainer.total_steps * BATCH, "an experience trained twice or lost"
    per_step: dict[int, int] = {}
    for r in ledger:
        per_step[r["step"]] = per_step.get(r["step"], 0) + 1
    assert per_step == {k: BATCH for k in range(1, cfg.trainer.total_steps + 1)}
    stored = query(paths.buffer_dir).column("eid").to_pylist()
    assert len(stored) == len(set(stored))
    assert set(eids) <= set(stored)  # nothing trained is missing, and untrained rows stay in the buffer
    assert group_consumption(paths.buffer_dir) == []  # every group trained whole, in one step
    return ledger


def test_two_ray_jobs_meet_when_the_trainer_is_submitted_first(tmp_path, tiny_model_path, ray_cluster):
    """`ray job submit` for both roles, the trainer first: it waits for experiences and says so once. The other
    order (explorers first, waiting for weights, then a trainer) is test_several_explorer_jobs_join_one_trainer_...:
    each order is one run of ~20 worker-seconds, so each is proved once."""
    waits = "trainer: waiting for experiences"
    cfg_path = _write_cfg(tmp_path, tiny_model_path, "two-jobs")
    trainer = _submit(ray_cluster, cfg_path, "trainer")
    _wait_until(lambda: waits in trainer.output, 240, "the trainer to say it waits", [trainer])
    explorer = _submit(ray_cluster, cfg_path, "explorer")  # its start-up takes seconds; the trainer keeps waiting
    assert explorer.wait(300) == 0, explorer.output
    assert trainer.wait(300) == 0, trainer.output
    assert trainer.output.count(waits) == 1
    assert "the run directory shows no explorer was ever started with this run directory" in trainer.output
    for job in (trainer, explorer):
        assert "succeeded" in job.output
    summary = json.loads(RunPaths.of(load_config(cfg_path)).summary.read_text())
    assert summary["role"] == "trainer" and summary["exit_reason"] == "completed"
    assert summary["trainer_steps"] == 5 and summary["final_version"] == 5
    assert summary["staleness_max"] <= 1
    check_ledger(cfg_path)
    assert sorted(r["step"] for r in _records(cfg_path, "explorer")) == [1, 2, 3, 4, 5]  # global steps, each once


def test_several_explorer_jobs_join_one_trainer_and_status_shows_them(tmp_path, tiny_model_path, ray_cluster):
    cfg_path = _write_cfg(tmp_path, tiny_model_path, "fleet", trainer__total_steps=6,
                          synchronizer__max_staleness=2)
    explorers = [_driver(ray_cluster, cfg_path, "explorer") for _ in range(2)]

    # steps 0-2 need version 0; then both wait for a trainer, and say so (no `status` process per poll)
    _wait_until(lambda: all("explorer: waiting for new weights" in e.output for e in explorers), 240,
                "both explorers to wait for a trainer", explorers)
    st = _status(ray_cluster, cfg_path)
    assert sorted((r["kind"], r["state"]) for r in st["roles"]) == [("explorer", "require_sync")] * 2
    assert st["namespace"] == "jobs/fleet" and st["synchronizer"] and st["latest_version"] == 0
    assert st["explore_steps"]["next"] == 5 and len(st["explore_steps"]["claimed"]) == 2  # 0-2 written, 3-4 held
    assert st["buffer"] == {"rows": 3 * BATCH, "unconsumed": 3 * BATCH, "quarantined": 0, "unconsumed_versions": [0, 0],
                            "unconsumed_staleness": [0, 0],
                            "by_source": {"explorer": {"rows": 3 * BATCH, "unconsumed": 3 * BATCH}}}
    text = subprocess.run([str(BIN / "trinity-like"), "status", str(cfg_path), "--address", ray_cluster.address],
                          env=ray_cluster.env, capture_output=True, text=True, timeout=120).stdout
    assert text.count("require_sync") == 2 and f"buffer: {3 * BATCH} rows, {3 * BATCH} not yet trained" in text

    trainer = _driver(ray_cluster, cfg_path, "trainer")
    for p in (trainer, *explorers):
        assert p.wait(300) == 0, p.output
    assert "trainer: waiting for" not in trainer.output  # the explorers were there before it
    assert all(e.output.count("explorer: waiting for new weights") == 1 for e in explorers)  # said once each
    assert all("the run directory shows no trainer was ever started" in e.output for e in explorers)
    check_ledger(cfg_path)
    paths = RunPaths.of(load_config(cfg_path))
    rows = query(paths.buffer_dir).to_pylist()
    steps = [json.loads(r["info"])["explore_step"] for r in rows]
    # Each global step exactly once. Two explorers commit steps out of order; on a loaded machine a late step's
    # rows can reach the trainer staler than the bound (seen once in a fresh clone: a step generated at version 2
    # written after the next one, then trained at 5), which it skips, and the explorers make that many rows up
    # with further steps: one more step for each one skipped, never a gap or a repeat.
    skipped = int(_records(cfg_path, "trainer")[-1]["buffer/skipped_stale"])  # a running total
    made_up = skipped // BATCH
    assert skipped % BATCH == 0  # whole steps: a step's rows all come from one version
    assert sorted(set(steps)) == list(range(6 + made_up)) and len(steps) == (6 + made_up) * BATCH
    writers = {"-".join(s.name.split("-")[1:3]) for s in (paths.buffer_dir / "segments").iterdir()}
    assert len(writers) == 2, "both explorer jobs wrote steps"
    final = _status(ray_cluster, cfg_path)
    assert sorted((r["kind"], r["state"]) for r in final["roles"]) == [
        ("explorer", "stopped"), ("explorer", "stopped"), ("trainer", "stopped")]
    assert final["buffer"]["unconsumed"] == skipped and final["latest_version"] == 6  # skipped rows stay, untrained
    # by namespace alone: the roles say where the run directory is
    out = subprocess.run([str(BIN / "trinity-like"), "status", "--namespace", "jobs/fleet", "--json", "--address",
                          ray_cluster.address], env=ray_cluster.env, capture_output=True, text=True, timeout=120)
    by_ns = json.loads(out.stdout)
    assert by_ns["run_dir"] == str(paths.run_dir) and by_ns["buffer"] == final["buffer"]


def test_a_self_setting_bound_rises_when_generation_is_slower_than_training(tmp_path, tiny_model_path, ray_cluster):
    """Three explorer jobs whose steps take over a second each (a slow workflow) and a trainer that needs a fraction
    of that. At a bound of 1 an explorer that finishes step s claims step s + 3, which needs the version made from
    step s + 1, still being generated by another explorer: it waits about a third of its step, while the trainer
    waits for data between steps. Both roles wait, so the bound widens (whether the widening then stays depends on
    the rows per second it buys: not asserted). Two explorers are not enough: they fall into a half-step offset
    in which an explorer's next step needs only the version the trainer made a moment ago, and neither waits
    beyond noise, so the test passed or failed with the machine's load."""
    workflow = Path(__file__).resolve().parent / "flaky_workflow.py"
    cfg_path = _write_cfg(tmp_path, tiny_model_path, "auto-rises", trainer__total_steps=16,
                          explorer__workflow=f"{workflow}:SlowWorkflow", synchronizer__max_staleness="auto",
                          synchronizer__auto_staleness={"start": 1, "min": 1, "max": 3, "window": 2,
                                                                        "window_s": 0})
    explorers = [_driver(ray_cluster, cfg_path, "explorer") for _ in range(3)]
    trainer = _driver(ray_cluster, cfg_path, "trainer")
    for p in (trainer, *explorers):
        assert p.wait(400) == 0, p.output
    check_ledger(cfg_path)
    trainer_records = _records(cfg_path, "trainer")
    bounds = [r["sync/staleness_bound"] for r in trainer_records]
    assert bounds[0] == 1 and 2 <= max(bounds) <= 3, bounds
    assert max(r["train/staleness_max"] for r in trainer_records) <= 3  # never past the hard bound


def test_killed_explorer_job_the_trainer_drains_waits_and_a_new_explorer_goes_on(tmp_path, tiny_model_path,
                                                                                   ray_cluster):
    # streaming rollout: the killed explorer may leave a step part-written, which the new one completes
    cfg_path = _write_cfg(tmp_path, tiny_model_path, "explorer-killed", trainer__total_steps=12,
                          explorer__rollout="stream", explorer__stream__flush_s=0)
    trainer = _driver(ray_cluster, cfg_path, "trainer")
    explorer = _driver(ray_cluster, cfg_path, "explorer")
    explorer_pid = _role_pid(explorer, "explorer")
    _wait_until(lambda: len(_records(cfg_path, "trainer")) >= 2, 240, "two trainer steps", [trainer, explorer],
                poll_s=0.05)
    explorer.kill(explorer_pid)
    before_kill = len(trainer.lines)
    _wait_until(lambda: "trainer: waiting for experiences" in "".join(trainer.lines[before_kill:]), 120,
                "the trainer to say it waits for an explorer", [trainer])
    trained_while_alone = len(_records(cfg_path, "trainer"))
    latest = _status(ray_cluster, cfg_path)["latest_version"]
    assert trained_while_alone >= 2 and trainer.proc.poll() is None  # it drained what was there, and waits

    started_again = time.time()
    again = _driver(ray_cluster, cfg_path, "explorer")
    assert again.wait(300) == 0, again.output
    assert trainer.wait(300) == 0, trainer.output
    assert "".join(trainer.lines[before_kill:]).count("trainer: waiting for experiences") == 1  # said once
    assert "the run directory shows an explorer that stopped without ending (pid " in trainer.output
    # the new explorer started from the latest published version: the first step it wrote rows for holds none
    # older, unless they are samples continued from the killed explorer's journal (a resumed sample's version is
    # its oldest token's, issue 37). (A step whose groups were all written before it was handed over is recorded
    # too, with no rows and before any load: it says nothing of the version.)
    first = min((r for r in _records(cfg_path, "explorer") if r["time"] >= started_again
                 and r["rollout/experiences"] > 0), key=lambda r: r["time"])
    if first["rollout/model_version"] < latest:
        assert first["rollout/partial_resumed_tokens"] > 0, first
    check_ledger(cfg_path)


def test_killed_trainer_job_resumes_and_nothing_is_lost_or_trained_twice(tmp_path, tiny_model_path, ray_cluster):
    # planned well past the kill: a loaded machine may let the trainer run several steps past the first odd one
    # before the kill lands, and the explorer must still have steps left to wait for (it ended once, at 10)
    total = 20
    cfg_path = _write_cfg(tmp_path, tiny_model_path, "trainer-killed", trainer__total_steps=total,
                          trainer__save_interval=2)
    paths = RunPaths.of(load_config(cfg_path))
    trainer = _driver(ray_cluster, cfg_path, "trainer")
    explorer = _driver(ray_cluster, cfg_path, "explorer")
    trainer_pid = _role_pid(trainer, "trainer")
    # kill it right after an odd step (3 or 5): it has trained past its last checkpoint (an even step)
    _wait_until(lambda: (n := len(_records(cfg_path, "trainer"))) >= 3 and n % 2 == 1, 240, "an odd trainer step",
                [trainer, explorer], poll_s=0.02)
    trainer.kill(trainer_pid)
    trained = len(_records(cfg_path, "trainer"))
    ckpt = int((paths.checkpoint_dir / "latest").read_text())
    # the kill may land anywhere in a step, even between the ledger commit and the checkpoint of step 4
    assert ckpt % 2 == 0 and ckpt <= trained + 1 and trained < total - 2
    ledger = Ledger(paths.buffer_dir, "trainer", create=False)
    committed = ledger.committed().to_pylist()
    kept = {r["eid"] for r in committed if r["step"] <= ckpt}
    # consumed after the checkpoint: pending, or committed without its checkpoint; all of it is trained again
    after_ckpt = {(r["eid"], r["step"]) for r in committed + ledger.pending().to_pylist() if r["step"] > ckpt}
    assert len(kept) == ckpt * BATCH
    assert {step for _, step in after_ckpt} >= set(range(ckpt + 1, trained + 1))

    # meanwhile the explorer goes on, up to the staleness bound, then waits for the trainer and says so
    _wait_until(lambda: "explorer: waiting for new weights" in explorer.output, 120,
                "the explorer to wait for weights", [explorer])
    roles = _status(ray_cluster, cfg_path)["roles"]
    assert any(r["kind"] == "explorer" and r["state"] == "require_sync" for r in roles)

    again = _driver(ray_cluster, cfg_path, "trainer", "--resume")
    assert again.wait(300) == 0, again.output
    assert explorer.wait(300) == 0, explorer.output
    summary = json.loads(paths.summary.read_text())
    assert summary["resumed_from"] == ckpt and summary["trainer_steps"] == total - ckpt
    assert summary["final_version"] == total and summary["staleness_max"] <= 1
    assert f"trainer  step {ckpt + 1:>4}/{total}" in again.output  # it went on right after the checkpoint
    final = check_ledger(cfg_path)
    # the buffer re-delivered exactly what the dead trainer had consumed after its checkpoint, to the same steps
    assert after_ckpt <= {(r["eid"], r["step"]) for r in final if r["step"] > ckpt}
    assert {r["eid"] for r in final if r["step"] <= ckpt} == kept


def test_signals_stop_the_run_cleanly_and_resume_goes_on(tmp_path, tiny_model_path, ray_cluster):
    """SIGTERM stops the run; its resume trains on from the checkpoint and is stopped by SIGINT. Each stop leaves
    the checkpoint of the step reached with every hand-out of it committed, each experience trained once. (Both
    signals in one run's life: a run start costs ~20 worker-seconds; that a resume then completes with the ledger
    whole is test_killed_trainer_job_resumes_and_nothing_is_lost_or_trained_twice, after a harder stop.)"""
    # Steps of the tiny model take ~0.05 s and a loaded machine delays the stop by a few of them: the run is
    # planned far longer than the stop can take.
    cfg_path = _write_cfg(tmp_path, tiny_model_path, "stop-signals", trainer__total_steps=200)
    paths = RunPaths.of(load_config(cfg_path))
    step = 0
    for sig, resume in ((signal.SIGTERM, ()), (signal.SIGINT, ("--resume",))):
        before = step
        run = _driver(ray_cluster, cfg_path, "all", *resume)
        _wait_until(lambda b=before: any(r["step"] >= b + 2 for r in _records(cfg_path, "trainer")), 240,
                    f"two trainer steps past {before}", [run], poll_s=0.05)
        run.signal(sig)
        assert run.wait(120) == 0, run.output
        summary = json.loads(paths.summary.read_text())
        assert summary["exit_reason"] == "stopped" and summary["resumed_from"] == (before or None), sig
        step = summary["final_version"]
        assert before + 2 <= step < 200
        if resume:  # it went on right after the checkpoint it resumed from
            assert f"trainer  step {before + 1:>4}/200" in run.output
        # checkpoint of the step reached, and every hand-out of it committed: nothing left pending
        assert (paths.checkpoint_dir / "latest").read_text().strip() == str(step)
        ledger = Ledger(paths.buffer_dir, "trainer", create=False)
        committed = ledger.committed().to_pylist()
        assert ledger.pending().num_rows == 0 and len(committed) == step * BATCH
        assert len({r["eid"] for r in committed}) == step * BATCH  # each experience trained once
        assert sorted({r["step"] for r in committed}) == list(range(1, step + 1))


def test_a_streaming_run_killed_whole_resumes_its_cut_steps_and_trains_every_group_once(tmp_path, tiny_model_path,
                                                                                       ray_cluster):
    """Streaming rollout with responses in pieces journaled as they go: the whole run (driver, explorer, engines,
    trainer) is SIGKILLed mid-run, some steps part-written, some groups part-generated; `--resume` takes the cut
    steps up again (their written groups kept, their journaled pieces continued), and every group is trained once,
    whole, with nothing left in buffer/partial at the end."""
    cfg_path = _write_cfg(tmp_path, tiny_model_path, "stream-killed", trainer__total_steps=14,
                          trainer__save_interval=2, explorer__rollout="stream", explorer__stream__flush_s=0,
                          explorer__stream__on_new_version="resubmit", explorer__stream__chunk_tokens=2,
                          explorer__sampling__max_new_tokens=8)
    paths = RunPaths.of(load_config(cfg_path))
    run = _driver(ray_cluster, cfg_path, "all")
    _wait_until(lambda: len(_records(cfg_path, "trainer")) >= 3, 240, "three trainer steps", [run], poll_s=0.02)
    run.kill()
    again = _driver(ray_cluster, cfg_path, "all", "--resume")
    assert again.wait(300) == 0, again.output
    summary = json.loads(paths.summary.read_text())
    assert summary["exit_reason"] == "completed" and summary["final_version"] == 14 and summary["staleness_max"] <= 1
    check_ledger(cfg_path)  # each row once, every step a full batch, every group whole in one step
    assert not any((paths.buffer_dir / "partial").iterdir()), "journals were left behind"
    rows = query(paths.buffer_dir).to_pylist()
    groups = {}
    for r in rows:
        info = json.loads(r["info"])
        groups.setdefault((info["explore_step"], info["explore_position"]), set()).add(r["group_id"])
    assert all(len(ids) == 1 for ids in groups.values())  # no group written under two ids or twice
