"""The explorer role: setup -> run -> shutdown.

``setup`` starts the engines and builds the parts a rollout driver runs steps with (``rollout.RolloutParts``:
the task set, the workflow, the reward, the buffer's writer, the metrics writer), then picks the driver, decided
once by ``runtime.schedule.rollout_mode``: ``StepRollout`` (``step_rollout``: a step generated whole, then
written, weights swapped between steps) or ``StreamRollout`` (``stream``: groups admitted one by one, each written
as it ends, weights loaded while groups run). ``run`` hands the claim-and-explore loop to that driver and marks the
explorer ended; ``shutdown`` stops the engines. ``step`` runs one step of the step driver (lock-step driving by
the launcher in mode sync).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
from functools import partial

from trinity_like.algorithms.rewards import load_reward_manager
from trinity_like.buffer import BufferWriter
from trinity_like.buffer.partial import PartialStore
from trinity_like.common.offline import set_offline_env
from trinity_like.common.plugins import import_plugins
from trinity_like.common.tasks import load_taskset
from trinity_like.config import Config
from trinity_like.explorer.evaluation import apply_prompt_limit
from trinity_like.explorer.reward_model import start_reward_model
from trinity_like.explorer.rollout import Progress, RolloutParts
from trinity_like.explorer.step_rollout import StepRollout
from trinity_like.explorer.stream import StreamRollout
from trinity_like.explorer.workflow_base import explorer_context
from trinity_like.explorer.workflows import workflow_for
from trinity_like.runtime.metrics import open_metrics_writer
from trinity_like.runtime.paths import RunPaths, namespace_of, read_run_id, redis_stream, redis_url
from trinity_like.runtime.run_dir import explorer_needs_run_dir, prepare_eval_tasksets
from trinity_like.runtime.run_home import RunFiles, join_run_home, written_explore_steps
from trinity_like.runtime.schedule import rollout_mode, rollout_mode_note
from trinity_like.synchronizer.synchronizer import Heartbeat

logger = logging.getLogger(__name__)


class ExplorerRole:
    """Runs as an async Ray actor; the engines are actors of their own (``EngineFleet``)."""

    def __init__(self, cfg: Config) -> None:
        set_offline_env()
        self.cfg = cfg
        self.paths = RunPaths.of(cfg)
        self.progress = Progress()
        """Where the explorer stands: its driver writes it; ``role_info`` and the heartbeat read it."""
        self.fleet = None
        self.driver: StepRollout | StreamRollout | None = None
        """The rollout driver ``setup`` picked (``rollout_mode``)."""

    async def setup(self) -> None:
        """Join the run, build the parts, pick the driver."""
        await self._join_run()
        self.parts = await self._build_parts()
        note = rollout_mode_note(self.cfg)
        if note:
            logger.info(note)
        self.driver = StreamRollout(self.parts) if rollout_mode(self.cfg) == "stream" else StepRollout(self.parts)

    async def run(self, num_steps: int | None = None) -> int:
        """Claim and run steps of the run's sequence (the driver's loop) until the rows written cover what the
        trainer needs (and no live trainer asks for more), the trainer finishes, or ``request_stop``; mark the
        explorer ended; return the steps this explorer ran."""
        try:
            await self.driver.run(num_steps)
        except BaseException as e:
            await self.synchronizer.mark_ended.remote("explorer", f"failed: {type(e).__name__}: {e}", self.role_id)
            raise
        await self.synchronizer.mark_ended.remote("explorer", "stopped" if self.progress.stop else "finished",
                                                  self.role_id)
        return self.progress.steps_done

    async def shutdown(self) -> None:
        if getattr(self, "heartbeat", None) is not None:
            self.heartbeat.stop()
        if self.fleet is not None:
            self.fleet.kill()
        if getattr(self, "reward_model", None) is not None:
            self.reward_model.stop()
        if getattr(self, "sender", None) is not None:
            await self.sender.close()
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()

    # ------------------------------------------------------------ setup's parts
    async def _join_run(self) -> None:
        """Register with the run's Synchronizer, find the run directory (or the trainer's, relayed to), tell the
        Synchronizer the steps already written or cut off, and start heartbeats."""
        import ray

        from trinity_like.synchronizer import get_synchronizer

        sc = self.cfg.synchronizer
        shared = explorer_needs_run_dir(self.cfg)  # else the run comes from the trainer, through the Synchronizer
        local_id = read_run_id(self.paths)
        self.synchronizer = get_synchronizer(namespace_of(self.cfg), sc.heartbeat_timeout_s,
                                             run_id=local_id if shared else None, run_dir=str(self.paths.run_dir))
        self.role_id = f"explorer-{socket.gethostname()}-{os.getpid()}"
        await self.synchronizer.register.remote("explorer", self.role_id, {
            "engines": self.cfg.explorer.num_engines, "run_dir": str(self.paths.run_dir),
            "node": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id()})
        if sc.auto_staleness.enabled:  # only in mode async (validation)
            await self.synchronizer.configure_staleness.remote(dataclasses.asdict(sc.auto_staleness))
        self.home = None if shared else await join_run_home(self.cfg, self.synchronizer, sc.timeout_s)
        # the trainer's run directory is this one (shared, or the same node): write there; else relay to it
        self.files = RunFiles(self.paths, self.synchronizer, relay=self.home is not None and self.home.run_id != local_id)
        written = await asyncio.to_thread(written_explore_steps, self.paths) if shared else {}
        # steps cut off mid-way by a crash (streaming rollout) are taken up again, whatever the buffer holds of them
        running = PartialStore(self.paths.buffer_dir).steps() if shared and self.cfg.buffer.transport == "file" else []
        await self.synchronizer.init_explore_steps.remote(written, running)  # off the filesystem: the trainer did
        self.progress.next_step = max(written) + 1 if written else 0  # lock-step driving resumes after them
        # heartbeats from now on: starting the engines may take longer than the heartbeat timeout
        self.heartbeat = Heartbeat(self.synchronizer, self.role_id, lambda: {
            "version": self.fleet.version if self.fleet is not None else 0, "state": self.progress.state,
            "engines": self.fleet.engine_versions() if self.fleet is not None else None,
            "groups_in_flight": self.driver.in_flight if self.driver is not None else None}).start()

    async def _build_parts(self) -> RolloutParts:
        """The task sets (a prompt over ``explorer.max_prompt_tokens`` stops the explorer here, in one line), the
        engines, the reward model, the workflow and reward, the buffer's writer (or Redis sender), the metrics."""
        from trinity_like.common.tokenizer import hf_tokenizer
        from trinity_like.explorer.fleet import EngineFleet

        self.tokenizer = hf_tokenizer(self.cfg.model.path)
        # the task sets before the engines start: a prompt over explorer.max_prompt_tokens stops the explorer
        # here, in one line, rather than failing its task at every step
        tasks = self.home.tasks if self.home else load_taskset(self.paths.taskset)
        eval_tasks = self.home.eval_tasks if self.home else prepare_eval_tasksets(self.cfg)
        tasks = apply_prompt_limit(self.cfg, self.tokenizer, tasks, "the training task set")
        eval_tasks = {name: apply_prompt_limit(self.cfg, self.tokenizer, ts, f"eval task set '{name}'")
                      for name, ts in eval_tasks.items()}
        self.fleet = EngineFleet(self.cfg)
        self.reward_model = start_reward_model(self.cfg)  # loads while the engines do
        await self.fleet.ready()
        if self.reward_model is not None:
            await self.reward_model.ready()
        import_plugins(self.cfg.explorer.plugin_dirs)  # users' workflows and reward functions register on import
        workflow = workflow_for(self.cfg)  # the task set's, or each row's (format.workflow_key)
        reward_manager = load_reward_manager(self.cfg, self.tokenizer)
        writer = self.sender = None
        if self.cfg.buffer.transport == "redis":
            from trinity_like.buffer.redis_transport import RedisSender

            self.sender = RedisSender(redis_url(self.cfg), redis_stream(self.cfg), timeout_s=self.cfg.buffer.redis_timeout_s)
        else:
            writer = BufferWriter(self.paths.buffer_dir, writer_id="explorer", capacity=self.cfg.buffer.capacity)
        self.metrics = open_metrics_writer(self.cfg, self.paths, role="explorer",
                                           relay=partial(self.files.relay_only, "metrics.jsonl"))
        return RolloutParts(
            self.cfg, files=self.files, workflow=workflow, fleet=self.fleet, tasks=tasks, eval_tasks=eval_tasks,
            base_ctx=explorer_context(self.cfg, self.tokenizer, reward_manager, self.reward_model),
            reward_manager=reward_manager, writer=writer, sender=self.sender, metrics=self.metrics,
            synchronizer=self.synchronizer, role_id=self.role_id, progress=self.progress)

    # ------------------------------------------------------------ driven from outside
    async def step(self, step: int | None = None) -> dict[str, float]:
        """Run explorer step ``step`` (default: the next one of this explorer) and write its experiences: lock-step
        driving (the launcher's mode sync), always by the step driver."""
        if not isinstance(self.driver, StepRollout):
            raise RuntimeError("ExplorerRole.step drives step rollout; this explorer streams (rollout_mode): call run()")
        return await self.driver.step(step)

    async def drain(self) -> dict[str, float] | None:
        """Write what the step driver's stragglers (``over_rollout_frac``) still produce."""
        return await self.driver.drain() if isinstance(self.driver, StepRollout) else None

    async def evaluate(self) -> dict[str, float]:
        """Every eval task set with the weights loaded now."""
        return await self.parts.evaluate()

    async def request_stop(self) -> None:
        """Finish the step (streaming: the groups) in progress, write it, and end ``run()`` (SIGINT / SIGTERM of
        the job)."""
        self.progress.stop = True

    async def role_info(self) -> dict:
        return {"role_id": self.role_id, "state": self.progress.state, "version": self.fleet.version,
                "next_step": self.progress.next_step}
