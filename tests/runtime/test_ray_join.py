"""Ray as its users use it: jobs without --address join the `ray start` cluster of their node (a stale address
file is none), else start a private instance, and say which; a role in another Ray cluster than the run's live
roles is refused in one line."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent

# A live trainer role of the run, as `trinity-like run --role trainer` holds it: run directory, Ray, its record
_TRAINER = """
import sys
from trinity_like.config import load_config
from trinity_like.runtime.ray_cluster import init_ray
from trinity_like.runtime.run_dir import prepare_run_dir
cfg = load_config(sys.argv[1])
prepare_run_dir(cfg, role="trainer")
record = init_ray(cfg, role="trainer")
print(record.record["gcs"], flush=True)
sys.stdin.read()
record.close()
"""


def _env(cluster, ray_tmp: Path, address_file: str | None) -> dict[str, str]:
    """A user's shell on a node: no RAY_ADDRESS; Ray's address file (what `ray start` writes) under
    ``ray_tmp`` (RAY_TMPDIR, where Ray also puts the sessions it starts) naming ``address_file``, or none."""
    (ray_tmp / "ray").mkdir(parents=True, exist_ok=True)
    if address_file:
        (ray_tmp / "ray" / "ray_current_cluster").write_text(address_file)
    env = {k: v for k, v in cluster.env.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    return {**env, "RAY_TMPDIR": str(ray_tmp)}


def _free_port() -> int:
    """A port nothing listens on (the address of a stale ``ray_current_cluster`` file). Not conftest's: a test
    module's ``import conftest`` gets whichever conftest an xdist worker imported first."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ray_target_is_the_ray_start_cluster_of_the_node_and_a_stale_file_is_none(ray_cluster, tmp_path,
                                                                                   monkeypatch):
    from trinity_like.runtime.ray_cluster import ray_target

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS")
    assert ray_target() == (None, "no RAY_ADDRESS and no `ray start` cluster on this node")
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(ray_cluster.address)
    target, source = ray_target()
    assert target == ray_cluster.address and "`ray start` cluster" in source
    assert ray_target("10.0.0.1:6379") == ("10.0.0.1:6379", "--address")
    stale = f"127.0.0.1:{_free_port()}"
    (tmp_path / "ray" / "ray_current_cluster").write_text(stale)
    target, source = ray_target()
    assert target is None and stale in source and "stale" in source
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert ray_target() == (None, "RAY_ADDRESS=local")


def test_a_role_in_another_ray_cluster_than_the_runs_live_trainer_is_refused(ray_cluster, tmp_path,
                                                                             tiny_model_path):
    """A trainer started without --address joins the `ray start` cluster of the node; an explorer started
    where no cluster is found (a stale address file) starts a private instance, says so, and is refused in one
    line naming both clusters and --address; `status` without --address finds the trainer's cluster."""
    import shutil
    import tempfile

    ray_tmp = Path(tempfile.mkdtemp(prefix="tljoin-", dir="/tmp"))  # short: Ray's socket paths are limited
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"checkpoint_root_dir: {tmp_path / 'runs'}\nproject: join\nname: run\nmode: async\n"
                   f"model:\n  path: {tiny_model_path}\nexplorer:\n  taskset:\n    size: 8\n")
    trainer = subprocess.Popen([sys.executable, "-c", _TRAINER, str(cfg)], env=_env(ray_cluster, ray_tmp / "a",
                               ray_cluster.address), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        gcs = trainer.stdout.readline().strip()
        assert gcs, trainer.stderr.read()[-2000:] if trainer.poll() is not None else "no record"
        stale = f"127.0.0.1:{_free_port()}"
        explorer = subprocess.run([str(BIN / "trinity-like"), "run", str(cfg), "--role", "explorer"],
                                  env=_env(ray_cluster, ray_tmp / "b", stale), capture_output=True, text=True,
                                  timeout=180)
        status = subprocess.run([str(BIN / "trinity-like"), "status", str(cfg), "--json"],
                                env=_env(ray_cluster, ray_tmp / "c", None), capture_output=True, text=True,
                                timeout=120)
    finally:
        trainer.stdin.close()
        trainer.wait(timeout=60)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    said = trainer.stderr.read()
    assert f"Ray: joined the cluster at {ray_cluster.address} (the `ray start` cluster of this node" in said
    assert explorer.returncode != 0
    assert "Ray: started a private instance" in explorer.stderr and "stale" in explorer.stderr
    refusal = [line for line in explorer.stderr.splitlines() if "live trainer" in line]
    assert len(refusal) == 1 and gcs in refusal[0] and "--address" in refusal[0], explorer.stderr[-2000:]
    assert f"Ray: joined the cluster at {gcs}" in status.stderr and '"cluster": "connected"' in status.stdout
    assert not list((tmp_path / "runs" / "join" / "run" / "ray_roles").glob("*.json"))  # the trainer's is gone
