"""Task data as Trinity-RFT reads it: ``datasets.load_dataset(path, name=subset_name, split=split)`` without the
``datasets`` package (trinity_like.common.datasets), rows -> Tasks by ``format`` (rows_to_tasks), the prompt
rendered as Trinity's model renders it, and the task file round trip of what a Trinity row carries."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from trinity_like.common.datasets import DatasetError, read_rows
from trinity_like.common.tasks import Task, load_taskset, prompt_ids, rows_to_tasks, write_taskset
from trinity_like.config.schema import TaskFormatConfig

DATA = Path(__file__).parent / "data" / "trinity"
TEMPLATE = (DATA / "custom_chat_template.j2").read_text()
ROWS = [{"question": "1+1=", "answer": "#### 2", "level": 1}, {"question": "2+5=", "answer": "#### 7", "level": 3}]


def _jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


# --- files read whole --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["jsonl", "json_list", "parquet", "csv", "tsv", "arrow_stream", "arrow_file",
                                  "feather"])
def test_every_file_type_reads_the_same_rows(tmp_path, kind):
    table = pa.Table.from_pylist(ROWS)
    if kind == "jsonl":
        path = _jsonl(tmp_path / "d.jsonl", ROWS)
    elif kind == "json_list":
        path = tmp_path / "d.json"
        path.write_text(json.dumps(ROWS, indent=2))
    elif kind == "parquet":
        path = tmp_path / "d.parquet"
        pq.write_table(table, path)
    elif kind in ("csv", "tsv"):
        path = tmp_path / f"d.{kind}"
        pcsv.write_csv(table, path, pcsv.WriteOptions(delimiter="\t" if kind == "tsv" else ","))
    elif kind == "arrow_stream":  # what datasets' save_to_disk / cache writes
        path = tmp_path / "d.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    elif kind == "arrow_file":
        path = tmp_path / "d.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    else:
        path = tmp_path / "d.feather"
        feather.write_feather(table, path)
    got = read_rows(path, split="test")  # a single file is read whole whatever the split
    assert got.rows == ROWS and got.columns == ["question", "answer", "level"] and got.files == [path]


def test_json_forms_as_datasets_reads_them(tmp_path):
    # records missing a field get null, as Arrow unifies them (datasets' json builder)
    got = read_rows(_jsonl(tmp_path / "a.jsonl", [{"a": 1, "b": {"x": 1}}, {"a": 2, "b": {"y": "t"}}]))
    assert got.rows == [{"a": 1, "b": {"x": 1, "y": None}}, {"a": 2, "b": {"x": None, "y": "t"}}]
    _jsonl(tmp_path / "m.jsonl", [{"a": 1}, {"c": True}])
    assert read_rows(tmp_path / "m.jsonl").rows == [{"a": 1, "c": None}, {"a": None, "c": True}]
    # a field whose type changes keeps its values (datasets stores it as JSON text; Arrow alone refuses it)
    got = read_rows(_jsonl(tmp_path / "t.jsonl", [{"truth": "72"}, {"truth": {"target": 3, "numbers": [1, 2]}}]))
    assert got.rows == [{"truth": "72"}, {"truth": {"target": 3, "numbers": [1, 2]}}]
    (tmp_path / "s.json").write_text(json.dumps(["one", "two"]))
    assert read_rows(tmp_path / "s.json").rows == [{"text": "one"}, {"text": "two"}]
    (tmp_path / "l.txt").write_text("x\ny\n")
    assert read_rows(tmp_path / "l.txt").rows == [{"text": "x"}, {"text": "y"}]


def test_one_json_object_is_refused_as_datasets_would_read_it_as_one_row(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"version": 1, "data": ROWS}, indent=2))
    with pytest.raises(DatasetError, match=r"holds one JSON object .*single row; write its records \('data'\)"):
        read_rows(path)


def test_values_come_as_json_values_and_binary_is_refused(tmp_path):
    import datetime

    pq.write_table(pa.table({"q": ["a"], "when": pa.array([datetime.date(2024, 5, 1)])}), tmp_path / "d.parquet")
    assert read_rows(tmp_path / "d.parquet").rows == [{"q": "a", "when": "2024-05-01"}]
    pq.write_table(pa.table({"q": ["a"], "image": [b"\x89PNG"]}), tmp_path / "b.parquet")
    with pytest.raises(DatasetError, match=r"row 0: column 'image' holds binary data.*drop that column"):
        read_rows(tmp_path / "b.parquet")


def test_bad_files_are_one_line(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(DatasetError, match=r"line 2 is not JSON"):
        read_rows(tmp_path / "bad.jsonl")
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(DatasetError, match=r"cannot be read as parquet"):
        read_rows(tmp_path / "bad.parquet")
    (tmp_path / "x.xlsx").write_text("?")
    with pytest.raises(DatasetError, match=r"not a data file this reader reads"):
        read_rows(tmp_path / "x.xlsx")
    with pytest.raises(DatasetError, match=r"does not exist"):
        read_rows(tmp_path / "nowhere" / "d.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DatasetError, match=r"holds no rows"):
        read_rows(tmp_path / "empty.jsonl")


# --- folders laid out as Hugging Face data sets are ----------------------------------------------------------------


def _folder(tmp_path, names: list[str]) -> Path:
    root = tmp_path / "ds"
    for n in names:
        split = "test" if "test" in n or "eval" in n else ("validation" if "val" in n or "dev" in n else "train")
        path = root / n
        path.parent.mkdir(parents=True, exist_ok=True)
        if n.endswith(".parquet"):
            pq.write_table(pa.Table.from_pylist([{"split": split, "file": n}]), path)
        else:
            _jsonl(path, [{"split": split, "file": n}])
    return root


@pytest.mark.parametrize("names, splits", [
    (["train.jsonl", "test.jsonl"], {"train": ["train.jsonl"], "test": ["test.jsonl"]}),
    (["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet", "data/test-00000-of-00001.parquet",
      "data/random-00000-of-00001.parquet"],
     {"train": ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"],
      "test": ["data/test-00000-of-00001.parquet"], "random": ["data/random-00000-of-00001.parquet"]}),
    (["data/train/shard_0.jsonl", "data/train/shard_1.jsonl", "data/test/shard_0.jsonl"],
     {"train": ["data/train/shard_0.jsonl", "data/train/shard_1.jsonl"], "test": ["data/test/shard_0.jsonl"]}),
    (["train_0.jsonl", "train_1.jsonl", "dev.jsonl", "my_eval.jsonl"],
     {"train": ["train_0.jsonl", "train_1.jsonl"], "validation": ["dev.jsonl"], "test": ["my_eval.jsonl"]}),
    (["everything.jsonl", "more.jsonl"], {"train": ["everything.jsonl", "more.jsonl"]}),
    (["main/train-00000-of-00001.parquet", "main/test-00000-of-00001.parquet"],
     {"train": ["main/train-00000-of-00001.parquet"], "test": ["main/test-00000-of-00001.parquet"]}),
])
def test_folder_splits_follow_datasets_patterns(tmp_path, names, splits):
    from trinity_like.common.datasets import data_files

    root = _folder(tmp_path, names)
    (root / "README.md").write_text("# a data set\n")  # never data
    (root / ".gitattributes").write_text("*.parquet lfs\n")
    _, got = data_files(root)
    assert {s: [str(f.relative_to(root)) for f in fs] for s, fs in got.items()} == splits
    for split, files in splits.items():
        assert [r["file"] for r in read_rows(root, split=split).rows] == files


def test_only_the_main_data_format_is_read_and_a_missing_split_is_named(tmp_path):
    root = _folder(tmp_path, ["train.jsonl", "test.jsonl", "test2.jsonl"])
    (root / "train_notes.py").write_text("print(1)\n")
    assert [r["file"] for r in read_rows(root, split="test").rows] == ["test.jsonl", "test2.jsonl"]
    with pytest.raises(DatasetError, match=r"has no split 'validation' \(it has train, test\); set split"):
        read_rows(root, split="validation")


def test_split_slices_and_sums(tmp_path):
    root = tmp_path / "ds"
    _jsonl(root / "train.jsonl", [{"i": i} for i in range(10)])
    _jsonl(root / "test.jsonl", [{"i": 100 + i} for i in range(4)])
    assert [r["i"] for r in read_rows(root, split="train[:3]").rows] == [0, 1, 2]
    assert [r["i"] for r in read_rows(root, split="train[-2:]").rows] == [8, 9]
    assert [r["i"] for r in read_rows(root, split="train[25%:40%]").rows] == [3]  # rows 2.5 -> 3 .. 4 -> 4
    assert [r["i"] for r in read_rows(root, split="train[:2]+test[:1]").rows] == [0, 1, 100]
    with pytest.raises(DatasetError, match="is not a split name"):
        read_rows(root, split="train[::2]")


def test_subset_name_is_a_readme_config_or_a_sub_folder(tmp_path):
    # Trinity's own task_scheduler data: two sub-folders, no README configs
    root = tmp_path / "ts"
    shutil.copytree(DATA / "task_scheduler", root)
    got = read_rows(root, subset_name="subset_2")
    assert got.rows[0]["question"] == "Question 1 in subset 2." and len(got.rows) > 1
    with pytest.raises(DatasetError, match=r"has no subset 'subset_3'.*\(folders: subset_1, subset_2\)"):
        read_rows(root, subset_name="subset_3")
    # datasets' implicit config of a folder without README configs is 'default': the folder itself
    assert len(read_rows(root / "subset_1", subset_name="default").rows) == len(read_rows(root / "subset_1").rows)
    # gsm8k's layout and README: configs main and socratic, data_files per split
    gsm = _folder(tmp_path, ["main/train-00000-of-00001.parquet", "main/test-00000-of-00001.parquet",
                             "socratic/train-00000-of-00001.parquet", "socratic/test-00000-of-00001.parquet"])
    (gsm / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: main/train-*\n"
        "  - split: test\n    path: main/test-*\n- config_name: socratic\n  data_files:\n  - split: train\n"
        "    path: socratic/train-*\n  - split: test\n    path: socratic/test-*\n---\n# GSM8K\n")
    assert read_rows(gsm, subset_name="socratic", split="test").rows == [
        {"split": "test", "file": "socratic/test-00000-of-00001.parquet"}]
    with pytest.raises(DatasetError, match=r"has 2 subsets \(main, socratic\) and none is the default; set subset"):
        read_rows(gsm)
    with pytest.raises(DatasetError, match=r"has no subset 'x' \(its README declares main, socratic\)"):
        read_rows(gsm, subset_name="x")


def test_a_hub_id_is_read_from_the_local_cache_or_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    with pytest.raises(DatasetError) as e:
        read_rows("openai/gsm8k", subset_name="main", key="explorer.taskset.path")
    msg = str(e.value)
    assert "\n" not in msg and "not in the local cache" in msg and "nothing is downloaded" in msg
    assert "huggingface-cli download openai/gsm8k --repo-type dataset" in msg and "TRINITY_TASKSET_PATH" in msg
    # the hub cache's layout: blobs, a snapshot of links named by refs/main
    repo = tmp_path / "hf" / "hub" / "datasets--openai--gsm8k"
    blob = repo / "blobs" / "abc123"
    blob.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"question": "q?", "answer": "x #### 72"}]), blob)
    snap = repo / "snapshots" / "f00d"
    (snap / "main").mkdir(parents=True)
    (snap / "main" / "test-00000-of-00001.parquet").symlink_to(blob)
    (snap / "README.md").write_text("---\nconfigs:\n- config_name: main\n  data_files:\n  - split: test\n"
                                    "    path: main/test-*\n---\n")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("f00d")
    assert read_rows("openai/gsm8k", subset_name="main", split="test").rows == [
        {"question": "q?", "answer": "x #### 72"}]


# --- rows -> Tasks --------------------------------------------------------------------------------------------------


def _fmt(**kw) -> TaskFormatConfig:
    return TaskFormatConfig(**kw)


def test_gsm8k_rows_keep_the_whole_answer_and_the_row(tmp_path):
    rows = read_rows(DATA / "gsm8k", split="train").rows
    tasks = rows_to_tasks(rows, _fmt(prompt_key="question", response_key="answer"), "train", "gsm8k")
    assert len(tasks) == 16 and tasks[0].task_id == "train-0"
    t = tasks[0]
    assert t.prompt == rows[0]["question"] and t.answer == rows[0]["answer"] and t.answer.endswith("#### 72")
    assert t.raw_task == rows[0] and t.messages == ({"role": "user", "content": rows[0]["question"]},)
    from trinity_like.algorithms.truths import gsm8k_reference

    assert gsm8k_reference(t.answer) == "72"


def test_plaintext_system_prompt_reply_prefix_and_row_columns():
    rows = [{"q": "2+2?", "a": 4, "sys": "Be brief.", "wf": "math_workflow", "rf": "", "data_source": "math"}]
    (t,) = rows_to_tasks(rows, _fmt(prompt_key="q", response_key="a", system_prompt="Think.", reply_prefix="<think>",
                                    workflow_key="wf", reward_fn_key="rf"), "test")
    assert t.messages == ({"role": "system", "content": "Think."}, {"role": "user", "content": "2+2?"},
                          {"role": "assistant", "content": "<think>"})
    assert t.answer == "4" and t.raw_task["a"] == 4  # the scorers compare text; the row keeps the number
    assert (t.workflow, t.reward_fn, t.data_source, t.task_id) == ("math_workflow", "", "math", "test-0")
    (t,) = rows_to_tasks(rows, _fmt(prompt_key="q", response_key="a", system_prompt="Think.",
                                    system_prompt_key="sys"))
    assert t.messages[0] == {"role": "system", "content": "Be brief."}


def test_messages_and_chatpair_rows():
    conv = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    (t,) = rows_to_tasks([{"message": conv}], _fmt(prompt_type="messages"))
    assert t.messages == ({"role": "user", "content": "Hi"},) and t.answer == "Hello!" and t.prompt == "Hi"
    (t,) = rows_to_tasks([{"messages": json.dumps(conv[:1]), "response": "r"}],
                         _fmt(prompt_type="messages", messages_key="messages", system_prompt="S"))
    assert t.messages == ({"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}) and t.answer == "r"
    rows = read_rows(DATA / "human_like").rows
    tasks = rows_to_tasks(rows, _fmt(prompt_type="chatpair"))
    assert tasks[0].prompt == rows[0]["prompt"] and tasks[0].answer == rows[0]["chosen"]


def test_row_errors_are_one_line_naming_row_column_and_fix():
    with pytest.raises(ValueError, match=r"gsm8k has no column 'prompt' \(format.prompt_key; its columns: question, "
                                         r"answer\); set format.prompt_key"):
        rows_to_tasks(read_rows(DATA / "gsm8k").rows, _fmt(), origin="gsm8k")
    with pytest.raises(ValueError, match=r"no column 'response' \(format.response_key"):
        rows_to_tasks([{"prompt": "p"}], _fmt())
    (t,) = rows_to_tasks([{"prompt": "p"}], _fmt(), answer_optional=True)
    assert t.answer == ""
    with pytest.raises(ValueError, match=r"set row 1: column 'prompt' \(format.prompt_key\) is empty"):
        rows_to_tasks([{"prompt": "p", "response": "r"}, {"prompt": " ", "response": "r"}], _fmt(), origin="set")
    with pytest.raises(ValueError, match=r"row 0: column 'message' is not a list of chat messages"):
        rows_to_tasks([{"message": [{"role": "robot", "content": "x"}]}], _fmt(prompt_type="messages"))
    with pytest.raises(ValueError, match=r"no column 'wf' \(format.workflow_key"):
        rows_to_tasks([{"prompt": "p", "response": "r"}], _fmt(workflow_key="wf"))


def test_a_task_of_a_row_is_written_and_read_back_equal(tmp_path):
    rows = [{"question": "q", "answer": "#### 1", "meta": {"k": [1, 2.5, None]}, "n": 3},
            {"question": "q2", "answer": "#### 2", "meta": {"k": []}, "n": None}]
    tasks = rows_to_tasks(rows, _fmt(prompt_key="question", response_key="answer", reply_prefix="So",
                                     chat_template=TEMPLATE, enable_thinking=False))
    write_taskset(tmp_path / "t.parquet", tasks)
    back = load_taskset(tmp_path / "t.parquet")
    assert back == tasks and back[0].raw_task == rows[0] and back[1].enable_thinking is False
    mixed = [*tasks, Task("plain", "1+1=", "2")]  # ours beside them: its row-columns are empty
    write_taskset(tmp_path / "m.parquet", mixed)
    assert load_taskset(tmp_path / "m.parquet") == mixed


# --- the prompt as Trinity's model renders it -----------------------------------------------------------------------


def _trinity_render(tok, messages, chat_template=None, enable_thinking=None) -> list[int]:
    """Trinity's BaseInferenceModel.apply_chat_template, then the text encoded."""
    if messages[-1]["role"] == "assistant":
        text = tok.apply_chat_template(messages, tokenize=False, continue_final_message=True,
                                       chat_template=chat_template)
    else:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                       chat_template=chat_template, enable_thinking=enable_thinking)
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("kw", [{}, {"reply_prefix": "<think>\nLet me"}, {"enable_thinking": False},
                                {"enable_thinking": True}, {"system_prompt": "Solve it."}])
def test_prompt_ids_are_the_chat_template_as_trinity_applies_it(tok, kw):
    (t,) = rows_to_tasks(ROWS[:1], _fmt(prompt_key="question", response_key="answer", chat_template=TEMPLATE, **kw))
    ids = prompt_ids(t, tok)
    assert ids == _trinity_render(tok, list(t.messages), TEMPLATE, kw.get("enable_thinking"))
    text = tok.decode(ids)
    if "reply_prefix" in kw:
        assert text.endswith("<|im_start|>assistant\n<think>\nLet me")  # continued, not closed
    elif kw.get("enable_thinking") is False:
        assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    else:
        assert text.endswith("<|im_start|>assistant\n")


def test_without_a_template_the_reply_prefix_is_continued_in_the_plain_format(tok):
    (t,) = rows_to_tasks(ROWS[:1], _fmt(prompt_key="question", response_key="answer", reply_prefix="The answer"))
    (plain,) = rows_to_tasks(ROWS[:1], _fmt(prompt_key="question", response_key="answer"))
    assert tok.decode(prompt_ids(t, tok)) == tok.decode(prompt_ids(plain, tok)) + "The answer"


def test_a_save_to_disk_folder_is_refused_as_load_dataset_refuses_it(tmp_path):
    root = tmp_path / "saved"
    (root / "train").mkdir(parents=True)
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    (root / "train" / "state.json").write_text("{}")
    with pytest.raises(DatasetError, match=r"written by datasets' save_to_disk.*Dataset.to_json"):
        read_rows(root)
