"""A Trinity-RFT task set given as `explorer.taskset` (a folder, a jsonl file, any `format` key) is read as Trinity
reads it when the run directory is prepared, written once into `<run_dir>/tasks.parquet`, compared at every later
prepare; eval sets likewise into `eval-<name>.parquet`; every failure in one line. Trinity's own data files
(tests/common/data/trinity)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trinity_like.common.errors import RunError
from trinity_like.common.tasks import load_taskset
from trinity_like.config import load_config
from trinity_like.runtime.paths import RunPaths
from trinity_like.runtime.run_dir import eval_taskset_path, prepare_eval_tasksets, prepare_run_dir

DATA = Path(__file__).parents[1] / "common" / "data" / "trinity"
GSM8K_FORMAT = ("explorer.taskset.format.prompt_key=question", "explorer.taskset.format.response_key=answer")


def cfg_of(tmp_path, model, *overrides):
    return load_config(None, [f"checkpoint_root_dir={tmp_path / 'runs'}", "project=p", "name=n", f"model.path={model}",
                              *overrides])


def test_a_trinity_folder_is_read_once_into_the_run_directory_and_compared_after(tmp_path, tiny_model_path):
    data = tmp_path / "gsm8k"
    shutil.copytree(DATA / "gsm8k", data)
    cfg = cfg_of(tmp_path, tiny_model_path, f"explorer.taskset.path={data}", *GSM8K_FORMAT,
                 "explorer.taskset.format.system_prompt=Solve it.")
    paths = prepare_run_dir(cfg)
    assert paths.taskset == paths.run_dir / "tasks.parquet" == RunPaths.of(cfg).taskset
    tasks = load_taskset(paths.taskset)
    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    assert [t.raw_task for t in tasks] == rows and [t.answer for t in tasks] == [r["answer"] for r in rows]
    assert tasks[0].messages[0] == {"role": "system", "content": "Solve it."} and tasks[0].task_id == "train-0"
    first = paths.taskset.read_bytes()
    prepare_run_dir(cfg, resume=True)
    assert paths.taskset.read_bytes() == first
    (data / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:3]) + "\n")
    with pytest.raises(RunError) as e:
        prepare_run_dir(cfg, resume=True)
    assert "\n" not in str(e.value) and "the run's task set changed" in str(e.value)
    assert "holds 16 tasks" in str(e.value) and "explorer.taskset no longer gives" in str(e.value)


def test_a_changed_format_is_a_changed_task_set(tmp_path, tiny_model_path):
    path = DATA / "gsm8k" / "train.jsonl"
    paths = prepare_run_dir(cfg_of(tmp_path, tiny_model_path, f"explorer.taskset.path={path}", *GSM8K_FORMAT))
    assert len(load_taskset(paths.taskset)) == 16
    with pytest.raises(RunError, match=r"differs from what .* give from row 0 on"):
        prepare_run_dir(cfg_of(tmp_path, tiny_model_path, f"explorer.taskset.path={path}", *GSM8K_FORMAT,
                               "explorer.taskset.format.reply_prefix=<think>"), resume=True)


def test_a_subset_of_a_folder(tmp_path, tiny_model_path):
    cfg = cfg_of(tmp_path, tiny_model_path, f"explorer.taskset.path={DATA / 'task_scheduler'}",
                 "explorer.taskset.subset_name=subset_2", *GSM8K_FORMAT, "explorer.workflow=guess_number")
    tasks = load_taskset(prepare_run_dir(cfg).taskset)
    assert tasks[0].prompt == "Question 1 in subset 2." and tasks[0].raw_task["feature_offline"] is not None


def test_eval_tasksets_read_their_split_into_the_run_directory(tmp_path, tiny_model_path):
    cfg = cfg_of(tmp_path, tiny_model_path, *GSM8K_FORMAT, f"explorer.taskset.path={DATA / 'gsm8k'}",
                 f"explorer.eval_tasksets=[{{name: gsm, path: {DATA / 'gsm8k'}, split: test, "
                 "format: {prompt_key: question, response_key: answer}}]")
    prepare_run_dir(cfg)
    ev = cfg.explorer.eval_tasksets[0]
    assert eval_taskset_path(cfg, ev) == RunPaths.of(cfg).run_dir / "eval-gsm.parquet"
    got = prepare_eval_tasksets(cfg)["gsm"]
    test_rows = [json.loads(line) for line in (DATA / "gsm8k" / "test.jsonl").read_text().splitlines()]
    assert [t.raw_task for t in got] == test_rows and [t.task_id for t in got] == ["test-0", "test-1"]
    assert load_taskset(eval_taskset_path(cfg, ev)) == got == prepare_eval_tasksets(cfg)["gsm"]


def test_failures_are_one_line_and_nothing_is_written(tmp_path, tiny_model_path):
    def refused(*overrides) -> str:
        with pytest.raises(RunError) as e:
            prepare_run_dir(cfg_of(tmp_path, tiny_model_path, *overrides))
        assert "\n" not in str(e.value)
        assert not (tmp_path / "runs" / "p" / "n" / "config.yaml").exists()
        return str(e.value)

    msg = refused(f"explorer.taskset.path={DATA / 'gsm8k'}")
    assert "no column 'prompt' (explorer.taskset.format.prompt_key; its columns: question, answer)" in msg
    assert "gsm8k/train.jsonl" in msg and "set explorer.taskset.format.prompt_key" in msg
    msg = refused(f"explorer.taskset.path={DATA / 'gsm8k'}", *GSM8K_FORMAT, "explorer.taskset.split=validation")
    assert "has no split 'validation' (it has train, test)" in msg
    msg = refused(f"explorer.taskset.path={DATA / 'gsm8k'}", *GSM8K_FORMAT,
                  f"explorer.eval_tasksets=[{{name: e, path: {DATA / 'gsm8k'}, split: test}}]")
    assert msg.startswith("explorer.eval_tasksets[0] ") and "no column 'prompt'" in msg
    msg = refused("explorer.taskset.path=nobody/no-such-set", *GSM8K_FORMAT)
    assert "not in the local cache" in msg and "nothing is downloaded" in msg
    msg = refused(f"explorer.taskset.path={DATA / 'gsm8k'}", *GSM8K_FORMAT,
                  "explorer.taskset.format.chat_template='{% if messages %}{{ messages[0].content'")
    assert "explorer.taskset.format: the prompt of task 'train-0' cannot be rendered" in msg


def test_a_truth_the_scorer_cannot_read_is_refused_before_anything_is_written(tmp_path, tiny_model_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "2+2?", "answer": "It is four, as everyone knows well"}) + "\n")
    with pytest.raises(Exception, match=r"row 0 \(task_id 'train-0'\).*cannot read its ground truth"):
        prepare_run_dir(cfg_of(tmp_path, tiny_model_path, f"explorer.taskset.path={data}", *GSM8K_FORMAT))
    # a set with a reward function of its own is that function's to score
    paths = prepare_run_dir(cfg_of(tmp_path, tiny_model_path, f"explorer.taskset.path={data}", *GSM8K_FORMAT,
                                   "explorer.taskset.reward_fn=math_reward"))
    assert load_taskset(paths.taskset)[0].answer.startswith("It is four")


def test_a_parquet_file_is_ours_verls_or_trinitys_by_its_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trinity_like.common.tasks import is_task_file

    def file(name, cols):
        pq.write_table(pa.table({c: ["x"] for c in cols}), tmp_path / name)
        return tmp_path / name

    assert is_task_file(file("ours.parquet", ["task_id", "prompt", "answer"]))
    assert is_task_file(file("verl.parquet", ["prompt", "reward_model"]))
    assert is_task_file(file("meant.parquet", ["task_id", "question"]))  # ours, missing columns: load_taskset says
    assert not is_task_file(file("gsm8k.parquet", ["question", "answer"]))  # Trinity's: read by format
    assert is_task_file(tmp_path / "not-yet.parquet") and not is_task_file(tmp_path / "d.jsonl")
