"""Mistakes people make, through the real command line: each is one line `error: ...` on stderr (what is wrong
and how to fix it) and exit status 2, never a traceback. Every case fails before Ray starts."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trinity_like.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "local")  # a private instance, whatever cluster the machine has


@pytest.fixture
def config(tmp_path, tiny_model_path) -> Path:
    """A small valid config whose run directory lies under tmp_path."""
    path = tmp_path / "run.yaml"
    path.write_text(f"checkpoint_root_dir: {tmp_path / 'runs'}\nproject: errors\nname: run\n"
                    f"model:\n  path: {tiny_model_path}\nexplorer:\n  taskset:\n    size: 8\n")
    return path


def _error(capsys, argv: list[str], *needles: str) -> str:
    """Run the CLI; assert exit status 2 and a single `error:` line holding every needle; return that line."""
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_unknown_config_key(capsys, config):
    _error(capsys, ["run", config, "trainer.total_stepz=3"],
           "unknown config key 'trainer.total_stepz'", "valid keys under 'trainer'", "total_steps")
    _error(capsys, ["run", config, "monitor.type=jsonl"], "config key 'monitor.type' was replaced",
           "monitor.backends")  # a key of an earlier version names what replaced it


def test_bad_value(capsys, config):
    _error(capsys, ["run", config, "mode=turbo"], "bad value for 'mode'", "allowed values: sync, async, offline")
    _error(capsys, ["run", config, "trainer.total_steps=many"], "bad value for 'trainer.total_steps'", "int")


def test_missing_model_path(capsys, config, tmp_path):
    _error(capsys, ["run", config, f"model.path={tmp_path / 'nowhere'}"],
           "model.path", "has no model", "make-tiny-model", "model.build_tiny_at")
    assert not (tmp_path / "runs" / "errors" / "run" / "config.yaml").exists()  # nothing written for a retry to trip on


def test_mistyped_model_path_builds_nothing(capsys, config, tmp_path):
    """With the quickstart's `build_tiny_at`, a typo in model.path used to build a random model at the typo and
    train it; the tiny model is now built only into the folder build_tiny_at names."""
    typo = tmp_path / "some" / "typo"
    line = _error(capsys, ["run", config, f"model.path={typo}", f"model.build_tiny_at={tmp_path / 'tiny'}"],
                  f"model.path '{typo}' has no model", "build_tiny_at builds the tiny model only into")
    assert str(tmp_path / "tiny") in line
    assert not typo.exists() and not (tmp_path / "tiny").exists()


def test_build_tiny_at_builds_and_says_so(capsys, config, tmp_path):
    from trinity_like.config import load_config
    from trinity_like.runtime.run_dir import prepare_run_dir

    tiny = tmp_path / "tiny"
    cfg = load_config(config, [f"model.path={tiny}", f"model.build_tiny_at={tiny}"])
    prepare_run_dir(cfg)
    assert (tiny / "config.json").is_file()
    assert f"building the tiny model into {tiny} (model.build_tiny_at)" in capsys.readouterr().out


def test_old_build_tiny_key_names_its_replacement(capsys, config):
    _error(capsys, ["run", config, "model.build_tiny_if_missing=true"],
           "config key 'model.build_tiny_if_missing' was replaced", "model.build_tiny_at")


def test_garbled_checkpoint_pointer_stops_resume(capsys, config, tmp_path):
    """A damaged `checkpoints/latest` used to make --resume start again from step 0 silently."""
    ckpts = tmp_path / "runs" / "errors" / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "latest").write_text("\x00\x00garbage")
    _error(capsys, ["run", config, "--resume"], "checkpoint pointer", "is garbled", "delete it to start from step 0")
    (ckpts / "latest").write_text("7\n")  # names a checkpoint that is not there
    _error(capsys, ["run", config, "--resume"], "names step 7", "not a complete checkpoint")


def test_model_folder_without_tokenizer(capsys, config, tmp_path, tiny_model_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(Path(tiny_model_path) / "config.json", bare)
    _error(capsys, ["run", config, f"model.path={bare}"], f"model.path '{bare}' has no tokenizer", "tokenizer.json")


def test_tokenizer_larger_than_the_models_embedding(capsys, config, tmp_path, tiny_model_path):
    other = tmp_path / "other"
    shutil.copytree(tiny_model_path, other)
    model_config = json.loads((other / "config.json").read_text())
    model_config["vocab_size"] = 100
    (other / "config.json").write_text(json.dumps(model_config))
    _error(capsys, ["run", config, f"model.path={other}"],
           "tokens but the model has only 100 embedding rows", "do not belong together",
           "use the tokenizer the model was trained with")


def test_task_file_missing(capsys, config, tmp_path):
    missing = tmp_path / "tasks-nowhere.parquet"
    _error(capsys, ["run", config, f"explorer.taskset.path={missing}"],
           f"task file '{missing}' does not exist", "explorer.taskset.path", "task_id, prompt, answer")


def test_task_file_with_wrong_columns(capsys, config, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "tasks.parquet"
    pq.write_table(pa.table({"task_id": ["1"], "question": ["1+1="]}), bad)
    _error(capsys, ["run", config, f"explorer.taskset.path={bad}"],
           "lacks column(s) prompt, answer", "it has task_id, question", "needs columns task_id, prompt, answer")
    not_parquet = tmp_path / "tasks.jsonl"
    not_parquet.write_text('{"task_id": "1"}\n')
    # not Parquet: read as Trinity-RFT reads a task set (explorer.taskset.format), whose columns it names
    _error(capsys, ["run", config, f"explorer.taskset.path={not_parquet}"], "has no column 'prompt'",
           "its columns: task_id", "set explorer.taskset.format.prompt_key")


def _segment_of_schema_version(buffer_dir: Path, version: bytes) -> str:
    """A well-formed segment (checksum in its name) whose footer records another schema version."""
    import zlib

    import pyarrow as pa
    import pyarrow.ipc as ipc

    from trinity_like.common.experience import Experience, experiences_to_table

    table = experiences_to_table([Experience(prompt_ids=[1, 2], response_ids=[3], source="human")])
    table = table.replace_schema_metadata({b"trinity_like.schema_version": version})
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    data = sink.getvalue().to_pybytes()
    name = f"{time.time_ns():020d}-ingest-human-000000-1-{zlib.crc32(data):08x}.arrow"
    (buffer_dir / "segments").mkdir(parents=True, exist_ok=True)
    (buffer_dir / "segments" / name).write_bytes(data)
    return name


@pytest.mark.parametrize("version", ["0", "3"])
def test_buffer_of_another_schema_version(capsys, config, tmp_path, version):
    # versions 1 (upgraded on read) and 2 are readable; one older or newer than both is refused
    name = _segment_of_schema_version(tmp_path / "runs" / "errors" / "run" / "buffer", version.encode())
    _error(capsys, ["run", config], f"holds 1 segment(s) of schema version {version}, e.g. {name}",
           "this build reads only versions 1-2", "buffer export")


def test_port_in_use(capsys, config):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        _error(capsys, ["serve", config, "--port", port], f"port {port} on 127.0.0.1 is in use", "--port")


def test_role_joining_a_run_with_another_config(capsys, config):
    from trinity_like.config import load_config
    from trinity_like.runtime.run_dir import prepare_run_dir
    prepare_run_dir(load_config(config), role="trainer")  # the run's config, as a trainer job saved it
    _error(capsys, ["run", config, "seed=3", "trainer.optimizer.lr=0.5", "--role", "explorer"],
           "runs another config (differs in seed, trainer.optimizer.lr)", "start this explorer with the run's "
           "config.yaml")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


def test_ray_address_unreachable_fails_fast(capsys, config):
    port = _closed_port()
    start = time.monotonic()
    _error(capsys, ["run", config, "--address", f"127.0.0.1:{port}"],
           f"cannot reach the Ray cluster at '127.0.0.1:{port}'", "ray start --head", "--address / RAY_ADDRESS")
    assert time.monotonic() - start < 10
    assert not (Path(config).parent / "runs" / "errors").exists()  # refused before the run directory


def test_fresh_process_from_ray_address_env(config):
    """The installed entry point in a fresh process: RAY_ADDRESS from `ray job submit` pointing nowhere."""
    port = _closed_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": f"127.0.0.1:{port}"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "trinity_like.cli", "run", str(config)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach the Ray cluster"), proc.stderr
    assert "(from RAY_ADDRESS)" in lines[0]
    assert time.monotonic() - start < 60


def test_token_count_without_transformers_is_the_hugging_face_tokenizers_length(tmp_path, tiny_model_path):
    from trinity_like.common.tokenizer import _token_count, hf_tokenizer

    folder = tmp_path / "added"
    shutil.copytree(tiny_model_path, folder)
    tok = hf_tokenizer(str(folder))
    tok.add_tokens(["<tool_call>", "<tool_response>"])  # added tokens count too
    tok.save_pretrained(folder)
    assert _token_count(folder) == len(hf_tokenizer(str(folder))) == len(tok)


def test_malformed_tokenizer_file(capsys, config, tmp_path, tiny_model_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_path, broken)
    (broken / "tokenizer.json").write_text("{not json")
    _error(capsys, ["run", config, f"model.path={broken}"], f"the tokenizer in model.path '{broken}' does not load",
           "replace it with the tokenizer files that came with this model")


TRINITY = """\
project: errors
name: trinity
checkpoint_root_dir: {root}
model:
  model_path: {model}
  max_model_len: 128
cluster:
  node_num: 1
  gpu_per_node: 0
buffer:
  batch_size: 2
  total_steps: 2
  explorer_input:
    taskset:
      path: ${{oc.env:MY_TASKS_FOR_THE_TEST}}
"""


def test_trinity_config_mistakes_are_one_line(capsys, tmp_path, tiny_model_path, monkeypatch):
    """A Trinity-RFT config's mistakes: every unknown key (with a close spelling) and refused value in one line, an
    unset environment variable named, a config file given twice."""
    monkeypatch.delenv("MY_TASKS_FOR_THE_TEST", raising=False)
    path = tmp_path / "trinity.yaml"
    path.write_text(TRINITY.format(root=tmp_path / "runs", model=tiny_model_path))
    _error(capsys, ["run", "-c", path], "'buffer.explorer_input.taskset.path' reads the environment variable "
           "MY_TASKS_FOR_THE_TEST, which is not set")
    monkeypatch.setenv("MY_TASKS_FOR_THE_TEST", str(tmp_path / "tasks.jsonl"))
    _error(capsys, ["run", "--config", path, "buffer.batch_sise=3", "trainer.ulysses_sequence_parallel_size=2"],
           "neither Trinity-RFT's config nor ours has the key 'buffer.batch_sise'")
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text() + "explorer:\n  rollout_model:\n    engine_nun: 2\n    ignore_eos: true\n")
    _error(capsys, ["run", bad, "trainer.ulysses_sequence_parallel_size=2"], "1 key(s) are not Trinity-RFT's",
           "explorer.rollout_model.engine_nun (did you mean explorer.rollout_model.engine_num?)",
           "2 key(s) have no counterpart here", "ignore_eos", "sequence parallelism")
    _error(capsys, ["config-convert", "-c", path, bad], "give the config file once")
    _error(capsys, ["run", path, "mode=sideways"], "bad value for 'mode'")
