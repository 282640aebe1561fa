"""The trainer role: setup -> run -> shutdown. Reads batches from the buffer, trains, publishes weights."""

from __future__ import annotations

import os
import socket
import time

from trinity_like.buffer import BufferConsumer
from trinity_like.common.errors import UserError
from trinity_like.common.metrics import MetricsWriter
from trinity_like.common.modeling import set_offline_env
from trinity_like.config import Config, RunPaths, namespace_of, redis_stream
from trinity_like.trainer.ppo import TRAINERS


def make_train_engine(cfg: Config, synchronizer=None):
    """The TrainEngineWrapper ``trainer.type`` names; spread over ``trainer.num_workers`` data-parallel
    workers when there is more than one."""
    if cfg.trainer.num_workers > 1:
        from trinity_like.trainer.workers import DataParallelTrainer

        return DataParallelTrainer(cfg, synchronizer)
    return TRAINERS.get(cfg.trainer.type)(cfg, synchronizer)

CONSUMER_NAME = "trainer"


class TrainerRole:
    """Runs as a Ray actor. In ``sync`` mode the launcher calls ``step()`` in lock-step with the explorer;
    in ``async`` mode ``run()`` loops on its own, bounded by ``synchronizer.max_staleness``; in ``offline``
    mode ``run()`` replays ``buffer.replay_sources`` epoch after epoch (nothing is consumed or published)."""

    def __init__(self, cfg: Config) -> None:
        set_offline_env()
        self.cfg = cfg
        self.paths = RunPaths.of(cfg)

    def setup(self) -> None:
        import ray

        from trinity_like.synchronizer import Heartbeat, get_synchronizer

        self.synchronizer = get_synchronizer(namespace_of(self.cfg))
        self.role_id = f"trainer-{socket.gethostname()}-{os.getpid()}"
        ray.get(self.synchronizer.register.remote("trainer", self.role_id, {"workers": self.cfg.trainer.num_workers}))
        self.engine = make_train_engine(self.cfg, self.synchronizer)
        self.engine.prepare()
        self.heartbeat = Heartbeat(self.synchronizer, self.role_id,
                                   lambda: {"version": self.engine.train_step_num}).start()
        b = self.cfg.buffer
        self.consumer = None if self.cfg.mode == "offline" else BufferConsumer(self.paths.buffer_dir, CONSUMER_NAME, policy=b.read_policy,
                                       priority=b.priority or None, where=b.where or None,
                                       max_uses=b.replay_max_uses, cooldown_steps=b.replay_cooldown_steps)
        self.metrics = MetricsWriter(self.paths.metrics, role="trainer")
        self._last_end_check = 0.0
        self.ingester = None
        self.replay = None
        if self.cfg.mode == "offline":
            from trinity_like.buffer.replay import ReplayReader

            self.replay = ReplayReader(b.replay_sources, where=b.where or None, batch_size=self.cfg.train_batch_size,
                                       seed=self.cfg.seed)
            if not len(self.replay):
                raise UserError(f"buffer.replay_sources hold no rows{' matching buffer.where' if b.where else ''}: "
                                f"{', '.join(b.replay_sources)}")
            self._replay_epoch, self._replay_batches = 0, self.replay.epoch(0)
        elif b.transport == "redis":
            from trinity_like.buffer.redis_transport import IngesterThread, RedisIngester

            self.ingester = IngesterThread(RedisIngester(
                b.redis_url, redis_stream(self.cfg), self.paths.buffer_dir,
                timeout_s=self.cfg.synchronizer.timeout_s)).start()

    def _min_version(self) -> int | None:
        """Oldest model_version this step may train on. In sync mode the lock-step schedule decides."""
        if self.cfg.mode == "sync":
            return None
        return self.engine.train_step_num - self.cfg.synchronizer.max_staleness

    def _next_replay_batch(self) -> list:
        for _ in range(2):
            batch = next(self._replay_batches, None)
            if batch is not None:
                return batch
            self._replay_epoch += 1
            self._replay_batches = self.replay.epoch(self._replay_epoch)
        raise AssertionError("a non-empty replay source yielded no batch")

    def step(self) -> dict[str, float]:
        """Read one batch, train on it, commit its consumption, publish weights when the interval says so."""
        wait_start = time.perf_counter()
        if self.replay is not None:
            exps = self._next_replay_batch()
        else:
            exps = self.consumer.read(self.cfg.train_batch_size, self._min_version(),
                                      timeout_s=self.cfg.synchronizer.timeout_s, step=self.engine.train_step_num + 1,
                                      should_stop=self._explorer_ended)
        wait_s = time.perf_counter() - wait_start
        metrics = self.engine.train_step(exps)
        step = self.engine.train_step_num
        if self.replay is not None:
            metrics["replay/epoch"] = float(self._replay_epoch)
        elif step % self.cfg.synchronizer.interval == 0 or step == self.cfg.trainer.total_steps:
            sync_start = time.perf_counter()
            metrics.update(self.engine.sync_weight() or {})
            metrics["time/sync_s"] = time.perf_counter() - sync_start
        save = self.cfg.trainer.save_interval
        if step == self.cfg.trainer.total_steps or (save and step % save == 0):
            # Ledger first, then checkpoint: a crash between the two resumes from the previous checkpoint,
            # whose resume discards this commit, so the rows are trained again rather than lost.
            if self.replay is None:
                self.consumer.commit(step)
            self.engine.save_checkpoint(block_until_saved=True)
        metrics["time/wait_data_s"] = wait_s
        metrics["trainer/version"] = float(step)
        if self.consumer is not None:
            metrics.update(self.consumer.stats())
        self.metrics.write(step, metrics)
        return metrics

    def _explorer_ended(self) -> bool:
        """Asked on every buffer poll; asks the synchronizer at most once a second."""
        import ray

        if self.ingester is not None and self.ingester.error is not None:
            raise RuntimeError(f"the redis ingester stopped: {self.ingester.error}")
        now = time.monotonic()
        if now - self._last_end_check < 1.0:
            return False
        self._last_end_check = now
        return "explorer" in ray.get(self.synchronizer.ended.remote())

    def run(self) -> int:
        """Train until ``trainer.total_steps``; return the final version."""
        try:
            while self.engine.train_step_num < self.cfg.trainer.total_steps:
                self.step()
        except BaseException as e:
            self._end(f"failed: {type(e).__name__}: {e}")
            raise
        self._end("finished")
        return self.engine.train_step_num

    def shutdown(self) -> None:
        """Stop the helpers this role started (the Redis ingester, data-parallel workers); safe to call twice."""
        if getattr(self, "heartbeat", None) is not None:
            self.heartbeat.stop()
        if self.ingester is not None:
            self.ingester.stop()
        if hasattr(self.engine, "shutdown"):
            self.engine.shutdown()

    def _end(self, reason: str) -> None:
        import ray

        self.shutdown()
        ray.get(self.synchronizer.mark_ended.remote("trainer", reason, self.role_id))
