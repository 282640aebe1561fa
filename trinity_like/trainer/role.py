"""The trainer role: setup -> run -> shutdown. Reads batches from the buffer, trains, publishes weights.

Resume (``resume=True``): the trainer loads the newest full checkpoint (step s; none = step 0), the buffer's
ledger forgets every hand-out after s, so exactly the rows consumed after s are delivered again, and the
Synchronizer and CheckpointMonitor are told that versions above s are replaced (the trainer republishes s).

Stop (``request_stop``, from the job's SIGINT / SIGTERM): the step in progress finishes (a wait for data is
abandoned), then the ledger is committed and a checkpoint written, so a later resume loses nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from trinity_like.buffer import BufferConsumer
from trinity_like.buffer.partial import PartialStore
from trinity_like.common.errors import RunError, UserError
from trinity_like.common.offline import set_offline_env
from trinity_like.common.tokenizer import model_vocab_size
from trinity_like.config import Config
from trinity_like.runtime.checkpoints import resume_checkpoint, set_aside
from trinity_like.runtime.metrics import open_metrics_writer
from trinity_like.runtime.paths import RunPaths, namespace_of, read_run_id, redis_stream, redis_url
from trinity_like.runtime.run_home import RelayDrain, publish_run_home, written_explore_steps
from trinity_like.runtime.schedule import Schedule, train_slack
from trinity_like.trainer.engine import TRAINERS, TrainEngineWrapper
from trinity_like.weights.publish import PUBLISHERS

logger = logging.getLogger(__name__)


def make_train_engine(cfg: Config, synchronizer=None) -> TrainEngineWrapper:
    """The TrainEngineWrapper ``trainer.type`` names; spread over ``trainer.num_workers`` data-parallel workers
    (each holding that engine) when there is more than one."""
    from trinity_like.trainer.ppo import PPOTrainer  # noqa: F401  (registers trainer.type ppo; imported here, in
    # the role's process: the launcher imports this module too, and needs no torch)

    engine_cls = TRAINERS.get(cfg.trainer.type)
    if cfg.trainer.num_workers > 1:
        from trinity_like.trainer.workers import DataParallelTrainer

        return DataParallelTrainer(cfg, synchronizer)
    return engine_cls(cfg, synchronizer)


CONSUMER_NAME = "trainer"

_OOM_WORDS = ("out of memory", "can't allocate memory", "cannot allocate memory")


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it wraps (a Ray error from a data-parallel worker, a chained cause), is a
    failed allocation: ``torch.OutOfMemoryError`` (CUDA), torch's CPU allocator refusing ("DefaultCPUAllocator:
    can't allocate memory"), or Python's ``MemoryError``."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
            return True
        if isinstance(e, RuntimeError) and any(w in str(e).split("\n", 1)[0].lower() for w in _OOM_WORDS):
            return True
        e = getattr(e, "cause", None) or e.__cause__
    return False


def out_of_memory_message(cfg: Config, step: int, exc: BaseException, checkpointing: bool | None = None) -> str:
    """The one line a trainer step that ran out of memory ends the run with: where, and which setting to lower
    (``checkpointing``: whether the engine already recomputes activations; None = as configured)."""
    tr = cfg.trainer
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    first = first if len(first) <= 160 else first[:157] + "..."
    if tr.max_token_len_per_micro_batch:
        fix = f"lower trainer.max_token_len_per_micro_batch (now {tr.max_token_len_per_micro_batch})"
    else:
        fix = (f"lower trainer.micro_batch_size (now {tr.micro_batch_size}) or set "
               "trainer.max_token_len_per_micro_batch (a token budget per micro-batch)")
    if not (tr.gradient_checkpointing if checkpointing is None else checkpointing):
        fix += ", or turn on trainer.gradient_checkpointing"
    return (f"trainer step {step} ran out of memory ({first}); {fix}, then continue the run with --resume "
            "(nothing is lost: the step's experiences were not committed)")


class TrainerRole:
    """Runs as a Ray actor. In ``sync`` mode the launcher calls ``step()`` in lock-step with the explorer;
    in ``async`` mode ``run()`` loops on its own, bounded by ``synchronizer.max_staleness``; in ``offline``
    mode ``run()`` replays ``buffer.replay_sources`` epoch after epoch (nothing is consumed or published)."""

    def __init__(self, cfg: Config, resume: bool = False) -> None:
        set_offline_env()
        self.cfg = cfg
        self.schedule = Schedule.of(cfg)
        self.paths = RunPaths.of(cfg)
        self.resume = resume
        self.state = "starting"
        """running, waiting_data (for the explorers), stopped: sent with the heartbeats."""
        self._stop = threading.Event()
        """Set by ``request_stop`` (another thread of this actor): end after the step in progress."""
        self._saved_step = -1
        """The step of the last checkpoint this role wrote or loaded."""
        self.resumed_from: int | None = None

    def setup(self) -> None:
        import ray

        from trinity_like.synchronizer import Heartbeat, get_synchronizer

        sc = self.cfg.synchronizer
        self.synchronizer = get_synchronizer(namespace_of(self.cfg), sc.heartbeat_timeout_s,
                                             run_id=read_run_id(self.paths), run_dir=str(self.paths.run_dir))
        self.role_id = f"trainer-{socket.gethostname()}-{os.getpid()}"
        ray.get(self.synchronizer.register.remote("trainer", self.role_id, {
            "workers": self.cfg.trainer.num_workers, "run_dir": str(self.paths.run_dir),
            "node": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id()}))
        self.engine = None
        # heartbeats from now on: loading the model and the checkpoint may take longer than the timeout
        self.heartbeat = Heartbeat(self.synchronizer, self.role_id, lambda: {
            "version": self.engine.train_step_num if self.engine is not None else 0, "state": self.state}).start()
        self.auto_staleness = sc.auto_staleness.enabled  # only in mode async (validation)
        if self.auto_staleness:
            import dataclasses

            ray.get(self.synchronizer.configure_staleness.remote(dataclasses.asdict(sc.auto_staleness)))
        self.engine = make_train_engine(self.cfg, self.synchronizer)
        self.engine.prepare()
        resume_step = self._load_checkpoint() if self.resume else None
        b = self.cfg.buffer
        vocab_size = model_vocab_size(self.cfg.model.path)  # rows with ids past it are quarantined, not trained
        self.consumer = None if self.cfg.mode == "offline" else BufferConsumer(
            self.paths.buffer_dir, CONSUMER_NAME, policy=b.read_policy, priority=b.priority or None,
            where=b.where or None, max_uses=b.replay_max_uses, cooldown_steps=b.replay_cooldown_steps,
            resume_step=resume_step, mix=b.mix, mix_fill=b.mix_fill, vocab_size=vocab_size,
            train_slack=train_slack(self.cfg))
        self.metrics = open_metrics_writer(self.cfg, self.paths, role="trainer")
        self._last_end_check = 0.0
        self.ingester = None
        self.replay = None
        if self.cfg.mode == "offline":
            from trinity_like.buffer.ledger import Ledger
            from trinity_like.buffer.replay import ReplayReader, replay_data

            self.replay = ReplayReader(b.replay_sources, where=b.where or None, batch_size=self.cfg.train_batch_size,
                                       seed=self.cfg.seed, vocab_size=vocab_size,
                                       quarantine=Ledger(self.paths.buffer_dir, CONSUMER_NAME, create=False),
                                       data=replay_data(self.cfg))
            if not len(self.replay):
                raise UserError(f"buffer.replay_sources hold no rows{' matching buffer.where' if b.where else ''}: "
                                f"{', '.join(b.replay_sources)}")
            self._replay_epoch, self._replay_batches = 0, self.replay.epoch(0)
            for _ in range(self.engine.train_step_num):  # a resumed replay goes on where it stopped
                self._next_replay_batch()
        elif b.transport == "redis":
            from trinity_like.buffer.redis_transport import IngesterThread, RedisIngester

            self.ingester = IngesterThread(RedisIngester(
                redis_url(self.cfg), redis_stream(self.cfg), self.paths.buffer_dir,
                timeout_s=self.cfg.buffer.redis_timeout_s)).start()
        self.relay = None
        if self.cfg.mode != "offline":  # explorers on nodes without this run directory meet it here
            running = PartialStore(self.paths.buffer_dir).steps()  # cut off by a crash: taken up again
            ray.get(self.synchronizer.init_explore_steps.remote(written_explore_steps(self.paths), running))
            publish_run_home(self.cfg, self.paths, self.synchronizer)
            self.relay = RelayDrain(self.synchronizer, self.paths.run_dir).start()

        if resume_step is not None and self.replay is None:
            self._republish(resume_step)
        self.state = "running"

    def _load_checkpoint(self) -> int:
        """Load the newest intact checkpoint (if any) and return its step: the step the ledger, the Synchronizer
        and the weight versions resume from. Damaged ones after it (``resume_checkpoint``) are moved to
        ``checkpoints/damaged/`` and ``checkpoints/latest`` back to it, once it has loaded."""
        path, damaged = resume_checkpoint(self.paths.checkpoint_dir)
        if path is not None:
            self.engine.load_checkpoint(path)
            self._saved_step = self.engine.train_step_num
            if damaged:  # latest first (the run's CheckpointMonitor moves it, and saves move it on again), then
                # the damaged folders go: a crash in between leaves a pointer that names a complete checkpoint
                import ray

                from trinity_like.synchronizer import CheckpointMonitor

                ray.get(CheckpointMonitor.get_actor(namespace_of(self.cfg)).rollback.remote(self.engine.train_step_num))
            for bad, _ in damaged:  # what is wrong with each was logged by resume_checkpoint
                logger.warning("resumed from %s instead of damaged %s; moved it to %s", path.name, bad, set_aside(bad))
            logger.warning("trainer resumed from %s (step %d)", path, self.engine.train_step_num)
        self.resumed_from = self.engine.train_step_num
        return self.engine.train_step_num

    def _republish(self, step: int) -> None:
        """Versions above ``step`` came from the run this one replaces: let the Synchronizer take this
        trainer's versions from ``step`` on, drop the replaced version files, and publish ``step`` again."""
        import ray

        from trinity_like.synchronizer import CheckpointMonitor

        ray.get(self.synchronizer.trainer_resumed.remote(step))
        if PUBLISHERS.get(self.cfg.synchronizer.method).writes_files:  # version files the monitor tracks
            ray.get(CheckpointMonitor.get_actor(namespace_of(self.cfg)).rollback.remote(step))
        if step > 0 and ray.get(self.synchronizer.latest.remote()).version != step:
            self.engine.sync_weight()

    def _min_version(self) -> int | None:
        """The staleness bound of this step's rows, ``train_step - max_staleness``: with ``train_slack`` 0 the
        oldest model_version it trains on; with slack k a row is read when its newest token is at least this
        minus k, and the engine masks its older tokens (``common.train_bound``). In sync mode the lock-step
        schedule decides."""
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
        # wall-clock phase starts (unix s) for the timeline of `trinity-like plot`; the record's `time` is the end
        timeline = {"timeline/start_unix_s": time.time()}
        wait_start = time.perf_counter()
        if self.replay is not None:
            exps = self._next_replay_batch()
        else:
            exps = self._read_batch()
        wait_s = time.perf_counter() - wait_start
        timeline["timeline/train_start_unix_s"] = time.time()
        metrics = self._train(exps)
        step = self.engine.train_step_num
        if self.replay is not None:
            metrics["replay/epoch"] = float(self._replay_epoch)
            metrics["buffer/quarantined"] = float(self.replay.quarantined)
        elif step % self.cfg.synchronizer.interval == 0 or step == self.cfg.trainer.total_steps:
            timeline["timeline/sync_start_unix_s"] = time.time()
            sync_start = time.perf_counter()
            metrics.update(self.engine.sync_weight() or {})
            metrics["time/sync_s"] = time.perf_counter() - sync_start
        save = self.cfg.trainer.save_interval
        if step == self.cfg.trainer.total_steps or (save and step % save == 0):
            self.save()
        metrics["time/wait_data_s"] = wait_s
        metrics["trainer/version"] = float(step)
        if self.auto_staleness:  # the controller sees the step's signal and waits; the bound after it is logged
            import ray

            reported = {k: v for k, v in metrics.items() if k in ("off_policy/ess", "actor/pg_clipfrac",
                                                                   "time/wait_data_s", "time/train_step_s")}
            bound = ray.get(self.synchronizer.report_train.remote(step, len(exps), reported))
            if bound is not None:
                metrics["sync/staleness_bound"] = float(bound)
        metrics.update(timeline)
        if self.consumer is not None:
            metrics.update(self._buffer_metrics())
        self.metrics.write(step, metrics)
        return metrics

    def _buffer_metrics(self) -> dict[str, float]:
        """The reader's stats, and from them the mean response length of the rows dropped as stale and of the
        rows trained so far (running means: dropping long late groups biases training toward short ones)."""
        stats = self.consumer.stats()
        dropped, trained = stats["buffer/skipped_stale"], stats["buffer/delivered"]
        if dropped:
            stats["train/dropped_row_length_mean"] = stats["buffer/skipped_stale_tokens"] / dropped
        if trained:
            stats["train/trained_row_length_mean"] = stats["buffer/delivered_tokens"] / trained
        return stats

    def _train(self, exps: list) -> dict[str, float]:
        """One engine step. A step that runs out of memory ends the run with a RunError naming the setting to
        lower: nothing is lost, its rows stay pending in the ledger (a resume hands them out again)."""
        try:
            return self.engine.train_step(exps)
        except Exception as e:
            if not out_of_memory(e):
                raise
            raise RunError(out_of_memory_message(self.cfg, self.engine.train_step_num + 1, e,
                                                 getattr(self.engine, "checkpointing", None))) from e

    def save(self) -> None:
        """Commit the ledger, then write a full checkpoint of the current step. Ledger first: a crash between
        the two resumes from the previous checkpoint, whose resume discards this commit, so the rows are
        trained again rather than lost."""
        step = self.engine.train_step_num
        if self.replay is None:
            self.consumer.commit(step)
        self.engine.save_checkpoint()
        self._saved_step = step

    def _read_batch(self) -> list:
        """The next batch from the buffer; while none is ready the role's state says it waits for data.
        InterruptedError when no explorer will write more, or when asked to stop."""
        self.state = "waiting_data"
        try:
            return self.consumer.read(self.cfg.train_batch_size, self._min_version(),
                                      timeout_s=self.cfg.synchronizer.timeout_s, step=self.engine.train_step_num + 1,
                                      should_stop=self._no_more_data)
        finally:
            self.state = "running"

    def batch_ready(self) -> bool:
        """Whether the buffer holds the next step's batch (sync mode explores until it does: an explorer step
        may write fewer rows than it planned)."""
        return self.consumer.ready(self.cfg.train_batch_size, self._min_version(), step=self.engine.train_step_num + 1)

    def _no_more_data(self) -> bool:
        """Asked on every buffer poll: stop requested, or every explorer step written and read (asks the
        synchronizer at most once a second). A dead explorer is not an end: the trainer waits for another."""
        import ray

        if self._stop.is_set():
            return True
        if self.ingester is not None and self.ingester.error is not None:
            if isinstance(self.ingester.error, RunError):  # Redis unreachable, a full disk: one line, as it is
                raise self.ingester.error
            raise RuntimeError(f"the redis ingester stopped: {self.ingester.error}")
        now = time.monotonic()
        if now - self._last_end_check < 1.0:
            return False
        self._last_end_check = now
        stats = self.consumer.stats()
        dropped = stats["buffer/skipped_stale"] + stats.get("buffer/quarantined", 0.0)
        self.synchronizer.report_dropped.remote(int(dropped))
        return ray.get(self.synchronizer.explore_finished.remote(self.schedule))

    def run(self) -> int:
        """Train until ``trainer.total_steps`` or ``request_stop``; return the final version."""
        try:
            while self.engine.train_step_num < self.cfg.trainer.total_steps and not self._stop.is_set():
                try:
                    self.step()
                except InterruptedError:
                    if not self._stop.is_set():
                        raise
        except BaseException as e:
            self._end(f"failed: {type(e).__name__}: {e}")
            raise
        if self._stop.is_set() and self.engine.train_step_num < self.cfg.trainer.total_steps:
            if self._saved_step != self.engine.train_step_num:
                self.save()
            self._end("stopped")
        else:
            self._end("finished")
        return self.engine.train_step_num

    def request_stop(self) -> None:
        """End ``run()`` cleanly after the step in progress (SIGINT / SIGTERM of the job)."""
        self._stop.set()

    def role_info(self) -> dict:
        """Who this role is and where it trains: ``device`` of the (rank 0) engine and the ``gpus`` Ray gave this
        role's process (with data-parallel workers the workers hold them)."""
        import ray

        return {"role_id": self.role_id, "state": self.state, "version": self.engine.train_step_num,
                "resumed_from": self.resumed_from, "device": str(getattr(self.engine, "device", "cpu")),
                "gpus": ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0)}

    def shutdown(self) -> None:
        """Stop the helpers this role started (the Redis ingester, data-parallel workers) and close the monitors;
        safe to call twice."""
        if getattr(self, "heartbeat", None) is not None:
            self.heartbeat.stop()
        if self.ingester is not None:
            self.ingester.stop()
        if getattr(self, "relay", None) is not None:
            self.relay.stop()  # what the explorers relayed to the last moment
            self.relay = None
        if hasattr(self.engine, "shutdown"):
            self.engine.shutdown()
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()

    def _end(self, reason: str) -> None:
        import ray

        self.state = "stopped"
        self.shutdown()
        ray.get(self.synchronizer.mark_ended.remote("trainer", reason, self.role_id))
