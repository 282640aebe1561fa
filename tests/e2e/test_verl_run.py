"""A verl GRPO config, a verl-format data file, a verl per-sample reward function and a reward model, run as they are:
`trinity-like run verl.yaml --allow-unmapped` on the shared Ray instance with the tiny model (and a tiny
sequence-classification model as the reward model)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import yaml
from conftest import write_verl_data as verl_data  # tests/ is on sys.path

from trinity_like.buffer import query
from trinity_like.cli import main
from trinity_like.common.tasks import load_taskset
from trinity_like.common.tiny_model import make_tiny_model
from trinity_like.config import load_config
from trinity_like.explorer.reward_model import RewardModel, reward_input
from trinity_like.runtime.paths import RunPaths

pytestmark = pytest.mark.slow

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # depends on extra_info, so the test can tell it arrived: odd task indices score 1
    assert data_source == "arithmetic" and isinstance(ground_truth, str)
    return {"score": float(extra_info["index"] % 2), "acc": False}
'''


def test_verl_grpo_config_runs_as_it_is(tmp_path, tiny_model_path, ray_session, capsys):
    reward_model = make_tiny_model(tmp_path / "rm", seed=3, reward_head=True)
    train = verl_data(tmp_path / "train.parquet", n=8)
    val = verl_data(tmp_path / "val.parquet", n=4, split="test")
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    config = {
        "data": {"train_files": str(train), "val_files": str(val), "train_batch_size": 2,
                 "max_response_length": 4, "max_prompt_length": 256},
        "algorithm": {"adv_estimator": "grpo"},
        "actor_rollout_ref": {"model": {"path": str(tiny_model_path)},
                              "actor": {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 4,
                                        "use_kl_loss": True, "kl_loss_type": "low_var", "optim": {"lr": 0.01}},
                              "rollout": {"name": "hf", "n": 4, "log_prob_micro_batch_size_per_gpu": 8}},
        "custom_reward_function": {"path": str(reward), "name": "compute_score"},
        "reward_model": {"enable": True, "model": {"path": str(reward_model)}, "micro_batch_size_per_gpu": 3},
        "trainer": {"total_training_steps": 2, "n_gpus_per_node": 1, "device": "cpu", "logger": ["console"],
                    "project_name": "verl_e2e", "experiment_name": "grpo", "test_freq": 1,
                    "default_local_dir": f"{tmp_path}/ck/${{trainer.project_name}}/${{trainer.experiment_name}}",
                    "balance_batch": True, "a_key_verl_does_not_have": 1},
    }
    path = tmp_path / "verl_grpo.yaml"
    path.write_text(yaml.safe_dump(config))

    assert main(["run", str(path)]) == 2  # refused: the unknown key is named
    assert "trainer.a_key_verl_does_not_have" in capsys.readouterr().err
    # verl replaces the function's score with the model's; `add` (ours) keeps both, so both can be checked
    assert main(["run", str(path), "--allow-unmapped", "reward.model.combine=add"]) == 0

    cfg = load_config(path, allow_unmapped=True)
    paths = RunPaths.of(cfg)
    assert paths.run_dir == tmp_path / "ck" / "verl_e2e" / "grpo"
    report = yaml.safe_load((paths.run_dir / "verl_translation.yaml").read_text())
    assert [d["verl"] for d in report["ignored_unmapped"]] == ["trainer.a_key_verl_does_not_have"]
    assert "trainer.balance_batch" in {d["verl"] for d in report["no_effect"]}
    records = [json.loads(x) for x in paths.metrics.read_text().splitlines()]
    assert [r["step"] for r in records if r["role"] == "trainer"] == [1, 2]
    assert any(k.startswith("eval/val/") for r in records for k in r)  # data.val_files became an eval set
    rows = query(paths.buffer_dir).to_pylist()
    assert rows
    tasks_by_id = {t.task_id: t for t in load_taskset(train)}
    model_scores = RewardModel(reward_model).score([reward_input(tasks_by_id[r["task_id"]]) for r in rows],
                                                   [r["response_text"] for r in rows])
    for row, model_score in zip(rows, model_scores, strict=True):
        info = json.loads(row["info"]) if isinstance(row["info"], str) else row["info"]
        index = int(row["task_id"].split("-")[1])
        # the verl reward function saw each task's extra_info; the reward model scored the chat + response
        assert row["reward"] == pytest.approx(float(index % 2) + model_score, abs=1e-4)
        assert info["data_source"] == "arithmetic"
    tasks = pq.read_table(train).to_pylist()
    assert {r["task_id"] for r in rows} <= {f"train-{t['extra_info']['index']}" for t in tasks}
