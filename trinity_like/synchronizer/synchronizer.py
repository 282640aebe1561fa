"""The Synchronizer: a named, detached Ray actor that holds the latest published policy version.

The trainer publishes version v (a version folder for ``checkpoint``, published by the CheckpointMonitor once
every writer is done; an object-store reference for ``memory``); explorers ask for the latest version at a
step boundary, or wait until one is new enough for their staleness bound. No weights pass through this
actor's memory: it holds a path or a reference only.

It also keeps the roles: each registers (``register``), sends heartbeats with its loaded version and state
(running / require_sync / waiting_data / stopped), and ends (``mark_ended``). A role whose heartbeats stop is
reported dead (logged, and in ``status``). Created by whichever role starts first (``get_if_exists``); it exits
on its own once every role that registered has ended or died and none came back for ``exit_grace_s``. It
carries the run's id (``run_id``, a file in the run directory), so a role of a new run never joins a
synchronizer left over from an earlier run of the same name.

Explorer steps are one global sequence shared by every explorer of the run (several explorer jobs may join one
trainer): an explorer claims the next step (``claim_explore_step``) and reports it written
(``finish_explore_step``). The steps a dead or stopped explorer had claimed are handed out again first, so a
killed explorer's step is redone by whichever explorer comes next. The sequence starts from what the buffer
already holds (``init_explore_steps``), so it survives the synchronizer itself being restarted.

A trainer that resumes from checkpoint s after it had published versions above s (it was killed between
checkpoints) calls ``trainer_resumed(s)``: the next version it publishes may then be lower than the latest
one. Explorers keep the weights they hold until the trainer publishes a version above them; the rows they
generated from the discarded versions stay in the buffer with their behaviour log-probs (valid off-policy
data, corrected like any other).

Which steps to hand out, and when the exploring is done, is decided on the rows the steps actually wrote
(``trinity_like.runtime.schedule``), so a step that writes fewer rows than planned is made up by more steps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from trinity_like.runtime.schedule import Schedule
from trinity_like.weights.messages import MONITOR_NAME, SYNCHRONIZER_NAME, BroadcastRound, WeightsInfo

HEARTBEAT_S = 1.0
"""How often roles send a heartbeat."""
GATHER_WINDOW_S = 0.25
"""How long a collective round waits for more engines after the first one is ready."""
RELAY_MAX_LINES = 100_000
"""Most relayed lines (``relay``) kept for the trainer to take."""

logger = logging.getLogger(__name__)


@dataclass
class ExploreSteps:
    """The run's global sequence of explorer steps. Invariant: every step below ``next`` is written, claimed
    (in ``claims``) or waiting to be handed out again (in ``returned``)."""

    next: int = 0
    """The lowest step never handed out."""
    claims: dict[int, str] = field(default_factory=dict)
    """step -> role id of the explorer running it."""
    returned: list[int] = field(default_factory=list)
    """Steps whose explorer died or stopped before writing them, lowest first."""
    previous: dict[int, str] = field(default_factory=dict)
    """returned step -> the role that had it (given back if that role turns out alive)."""
    initialized: bool = False
    """Set by the first explorer from the buffer's contents (``init_explore_steps``)."""
    rows: dict[int, int] = field(default_factory=dict)
    """written step -> the rows it wrote (fewer than planned when groups were filtered or tasks failed)."""
    rows_dropped: int = 0
    """Rows the trainer reported it will never train (too stale, quarantined): explored again."""
    redone: set[int] = field(default_factory=set)
    """Steps handed out again (their explorer died or stopped first; or missing below the highest written one
    at start): streaming rollout may have written some of their groups already."""

    @property
    def rows_written(self) -> int:
        return sum(self.rows.values())

    def release(self, role_id: str) -> list[int]:
        steps = sorted(s for s, rid in self.claims.items() if rid == role_id)
        for s in steps:
            del self.claims[s]
            self.previous[s] = role_id
        self.returned = sorted({*self.returned, *steps})
        return steps

    def revive(self, role_id: str) -> list[int]:
        """A role reported dead sent a heartbeat after all: its steps not handed out again are its again."""
        steps = [s for s in self.returned if self.previous.get(s) == role_id]
        for s in steps:
            self.claims[s] = role_id
            del self.previous[s]
        self.returned = [s for s in self.returned if s not in steps]
        return steps

    def take_returned(self) -> int:
        step = self.returned.pop(0)
        self.previous.pop(step, None)
        self.redone.add(step)
        return step


@dataclass
class RoleRecord:
    kind: str
    """``trainer`` or ``explorer``."""
    role_id: str
    state: str = "running"
    """running, require_sync (waiting for weights), stopped, or dead (heartbeats stopped)."""
    version: int = 0
    """The policy version it holds (explorer: loaded in every engine; trainer: its step)."""
    last_seen: float = field(default_factory=time.monotonic)
    info: dict[str, Any] = field(default_factory=dict)


class Synchronizer:
    """State: the latest ``WeightsInfo`` and the roles that ended. All methods run on the actor's event
    loop, one at a time, so no lock is needed; ``_changed`` wakes waiters when either changes."""

    def __init__(self, heartbeat_timeout_s: float = 30.0, exit_grace_s: float = 120.0, run_id: str = "") -> None:
        self.run_id = run_id
        self._latest = WeightsInfo(version=0)
        self._resume_floor: int | None = None
        """Set by ``trainer_resumed(s)``: the next publish may go back to a version >= s."""
        self._ended: dict[str, str] = {}
        """role kind -> "finished", "stopped" or the error text of a failed role, until one of that kind
        registers again."""
        self._steps = ExploreSteps()
        self._changed = asyncio.Event()
        self.roles: dict[str, RoleRecord] = {}
        self.heartbeat_timeout_s, self.exit_grace_s = heartbeat_timeout_s, exit_grace_s
        self._watchdog: asyncio.Task | None = None
        self._empty_since: float | None = None
        # collective rounds (method broadcast): engines waiting, and the members of the current generation
        self._ready: dict[str, tuple[int, asyncio.Future]] = {}
        self._ready_event = asyncio.Event()
        self._members: tuple[str, ...] = ()
        self._sender: tuple[str, int] | None = None
        self._generation = 0
        self._round = 0
        self._staleness = None
        """The run's ``StalenessController`` (``synchronizer.max_staleness: auto``), made by the first role."""
        self._run: dict[str, Any] | None = None
        """What the trainer published of its run directory (``publish_run``)."""
        self._relayed: dict[str, list[str]] = {}
        self.relay_dropped = 0

    # ------------------------------------------------------------ roles
    async def claim_run(self, run_id: str) -> bool:
        """Whether this synchronizer serves run ``run_id`` (one created without an id takes it)."""
        self.run_id = self.run_id or run_id
        return self.run_id == run_id

    async def register(self, kind: str, role_id: str, info: dict[str, Any] | None = None) -> None:
        """A role (re)joins; a restarted role replaces its dead record and clears its ended mark."""
        self.roles[role_id] = RoleRecord(kind=kind, role_id=role_id, info=dict(info or {}))
        logger.info("%s %s joined", kind, role_id)
        self._ended.pop(kind, None)
        self._empty_since = None
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())
        self._notify()

    async def heartbeat(self, role_id: str, version: int | None = None, state: str | None = None,
                        engines: list[dict] | None = None, groups_in_flight: int | None = None) -> None:
        """A role is alive, holds ``version`` and is in ``state``; an explorer adds each engine's version and
        fingerprint check (``EngineFleet.engine_versions``) and, streaming, its groups generating now; ``status``
        shows them."""
        record = self.roles.get(role_id)
        if record is None or record.state == "stopped":  # a heartbeat in flight when the role ended says nothing
            return
        record.last_seen = time.monotonic()
        if record.state == "dead":
            logger.warning("role %s is alive again; its explorer steps %s are its own again", role_id,
                           self._steps.revive(role_id))
            record.state = "running"
        if version is not None:
            record.version = version
        if state is not None:
            record.state = state
        if engines is not None:
            record.info["engine_versions"] = engines
        if groups_in_flight is not None:
            record.info["groups_in_flight"] = groups_in_flight

    async def _watch(self) -> None:
        """Mark roles whose heartbeats stopped as dead; exit once no role is left for ``exit_grace_s``."""
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            now = time.monotonic()
            for r in self.roles.values():
                if r.state not in ("stopped", "dead") and now - r.last_seen > self.heartbeat_timeout_s:
                    r.state = "dead"
                    returned = self._steps.release(r.role_id)
                    logger.error("role %s (%s) sent no heartbeat for %.0fs: reported dead%s", r.role_id, r.kind,
                                 now - r.last_seen, f"; its explorer steps {returned} will be redone" if returned else "")
                    self._notify()
            trainers = [r for r in self.roles.values() if r.kind == "trainer"]
            if self._ready and trainers and all(r.state in ("stopped", "dead") for r in trainers):
                self._fail_waiting("the trainer is gone; no broadcast will come")
            if any(r.state not in ("stopped", "dead") for r in self.roles.values()):
                self._empty_since = None
            elif self._empty_since is None:
                self._empty_since = now
            elif now - self._empty_since > self.exit_grace_s:
                logger.warning("no role left for %.0fs: the synchronizer exits", self.exit_grace_s)
                try:  # the run's CheckpointMonitor goes with it
                    ray.kill(ray.get_actor(MONITOR_NAME, namespace=ray.get_runtime_context().namespace))
                except ValueError:
                    pass
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    # ------------------------------------------------------------ collective rounds (method broadcast)
    async def collective_ready(self, engine_key: str, min_version: int, timeout_s: float) -> BroadcastRound:
        """An engine waits to receive a version >= ``min_version`` by broadcast; returns its round (its own
        rank in it; the parameter metadata when the generation is new)."""
        old = self._ready.pop(engine_key, None)
        if old is not None and not old[1].done():
            old[1].cancel()
        fut = asyncio.get_running_loop().create_future()
        self._ready[engine_key] = (min_version, fut)
        self._ready_event.set()
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise TimeoutError(f"no broadcast of a version >= {min_version} started within {timeout_s:.0f}s "
                               f"(latest published: {self._latest.version})") from None
        finally:
            if self._ready.get(engine_key, (None, None))[1] is fut:
                del self._ready[engine_key]

    def _waiting_for(self, version: int) -> list[str]:
        return sorted(k for k, (need, fut) in self._ready.items() if need <= version and not fut.done())

    async def collective_next_round(self, version: int, meta: list[dict], addr: str, port: int, bucket_bytes: int,
                                    backend: str, wait_s: float, failed_generation: int = -1,
                                    fingerprint: str = "") -> BroadcastRound | None:
        """The trainer's broadcaster asks for the next round of ``version``: None if no engine waits for it
        within ``wait_s``, or at once if an engine waits for a newer version (the broadcaster should take its
        newer snapshot); otherwise the engines that are ready (after a short gathering window) become the
        round's members and each gets its rank. Same members as before: same generation (the group is
        reused); otherwise, or after a failed round, a new generation."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while not self._waiting_for(version):
            remaining = deadline - loop.time()
            if remaining <= 0 or any(need > version for need, fut in self._ready.values() if not fut.done()):
                return None
            self._ready_event.clear()
            try:
                await asyncio.wait_for(self._ready_event.wait(), remaining)
            except TimeoutError:
                pass
        await asyncio.sleep(GATHER_WINDOW_S)
        members = tuple(self._waiting_for(version))
        if not members:
            return None
        new = members != self._members or (addr, port) != self._sender or failed_generation == self._generation
        if new:
            self._generation += 1
            self._members, self._sender = members, (addr, port)
        self._round += 1
        spec = BroadcastRound(round=self._round, version=version, generation=self._generation,
                              world=len(members) + 1, addr=addr, port=port, bucket_bytes=bucket_bytes,
                              backend=backend, meta=meta if new else None, fingerprint=fingerprint)
        for rank, key in enumerate(members, start=1):
            _, fut = self._ready.pop(key)
            fut.set_result(spec.for_rank(rank))
        return spec

    def _fail_waiting(self, reason: str) -> None:
        for _, fut in self._ready.values():
            if not fut.done():
                fut.set_exception(RuntimeError(reason))
        self._ready.clear()

    async def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "run_id": self.run_id,
            "latest_version": self._latest.version,
            "latest_path": self._latest.path,
            "latest_method": self._latest.method,
            "latest_transport": self._latest.transport,
            "ended": dict(self._ended),
            "explore_steps": {"next": self._steps.next, "rows_written": self._steps.rows_written,
                              "claimed": sorted(self._steps.claims), "returned": list(self._steps.returned)},
            "collective": {"generation": self._generation, "rounds": self._round, "members": list(self._members),
                           "waiting": sorted(self._ready)},
            "staleness": None if self._staleness is None else self._staleness.state(),
            "roles": {rid: {"kind": r.kind, "state": r.state, "version": r.version,
                            "seconds_since_heartbeat": round(now - r.last_seen, 1), **r.info}
                      for rid, r in self.roles.items()},
        }

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def publish(self, info: WeightsInfo) -> None:
        if info.version < self._latest.version:
            if self._resume_floor is None or info.version < self._resume_floor:
                raise ValueError(f"version {info.version} is older than the published {self._latest.version}")
            logger.warning("the resumed trainer publishes version %d after %d: versions above %d are discarded",
                           info.version, self._latest.version, info.version)
        self._resume_floor = None
        self._latest = info
        self._notify()

    async def trainer_resumed(self, step: int) -> None:
        """The trainer restarted from checkpoint ``step``: let its next publish go back to ``step``."""
        self._resume_floor = step if step < self._latest.version else None

    # ------------------------------------------------------------ the self-setting staleness bound
    async def configure_staleness(self, params: dict[str, Any]) -> int:
        """``max_staleness: auto``: make the run's controller (the first role to call it does; a later call, or a
        role restarting, keeps the bound where it is); return the current bound."""
        from trinity_like.synchronizer.staleness import StalenessController

        if self._staleness is None:
            self._staleness = StalenessController(params)
        return self._staleness.bound

    async def staleness_bound(self) -> int | None:
        """The bound now (None without ``max_staleness: auto``)."""
        return None if self._staleness is None else self._staleness.bound

    async def report_train(self, step: int, rows: int, metrics: dict[str, float]) -> int | None:
        """A trainer step's rows and metrics, for the controller; returns the bound after it (None without)."""
        if self._staleness is None:
            return None
        before = self._staleness.bound
        bound = self._staleness.observe_train(step, time.time(), rows, metrics)
        if bound != before:
            logger.warning("staleness bound %d -> %d after trainer step %d: %s", before, bound, step,
                           self._staleness.history[-1]["reason"])
        return bound

    async def report_explore(self, wait_s: float) -> int | None:
        """An explorer step's admission wait (time held back by the bound); returns the bound (None without)."""
        if self._staleness is None:
            return None
        self._staleness.observe_explore(wait_s)
        return self._staleness.bound

    # ------------------------------------------------------------ the global sequence of explorer steps
    async def init_explore_steps(self, written: dict[int, int], running: list[int] | tuple = ()) -> None:
        """Start the sequence after the steps the buffer already holds (``written``: step -> rows; first
        explorer only); a step below the highest written one that is missing (its explorer died, or the
        synchronizer did) is done again, and so is one of ``running`` (streaming rollout: cut off mid-way, its
        groups part-written; the explorer that takes it up runs the others)."""
        if self._steps.initialized:
            return
        cut = {int(k) for k in running}
        done = {int(k): int(v) for k, v in written.items() if int(k) not in cut}
        self._steps.next = max([*done, *cut]) + 1 if done or cut else 0
        self._steps.returned = sorted(set(range(self._steps.next)) - set(done))
        self._steps.rows = done
        self._steps.initialized = True

    async def claim_explore_step(self, role_id: str, schedule: Schedule, max_steps: int | None = None) -> int | None:
        """The next explorer step for ``role_id`` (a returned one first), or None when the rows written and
        the steps running cover what the trainer needs (``Schedule.explore_more``), or ``max_steps`` steps
        have been handed out."""
        s = self._steps
        if not s.initialized:
            raise RuntimeError("init_explore_steps must come before the first claim")
        if s.returned:
            step = s.take_returned()
        elif (schedule.explore_more(s.rows_written, len(s.claims), s.rows_dropped)
              and (max_steps is None or s.next < max_steps)):
            step = s.next
            s.next += 1
        else:
            return None
        s.claims[step] = role_id
        return step

    async def explore_step_redone(self, step: int) -> bool:
        """Whether ``step`` was handed out before (see ``ExploreSteps.redone``)."""
        return step in self._steps.redone

    async def finish_explore_step(self, step: int, rows: int) -> None:
        """The step's ``rows`` experiences are in the buffer."""
        self._steps.claims.pop(step, None)
        self._steps.rows[step] = rows
        self._notify()

    async def report_dropped(self, rows: int) -> None:
        """The trainer will never train ``rows`` rows written so far (a running total): explore that many more."""
        self._steps.rows_dropped = max(self._steps.rows_dropped, rows)

    async def rows_before(self, step: int, rows_per_step: int) -> int:
        """Rows the trainer trains before those of explorer step ``step``: what each step below it wrote, and
        ``rows_per_step`` (what it plans) for each one still running or to be redone, less the rows the trainer
        dropped (too stale, quarantined). Admission counts on this: an upper bound while earlier steps run
        (never too lenient), exact once they are written. Without the dropped rows taken off, every later step
        would be admitted as if trained that many rows later than it is: with two explorers whose steps commit
        out of order, a few rows dropped as too stale early in a run held the explorers to a bound smaller by
        that many steps for the rest of it (realised staleness 0.1 at max_staleness 2, throughput that of sync)."""
        s = self._steps
        return max(0, sum(s.rows.get(k, rows_per_step) for k in range(step)) - s.rows_dropped)

    async def explore_finished(self, schedule: Schedule) -> bool:
        """No explorer step is running or waiting to be redone, and the rows written cover the run: no more
        experiences will come."""
        s = self._steps
        return (s.initialized and not s.claims and not s.returned
                and not schedule.explore_more(s.rows_written, 0, s.rows_dropped))

    async def alive(self, kind: str) -> int:
        """How many roles of ``kind`` are registered and neither stopped nor dead."""
        return sum(r.kind == kind and r.state not in ("stopped", "dead") for r in self.roles.values())

    async def latest(self) -> WeightsInfo:
        return self._latest

    async def wait_for_version(self, min_version: int, timeout_s: float, raise_timeout: bool = True) -> WeightsInfo | None:
        """Return the latest info once its version is >= ``min_version``. After ``timeout_s`` raise
        TimeoutError (or return None with ``raise_timeout=False``); raise RuntimeError if the trainer
        finished without publishing it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._latest.version < min_version:
            if self._ended.get("trainer") == "finished":
                raise RuntimeError(f"the trainer finished before publishing version {min_version}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                if not raise_timeout:
                    return None
                raise TimeoutError(f"no policy version >= {min_version} was published within {timeout_s:.0f}s "
                                   f"(latest is {self._latest.version})")
            event = self._changed
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                pass
        return self._latest

    async def mark_ended(self, role: str, reason: str = "finished", role_id: str | None = None) -> None:
        """A role ends: ``finished`` (its work is done), ``stopped`` (asked to stop; it may come back) or a
        failure's text. A trainer that did not finish leaves explorers waiting for its restart."""
        self._ended[role] = reason
        if role_id in self.roles:
            self.roles[role_id].state = "stopped"
            self._steps.release(role_id)
        self._notify()

    async def ended(self) -> dict[str, str]:
        return dict(self._ended)

    # ------------------------------------------------------------ the run, for explorers off its filesystem
    async def publish_run(self, run: dict[str, Any]) -> None:
        """The trainer hands over what an explorer would read from the run directory (``RunHome``: the run's
        id, config, task sets, the trainer's node and run directory), for explorers on nodes without it."""
        self._run = run
        self._notify()

    async def run_home(self, timeout_s: float) -> dict[str, Any] | None:
        """What the trainer published with ``publish_run``, once it has (None after ``timeout_s``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._run is None and loop.time() < deadline:
            event = self._changed
            try:
                await asyncio.wait_for(event.wait(), deadline - loop.time())
            except TimeoutError:
                pass
        return self._run

    async def relay(self, name: str, lines: list[str]) -> None:
        """Lines an explorer off the run's filesystem appends to run-directory file ``name``; the trainer
        takes them (``take_relayed``) and writes them there. At most ``RELAY_MAX_LINES`` wait: beyond that
        (no trainer to take them) the oldest are dropped, and counted."""
        waiting = self._relayed.setdefault(name, [])
        waiting.extend(lines)
        if len(waiting) > RELAY_MAX_LINES:
            self.relay_dropped += len(waiting) - RELAY_MAX_LINES
            del waiting[:len(waiting) - RELAY_MAX_LINES]

    async def take_relayed(self) -> dict[str, list[str]]:
        taken, self._relayed = self._relayed, {}
        return taken


def get_synchronizer(namespace: str, heartbeat_timeout_s: float = 30.0, exit_grace_s: float = 120.0,
                     run_id: str | None = None, options: dict[str, Any] | None = None, run_dir: str = ""):
    """The run's Synchronizer actor, created by whichever role asks first (``options``: its placement,
    ``synchronizer.node``). Detached: it outlives the job that created it, so explorer and trainer jobs can come
    and go. With ``run_id`` (that of the caller's run directory ``run_dir``), a synchronizer left over from an
    earlier run of the same namespace (another id, no live role) is replaced; one whose run still has live
    roles is not: the caller sees another run directory than theirs (RunError)."""
    actor_cls = ray.remote(num_cpus=0)(Synchronizer)

    def get():
        return actor_cls.options(name=SYNCHRONIZER_NAME, namespace=namespace, get_if_exists=True,
                                 lifetime="detached", max_concurrency=64, **(options or {})).remote(
            heartbeat_timeout_s, exit_grace_s, run_id or "")

    actor = get()
    if run_id is not None:
        try:
            ours = ray.get(actor.claim_run.remote(run_id), timeout=60)
        except ray.exceptions.RayActorError:  # it was exiting (no role left): start a new one
            ours = False
        if not ours:
            _refuse_live_run(actor, namespace, run_id, run_dir)
            logger.warning("replacing the synchronizer of an earlier run in namespace %s", namespace)
            ray.kill(actor, no_restart=True)
            for _ in range(50):  # the name is freed once the kill is processed
                try:
                    ray.get_actor(SYNCHRONIZER_NAME, namespace=namespace)
                except ValueError:
                    break
                time.sleep(0.1)
            actor = get()
    return actor


def _refuse_live_run(actor, namespace: str, run_id: str, run_dir: str) -> None:
    """Raise RunError when the synchronizer ``actor`` (of another run id than ``run_id``) still has live
    roles: then the caller's run directory is not theirs (a node that does not see the shared run directory
    made one of its own), or two runs share one name."""
    from trinity_like.common.errors import RunError

    try:
        status = ray.get(actor.status.remote(), timeout=60)
    except ray.exceptions.RayActorError:
        return
    live = {rid: r for rid, r in status["roles"].items() if r["state"] not in ("stopped", "dead")}
    if not live:
        return
    rid, record = next(iter(live.items()))
    theirs = f"{record['kind']} {rid}" + (f" on run directory {record['run_dir']}" if record.get("run_dir") else "")
    raise RunError(
        f"namespace '{namespace}' is in use by a live run (id {status['run_id'][:8]}: {theirs}), but this role's run "
        f"directory {run_dir or '?'} holds run id {run_id[:8]}: if it should join that run, its node does not see "
        "the run directory: mount the trainer's run directory here at the same path (buffer.transport file and "
        "synchronizer.method checkpoint need a shared filesystem), or use buffer.transport=redis with "
        "synchronizer.method broadcast or memory, which need none; if it is another run, give it another name")


class Heartbeat:
    """Sends a role's heartbeat every second from a daemon thread (the role may be busy in a long step)."""

    def __init__(self, synchronizer, role_id: str, status=lambda: {}) -> None:
        import threading

        from trinity_like.common.logs import RateLimitedLog

        self.synchronizer, self.role_id, self.status = synchronizer, role_id, status
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{role_id}", daemon=True)
        self._failures = RateLimitedLog(logger)
        """A Synchronizer that stays unreachable is named once a minute, not every heartbeat."""

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                ray.get(self.synchronizer.heartbeat.remote(self.role_id, **self.status()), timeout=10)
            except Exception as e:  # the synchronizer restarting must not kill the role
                self._failures.log(logging.WARNING, type(e).__name__, "heartbeat of %s failed: %s", self.role_id,
                                   type(e).__name__)

    def stop(self) -> None:
        self._stop.set()
