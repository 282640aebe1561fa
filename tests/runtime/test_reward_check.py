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
