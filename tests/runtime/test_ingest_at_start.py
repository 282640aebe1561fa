"""`buffer.ingest`: SFT data written into the run's buffer once, as its source, when the trainer prepares the run
directory (Trinity-RFT's mix reads its expert data, `auxiliary_buffers`, so); a resumed run adds nothing; bad data
is refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trinity_like.buffer.sql import query
from trinity_like.common.errors import ConfigError, RunError
from trinity_like.config import load_config
from trinity_like.runtime.run_dir import prepare_run_dir

EXAMPLES = Path(__file__).resolve().parents[1] / "config" / "trinity_examples"


def _sft(path: Path, n: int = 3) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    with (path / "train.jsonl").open("w") as f:
        for i in range(n):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"{i}+1="},
                                             {"role": "assistant", "content": str(i + 1)}]}) + "\n")
    return path


def _cfg(tmp_path, tiny_model_path, data, *extra):
    return load_config(None, [f"checkpoint_root_dir={tmp_path / 'runs'}", f"model.path={tiny_model_path}",
                              f"buffer.ingest=[{{path: '{data}', format: {{prompt_type: messages, "
                              "messages_key: messages}}]", *extra])


def test_ingested_once_as_human_rows_and_not_again_on_resume(tmp_path, tiny_model_path):
    data = _sft(tmp_path / "expert")
    cfg = _cfg(tmp_path, tiny_model_path, data)
    said = []
    from trinity_like.runtime import run_dir

    paths = prepare_run_dir(cfg, role="trainer")
    rows = query(paths.buffer_dir).to_pylist()
    assert [r["source"] for r in rows] == ["human"] * 3
    answers = sorted(json.loads(r["messages"])[-1]["content"] for r in rows)
    assert answers == ["1", "2", "3"] and all(len(r["response_ids"]) > 0 for r in rows)
    assert run_dir.ingest_at_start(cfg, paths, say=said.append) == [0]  # again: every row is there already
    assert "0 rows of" in said[0] and "3 already there" in said[0]
    prepare_run_dir(cfg, role="trainer", resume=True)
    assert query(paths.buffer_dir).num_rows == 3


def test_bad_ingest_data_is_refused_before_anything_is_written(tmp_path, tiny_model_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.jsonl").write_text(json.dumps({"question": "1+1=", "solution": "2"}) + "\n")
    cfg = _cfg(tmp_path, tiny_model_path, bad)
    with pytest.raises(RunError, match=r"buffer\.ingest\[0\]: .* has no column 'messages'") as e:
        prepare_run_dir(cfg, role="trainer")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ConfigError, match="buffer.ingest\\[0\\].source"):
        _cfg(tmp_path, tiny_model_path, bad, "buffer.ingest.0.source=explorer")


def test_trinitys_mix_example_ingests_its_expert_data(tmp_path, monkeypatch):
    from trinity_like.config.loading import load_config_with_translation

    data = _sft(tmp_path / "expert")
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(EXAMPLES / "data" / "gsm8k_tiny.jsonl"))
    monkeypatch.setenv("TRINITY_SFT_DATASET_PATH", str(data))
    cfg, tr = load_config_with_translation(EXAMPLES / "mix_math" / "mix_math.yaml",
                                           ["cluster.gpu_per_node=0", "buffer.total_steps=2",
                                            "model.model_path=runs/models/tiny"])
    (src,) = cfg.buffer.ingest
    assert src.path == str(data) and src.source == "human" and src.split == "train"
    assert src.format.prompt_type == "messages" and src.format.messages_key == "messages"
    assert cfg.buffer.mix == {"explorer": 0.8, "human": 0.2} and cfg.algorithm.sft_sources == ["human"]
    assert any("buffer.ingest" in d for d in tr.differences)
