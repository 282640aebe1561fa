"""Streaming rollout (``explorer.rollout: stream``): groups start one by one as the staleness bound admits
each, are written as soon as they end, and a new version is loaded as soon as it is published, while groups run.

The explorer claims steps of the run's sequence as in step mode, so a step's tasks, seeds and group ids are the
same whichever way it runs; but a step is no longer a unit of generation. Group ``p`` of step ``s`` starts as soon
as an engine holds the version ``Schedule.version_needed(rows_before_group(rows_before(s), p))`` (AReaL's capacity
rule, per group), on the engines that hold it (``EngineFleet.at_least``: a load need not reach every engine, whose
slowest may be draining a long response, before groups of the new version start), and every admitted group runs
at once (``stream.max_groups_in_flight`` caps them): the engines
hold work whenever any is admissible, instead of idling while each step's longest response ends. A finished group
waits at most ``stream.flush_s`` to share a segment with others. When the last group of a step is written, the
step is finished in the Synchronizer and one metrics record is written for it, as in step mode (the records of
steps that overlap in time overlap too).

Weights: each engine ends the requests it holds on the weights they started on (an ``hf`` engine runs one call at a
time, so a load waits behind the calls queued before it; vLLM's gate drains its requests first), and every sample
carries the version that made it, so ``model_version`` and the trainer's corrections stay exact.

Late groups: when a version ``V`` is published, under ``on_new_version: finish`` a running group whose latest
engine call could run at most on a version older than ``V - max_staleness - synchronizer.train_slack`` can have no
token trained any more (the trainer masks older tokens, ``common.train_bound``), so it is cancelled (``late_groups``)
and ends with no rows, as a failed group does (``rollout/cancelled_groups``); under ``resubmit`` and ``keep`` the
tokens after a load carry the new version and no group is cancelled. The version a call runs on is noted when it
is made (``CallVersions``): the newest an engine holds, or the one loading; a call that waits in the fleet for an
engine across a whole load runs on a newer one than noted. Cancelling ends the explorer's wait; the engine's
request itself runs on (the fleet does not abort it). ``rollout/group_latency_versions``: the mean, over a step's
written groups, of the fleet's version when the group was written less the version it started on.

A stop request (or the trainer finishing) admits no more groups: the running ones end and are written, and a step
left part-written is finished with the rows it wrote, as a step whose groups were filtered is (later steps make up
the rows; its unstarted tasks are skipped this pass).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from trinity_like.buffer import explore_group_rows
from trinity_like.buffer.partial import PartialStore
from trinity_like.common.experience import Experience
from trinity_like.common.tasks import Task
from trinity_like.common.train_bound import row_trainable
from trinity_like.explorer.continuing import ContinuingEngine, GroupJournal
from trinity_like.explorer.fleet import WeightsLoadFailed
from trinity_like.explorer.rollout import Finished, RolloutParts
from trinity_like.runtime.schedule import on_new_version, train_slack

logger = logging.getLogger(__name__)

VERSION_POLL_S = 5.0
"""Longest one wait for a newer version lasts before it is asked again (a stop request is seen at once anyway)."""
RETRY_LOAD_S = 1.0
"""Pause before a version that failed to load is tried again."""


@dataclass
class _Step:
    """One claimed explorer step while its groups run."""

    step: int
    tasks: list[Task]
    positions: list[int]
    """The positions (indices into ``tasks``) this explorer runs: all of them, less the groups of a redone step
    already in the buffer."""
    earlier_rows: int
    """Rows of this step's groups already in the buffer when it was claimed."""
    opened: float
    """``time.perf_counter()`` when it was claimed."""
    timeline: dict[str, float]
    eval_metrics: dict[str, float]
    started: int = 0
    """Groups started (``positions[:started]``)."""
    ended: int = 0
    """Groups written, filtered or failed."""
    rows: list[Experience] = field(default_factory=list)
    failed: int = 0
    filtered: int = 0
    cancelled: int = 0
    """Groups cancelled when a version was published: no token of theirs could be trained (``late_groups``)."""
    latency_versions: list[int] = field(default_factory=list)
    """Per written group: the fleet's version when it was written minus the version it started on."""
    wait_s: float = 0.0
    """Time an admissible engine slot waited for a version this step's next group needs."""
    resumed_tokens: int = 0
    """Tokens its groups took from their journals (generated before a restart) instead of generating them."""
    discarded: int = 0
    """Journals dropped as too old for the bound (the group was generated again)."""
    buffer_wait_s: float = 0.0
    first_start: float | None = None

    @property
    def complete(self) -> bool:
        return self.ended == len(self.positions)

    @property
    def all_started(self) -> bool:
        return self.started == len(self.positions)


@dataclass
class _Loads:
    """Weight loads since the last step record."""

    bytes: float = 0.0
    seconds: float = 0.0
    count: int = 0
    cuda_ipc: int = 0
    """Loads of those whose bytes came over CUDA IPC (``WeightsInfo.transport``)."""


class StreamRollout:
    """Runs the explorer's claim-and-explore loop group by group (see the module docstring)."""

    def __init__(self, parts: RolloutParts) -> None:
        self.parts = parts
        self.progress = parts.progress
        self.cfg = parts.cfg.explorer.stream
        self.steps: dict[int, _Step] = {}
        self.running: dict[asyncio.Future, tuple[int, int]] = {}
        """Group task -> (step, position)."""
        self.done: list[Finished] = []
        """Groups ended and not yet written: (step, position, task, group or None when it failed)."""
        self.first_done: float | None = None
        self.loads = _Loads()
        self.groups_written = 0
        self._blocked_since: float | None = None
        self._last_progress = time.perf_counter()
        self.on_new_version = on_new_version(parts.cfg)
        """``explorer.stream.on_new_version`` with ``auto`` resolved (``runtime.schedule.on_new_version``)."""
        self.resubmit = self.on_new_version == "resubmit"
        self.store = (PartialStore(parts.paths.buffer_dir) if self.cfg.keep_partial and parts.writer is not None
                      else None)
        """Where each group's engine calls are journaled as they go (``keep_partial``, file transport)."""
        self.counts = {"pieces": 0}
        self.journals: dict[tuple[int, int], GroupJournal] = {}
        """(step, position) -> the journal of a group running or ended and not yet written."""
        self._calls_seen = 0
        self.call_versions: dict[tuple[int, int], int] = {}
        """(step, position) -> the newest version the latest engine call of a running group can run on (under
        ``on_new_version: finish`` only, where a call's tokens all have the version it starts on)."""
        self.loading: int | None = None
        """The version being loaded now, if any: a call made meanwhile may run on it."""
        self.cancelled: set[tuple[int, int]] = set()
        """Groups cancelled and not yet counted by a flush."""

    @property
    def in_flight(self) -> int:
        """Groups generating now (the heartbeat's ``groups_in_flight``)."""
        return len(self.running)

    async def run(self, num_steps: int | None = None) -> None:
        parts, sync, fleet = self.parts, self.parts.synchronizer, self.parts.fleet
        watch: asyncio.Future | None = None
        loader: asyncio.Future | None = None
        exhausted = False
        next_claim = 0.0
        while True:
            stopping = self.progress.stop or (await sync.ended.remote()).get("trainer") == "finished"
            if not stopping and not exhausted and time.monotonic() >= next_claim and all(
                    s.all_started for s in self.steps.values()):
                step = await sync.claim_explore_step.remote(parts.role_id, parts.schedule, num_steps)
                if step is not None:
                    await self._open(step)
                elif num_steps is None and await sync.alive.remote("trainer"):
                    next_claim = time.monotonic() + 1.0  # covered for now; the trainer may still drop rows
                else:
                    exhausted = True
            if not stopping:
                await self._admit()
            if self._should_flush(stopping):
                await self._flush()
            if not self.running and not self.done and (stopping or (exhausted and not self.steps)):
                break
            if loader is None and watch is None and not stopping:
                watch = asyncio.ensure_future(_ray(sync.wait_for_version.remote(fleet.version + 1,
                                                                                VERSION_POLL_S, False)))
            waiting = set(self.running) | {f for f in (watch, loader) if f is not None}
            finished: set[asyncio.Future] = set()
            if waiting:
                finished, _ = await asyncio.wait(waiting, timeout=self._wait_s(next_claim),
                                                 return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(self._wait_s(next_claim))
            for fut in finished:
                if fut is watch:
                    watch = None
                    info = None if fut.exception() else fut.result()
                    if info is not None and info.version > fleet.version:
                        self._cancel_late(info.version)
                        loader = asyncio.ensure_future(self._load(info))
                elif fut is loader:
                    loader = None
                    fut.result()  # a load that failed for good raised there
                elif fut in self.running:  # not cancelled meanwhile
                    step, position = self.running.pop(fut)
                    self.call_versions.pop((step, position), None)
                    self.done.append((step, position, self.steps[step].tasks[position], fut.result()))
                    self.first_done = self.first_done or time.perf_counter()
                    self._last_progress = time.perf_counter()
        for fut in (watch, loader):
            if fut is not None:
                fut.cancel()
        for state in list(self.steps.values()):  # stopped: a step part-written ends with the rows it wrote
            if state.started:
                await self._finish(state)
            elif self.store is not None:  # claimed, never begun: nothing journaled to keep
                self.store.drop_step_if_empty(state.step)

    def _wait_s(self, next_claim: float) -> float:
        """How long the loop may wait for a group, a version or a load before it looks again: until the ended
        groups are due to be written, the next claim, or a second."""
        wait = 1.0
        if self.done:
            wait = self.first_done + self.cfg.flush_s - time.perf_counter()
        if next_claim:
            wait = min(wait, next_claim - time.monotonic())
        return max(0.01, min(wait, 1.0))

    # ------------------------------------------------------------ claiming and admission
    async def _open(self, step: int) -> None:
        parts = self.parts
        timeline = {"timeline/start_unix_s": time.time()}
        timeline["timeline/eval_start_unix_s"] = time.time()
        eval_metrics = await parts.maybe_evaluate(step)
        tasks = parts.tasks_for_step(step)
        written: dict[int, int] = {}
        if await parts.synchronizer.explore_step_redone.remote(step) and parts.writer is not None:
            written = await asyncio.to_thread(explore_group_rows, parts.paths.buffer_dir, step)
            if written:
                logger.warning("explorer step %d was handed over with %d of its %d groups written; running the other "
                               "%d", step, len(written), len(tasks), len(tasks) - len(written))
        positions = [p for p in range(len(tasks)) if p not in written]
        if self.store is not None:
            self.store.open_step(step)
        state = _Step(step, tasks, positions, sum(written.values()), time.perf_counter(), timeline, eval_metrics)
        self.steps[step] = state
        if not positions:  # every group was written before: only the Synchronizer has to hear it
            await self._finish(state)

    async def _admit(self) -> None:
        """Start every group the staleness bound admits now, in the run's order (a later group never needs an
        older version than an earlier one, so the first refused one ends the pass)."""
        parts, sync, schedule = self.parts, self.parts.synchronizer, self.parts.schedule
        cap = self.cfg.max_groups_in_flight
        bound = await sync.staleness_bound.remote() if parts.auto_staleness else None
        for state in sorted(self.steps.values(), key=lambda s: s.step):
            if state.all_started:
                continue
            rows_before = await sync.rows_before.remote(state.step, schedule.rows_per_step)
            while not state.all_started:
                if cap and len(self.running) >= cap:
                    return
                position = state.positions[state.started]
                need = schedule.version_needed(schedule.rows_before_group(rows_before, position), bound)
                if parts.fleet.newest_version < need:  # one engine holding it is enough: the group runs there
                    self._blocked(state, need)
                    return
                self._unblocked(state)
                self._start(state, need)
        self._blocked_since = None

    def _blocked(self, state: _Step, need: int) -> None:
        now = time.perf_counter()
        if self._blocked_since is None:
            self._blocked_since = now
            self.progress.state = "require_sync"
        timeout = self.parts.cfg.synchronizer.timeout_s
        if not self.running and now - max(self._blocked_since, self._last_progress) > timeout:
            raise TimeoutError(f"no policy version >= {need} was published within {timeout:.0f}s: is the trainer "
                               "running?")

    def _unblocked(self, state: _Step) -> None:
        if self._blocked_since is not None:
            state.wait_s += time.perf_counter() - self._blocked_since
            self._blocked_since = None
            self.progress.state = "running"

    def _start(self, state: _Step, need: int) -> None:
        parts, position = self.parts, state.positions[state.started]
        if state.first_start is None:
            state.first_start = time.perf_counter()
            state.timeline["timeline/rollout_start_unix_s"] = time.time()
        task = state.tasks[position]
        fut = asyncio.ensure_future(parts.run_task(task, parts.context(state.step, position),
                                                   self._engine(state, position, need)))
        self.running[fut] = (state.step, position)
        state.started += 1

    def _engine(self, state: _Step, position: int, need: int):
        """What the group's workflow calls: the fleet's engines that hold ``need`` (``finish``, no journal), else
        that view interruptible (``resubmit``; in pieces of ``chunk_tokens``) and journaling every piece
        (``keep_partial``), taking up what a journal left by a killed explorer holds of this group."""
        fleet = self.parts.fleet.at_least(need)
        journal = None
        if self.store is not None:
            journal = GroupJournal(self.store, state.step, position, need)
            state.discarded += journal.discarded
            self.journals[(state.step, position)] = journal
        if journal is None and not self.resubmit:
            engine = fleet
        else:
            engine = ContinuingEngine(fleet, self.cfg.chunk_tokens, self.resubmit, journal, self.counts)
        if self.on_new_version != "finish":
            return engine
        key = (state.step, position)
        return CallVersions(engine, lambda: self._note_call(key))

    def _note_call(self, key: tuple[int, int]) -> None:
        """A group's workflow makes an engine call: the newest version it can run on is the newest an engine
        holds, or the one loading now."""
        newest = max(self.parts.fleet.newest_version, self.loading if self.loading is not None else -1)
        self.call_versions[key] = max(self.call_versions.get(key, -1), newest)

    def _cancel_late(self, published: int) -> None:
        """Version ``published`` is out (about to load): cancel the running groups none of whose tokens could be
        trained any more (``late_groups``); each ends with no rows, as a failed group does, so its step still
        finishes. Decided before the load: under ``finish`` the load waits for the calls in flight, the long
        responses these groups are waiting for."""
        sc = self.parts.cfg.synchronizer
        running = {key: fut for fut, key in self.running.items() if not fut.done()}
        versions = {key: v for key, v in self.call_versions.items() if key in running}
        for key in late_groups(versions, published, sc.max_staleness, train_slack(self.parts.cfg),
                               self.on_new_version):
            fut = running[key]
            fut.cancel()
            del self.running[fut]
            self.call_versions.pop(key, None)
            self.cancelled.add(key)
            step, position = key
            self.done.append((step, position, self.steps[step].tasks[position], None))
            self.first_done = self.first_done or time.perf_counter()
            logger.info("explorer step %d, group %d cancelled: its tokens (version %d) are older than version %d "
                        "less max_staleness %d and train_slack %d, so none could be trained", step, position,
                        versions[key], published, sc.max_staleness, train_slack(self.parts.cfg))

    # ------------------------------------------------------------ weights
    async def _load(self, info) -> None:
        """Load a published version while groups run; a version that fails to load (a damaged file) is logged
        and asked for again after a pause, the previous one serving meanwhile."""
        parts = self.parts
        start = time.perf_counter()
        self.loading = info.version
        try:
            size = await parts.fleet.update_weights(info)
        except WeightsLoadFailed as e:
            self.progress.sync_failures += 1
            logger.warning("version %d did not load (%s); the explorer keeps version %d and tries again", info.version,
                           e, parts.fleet.version)
            await asyncio.sleep(RETRY_LOAD_S)
            return
        finally:
            self.loading = None
        self.loads.bytes += float(size)
        self.loads.seconds += time.perf_counter() - start
        self.loads.count += 1
        self.loads.cuda_ipc += info.transport == "CUDA IPC"
        await parts.synchronizer.heartbeat.remote(parts.role_id, version=parts.fleet.version)

    # ------------------------------------------------------------ writing
    def _should_flush(self, stopping: bool) -> bool:
        if not self.done:
            return False
        due = time.perf_counter() - self.first_done >= self.cfg.flush_s
        full = self.cfg.flush_groups and len(self.done) >= self.cfg.flush_groups
        return bool(due or full or stopping or not self.running or self._completes_a_step())

    def _completes_a_step(self) -> bool:
        """The ended groups include a step's last one: the trainer's batch may be waiting for it."""
        ending: dict[int, int] = {}
        for step, *_ in self.done:
            ending[step] = ending.get(step, 0) + 1
        return any(self.steps[s].ended + n == len(self.steps[s].positions) for s, n in ending.items())

    async def _flush(self) -> None:
        """Write the ended groups as one segment; finish each step whose last group that was."""
        parts = self.parts
        done, self.done, self.first_done = self.done, [], None
        cancelled = {(d[0], d[1]) for d in done} & self.cancelled
        self.cancelled -= cancelled
        parts.check_rewards(min(s for s, *_ in done), done)
        rows: list[Experience] = []
        for step in sorted({s for s, *_ in done}):
            state = self.steps[step]
            mine = [d for d in done if d[0] == step]
            state.cancelled += sum(s == step for s, _ in cancelled)
            exps, failed, filtered = parts.stamp([d for d in mine if (d[0], d[1]) not in cancelled])
            state.rows.extend(exps)
            state.failed += failed
            state.filtered += filtered
            state.ended += len(mine)
            state.latency_versions.extend(group_latency_versions(exps, parts.fleet.version))
            rows.extend(exps)
        wait_s = await parts.write_rows(rows)
        self.groups_written += len(done) - len(cancelled)
        for step, position, *_ in done:  # in the buffer now: the buffer decides, the journal goes
            journal = self.journals.pop((step, position), None)
            if journal is not None:
                self.steps[step].resumed_tokens += journal.resumed_tokens
                self.store.drop_group(step, position)
        for step in sorted({s for s, *_ in done}):
            state = self.steps[step]
            state.buffer_wait_s += wait_s
            if state.complete:
                await self._finish(state)

    async def _finish(self, state: _Step) -> None:
        """The step's rows are all in the buffer: tell the Synchronizer, write its metrics record."""
        parts, fleet, progress = self.parts, self.parts.fleet, self.progress
        del self.steps[state.step]
        await parts.synchronizer.finish_explore_step.remote(state.step, state.earlier_rows + len(state.rows))
        if self.store is not None:
            self.store.drop_step(state.step)
        progress.steps_done += 1
        progress.next_step = max(progress.next_step, state.step + 1)
        parts.count_empty(state.earlier_rows + len(state.rows))
        start = state.first_start or state.opened
        elapsed = time.perf_counter() - start - state.buffer_wait_s
        metrics = parts.step_metrics(state.rows, elapsed)
        if state.rows:  # the rows' own (oldest) version: loads go on while a step's groups run
            metrics["rollout/model_version"] = float(min(e.model_version for e in state.rows))
        metrics.update({
            "rollout/failed_tasks": float(state.failed), "rollout/filtered_groups": float(state.filtered),
            "rollout/engine_restarts": float(fleet.restarts), "time/wait_buffer_s": state.buffer_wait_s,
            "rollout/engine_busy_frac": parts.engine_busy_frac(),
            "rollout/admission_wait_s": state.wait_s, "sync/wait_s": state.wait_s,
            "rollout/groups_in_flight": float(len(self.running)), "rollout/groups_written": float(self.groups_written),
            "rollout/groups_unstarted": float(len(state.positions) - state.started),
            "rollout/groups_taken_over": float(len(state.tasks) - len(state.positions)),
            "rollout/mixed_version_rows": float(sum(e.token_versions is not None for e in state.rows)),
            "rollout/engine_calls": float(self._take_calls()),
            "rollout/partial_resumed_tokens": float(state.resumed_tokens),
            "rollout/partial_discarded": float(state.discarded),
            "rollout/cancelled_groups": float(state.cancelled),
            "rollout/group_latency_versions": (sum(state.latency_versions) / len(state.latency_versions)
                                               if state.latency_versions else 0.0),
            "sync/version": float(fleet.version), "sync/failures": float(progress.sync_failures),
            "sync/fingerprint_mismatches": float(fleet.fingerprint_mismatches),
            **self._take_loads(), **state.eval_metrics, **state.timeline})
        if parts.auto_staleness:
            metrics["sync/staleness_bound"] = float(await parts.synchronizer.report_explore.remote(state.wait_s))
        parts.metrics.write(state.step + 1, metrics)

    def _take_calls(self) -> int:
        """Engine calls of pieces (``chunk_tokens``) since the last step record; 0 without pieces."""
        calls, self._calls_seen = self.counts["pieces"] - self._calls_seen, self.counts["pieces"]
        return calls

    def _take_loads(self) -> dict[str, Any]:
        loads, self.loads = self.loads, _Loads()
        return {"sync/bytes": loads.bytes, "sync/seconds": loads.seconds, "sync/loads": float(loads.count),
                "sync/cuda_ipc": float(loads.cuda_ipc)}


async def _ray(ref) -> Any:
    return await ref


class CallVersions:
    """An engine view that calls ``note()`` before each ``generate`` / ``chat`` (``StreamRollout`` notes the newest
    version each call of a group can run on); everything else is the view's own."""

    def __init__(self, engine: Any, note) -> None:
        self.engine, self.note = engine, note

    def __getattr__(self, name: str) -> Any:  # version, new_attempt, generate_spread, ...
        return getattr(self.engine, name)

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        self.note()
        return await self.engine.generate(*args, **kwargs)

    async def chat(self, *args: Any, **kwargs: Any) -> Any:
        self.note()
        return await self.engine.chat(*args, **kwargs)


def late_groups(call_versions: dict[Any, int], published: int, max_staleness: int, train_slack: int,
                on_new_version: str) -> list[Any]:
    """The running groups to cancel when version ``published`` is published: those none of whose tokens could be
    trained.

    Every row still to be trained is trained at a trainer version ``>= published``, so with a bound of at least
    ``published - max_staleness`` (``common.train_bound``): a token older than ``published - max_staleness -
    train_slack`` (with ``train_slack`` 0: older than ``published - max_staleness``, rows being kept or dropped
    whole) is never
    trained. Under ``on_new_version: finish`` a call's tokens all carry the version it started on, and a group's
    newest tokens are its latest call's, so a group whose latest call could run on at most version ``v``
    (``call_versions``) is cancelled iff ``v`` is older than that. Under ``resubmit`` and ``keep`` the tokens after
    a load carry the new version: no group is cancelled.

    Example: published 7, max_staleness 2, train_slack 1: groups whose latest call ran on version 3 are cancelled
    (3 < 7 - 2 - 1 = 4), on 4 or newer kept; with train_slack 0, on 4 cancelled too (4 < 5)."""
    if on_new_version != "finish":
        return []
    bound = published - max_staleness  # the trainer's, at the oldest
    return [key for key, v in call_versions.items() if not row_trainable(v, v, bound, train_slack)]


def group_latency_versions(rows: list[Experience], version: int) -> list[int]:
    """Per group of ``rows`` (by ``group_id``): ``version`` (the fleet's, when written) minus the version the group
    started on (its rows' oldest ``model_version``)."""
    started: dict[str, int] = {}
    for e in rows:
        started[e.group_id] = min(started.get(e.group_id, e.model_version), e.model_version)
    return [version - v for v in started.values()]
