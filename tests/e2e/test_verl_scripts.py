"""verl's own example scripts run as they are (issue 36, item 1): each script's override list (tests/config/
verl_scripts/) through `trinity-like run --verl <entry> key=value ...`, with only its data, model and run-directory
paths replaced and the tiny model's sizes appended (`VERL_ON_THE_TINY_MODEL`: batch 2, 4 tokens, the CPU, three
steps), on the shared Ray instance."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import verl_script_on_the_tiny_model
from conftest import write_verl_data as verl_data

from trinity_like.cli import main
from trinity_like.config.loading import load_config_with_translation
from trinity_like.runtime.paths import RunPaths

pytestmark = pytest.mark.slow

SCRIPTS = {
    # script: (what it is, keys its conversion ignores)
    "grpo_qwen2_7b_gsm8k": ("GRPO", set()),
    "grpo_qwen2_5_3b_gsm8k_lora": ("GRPO + LoRA", set()),
    "ppo_deepseek7b_gsm8k": ("PPO + GAE critic", set()),
    "grpo_qwen2_7b_seq_balance": ("GRPO, token-budget micro-batches", set()),
    "dapo_qwen2_5_32b": ("DAPO (recipe.dapo.main_dapo)", {"actor_rollout_ref.actor.ulysses_sequence_parallel_size"}),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_a_verl_example_script_runs_three_steps(name, tmp_path, tiny_model_path, ray_session, capsys):
    what, ignored = SCRIPTS[name]
    train = verl_data(tmp_path / "train.parquet", n=16)
    val = verl_data(tmp_path / "val.parquet", n=4, split="test")
    entry, items = verl_script_on_the_tiny_model(name, tmp_path, tiny_model_path, train, val)
    argv = ["run", "--verl", entry, *items, *(["--allow-unmapped"] if ignored else [])]
    assert main(argv) == 0, f"{what}: {capsys.readouterr().err[-3000:]}"
    out = capsys.readouterr().out
    # the mode, the split and the ignored keys said on the console, in one line each
    assert "verl config: mode sync, as verl's PPO" in out
    if ignored:
        line = next(x for x in out.splitlines() if x.startswith("verl config: ignored"))
        assert all(k in line for k in ignored)
    cfg, tr = load_config_with_translation(None, items, allow_unmapped=bool(ignored), verl=True, entry=entry)
    paths = RunPaths.of(cfg)
    assert paths.run_dir == tmp_path / "run"  # trainer.default_local_dir, any folder
    report = yaml.safe_load((paths.run_dir / "verl_translation.yaml").read_text())
    assert {d["verl"] for d in report["ignored_unmapped"]} == ignored
    records = [json.loads(x) for x in paths.metrics.read_text().splitlines()]
    assert [r["step"] for r in records if r["role"] == "trainer"] == [1, 2, 3]
    assert cfg.mode == "sync" and cfg.algorithm.off_policy.recompute_old_log_probs
    if "lora" in name:
        assert cfg.trainer.lora.enabled and cfg.trainer.lora.r == 64
    if name.startswith("ppo"):
        assert cfg.algorithm.adv_estimator == "gae"
        assert any("critic/vf_loss" in r or any(k.startswith("critic/") for k in r) for r in records)
    if name.startswith("dapo"):
        assert cfg.explorer.dynamic_sampling and cfg.reward.manager == "dapo" and cfg.explorer.batch_size == 4


def test_the_gsm8k_and_math_script_trains_on_both_training_files(tmp_path, tiny_model_path, ray_session, capsys):
    """run_qwen2-7b_math.sh names two training files (gsm8k + MATH), which verl concatenates: here they are
    explorer.taskset.files, concatenated into the run's tasks.parquet with ids told apart by file (both files
    number their rows train-0..), and one epoch of three steps draws from both."""
    from trinity_like.buffer import query
    from trinity_like.common.tasks import load_taskset

    trains = [verl_data(tmp_path / "gsm8k" / "train.parquet", n=3, data_source="openai/gsm8k"),
              verl_data(tmp_path / "math" / "train.parquet", n=3, data_source="DigitalLearningGmbH/MATH-lighteval")]
    val = verl_data(tmp_path / "val.parquet", n=4, split="test")
    entry, items = verl_script_on_the_tiny_model("grpo_qwen2_7b_math", tmp_path, tiny_model_path, trains, val)
    assert f"data.train_files=[{trains[0]},{trains[1]}]" in items
    assert main(["run", "--verl", entry, *items]) == 0, capsys.readouterr().err[-3000:]
    cfg, _ = load_config_with_translation(None, items, verl=True, entry=entry)
    assert cfg.explorer.taskset.files == [str(f) for f in trains] and not cfg.explorer.taskset.path
    paths = RunPaths.of(cfg)
    ids = [f"{d}/train:train-{i}" for d in ("gsm8k", "math") for i in range(3)]
    tasks = load_taskset(paths.taskset)
    assert paths.taskset == paths.run_dir / "tasks.parquet" and [t.task_id for t in tasks] == ids
    assert [t.data_source for t in tasks] == ["openai/gsm8k"] * 3 + ["DigitalLearningGmbH/MATH-lighteval"] * 3
    records = [json.loads(x) for x in paths.metrics.read_text().splitlines()]
    assert [r["step"] for r in records if r["role"] == "trainer"] == [1, 2, 3]
    assert {r["task_id"] for r in query(paths.buffer_dir).to_pylist()} == set(ids)  # 3 steps x 2 = one epoch
