"""Rewards by data source as verl dispatches them, never a silent zero (issue 36, item 0), through the real command
line with the tiny model: a task set in verl's Parquet format labelled `openai/gsm8k` runs on the built-in reward
(verl's gsm8k rule) with no reward failures; a task set whose data source has no built-in scorer (training or
eval) is refused at start-up in one line, before Ray starts or anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trinity_like.algorithms.verl_scores import gsm8k_score

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def verl_taskset(path: Path, data_source: str, n: int = 4) -> Path:
    """``n`` tasks in verl's format (examples/data_preprocess/gsm8k.py): chat-message prompt, data_source,
    reward_model.ground_truth, extra_info."""
    rows = [{"data_source": data_source,
             "prompt": [{"role": "user", "content": f"Tom has {i} apples and buys {i + 2} more. How many? "
                                                    "Let's think step by step and output the final answer after ####."}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(2 * i + 2)},
             "extra_info": {"split": "train", "index": i}} for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _run(tmp_path, tiny_model_path, *overrides, timeout=300):
    config = tmp_path / "run.yaml"
    config.write_text("mode: sync\n")
    args = [str(BIN / "trinity-like"), "run", str(config), f"checkpoint_root_dir={tmp_path}", "project=rs", "name=rs",
            f"model.path={tiny_model_path}", "explorer.batch_size=2", "explorer.repeat_times=2",
            "explorer.sampling.max_new_tokens=4", "trainer.total_steps=1", *overrides]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


def test_a_gsm8k_task_set_runs_on_the_built_in_reward_without_failures(tmp_path, tiny_model_path):
    train = verl_taskset(tmp_path / "gsm8k.parquet", "openai/gsm8k")
    proc = _run(tmp_path, tiny_model_path, f"explorer.taskset.path={train}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the reward failed" not in proc.stdout + proc.stderr

    from trinity_like.buffer import query

    rows = query(tmp_path / "rs" / "rs" / "buffer").to_pylist()
    assert len(rows) == 4  # one step: 2 tasks x 2 samples
    for row in rows:
        info = json.loads(row["info"]) if isinstance(row["info"], str) else row["info"]
        assert info["data_source"] == "openai/gsm8k" and "reward_failed" not in info
        # the reward is verl's gsm8k rule (strict "#### <number>") on the response the row holds
        assert row["reward"] == gsm8k_score(row["response_text"], info["ground_truth"])


def _refusal(proc) -> str:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "run directory:" not in proc.stdout  # refused before the run started (Ray, roles, steps)
    return errors[0]


def test_a_task_set_with_no_scorer_is_refused_at_start_up_in_one_line(tmp_path, tiny_model_path):
    train = verl_taskset(tmp_path / "chess.parquet", "chess_puzzles")
    line = _refusal(_run(tmp_path, tiny_model_path, f"explorer.taskset.path={train}", timeout=60))
    assert f"task set '{train}' (explorer.taskset.path): no built-in scorer for data source 'chess_puzzles', in 4 " \
           "of 4 rows" in line
    assert "arithmetic, math, countdown, format, openai/gsm8k" in line and "aime*" in line
    assert "reward.function_path=" in line and "custom_reward_function.path" in line
    assert not (tmp_path / "rs" / "rs" / "config.yaml").exists()  # nothing written

    # an eval task set of a code data set: refused too, saying why (verl runs its code in a sandbox)
    good = verl_taskset(tmp_path / "gsm8k.parquet", "openai/gsm8k")
    code = verl_taskset(tmp_path / "code.parquet", "codecontests", n=2)
    line = _refusal(_run(tmp_path, tiny_model_path, f"explorer.taskset.path={good}",
                         f"explorer.eval_tasksets=[{{name: code, path: '{code}'}}]", timeout=60))
    assert f"task set '{code}' (explorer.eval_tasksets[0].path): no built-in scorer for data source " \
           "'codecontests' (a code data set" in line and "sandbox" in line
