"""What a waiting role says of the role it waits for: what the run directory's role records show (alive here or in
another Ray cluster, ended and how, never started)."""

from __future__ import annotations

import json
import os

from trinity_like.runtime.ray_cluster import ENDED_DIR, ROLES_DIR, live_roles, register_role, role_status


def test_role_status_tells_never_started_alive_elsewhere_and_ended(tmp_path):
    assert role_status(tmp_path, "trainer") == "no trainer was ever started with this run directory"

    record = register_role(tmp_path, "trainer", "10.0.0.1:6379")
    try:
        shown = role_status(tmp_path, "trainer", "10.0.0.1:6379")
        assert shown.startswith(f"a live trainer (pid {os.getpid()} ") and "in Ray cluster 10.0.0.1:6379" in shown
        elsewhere = role_status(tmp_path, "trainer", "10.0.0.2:6379")
        assert "in another Ray cluster, at 10.0.0.1:6379" in elsewhere
        assert role_status(tmp_path, "explorer") == "no explorer was ever started with this run directory"
    finally:
        record.close("completed")
    assert live_roles(tmp_path) == []
    ended = role_status(tmp_path, "trainer", "10.0.0.1:6379")
    assert ended.startswith("the trainer ended ") and "(completed; pid" in ended
    assert json.loads((tmp_path / ROLES_DIR / ENDED_DIR / "trainer.json").read_text())["outcome"] == "completed"

    # the role started again: no longer "ended", and its end record is gone until it ends again
    again = register_role(tmp_path, "trainer", "10.0.0.1:6379")
    try:
        assert not (tmp_path / ROLES_DIR / ENDED_DIR / "trainer.json").exists()
        assert role_status(tmp_path, "trainer").startswith("a live trainer")
    finally:
        again.close("failed: RunError: disk full")
    assert "(failed: RunError: disk full;" in role_status(tmp_path, "trainer")


def test_a_role_that_never_closed_its_record_is_told_as_killed(tmp_path):
    """A SIGKILLed role leaves its live record behind; on this node a record whose pid is gone is no live role, and
    the waiting side says the role stopped without ending."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from trinity_like.runtime.ray_cluster import register_role; "
            "register_role(Path(sys.argv[1]), 'explorer', '10.0.0.1:6379'); print('up', flush=True); "
            "sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "up"
    assert role_status(tmp_path, "explorer").startswith(f"a live explorer (pid {proc.pid} ")
    proc.kill()
    proc.wait()
    shown = role_status(tmp_path, "explorer")
    assert shown.startswith(f"an explorer that stopped without ending (pid {proc.pid} ") and "killed or crashed" in shown
