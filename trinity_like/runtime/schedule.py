"""The schedule: how explorer steps and trainer steps relate, stated once, as pure functions.

An explorer step plans ``batch_size * repeat_times`` rows, but may write fewer: dynamic sampling drops groups
whose rewards are all equal, and a task that fails writes nothing. So every decision that depends on how far
the explorer has got is taken on the rows it has actually *written*, never on the steps it has run:

- the trainer step an explorer step feeds: ``c = rows_before // train_batch_size`` (rows written by earlier
  steps; an earlier step still running counts the rows it plans until it is written, so that several explorers
  running at once never admit a step too early);
- admission (AReaL's rule): the step may start once the published version is at least
  ``c - max_staleness`` (async), or the version of the trainer step that precedes it on the sync interval
  (sync: ``c - c % interval``), so no row it writes is staler than the bound when trained;
- whether to explore more: while the rows written, plus the rows planned by steps still running, fall short
  of what the trainer still needs (``total_steps * train_batch_size`` plus every row the trainer dropped:
  too stale or quarantined);
- ``sync_due``: whether the explorer loads the newest weights before its next step.

Worked example (batch_size 4, repeat_times 2 -> 8 planned rows per step; train_batch_size 12; interval 1):
explorer steps that write 8, 8, 8 rows feed trainer steps 0, 0, 1 (rows before: 0, 8, 16); in async mode with
max_staleness 1 they need versions 0, 0, 0; in sync mode 0, 0, 1. If step 1 writes only 3 rows (dynamic
sampling), step 2 has 11 rows before it: it still feeds trainer step 0 and needs version 0 in both modes,
where counting planned rows would have made a sync run wait for version 1, which needs rows nobody writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from trinity_like.common.errors import RunError
from trinity_like.config import Config


class ExplorerStalled(RunError):
    """The explorer wrote no rows for ``explorer.max_empty_steps`` steps in a row: the trainer would wait
    forever."""


@dataclass(frozen=True)
class Schedule:
    mode: str
    rows_per_step: int
    """Rows one explorer step plans: ``explorer.batch_size * explorer.repeat_times``."""
    train_batch_size: int
    total_steps: int
    """Trainer steps of the run."""
    interval: int
    offset: int
    max_staleness: int
    group_size: int = 1
    """Rows of one group (``explorer.repeat_times``): streaming rollout admits a step's groups one by one."""

    @classmethod
    def of(cls, cfg: Config) -> Schedule:
        sc = cfg.synchronizer
        return cls(mode=cfg.mode, rows_per_step=cfg.explorer.batch_size * cfg.explorer.repeat_times,
                   train_batch_size=cfg.train_batch_size, total_steps=cfg.trainer.total_steps,
                   interval=sc.interval, offset=sc.offset, max_staleness=sc.max_staleness,
                   group_size=cfg.explorer.repeat_times)

    @property
    def rows_needed(self) -> int:
        """Rows the trainer trains on over the whole run."""
        return self.total_steps * self.train_batch_size

    @property
    def planned_explore_steps(self) -> int:
        """Explorer steps that cover the run when every step writes all its planned rows (a lower bound, and
        the progress bar's total)."""
        return -(-self.rows_needed // self.rows_per_step)

    def trainer_step_fed(self, rows_before: int) -> int:
        """The trainer step (0-based) whose batch the next row goes into, ``rows_before`` rows having been
        written."""
        return rows_before // self.train_batch_size

    def version_needed(self, rows_before: int, bound: int | None = None) -> int:
        """The lowest policy version an explorer step may generate with, ``rows_before`` rows written before
        it (the admission rule); ``bound``: the staleness bound now (``max_staleness: auto``), else
        ``max_staleness``."""
        c = self.trainer_step_fed(rows_before)
        if self.mode == "sync":
            return c - c % self.interval
        return max(0, c - (self.max_staleness if bound is None else min(bound, self.max_staleness)))

    def rows_before_group(self, rows_before_step: int, position: int) -> int:
        """Rows trained before group ``position`` of an explorer step that has ``rows_before_step`` rows before it:
        streaming rollout admits each group by ``version_needed`` of this, so the rule that bounds a step's rows
        bounds each group's. It is AReaL's capacity rule: with ``r`` rows before it, a group feeds trainer step
        ``c = r // train_batch_size`` and starts iff the version ``v`` it would use has ``v >= c - S``, i.e. iff
        ``r < (v + S + 1) * train_batch_size``: at most ``S + 1`` batches ahead of the weights in use."""
        return rows_before_step + position * self.group_size

    def explore_more(self, rows_written: int, steps_running: int, rows_dropped: int = 0) -> bool:
        """Whether another explorer step is needed: the rows written, plus those planned by the
        ``steps_running`` steps not yet written, fall short of what the trainer needs, including the
        ``rows_dropped`` rows it will never train (too stale, quarantined)."""
        return rows_written + steps_running * self.rows_per_step < self.rows_needed + rows_dropped

    def sync_due(self, steps_done: int) -> bool:
        """Whether the explorer loads the newest weights before its next step, having done ``steps_done``."""
        return steps_done == 0 or (steps_done >= self.offset and (steps_done - self.offset) % self.interval == 0)


def rollout_mode(cfg: Config) -> str:
    """How the explorer generates: ``"stream"`` (groups one by one, each written as it ends, weights loaded while
    groups run: ``explorer.stream.StreamRollout``) only where ``explorer.rollout: stream`` has a bound to stream
    within (``mode: async`` and ``max_staleness > 0``; with ``auto``, its maximum); else ``"step"``
    (``explorer.step_rollout.StepRollout``). At bound 0 the admissible window is one trainer batch, nothing
    overlaps, and the step path keeps async(0) == sync. The one place this is decided."""
    streams = (cfg.explorer.rollout == "stream" and cfg.mode == "async" and cfg.synchronizer.max_staleness > 0)
    return "stream" if streams else "step"


def train_slack(cfg: Config) -> int:
    """``synchronizer.train_slack`` where it applies: mode ``async`` with a bound (``max_staleness > 0``), else 0.
    At bound 0 async is sync, bit for bit: a row that lands a version late (two roles racing) is dropped whole, as
    sync would never have made it, rather than trained with its tokens masked. The trainer's reader and loss mask
    and the explorer's cancelling of late groups all read it here, so they agree."""
    sc = cfg.synchronizer
    return sc.train_slack if cfg.mode == "async" and sc.max_staleness > 0 else 0


def on_new_version(cfg: Config) -> str:
    """What requests running when a version loads do (``explorer.stream.on_new_version``), as the engines and the
    streaming driver read it: ``finish`` wherever weights change only between steps (``rollout_mode`` step); under
    streaming the configured policy, with ``auto`` resolved to ``resubmit`` where an engine can cut a request at
    once (vLLM's async engine, the emulated one) or ``chunk_tokens`` cuts responses into pieces, else ``finish``.
    No anchor's streaming mode drains (PipelineRL and prime-rl keep, AReaL and verl abort and resume): a drain
    holds an engine's load until its longest response ends (8,192 tokens x 5.9 ms = 48 s at 7B)."""
    ex = cfg.explorer
    if rollout_mode(cfg) == "step":
        return "finish"
    if ex.stream.on_new_version != "auto":
        return ex.stream.on_new_version
    cuts = (ex.engine == "vllm" and ex.vllm.async_engine) or ex.engine == "emulated" or ex.stream.chunk_tokens > 0
    return "resubmit" if cuts else "finish"


def rollout_mode_note(cfg: Config) -> str | None:
    """The line the explorer logs where ``explorer.rollout: stream`` runs as step (``rollout_mode``), else None."""
    if cfg.explorer.rollout == "stream" and rollout_mode(cfg) == "step":
        return (f"explorer.rollout=stream at staleness bound 0 (or mode {cfg.mode}) runs as rollout=step: there is "
                "nothing to overlap")
    return None
