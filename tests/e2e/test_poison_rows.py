"""A row no model can train on (token id 99999; the tiny model's vocabulary is far smaller) that got into a
buffer past `buffer ingest` is quarantined by the trainer: the run completes, the row is counted and recorded,
never trained, and not retried after --resume. Offline (replay) and async (the run's own buffer)."""

from pathlib import Path

import pytest

from trinity_like.buffer import BufferWriter
from trinity_like.buffer.ledger import Ledger
from trinity_like.buffer.maintenance import buffer_stats
from trinity_like.buffer.sql import consumption_table
from trinity_like.common.experience import Experience
from trinity_like.common.metrics import read_metrics
from trinity_like.config import load_config
from trinity_like.launcher import run
from trinity_like.runtime.paths import RunPaths

pytestmark = pytest.mark.slow

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
POISON = "poison-1"


def _cfg(tmp_path, model_path, *overrides):
    return load_config(str(QUICKSTART), [
        f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}", "warmup.sft_steps=0",
        "explorer.batch_size=2", "explorer.repeat_times=4", "explorer.taskset.size=16", "explorer.eval_tasksets=[]",
        "trainer.micro_batch_size=8", *overrides])


def _human_rows(n: int) -> list[Experience]:
    """One group of human demonstrations; row 1 holds token id 99999."""
    return [Experience(prompt_ids=[5, 6, 7], response_ids=[8, 99999 if i == 1 else 9, 2], source="human",
                       group_id="poison", eid=f"poison-{i}", reward=1.0) for i in range(n)]


def _trainer_records(cfg) -> list[dict]:
    return [r for r in read_metrics(RunPaths.of(cfg).metrics, 0)[0] if r["role"] == "trainer"]


def test_offline_replay_quarantines_the_row_and_completes(tmp_path, tiny_model_path, ray_session):
    source = tmp_path / "source"
    BufferWriter(source, writer_id="import").write(_human_rows(9))  # 8 trainable rows: one batch per epoch
    cfg = _cfg(tmp_path, tiny_model_path, "mode=offline", f"buffer.replay_sources=[{source}]",
               "algorithm.policy_loss=sft", "trainer.total_steps=2")
    summary = run(cfg)
    assert summary["exit_reason"] == "completed" and summary["trainer_steps"] == 2
    trainer = _trainer_records(cfg)
    assert [r["buffer/quarantined"] for r in trainer] == [1, 1]
    assert all(r["train/batch_size"] == 8 for r in trainer)  # the other 8 rows, every step
    paths = RunPaths.of(cfg)
    assert buffer_stats(paths.buffer_dir)["consumers"]["trainer"]["quarantined_rows"] == 1
    [row] = Ledger(paths.buffer_dir, "trainer").quarantined().to_pylist()
    assert row["eid"] == POISON and "99999" in row["problem"]


def test_async_run_quarantines_the_row_and_does_not_retry_it_after_resume(tmp_path, tiny_model_path, ray_session):
    cfg = _cfg(tmp_path, tiny_model_path, "mode=async", "algorithm.sft_sources=[human]", "trainer.total_steps=2")
    paths = RunPaths.of(cfg)
    BufferWriter(paths.buffer_dir, writer_id="import").write(_human_rows(4))
    summary = run(cfg)
    assert summary["exit_reason"] == "completed" and summary["trainer_steps"] == 2
    assert [r["buffer/quarantined"] for r in _trainer_records(cfg)] == [1, 1]
    trained = {r["eid"] for r in consumption_table(paths.buffer_dir).to_pylist()}
    assert {"poison-0", "poison-2", "poison-3"} <= trained and POISON not in trained

    resumed = _cfg(tmp_path, tiny_model_path, "mode=async", "algorithm.sft_sources=[human]", "trainer.total_steps=3")
    summary = run(resumed, resume=True)
    assert summary["exit_reason"] == "completed" and summary["resumed_from"] == 2
    assert _trainer_records(resumed)[-1]["buffer/quarantined"] == 1
    assert len(Ledger(paths.buffer_dir, "trainer").quarantined()) == 1  # recorded once, not per resume
    assert POISON not in {r["eid"] for r in consumption_table(paths.buffer_dir).to_pylist()}
