"""`buffer ingest` refuses token ids no model can train on: negative ones always, ones past the vocabulary of
the run's model when the buffer is a run's. The whole ingest is refused, naming file:line; nothing is written."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from trinity_like.buffer import count_rows
from trinity_like.buffer.ingest import ingest_files
from trinity_like.common.errors import UserError

GOOD = {"prompt_ids": [5, 6], "response_ids": [7, 8, 0], "reward": 1.0}


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_negative_id_refuses_the_whole_ingest_and_writes_nothing(tmp_path):
    src = _jsonl(tmp_path / "in.jsonl", [GOOD, {**GOOD, "prompt_ids": [5, -1]}, {**GOOD, "reward": "x"}])
    buf = tmp_path / "buf"
    with pytest.raises(UserError, match=r"in\.jsonl:2: prompt_ids holds token id -1 \(negative\); nothing was "
                                        r"ingested.*re-tokenise"):
        ingest_files([src], buf)
    assert not buf.exists() or not any(buf.rglob("*"))  # no segment and no rejects file


def test_ids_past_the_run_models_vocabulary_are_refused_only_for_a_runs_buffer(tmp_path, tiny_model_path):
    rows = [GOOD, {**GOOD, "response_ids": [7, 99999, 0]}, {**GOOD, "response_ids": [99998, 8, 0]}]
    src = _jsonl(tmp_path / "in.jsonl", rows)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"model": {"path": tiny_model_path}}))
    with pytest.raises(UserError) as e:
        ingest_files([src], run / "buffer")
    assert str(e.value).startswith(f"{src}:2: response_ids holds token id 99999 (>= the model's vocabulary size ")
    assert f"of the run's model {tiny_model_path} (and 1 more row(s))" in str(e.value)
    assert count_rows(run / "buffer") == 0
    # a buffer of no run has no model to check against: the ids are stored (a trainer quarantines them later)
    assert ingest_files([src], tmp_path / "loose").accepted == 3


def test_the_cli_prints_one_line_and_exits_2(tmp_path):
    src = _jsonl(tmp_path / "in.jsonl", [{**GOOD, "response_ids": [-7]}])
    proc = subprocess.run([sys.executable, "-m", "trinity_like.cli", "buffer", "ingest", str(src), "--buffer",
                           str(tmp_path / "buf")], capture_output=True, text=True, env=os.environ)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "in.jsonl:1: response_ids holds token id -7" in proc.stderr
