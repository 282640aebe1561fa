"""The start-up check of the built-in reward's data sources (runtime.run_dir.check_reward_sources): which runs it
refuses and which it leaves alone. Through the command line: tests/e2e/test_reward_sources.py."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trinity_like.common.errors import ConfigError
from trinity_like.common.tasks import data_sources_of
from trinity_like.config import load_config
from trinity_like.runtime.run_dir import check_reward_sources, reward_task_files


def ours(path, sources):
    """A task file of ours (task_id, prompt, answer, data_source) with one row per data source given."""
    pq.write_table(pa.table({"task_id": [str(i) for i in range(len(sources))], "prompt": ["1+1="] * len(sources),
                             "answer": ["2"] * len(sources), "data_source": sources}), path)
    return path


def cfg_of(tmp_path, *overrides):
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", "project=p", "name=n", *overrides])


def test_data_sources_of_counts_rows(tmp_path):
    assert data_sources_of(ours(tmp_path / "a.parquet", ["x", "y", "x", None])) == {"x": 2, "y": 1, "": 1}
    pq.write_table(pa.table({"task_id": ["0"], "prompt": ["p"], "answer": ["a"]}), tmp_path / "b.parquet")
    assert data_sources_of(tmp_path / "b.parquet") == {"": 1}  # no column: every row "" (scored as math)


def test_the_check_names_the_first_unknown_source_and_the_others(tmp_path):
    train = ours(tmp_path / "t.parquet", ["math", "chess", "go", "chess", "openai/gsm8k", "aime2024", ""])
    with pytest.raises(ConfigError) as e:
        check_reward_sources(cfg_of(tmp_path, f"explorer.taskset.path={train}"))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"task set '{train}' (explorer.taskset.path): no built-in scorer for data source "
                          "'chess', in 2 of 7 rows; also without a scorer: 'go'; the built-in reward scores ")


def test_what_the_check_leaves_alone(tmp_path):
    train = ours(tmp_path / "t.parquet", ["chess"])
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(responses, ground_truths, **kwargs):\n    return [0.0] * len(responses)\n")
    rm = tmp_path / "rm"
    rm.mkdir()
    (rm / "config.json").write_text(json.dumps({"num_labels": 1}))
    base = f"explorer.taskset.path={train}"
    check_reward_sources(cfg_of(tmp_path, base, f"reward.function_path={reward}"))  # a reward function
    check_reward_sources(cfg_of(tmp_path, base, f"reward.model.path={rm}"))  # the model's score replaces it
    check_reward_sources(cfg_of(tmp_path, base, "explorer.workflow=guess_number"))  # scores its own game
    with pytest.raises(ConfigError):  # a reward model whose score is added: the function still scores
        check_reward_sources(cfg_of(tmp_path, base, f"reward.model.path={rm}", "reward.model.combine=add"))
    # a generated set that is not there yet is ours (arithmetic); a given file that is missing is refused elsewhere
    assert reward_task_files(cfg_of(tmp_path)) == []
    check_reward_sources(cfg_of(tmp_path, f"explorer.taskset.path={tmp_path / 'missing.parquet'}"))


GSM8K_SOLUTION = "Natalia sold 48/2 = 24 clips in May.\nSo 48+24 = 72 clips in all.\n#### 72"


def test_readable_truths_pass(tmp_path):
    """Every truth form the scorers read: a bare answer, gsm8k's solution, a boxed answer, countdown's JSON."""
    train = tmp_path / "t.parquet"
    pq.write_table(pa.table({
        "task_id": ["a", "b", "c", "d", "e"], "prompt": ["q"] * 5,
        "answer": ["72", GSM8K_SOLUTION, "\\boxed{\\frac{1}{2}}", GSM8K_SOLUTION, ""],
        "data_source": ["math", "", "math", "openai/gsm8k", "countdown"],
        "ground_truth": [None, None, None, None, json.dumps({"target": 4, "numbers": [8, 4, 2]})]}), train)
    check_reward_sources(cfg_of(tmp_path, f"explorer.taskset.path={train}"))


def test_an_unreadable_truth_is_refused_naming_row_scorer_truth_and_fix(tmp_path):
    train = tmp_path / "t.parquet"
    prose = "Natalia sold 48 clips in April and half as many in May.\nShe sold 72 clips in all."
    pq.write_table(pa.table({"task_id": ["g0", "g1", "g2"], "prompt": ["q"] * 3,
                             "answer": [GSM8K_SOLUTION, prose, prose], "data_source": ["openai/gsm8k"] * 3}), train)
    with pytest.raises(ConfigError) as e:
        check_reward_sources(cfg_of(tmp_path, f"explorer.taskset.path={train}"))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"task set '{train}' (explorer.taskset.path): row 1 (task_id 'g1'): the gsm8k_score scorer "
                          f"(data source 'openai/gsm8k') cannot read its ground truth {repr(prose)[:57]}...: the "
                          "ground truth is a text with no final answer marked in it; it "
                          "reads a number ('72', '1,234'), gsm8k's 'solution #### 72' or '\\boxed{72}' (in 2 of 3 rows)")
    assert msg.endswith("reward.function_path=FILE.py")
    # a reward function reads what it likes: not checked
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(responses, ground_truths, **kwargs):\n    return [0.0] * len(responses)\n")
    check_reward_sources(cfg_of(tmp_path, f"explorer.taskset.path={train}", f"reward.function_path={reward}"))


def test_a_countdown_truth_that_is_not_json_is_refused(tmp_path):
    train = tmp_path / "t.parquet"
    pq.write_table(pa.table({"task_id": ["c0"], "prompt": ["q"], "answer": ["8 4 2 -> 4"],
                             "data_source": ["countdown"]}), train)
    with pytest.raises(ConfigError, match=r"row 0 \(task_id 'c0'\): the countdown_score scorer .* not JSON"):
        check_reward_sources(cfg_of(tmp_path, f"explorer.taskset.path={train}"))
