"""The seeds' awaitable shapes: ``await engine.prepare()`` / ``await engine.train_step(...)`` (seed 002), and
``CheckpointMonitor(save_strategy, default_local_dir, default_hdfs_dir)``."""

from __future__ import annotations

import asyncio

import pytest
import torch

from trinity_like.common.errors import UserError
from trinity_like.common.modeling import export_state_dict
from trinity_like.config import load_config
from trinity_like.synchronizer import CheckpointMonitor, SaveStrategy
from trinity_like.trainer.ppo import PPOTrainer


def _cfg(tmp_path, model_path):
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}", "trainer.device=cpu",
                              "explorer.repeat_times=3", "trainer.optimizer.lr=0.01"])


def test_awaitable_train_step_equals_the_plain_one_and_leaves_the_loop_running(tmp_path, tiny_model_path,
                                                                               batch_exps):
    plain = PPOTrainer(_cfg(tmp_path / "a", tiny_model_path))
    plain.prepare()
    expected = plain.train_step(batch_exps)

    async def run():
        engine = PPOTrainer(_cfg(tmp_path / "b", tiny_model_path)).as_async()
        await engine.prepare()
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0)  # yields to the loop: counts turns the loop took meanwhile
                ticks += 1

        task = asyncio.create_task(ticker())
        metrics = await engine.train_step(batch_exps)
        task.cancel()
        return engine, metrics, ticks

    engine, metrics, ticks = asyncio.run(run())
    assert engine.train_step_num == 1 == plain.train_step_num
    assert metrics["actor/pg_loss"] == pytest.approx(expected["actor/pg_loss"], abs=1e-6)
    assert metrics["actor/grad_norm"] == pytest.approx(expected["actor/grad_norm"], rel=1e-5)
    got, want = export_state_dict(engine.engine.module), export_state_dict(plain.module)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-7)
    assert ticks > 0  # the event loop ran while the step trained in its thread


def test_checkpoint_monitor_in_the_seeds_shape(tmp_path):
    monitor = CheckpointMonitor(SaveStrategy.SINGLE_THREAD, str(tmp_path), None)
    assert monitor.save_strategy is SaveStrategy.SINGLE_THREAD and monitor.dir == tmp_path

    async def two_writers():
        await monitor.register_thread_count(3, checkpoint_thread_count=2)
        await monitor.notify_finished(3)
        first = await monitor.monitor_step(3, timeout_s=0.05)  # one of two writers in: not complete
        await monitor.notify_finished(3)
        return first, await monitor.monitor_step(3, timeout_s=1)

    assert asyncio.run(two_writers()) == (False, True)
    assert (tmp_path / "latest").read_text() == "3\n" and monitor.latest_checkpoint_step == 3
    assert CheckpointMonitor("unrestricted", tmp_path).save_strategy is SaveStrategy.UNRESTRICTED
    with pytest.raises(UserError, match="default_hdfs_dir 'hdfs://nn/ckpt' is not supported"):
        CheckpointMonitor(SaveStrategy.SINGLE_NODE, str(tmp_path), "hdfs://nn/ckpt")
    with pytest.raises(ValueError, match="unknown save_strategy 'fast'; valid: single_thread"):
        CheckpointMonitor("fast", str(tmp_path))
    with pytest.raises(ValueError, match="needs the checkpoint folder"):
        CheckpointMonitor(SaveStrategy.SINGLE_NODE)
