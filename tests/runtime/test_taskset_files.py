"""Several training files as one task set (`explorer.taskset.files`, verl's list-valued `data.train_files`):
concatenated in order into `<run_dir>/tasks.parquet` when the run directory is prepared, every id prefixed by its
file's label, every verl row's messages, data source, ground truth and extra_info kept; the same file at every
later prepare, and a refusal when the files no longer give it. Real Parquet files, shaped as verl's
examples/data_preprocess/gsm8k.py and math_dataset.py write them."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trinity_like.common.errors import ConfigError, RunError
from trinity_like.common.tasks import concat_tasksets, load_taskset, taskset_labels, write_taskset
from trinity_like.config import load_config
from trinity_like.runtime.paths import RunPaths
from trinity_like.runtime.run_dir import check_reward_sources, prepare_run_dir, reward_task_files
from trinity_like.runtime.run_home import NODE_LOCAL_KEYS

INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."


def gsm8k_file(path, n=5, data_source="openai/gsm8k"):
    """verl's gsm8k.py: a user message, `extra_info` {split, index, answer, question}."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"data_source": data_source,
             "prompt": [{"role": "user", "content": f"Tom has {i} apples and buys {i + 2}. How many? {INSTRUCTION}"}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(2 * i + 2)},
             "extra_info": {"split": "train", "index": i, "answer": f"{i}+{i + 2} = <<{2 * i + 2}>>\n#### {2 * i + 2}",
                            "question": f"Tom has {i} apples and buys {i + 2}. How many?"}} for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def math_file(path, n=4):
    """verl's math_dataset.py: MATH's own columns `level` and `type` kept beside verl's, `extra_info` {split,
    index} only, LaTeX ground truths."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"level": f"Level {i % 5 + 1}", "type": "Algebra" if i % 2 else "Geometry",
             "data_source": "DigitalLearningGmbH/MATH-lighteval",
             "prompt": [{"role": "user", "content": f"What is $\\frac{{1}}{{{i + 2}}}$ doubled? Let's think step by "
                                                    "step and output the final answer within \\boxed{}."}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": f"\\frac{{2}}{{{i + 2}}}"},
             "extra_info": {"split": "train", "index": i}} for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def cfg_of(tmp_path, tiny_model_path, *overrides):
    return load_config(None, [f"checkpoint_root_dir={tmp_path / 'runs'}", "project=p", "name=n",
                              f"model.path={tiny_model_path}", *overrides])


def files_key(*files):
    return f"explorer.taskset.files=[{','.join(str(f) for f in files)}]"


def test_gsm8k_and_math_concatenate_with_every_row_and_unique_ids(tmp_path, tiny_model_path):
    gsm8k, math = gsm8k_file(tmp_path / "gsm8k" / "train.parquet"), math_file(tmp_path / "math" / "train.parquet")
    paths = prepare_run_dir(cfg_of(tmp_path, tiny_model_path, files_key(gsm8k, math)))
    assert paths.taskset == paths.run_dir / "tasks.parquet"
    tasks = load_taskset(paths.taskset)
    ids = [t.task_id for t in tasks]
    # both files name their rows train-0..; the label (enough parent folders to tell them apart) keeps them apart
    assert ids == [f"gsm8k/train:train-{i}" for i in range(5)] + [f"math/train:train-{i}" for i in range(4)]
    originals = load_taskset(gsm8k) + load_taskset(math)
    assert tasks == [replace(o, task_id=t.task_id) for o, t in zip(originals, tasks, strict=True)]
    # what the reward function receives, as each verl file gives it (MATH's extra_info has no answer/question)
    assert tasks[0].messages[0]["content"].startswith("Tom has 0 apples") and tasks[0].answer == "2"
    assert tasks[0].extra_info == {"split": "train", "index": 0, "answer": "0+2 = <<2>>\n#### 2",
                                   "question": "Tom has 0 apples and buys 2. How many?"}
    assert tasks[5].data_source == "DigitalLearningGmbH/MATH-lighteval" and tasks[5].answer == "\\frac{2}{2}"
    assert tasks[5].extra_info == {"split": "train", "index": 0} and tasks[5].messages[0]["role"] == "user"
    assert concat_tasksets([gsm8k, math]) == tasks


def test_a_mixed_set_keeps_ours_and_a_ground_truth_that_is_not_text(tmp_path):
    ours = tmp_path / "ours.parquet"
    pq.write_table(pa.table({"task_id": ["a", "b"], "prompt": ["1+1=", "2+2="], "answer": ["2", "4"],
                             "data_source": ["arithmetic"] * 2}), ours)
    countdown = tmp_path / "countdown.parquet"  # verl's countdown: a struct ground truth
    pq.write_table(pa.Table.from_pylist([{"data_source": "countdown", "prompt": [{"role": "user", "content": "24?"}],
                                          "reward_model": {"style": "rule",
                                                           "ground_truth": {"target": 24, "numbers": [3, 8, 1]}},
                                          "extra_info": {"split": "train", "index": 0}}]), countdown)
    tasks = concat_tasksets([ours, countdown])
    assert [t.task_id for t in tasks] == ["ours:a", "ours:b", "countdown:train-0"]
    write_taskset(tmp_path / "all.parquet", tasks)
    back = load_taskset(tmp_path / "all.parquet")
    assert back == tasks and back[2].answer == {"target": 24, "numbers": [3, 8, 1]}
    assert back[0].messages is None and back[0].extra_info == {} and back[0].answer == "2"


def test_labels_take_as_many_folders_as_tell_the_files_apart(tmp_path):
    assert taskset_labels(["x/a.parquet", "x/b.parquet"]) == ["a", "b"]
    assert taskset_labels(["d/gsm8k/train.parquet", "d/math/train.parquet"]) == ["gsm8k/train", "math/train"]
    with pytest.raises(ValueError, match="named twice"):
        taskset_labels(["a.parquet", "./a.parquet"])


def test_path_and_files_together_and_a_file_named_twice_are_refused(tmp_path, tiny_model_path):
    a, b = gsm8k_file(tmp_path / "a.parquet"), math_file(tmp_path / "b.parquet")
    with pytest.raises(ConfigError, match="explorer.taskset.path .* and explorer.taskset.files .* give one"):
        cfg_of(tmp_path, tiny_model_path, files_key(a, b), f"explorer.taskset.path={a}")
    with pytest.raises(ConfigError, match="names '.*a.parquet' twice"):
        cfg_of(tmp_path, tiny_model_path, files_key(a, b, a))


def test_a_second_prepare_gives_the_same_file_and_changed_files_are_refused(tmp_path, tiny_model_path):
    gsm8k, math = gsm8k_file(tmp_path / "gsm8k" / "train.parquet"), math_file(tmp_path / "math" / "train.parquet")
    paths = prepare_run_dir(cfg_of(tmp_path, tiny_model_path, files_key(gsm8k, math)))
    first = paths.taskset.read_bytes()
    prepare_run_dir(cfg_of(tmp_path, tiny_model_path, files_key(gsm8k, math)), role="trainer")
    prepare_run_dir(cfg_of(tmp_path, tiny_model_path, files_key(gsm8k, math)), resume=True)
    assert paths.taskset.read_bytes() == first
    other = gsm8k_file(tmp_path / "other" / "train.parquet", n=2)
    with pytest.raises(RunError, match=r"the run's task set changed: '.*tasks.parquet' holds 9 tasks .* give 11 "):
        prepare_run_dir(cfg_of(tmp_path, tiny_model_path, files_key(gsm8k, math, other)), resume=True)
    with pytest.raises(RunError, match="from row 0 on .*task 'gsm8k/train:train-0', now 'math/train:train-0'"):
        prepare_run_dir(cfg_of(tmp_path, tiny_model_path, files_key(math, gsm8k)), resume=True)
    gsm8k_file(gsm8k, data_source="openai/gsm8k-v2")  # the same file name, other rows
    with pytest.raises(RunError, match="from row 0 on"):
        prepare_run_dir(cfg_of(tmp_path, tiny_model_path, files_key(gsm8k, math)), resume=True)
    assert paths.taskset.read_bytes() == first  # never replaced
    config = (paths.run_dir / "config.yaml").read_text()
    assert str(other) not in config  # refused before the changed config was saved


def test_a_bad_file_is_named(tmp_path, tiny_model_path):
    good = gsm8k_file(tmp_path / "good.parquet")
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"question": ["1+1"]}), bad)
    with pytest.raises(RunError, match=f"explorer.taskset.files: task file '{bad}' lacks column"):
        prepare_run_dir(cfg_of(tmp_path, tiny_model_path, files_key(good, bad)))
    missing = tmp_path / "missing.parquet"
    with pytest.raises(RunError, match=f"task file '{missing}' does not exist"):
        prepare_run_dir(cfg_of(tmp_path, tiny_model_path, files_key(good, missing)))
    assert not RunPaths.of(cfg_of(tmp_path, tiny_model_path)).run_dir.exists()  # nothing written


def test_the_reward_check_covers_every_file(tmp_path, tiny_model_path):
    gsm8k, chess = gsm8k_file(tmp_path / "gsm8k.parquet"), gsm8k_file(tmp_path / "chess.parquet", data_source="chess")
    cfg = cfg_of(tmp_path, tiny_model_path, files_key(gsm8k, chess))
    assert reward_task_files(cfg) == [("explorer.taskset.files[0]", gsm8k), ("explorer.taskset.files[1]", chess)]
    with pytest.raises(ConfigError, match=rf"task set '{chess}' \(explorer.taskset.files\[1\]\): no built-in scorer "
                                          "for data source 'chess'"):
        check_reward_sources(cfg)
    with pytest.raises(ConfigError, match="data source 'chess'"):
        prepare_run_dir(cfg)


def test_an_explorer_off_the_run_filesystem_takes_the_task_set_from_the_trainer():
    """As with `path`: its node may name the files elsewhere, or not have them (run_home.join_run_home)."""
    assert "explorer.taskset.files" in NODE_LOCAL_KEYS and "explorer.taskset.path" in NODE_LOCAL_KEYS
