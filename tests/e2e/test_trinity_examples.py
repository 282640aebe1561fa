"""Trinity-RFT's own example configs (tests/config/trinity_examples, upstream 9051d63) run a few steps on the tiny
model with only model, data and sizes changed (Trinity's environment variables and keys), each meaning what it
means in Trinity: SFT on a messages data set (mode train), DPO on chosen/rejected pairs, mix with its expert data
(ingested into the buffer as human rows, trained with the SFT term), PPO on countdown with experience replay, and
Trinity's test template (mode both). The GRPO gsm8k example: test_trinity_run.py; the async pair:
test_trinity_pair.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trinity_like.cli import main

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[1] / "config" / "trinity_examples"
DATA = Path(__file__).resolve().parents[1] / "common" / "data" / "trinity"
SMALL = ["cluster.gpu_per_node=0", "model.max_model_len=256", "model.max_response_tokens=8"]


def _messages_folder(folder: Path, subset: str | None = None) -> Path:
    """Trinity's sft_for_gsm8k rows as a conversation column (`messages`), laid out as a Hugging Face data set."""
    out = folder / subset if subset else folder
    out.mkdir(parents=True)
    rows = [json.loads(line) for line in (DATA / "sft_for_gsm8k" / "sft.jsonl").read_text().splitlines()][:8]
    (out / "train.jsonl").write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["response"]}]}) + "\n"
        for r in rows))
    return folder


def _run(capsys, config: str, *overrides: str) -> tuple[dict, list[dict]]:
    code = main(["run", "-c", str(EXAMPLES / config), *SMALL, *overrides])
    said = capsys.readouterr()
    out = said.out
    assert code == 0, (out + said.err)[-3000:]
    run_dir = Path(next(line.split()[2] for line in out.splitlines() if line.startswith("run directory: ")))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return json.loads((run_dir / "summary.json").read_text()), rows


def test_trinitys_sft_dpo_mix_replay_and_template_examples_run(tmp_path, tiny_model_path, ray_session, monkeypatch,
                                                              capsys):
    monkeypatch.setenv("TRINITY_MODEL_PATH", tiny_model_path)
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "checkpoints"))

    # SFT (mode train): a hub-style folder with its `math` subset, as open-r1/Mixture-of-Thoughts is laid out
    mot = _messages_folder(tmp_path / "mot", "math")
    summary, rows = _run(capsys, "sft_mot/sft.yaml", f"buffer.trainer_input.experience_buffer.path={mot}",
                         "buffer.train_batch_size=4", "buffer.total_steps=2")
    assert summary["mode"] == "offline" and summary["trainer_steps"] == 2, summary
    assert all(r["actor/sft_nll"] > 0 for r in rows if r["role"] == "trainer")

    # DPO (mode train): Trinity's human_like pairs (prompt, chosen, rejected)
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(DATA / "human_like"))
    summary, rows = _run(capsys, "dpo_humanlike/dpo.yaml", "buffer.train_batch_size=4", "trainer.total_steps=2")
    assert summary["mode"] == "offline" and summary["trainer_steps"] == 2, summary
    assert all("actor/dpo_accuracy" in r for r in rows if r["role"] == "trainer")

    # mix: GRPO rows plus the expert data, 20% of each batch, with (1 - mu) pg + mu sft
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(DATA / "gsm8k"))
    monkeypatch.setenv("TRINITY_SFT_DATASET_PATH", str(_messages_folder(tmp_path / "expert")))
    summary, rows = _run(capsys, "mix_math/mix_math.yaml", "buffer.explorer_input.taskset.format.prompt_key=question",
                         "buffer.explorer_input.eval_tasksets.0.format.prompt_key=question",
                         "buffer.batch_size=4", "algorithm.repeat_times=2", "buffer.train_batch_size=10",
                         "buffer.total_steps=2", "explorer.eval_interval=0")
    assert summary["exit_reason"] == "completed" and summary["trainer_steps"] >= 1, summary
    assert all(r["actor/sft_rows"] == 2 for r in rows if r["role"] == "trainer")  # 20% of 10: the expert rows

    # PPO on countdown with experience replay (Trinity's countdown data, its countdown reward)
    summary, rows = _run(capsys, "ppo_countdown_exp_replay/countdown.yaml",
                         f"buffer.explorer_input.taskset.path={DATA / 'countdown'}", "model.max_model_len=600",
                         "buffer.batch_size=2",
                         "algorithm.repeat_times=2", "buffer.total_steps=2")
    assert summary["exit_reason"] == "completed" and summary["trainer_steps"] == 2, summary

    # Trinity's test template (mode both, sync_interval 10): its placeholder task set pointed at gsm8k
    monkeypatch.setenv("GPU_PER_NODE", "0")
    monkeypatch.setenv("NODE_NUM", "1")
    summary, rows = _run(capsys, "template/config.yaml", f"checkpoint_root_dir={tmp_path / 'template'}",
                         f"buffer.explorer_input.taskset.path={DATA / 'gsm8k'}",
                         "buffer.explorer_input.taskset.format.prompt_key=question",
                         "buffer.explorer_input.taskset.format.response_key=answer",
                         "buffer.explorer_input.default_workflow_type=math_workflow", "buffer.batch_size=2",
                         "buffer.total_steps=2")
    assert summary["mode"] == "async" and summary["trainer_steps"] == 2 and summary["staleness_max"] <= 9, summary
