"""Trinity-RFT's GRPO gsm8k example (examples/grpo_gsm8k/gsm8k.yaml at 9051d63) runs as it is: `trinity-like run -c
gsm8k.yaml` with Trinity's environment variables for the model, the data and the checkpoint root, and overrides in
Trinity's own keys for the sizes only, on the shared Ray instance with the tiny model, for 2 steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trinity_like.cli import main

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[1] / "config" / "trinity_examples"


def test_trinitys_grpo_gsm8k_example_runs_two_steps(tmp_path, tiny_model_path, ray_session, monkeypatch, capsys):
    monkeypatch.setenv("TRINITY_MODEL_PATH", tiny_model_path)
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(EXAMPLES / "data" / "gsm8k_tiny.jsonl"))
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "checkpoints"))
    code = main(["run", "-c", str(EXAMPLES / "grpo_gsm8k" / "gsm8k.yaml"), "cluster.gpu_per_node=0",
                 "buffer.batch_size=2", "algorithm.repeat_times=2", "trainer.total_steps=2",
                 "model.max_response_tokens=8", "model.max_model_len=512", "explorer.eval_interval=2"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "Trinity config: mode sync" in out
    run_dir = tmp_path / "checkpoints" / "Trinity-RFT-gsm8k" / "qwen2.5-1.5B-gsm8k"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_reason"] == "completed" and summary["trainer_steps"] == 2, summary
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    explorer = [r for r in rows if "rollout/experiences" in r]
    assert len(explorer) == 2 and all(r["rollout/experiences"] == 4 for r in explorer)  # 2 tasks x 2 samples
    assert all("rollout/reward/accuracy" in r for r in explorer)  # Trinity's math_workflow scored them
    assert any(k.startswith("eval/gsm8k-eval/") for r in rows for k in r)  # the example's eval set ran
    kept = (run_dir / "trinity_translation.yaml").read_text()
    assert "algorithm.optimizer.lr" in kept
