"""Trinity-RFT's async pair (examples/async_gsm8k/explorer.yaml and trainer.yaml at 9051d63) as its users start it:
`ray start --head`, then each file with `trinity-like run -c FILE` and no --address, as Trinity's `trinity run`
would be. Both find the `ray start` cluster of the node (from Ray's address file, as `ray.init()` does), meet through
the run directory and its Synchronizer, and complete. Sizes, model and data are changed through Trinity's own
environment variables and keys only."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
EXAMPLES = Path(__file__).resolve().parents[1] / "config" / "trinity_examples"
SIZES = ["cluster.gpu_per_node=0", "buffer.batch_size=2", "algorithm.repeat_times=2", "buffer.train_batch_size=4",
         "buffer.total_steps=3", "model.max_response_tokens=8", "model.max_model_len=512"]


def test_trinitys_async_pair_started_without_address_meets_on_the_ray_start_cluster(tmp_path, tiny_model_path,
                                                                                    ray_cluster):
    ray_tmp = Path(tempfile.mkdtemp(prefix="tlpair-", dir="/tmp"))  # short: Ray's socket paths are limited
    (ray_tmp / "ray").mkdir()
    (ray_tmp / "ray" / "ray_current_cluster").write_text(ray_cluster.address)  # what `ray start` leaves
    env = {k: v for k, v in ray_cluster.env.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env.update(RAY_TMPDIR=str(ray_tmp), TRINITY_MODEL_PATH=tiny_model_path,
               TRINITY_TASKSET_PATH=str(EXAMPLES / "data" / "gsm8k_tiny.jsonl"),
               TRINITY_CHECKPOINT_ROOT_DIR=str(tmp_path / "checkpoints"))
    procs = {}
    try:
        for role in ("trainer", "explorer"):  # the trainer first, as the example's run.sh starts them
            procs[role] = subprocess.Popen(
                [str(BIN / "trinity-like"), "run", "-c", str(EXAMPLES / "async_gsm8k" / f"{role}.yaml"), *SIZES],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out = {role: p.communicate(timeout=400)[0] for role, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    for role, p in procs.items():
        assert p.returncode == 0, f"{role}:\n{out[role][-3000:]}"
        assert f"Ray: joined the cluster at {ray_cluster.address} (the `ray start` cluster of this node" in out[role]
    run_dir = tmp_path / "checkpoints" / "Trinity-RFT-gsm8k" / "async-qwen2.5-1.5B-gsm8k"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["role"] == "trainer" and summary["exit_reason"] == "completed", summary
    assert summary["trainer_steps"] == 3
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("rollout/reward/accuracy" in r for r in rows)  # the explorer's math_workflow rows, trained on


def test_serve_and_a_trainer_started_without_address_meet_on_the_ray_start_cluster(tmp_path, tiny_model_path,
                                                                                  ray_cluster):
    """`trinity-like serve` and `trinity-like run --role trainer`, both without --address after `ray start`: an
    agent's rewarded, committed conversations are trained by the trainer, and the server loads the version it
    publishes (they share the cluster, so the Synchronizer)."""
    import httpx
    import yaml

    ray_tmp = Path(tempfile.mkdtemp(prefix="tlserve-", dir="/tmp"))
    (ray_tmp / "ray").mkdir()
    (ray_tmp / "ray" / "ray_current_cluster").write_text(ray_cluster.address)
    env = {k: v for k, v in ray_cluster.env.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env["RAY_TMPDIR"] = str(ray_tmp)
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(yaml.safe_dump({
        "checkpoint_root_dir": str(tmp_path / "runs"), "project": "meet", "name": "serve", "mode": "async",
        "model": {"path": tiny_model_path},
        "explorer": {"taskset": {"size": 8}, "repeat_times": 2, "sampling": {"max_new_tokens": 4}},
        "synchronizer": {"method": "checkpoint"},
        "trainer": {"batch_size": 2, "total_steps": 1, "micro_batch_size": 2}}))
    server = subprocess.Popen([str(BIN / "trinity-like"), "serve", str(cfg), "--port", "0"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    trainer = None
    lines: list[str] = []
    try:
        while not any(line.startswith("serving ") for line in lines):
            line = server.stdout.readline()
            assert line, "".join(lines)[-3000:]
            lines.append(line)
        url = next(line for line in lines if line.startswith("serving ")).split(" at ")[1].split()[0]
        base = url.removesuffix("/v1")
        ids = []
        for k in range(2):
            r = httpx.post(f"{url}/chat/completions", timeout=120, json={
                "model": "p", "messages": [{"role": "user", "content": f"{k}+1="}], "max_tokens": 3})
            assert r.status_code == 200, r.text
            ids.append(r.json()["experience_id"])
            assert httpx.post(f"{base}/v1/feedback", json={"experience_id": ids[-1], "reward": float(k)},
                              timeout=60).status_code == 200
        assert httpx.post(f"{base}/v1/commit", json={"experience_ids": ids}, timeout=60).status_code == 200
        trainer = subprocess.run([str(BIN / "trinity-like"), "run", str(cfg), "--role", "trainer"], env=env,
                                 capture_output=True, text=True, timeout=300)
        assert trainer.returncode == 0, (trainer.stdout + trainer.stderr)[-3000:]
        assert f"Ray: joined the cluster at {ray_cluster.address}" in trainer.stderr
        deadline = time.monotonic() + 60
        while httpx.get(f"{base}/health", timeout=30).json()["model_version"] < 1:
            assert time.monotonic() < deadline, "the server never loaded the trainer's version 1"
            time.sleep(0.2)
    finally:
        server.terminate()
        out = server.communicate(timeout=60)[0]
        shutil.rmtree(ray_tmp, ignore_errors=True)
    said = "".join(lines) + out
    assert f"Ray: joined the cluster at {ray_cluster.address} (the `ray start` cluster of this node" in said
