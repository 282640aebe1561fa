"""The Synchronizer: a named, detached Ray actor that holds the latest published policy version.

The trainer publishes version v (a version folder for ``checkpoint``, published by the CheckpointMonitor once
every writer is done; an object-store reference for ``memory``); explorers ask for the latest version at a
step boundary, or wait until one is new enough for their staleness bound. No weights pass through this
actor's memory: it holds a path or a reference only.

It also keeps the roles: each registers (``register``), sends heartbeats with its loaded version and state
(running / require_sync / stopped), and ends (``mark_ended``). A role whose heartbeats stop is reported
dead (logged, and in ``status``). Created by whichever role starts first (``get_if_exists``); it exits on its
own once every role that registered has ended or died and none came back for ``exit_grace_s``.

``sync_due`` is the explorer's schedule: it loads new weights before step k (k = steps done) when
``(k - offset) % interval == 0`` and ``k >= offset``, and always before its first step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import ray

SYNCHRONIZER_NAME = "synchronizer"
HEARTBEAT_S = 1.0
"""How often roles send a heartbeat."""
GATHER_WINDOW_S = 0.25
"""How long a collective round waits for more engines after the first one is ready."""

logger = logging.getLogger(__name__)


def sync_due(steps_done: int, interval: int, offset: int = 0) -> bool:
    """Whether the explorer loads the newest weights before its next step, having done ``steps_done``."""
    return steps_done == 0 or (steps_done >= offset and (steps_done - offset) % interval == 0)


@dataclass
class WeightsInfo:
    """Where the weights of one published version are."""

    version: int
    path: str | None = None
    """safetensors file (method ``checkpoint``)."""
    refs: list[Any] = field(default_factory=list)
    """One Ray ObjectRef of the state dict (method ``memory``); wrapped in a list so Ray does not
    dereference it when the message crosses an actor boundary."""
    bytes: int = 0
    """Size of the weights of this version."""
    method: str = ""
    """``checkpoint`` or ``memory`` (empty for version 0, the initial model)."""


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

    def __init__(self, heartbeat_timeout_s: float = 30.0, exit_grace_s: float = 120.0) -> None:
        self._latest = WeightsInfo(version=0)
        self._ended: dict[str, str] = {}
        """role -> "finished" or the error text of a failed role."""
        self._changed = asyncio.Event()
        self.roles: dict[str, RoleRecord] = {}
        self.heartbeat_timeout_s, self.exit_grace_s = heartbeat_timeout_s, exit_grace_s
        self._watchdog: asyncio.Task | None = None
        self._empty_since: float | None = None
        # collective rounds (method nccl): engines waiting, and the members of the current generation
        self._ready: dict[str, tuple[int, asyncio.Future]] = {}
        self._ready_event = asyncio.Event()
        self._members: tuple[str, ...] = ()
        self._sender: tuple[str, int] | None = None
        self._generation = 0
        self._round = 0

    # ------------------------------------------------------------ roles
    async def register(self, kind: str, role_id: str, info: dict[str, Any] | None = None) -> None:
        """A role (re)joins; a restarted role replaces its dead record and clears its ended mark."""
        self.roles[role_id] = RoleRecord(kind=kind, role_id=role_id, info=dict(info or {}))
        self._ended.pop(kind, None)
        self._empty_since = None
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())
        self._notify()

    async def heartbeat(self, role_id: str, version: int | None = None, state: str | None = None) -> None:
        record = self.roles.get(role_id)
        if record is None:
            return
        record.last_seen = time.monotonic()
        if record.state == "dead":
            logger.warning("role %s is alive again", role_id)
            record.state = "running"
        if version is not None:
            record.version = version
        if state is not None:
            record.state = state

    async def _watch(self) -> None:
        """Mark roles whose heartbeats stopped as dead; exit once no role is left for ``exit_grace_s``."""
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            now = time.monotonic()
            for r in self.roles.values():
                if r.state not in ("stopped", "dead") and now - r.last_seen > self.heartbeat_timeout_s:
                    r.state = "dead"
                    logger.error("role %s (%s) sent no heartbeat for %.0fs: reported dead", r.role_id, r.kind,
                                 now - r.last_seen)
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
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    # ------------------------------------------------------------ collective rounds (method nccl)
    async def collective_ready(self, engine_key: str, min_version: int, timeout_s: float) -> dict[str, Any]:
        """An engine waits to receive a version >= ``min_version`` by broadcast; returns its round: version,
        generation, rank, world size, the trainer's store address, slice size, backend, and the parameter
        metadata when the generation is new."""
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
                                    backend: str, wait_s: float, failed_generation: int = -1) -> dict | None:
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
        spec = {"round": self._round, "version": version, "generation": self._generation, "world": len(members) + 1,
                "addr": addr, "port": port, "bucket_bytes": bucket_bytes, "backend": backend,
                "meta": meta if new else None}
        for rank, key in enumerate(members, start=1):
            _, fut = self._ready.pop(key)
            fut.set_result({**spec, "rank": rank})
        return spec

    def _fail_waiting(self, reason: str) -> None:
        for _, fut in self._ready.values():
            if not fut.done():
                fut.set_exception(RuntimeError(reason))
        self._ready.clear()

    async def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "latest_version": self._latest.version,
            "latest_path": self._latest.path,
            "ended": dict(self._ended),
            "collective": {"generation": self._generation, "rounds": self._round, "members": list(self._members),
                           "waiting": sorted(self._ready)},
            "roles": {rid: {"kind": r.kind, "state": r.state, "version": r.version,
                            "seconds_since_heartbeat": round(now - r.last_seen, 1), **r.info}
                      for rid, r in self.roles.items()},
        }

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def publish(self, info: WeightsInfo) -> None:
        if info.version < self._latest.version:
            raise ValueError(f"version {info.version} is older than the published {self._latest.version}")
        self._latest = info
        self._notify()

    async def latest(self) -> WeightsInfo:
        return self._latest

    async def wait_for_version(self, min_version: int, timeout_s: float) -> WeightsInfo:
        """Return the latest info once its version is >= ``min_version``. Raise TimeoutError after
        ``timeout_s``, or RuntimeError if the trainer ended without publishing it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._latest.version < min_version:
            if "trainer" in self._ended:
                raise RuntimeError(f"trainer ended ({self._ended['trainer']}) before publishing version "
                                   f"{min_version}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"no policy version >= {min_version} was published within {timeout_s:.0f}s "
                                   f"(latest is {self._latest.version})")
            event = self._changed
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                pass
        return self._latest

    async def mark_ended(self, role: str, reason: str = "finished", role_id: str | None = None) -> None:
        self._ended[role] = reason
        if role_id in self.roles:
            self.roles[role_id].state = "stopped"
        self._notify()

    async def ended(self) -> dict[str, str]:
        return dict(self._ended)


def get_synchronizer(namespace: str, heartbeat_timeout_s: float = 30.0, exit_grace_s: float = 120.0):
    """The run's Synchronizer actor, created by whichever role asks first. Detached: it outlives the job
    that created it, so explorer and trainer jobs can come and go."""
    actor_cls = ray.remote(num_cpus=0)(Synchronizer)
    return actor_cls.options(name=SYNCHRONIZER_NAME, namespace=namespace, get_if_exists=True, lifetime="detached",
                             max_concurrency=64).remote(heartbeat_timeout_s, exit_grace_s)


class Heartbeat:
    """Sends a role's heartbeat every second from a daemon thread (the role may be busy in a long step)."""

    def __init__(self, synchronizer, role_id: str, status=lambda: {}) -> None:
        import threading

        self.synchronizer, self.role_id, self.status = synchronizer, role_id, status
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{role_id}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                ray.get(self.synchronizer.heartbeat.remote(self.role_id, **self.status()), timeout=10)
            except Exception as e:  # the synchronizer restarting must not kill the role
                logger.warning("heartbeat of %s failed: %s", self.role_id, type(e).__name__)

    def stop(self) -> None:
        self._stop.set()
