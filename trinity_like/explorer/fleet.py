"""The explorer fleet: rollout engines as Ray actors, with routing, retries and restarts.

Each engine runs in its own actor (``EngineActor``), restarted by Ray if its process dies
(``max_restarts=-1``). The fleet sends every call to the least-loaded healthy engine; a call that fails
because its engine died is retried on another engine, and the restarted engine is brought back to the
fleet's current weights before it serves again. A call that keeps failing raises ``EngineCallFailed`` after
``max_retries`` retries; the workflow that made it is then recorded as failed and the step goes on.

An engine whose process lives on but whose inference engine died inside it (vLLM's engine core, after an
out-of-memory or an illegal memory access in a forward: every call fails with ``EngineDeadError`` from then on,
and Ray sees a healthy actor) is told apart (``EngineCoreDied``): the fleet kills that actor, Ray starts it
again, and it loads the fleet's current version before it serves; after ``explorer.max_engine_restarts`` such
restarts of one engine the run stops at once (``EngineLost``, one line naming the engine and the cause) instead
of failing every task until ``explorer.max_empty_steps`` empty steps end it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from trinity_like.common.errors import RunError
from trinity_like.config import Config, SamplingConfig
from trinity_like.explorer.engines.base import (
    EngineCoreDied,
    Sample,
    WeightsMismatch,
    engine_core_death,
)
from trinity_like.runtime.schedule import rollout_mode
from trinity_like.weights.messages import WeightsInfo
from trinity_like.weights.receive import receiver_for

logger = logging.getLogger(__name__)


def _engine_gone_error() -> type[BaseException]:
    from ray.exceptions import RayActorError

    return RayActorError


_ENGINE_GONE = _engine_gone_error()
"""A call failed because its engine died or is restarting (ActorDiedError, ActorUnavailableError): retry it
elsewhere."""


class EngineCallFailed(RuntimeError):
    """A generate/chat call failed on every engine it was tried on."""


class WeightsLoadFailed(RuntimeError):
    """Some engines could not load a version (damaged or deleted files); they keep serving their previous one."""


class EngineStalled(TimeoutError):
    """An engine did not finish loading a version within ``synchronizer.sync_timeout_s``."""


class EngineLost(RunError):
    """An engine's inference engine died more often than ``explorer.max_engine_restarts`` allows, or its actor
    did not come back after a restart: the explorer cannot go on with it, and the run stops (the command line
    prints this one line)."""


def _names_core_death(method):
    """``method`` of an engine actor, raising ``EngineCoreDied`` in place of an error that says the engine's
    inference engine is dead (``engine_core_death``), so the fleet can tell it from a failed call."""

    def died(self, e: BaseException) -> EngineCoreDied:
        dead = engine_core_death(e)
        engine_id = getattr(getattr(self, "engine", None), "engine_id", "")
        return EngineCoreDied(f"{type(dead).__name__}: {dead}", engine_id, os.getpid())

    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def guarded(self, *args, **kwargs):
            try:
                return await method(self, *args, **kwargs)
            except Exception as e:
                if engine_core_death(e) is None:
                    raise
                raise died(self, e) from e
    else:
        @functools.wraps(method)
        def guarded(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except Exception as e:
                if engine_core_death(e) is None:
                    raise
                raise died(self, e) from e
    return guarded


class EngineActor:
    """Hosts one rollout engine in its own process. Calls run one at a time (actor concurrency 1)."""

    def __init__(self, cfg: Config, index: int) -> None:
        import uuid

        from trinity_like.common.offline import set_offline_env
        from trinity_like.runtime.paths import namespace_of
        set_offline_env()
        self.engine = make_engine(cfg, f"{cfg.explorer.engine}-{index}")
        self.key = f"{self.engine.engine_id}-{uuid.uuid4().hex[:8]}"
        """This engine process in collective rounds: a restarted engine is a new member."""
        self.namespace, self.timeout_s = namespace_of(cfg), cfg.synchronizer.timeout_s
        self.sync_timeout_s = cfg.synchronizer.sync_timeout_s
        self.receiver = None

    @_names_core_death
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int],
                 offsets: list[int] | None = None, interruptible: bool = False) -> list[Sample]:
        """``interruptible``: only an async engine can be cut mid-call; this one ends each call it starts."""
        return self.engine.generate(prompts, sampling, seeds, offsets)

    @_names_core_death
    def chat(self, messages: list[dict[str, str]], sampling: SamplingConfig, seed: int,
             interruptible: bool = False) -> Sample:
        return self.engine.chat(messages, sampling, seed)

    @_names_core_death
    def update_weights(self, info: WeightsInfo) -> dict[str, Any]:
        """Load a version (from files, the object store or a shared buffer: the engine reads it through
        ``weights.receive.read_weights``); all its tensors are read (and checked against the published
        fingerprint) before any is applied, so a failure leaves the previous version serving."""
        self.engine.update_weights(info)
        return self._loaded(self.engine.last_load_bytes)

    def _loaded(self, size: int) -> dict[str, Any]:
        return {"version": self.engine.model_version, "bytes": size,
                "fingerprint": getattr(self.engine, "fingerprint", "")}

    @_names_core_death
    def receive_weights(self, min_version: int) -> dict[str, Any]:
        """Method ``broadcast``: join the next broadcast round of a version >= ``min_version`` and load it. The
        engine receives every slice into a staging buffer first and applies the version only when all are
        in, so a cut-off transfer leaves the previous version serving."""
        import ray

        from trinity_like.weights.broadcast import WeightReceiver
        spec = ray.get(self._synchronizer().collective_ready.remote(self.key, min_version, self.timeout_s))
        if hasattr(self.engine, "receive_collective"):  # vLLM: its worker process joins the group
            size = self.engine.receive_collective(spec, self.sync_timeout_s)
        else:
            self.receiver = self.receiver or WeightReceiver(self.sync_timeout_s)
            state_dict, size = self.receiver.receive(spec, device="cpu")
            self.engine.update_weights(WeightsInfo(version=spec.version, state_dict=state_dict,
                                                   fingerprint=spec.fingerprint))
        return self._loaded(size)

    def _synchronizer(self):
        import ray

        from trinity_like.weights.messages import SYNCHRONIZER_NAME
        return ray.get_actor(SYNCHRONIZER_NAME, namespace=self.namespace)

    def health(self) -> dict[str, Any]:
        return self.engine.health()

    def weights_fingerprint(self) -> str:
        return self.engine.weights_fingerprint()

    def pid(self) -> int:
        import os

        return os.getpid()


class AsyncEngineActor(EngineActor):
    """``EngineActor`` for an engine with async methods (``agenerate``, ``achat``, ``aupdate_weights``,
    ``areceive_collective``: vLLM's async engine). An async actor: every call runs concurrently on its event
    loop, so concurrent calls join the engine's continuous batch. (Synchronous engines stay in ``EngineActor``,
    whose calls run on the thread that built the engine: vLLM's CPU kernels refuse a call from a thread with
    another OpenMP thread count.)"""

    @_names_core_death
    async def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int],
                       offsets: list[int] | None = None, interruptible: bool = False) -> list[Sample]:
        return await self.engine.agenerate(prompts, sampling, seeds, offsets, interruptible)

    @_names_core_death
    async def chat(self, messages: list[dict[str, str]], sampling: SamplingConfig, seed: int,
                   interruptible: bool = False) -> Sample:
        return await self.engine.achat(messages, sampling, seed, interruptible)

    @_names_core_death
    async def update_weights(self, info: WeightsInfo) -> dict[str, Any]:
        """The engine reads the version off the event loop (an ObjectRef's tensors too: ``ray.get`` there)."""
        await self.engine.aupdate_weights(info)
        return self._loaded(self.engine.last_load_bytes)

    @_names_core_death
    async def receive_weights(self, min_version: int) -> dict[str, Any]:
        spec = await self._synchronizer().collective_ready.remote(self.key, min_version, self.timeout_s)
        return self._loaded(await self.engine.areceive_collective(spec, self.sync_timeout_s))

    async def health(self) -> dict[str, Any]:
        return self.engine.health()

    async def weights_fingerprint(self) -> str:
        return self.engine.weights_fingerprint()

    async def pid(self) -> int:
        return super().pid()


async def _ray_await(ref) -> Any:
    return await ref


def _process_of(actor: Any) -> Any:
    """The Ray actor behind a slot's engine: itself, or the host actor of an emulated engine (``HostedEngine``)."""
    from trinity_like.explorer.engines.emulated import HostedEngine

    return actor.host if isinstance(actor, HostedEngine) else actor


def make_engine(cfg: Config, engine_id: str):
    """The engine ``explorer.engine`` names, on ``model.path``."""
    if cfg.explorer.engine == "hf":
        from trinity_like.explorer.engines.hf_engine import HFEngine

        return HFEngine(cfg.model.path, engine_id=engine_id, num_threads=cfg.explorer.num_threads,
                        dtype=cfg.explorer.dtype, kv_cache=cfg.explorer.kv_cache, device=cfg.explorer.device)
    if cfg.explorer.engine == "vllm":
        from trinity_like.explorer.engines.vllm_engine import AsyncVLLMEngine, VLLMEngine

        v = cfg.explorer.vllm
        return (AsyncVLLMEngine if v.async_engine else VLLMEngine)(cfg.model.path, engine_id=engine_id, cfg=cfg, dtype=cfg.explorer.dtype,
                          max_model_len=v.max_model_len,
                          max_num_seqs=v.max_num_seqs, gpu_memory_utilization=v.gpu_memory_utilization,
                          kv_cache_memory_gb=v.kv_cache_memory_gb,
                          enforce_eager=v.enforce_eager, seed=cfg.seed, seeded=v.seeded,
                          tensor_parallel_size=max(1, int(cfg.explorer.gpus_per_engine)))
    if cfg.explorer.engine == "emulated":  # EMULATION (async only): the fleet hosts many per process instead
        from trinity_like.explorer.engines.emulated import EmulatedEngine

        return EmulatedEngine(cfg, engine_id)
    raise ValueError(f"unknown engine {cfg.explorer.engine!r}")


def engine_actor_options(cfg: Config) -> tuple[dict[str, Any], Any]:
    """Ray options of one engine actor, and the placement group made for it (None when it needs none). Ray shows
    an engine's process only the GPUs it asks for (``explorer.gpus_per_engine``; 0: the CPU). An engine over
    several GPUs (vLLM tensor parallelism) asks for none itself: a placement group holds one bundle per GPU on
    one node, the engine runs in the first bundle, and vLLM's Ray executor puts one worker in each bundle (it
    uses the placement group of the actor it runs in). ``explorer.node`` pins the engines (or their bundles)."""
    from trinity_like.common.placement import actor_options, bundle, bundle_label_selector

    gpus, node = cfg.explorer.gpus_per_engine, cfg.explorer.node
    if cfg.explorer.engine == "emulated":  # EMULATION: no device, many engines per actor (hosted_engines)
        return {"num_gpus": 0, **actor_options(node)}, None
    if gpus <= 1:
        return {"num_gpus": gpus, **actor_options(node)}, None
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundles = [bundle(node, {"GPU": 1.0, "CPU": 0.01})] + [bundle(node, {"GPU": 1.0}) for _ in range(int(gpus) - 1)]
    group = placement_group(bundles, strategy="STRICT_PACK", bundle_label_selector=bundle_label_selector(node, len(bundles)))
    strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=0,
                                                placement_group_capture_child_tasks=True)
    return {"num_gpus": 0, "num_cpus": 0.01, "scheduling_strategy": strategy}, group


class _Pool:
    """Generate calls with one sampling setting, merged: a call waits until an engine is free (at most one pool
    call per engine at a time), then goes with every call waiting beside it as one engine call, and each gets its
    own samples back (per-request seeds make a request's tokens independent of its batch mates). Continuous
    batching at call granularity: a call arriving while others decode joins the next engine call, not the end of
    a queue of them. Its samples carry the version of the engine that made them, as any call's."""

    def __init__(self, fleet: EngineFleet, sampling: SamplingConfig) -> None:
        self.fleet, self.sampling = fleet, sampling
        self.waiting: list[tuple[list[list[int]], list[int], list[int], int, asyncio.Future]] = []
        self.running = 0
        """Engine calls of this pool in flight."""

    async def submit(self, prompts: list[list[int]], seeds: list[int], offsets: list[int],
                     min_version: int = 0) -> list[Sample]:
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append((prompts, seeds, offsets, min_version, fut))
        if self.running < len(self.fleet.slots):
            self.running += 1
            asyncio.ensure_future(self._drain())
        return await fut

    async def _drain(self) -> None:
        """Send what waits as one call, again while anything waits."""
        try:
            while self.waiting:
                batch, self.waiting = self.waiting, []
                prompts = [p for b in batch for p in b[0]]
                seeds = [s for b in batch for s in b[1]]
                offsets = [k for b in batch for k in b[2]]
                self.fleet.pooled_calls += 1
                try:  # on an engine that holds the newest version any of the merged calls needs
                    samples = await self.fleet.call("generate", prompts, self.sampling, seeds, offsets, False,
                                                    min_version=max(b[3] for b in batch))
                except Exception as e:  # every call of the batch failed with it (their tasks are retried)
                    for *_, fut in batch:
                        if not fut.done():
                            fut.set_exception(e)
                    continue
                k = 0
                for p, *_, fut in batch:
                    if not fut.done():
                        fut.set_result(samples[k:k + len(p)])
                    k += len(p)
        finally:
            self.running -= 1


@dataclass
class _Slot:
    """The fleet's view of one engine: its actor, calls in flight, and the weights it holds."""

    actor: Any
    index: int
    in_flight: int = 0
    version: int = 0
    """Version the fleet knows this engine holds; reset to -1 when the engine died (it restarts from the
    initial weights) or failed the fingerprint check after a load, so the next call brings it up to date
    first. May be ahead of the fleet's version when other engines failed to load the newer one."""
    fingerprint: str = ""
    """Fingerprint of the weights the engine reported serving after its last load."""
    mismatches: int = 0
    """Loads this engine refused because the weights did not match the published fingerprint."""
    stalled: bool = False
    """It did not finish loading a version within the sync deadline (a stopped process, a hung transfer): out
    of service (no calls, no rounds) until it answers a health probe, then brought up to date first."""
    probe: Any = None
    """The pending health probe of a stalled engine."""
    busy_s: float = 0.0
    """Seconds with at least one call of the fleet's in flight on this engine (ended spans)."""
    busy_since: float = 0.0
    """When ``in_flight`` last rose from 0."""
    core_deaths: int = 0
    """Times its inference engine died inside a live process (``EngineCoreDied``); each restarts the actor."""
    dead_pids: set[int] = dataclasses.field(default_factory=set)
    """Processes of this engine whose inference engine died: their calls fail until the restart, and each
    restarts the actor once, however many calls report it."""
    reviving: asyncio.Future | None = None
    """The restart under way after its inference engine died (``EngineFleet._revive``): no calls, no loads, until
    it is done."""

    @property
    def restarting(self) -> bool:
        return self.reviving is not None and not self.reviving.done()

    def enter(self) -> None:
        if not self.in_flight:
            self.busy_since = time.perf_counter()
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self.busy_s += time.perf_counter() - self.busy_since

    def busy_now(self) -> float:
        """``busy_s`` with the span running now."""
        return self.busy_s + (time.perf_counter() - self.busy_since if self.in_flight else 0.0)


class EngineFleet:
    """``explorer.num_engines`` engine actors behind one async interface."""

    def __init__(self, cfg: Config, namespace: str | None = None, engine_actor: type | None = None) -> None:
        """``engine_actor``: the actor class hosting each engine; default ``AsyncEngineActor`` for vLLM's async
        engine, else ``EngineActor`` (tests pass a subclass that fakes a device fault). EMULATION
        (``explorer.engine: emulated``): ``explorer.emulated.engines_per_actor`` engines per actor
        (``emulated.hosted_engines``), each a slot of its own."""
        import ray

        self.cfg = cfg
        emulated = cfg.explorer.engine == "emulated"
        async_engine = (cfg.explorer.engine == "vllm" and cfg.explorer.vllm.async_engine) or emulated
        self.placement_groups: list[Any] = []
        """One per tensor-parallel engine (``explorer.gpus_per_engine`` > 1), removed with the fleet."""
        self.slots = []
        if emulated:
            from trinity_like.explorer.engines.emulated import hosted_engines

            self.slots = [_Slot(engine, i) for i, engine in enumerate(hosted_engines(cfg))]
        else:
            actor_cls = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(
                engine_actor or (AsyncEngineActor if async_engine else EngineActor))
            for i in range(cfg.explorer.num_engines):
                options, group = engine_actor_options(cfg)
                if group is not None:
                    self.placement_groups.append(group)
                self.slots.append(_Slot(actor_cls.options(**options).remote(cfg, i), i))
        self.max_retries = cfg.explorer.max_retries
        self.sync_timeout_s = cfg.synchronizer.sync_timeout_s
        self.call_timeout_s = cfg.explorer.call_timeout_s or 0.9 * cfg.explorer.task_timeout_s
        self._weights = WeightsInfo(version=0)
        """The newest weights every engine loaded. Restarted engines get these (by broadcast: the newest version
        the trainer offers)."""
        self._offered = self._weights
        """The newest version asked of the engines (``update_weights``): some may hold it before all do."""
        self._lock = asyncio.Lock()
        """Serialises weight updates with the catch-up of restarted engines."""
        self.restarts = 0
        self.max_engine_restarts = cfg.explorer.max_engine_restarts
        self.restart_timeout_s = cfg.explorer.task_timeout_s
        """Longest a restarted engine may take to answer again (its process starts, its engine loads the model)."""
        self.lost: EngineLost | None = None
        """Set once an engine is lost for good (``_revive``): every call and load raises it from then on."""
        self.cancels_remote = async_engine
        """A caller cancelled (streaming rollout's late groups) cancels its request in the engine too
        (``_cancel_remote``): an async engine actor runs each call as a task that stops where it is (vLLM aborts
        the request; the emulated engine takes it out of its batch). Not on a timeout of ``call_timeout_s`` (that
        engine is taken out of service as it is) and not on a synchronous actor, whose running call cannot stop."""
        self.pooled = rollout_mode(cfg) == "stream" and not async_engine
        """Merge the generate calls waiting for an engine into one (``_Pool``): streaming rollout calls per group,
        and an engine that serves one call at a time would otherwise decode each group's batch alone."""
        self._pools: dict[str, _Pool] = {}
        self.pooled_calls = 0
        """Engine calls the pools made (fewer than the generate calls they served)."""

    async def ready(self) -> None:
        await asyncio.gather(*(s.actor.health.remote() for s in self.slots))

    @property
    def version(self) -> int:
        """The version every engine holds (the oldest): what the fleet reports and loads from."""
        return self._weights.version

    @property
    def newest_version(self) -> int:
        """The newest version an engine in service holds: a call that needs it (``min_version``) goes there
        while the others are still loading (under ``on_new_version: finish``, draining their requests first)."""
        return max([self.version, *(s.version for s in self.slots if not s.stalled)])

    def at_least(self, version: int) -> AtLeast:
        """This fleet, its calls sent only to engines that hold ``version`` or newer."""
        return AtLeast(self, version)

    async def update_weights(self, info: WeightsInfo) -> int:
        """Load the version ``info`` describes into every engine (concurrently); return the bytes loaded. If any
        engine fails (a damaged or deleted file), the error is logged, that engine keeps its previous version,
        the fleet's version stays the old one, and ``WeightsLoadFailed`` is raised; calling again retries only
        the engines that do not hold it yet."""
        async with self._lock:
            self._check_stalled()
            if self.lost is not None:
                raise self.lost
            if info.version > self._offered.version:
                self._offered = info
            # an engine restarting after its inference engine died loads the fleet's version when it is back
            live = [s for s in self.slots if not s.stalled and not s.restarting]
            if not live:
                raise WeightsLoadFailed(f"no engine can load version {info.version}: all {len(self.slots)} are "
                                        "stalled (out of service until they answer again)")
            results = await asyncio.gather(*(self._bounded_sync(s, info) for s in live), return_exceptions=True)
            errors = [(s.index, r) for s, r in zip(live, results, strict=True) if isinstance(r, BaseException)]
            for index, err in errors:
                if isinstance(err, EngineCoreDied):
                    self._revive(self.slots[index], err)  # raises EngineLost when its restarts are used up
                logger.error("engine %d could not load version %d from %s: %s", index, info.version,
                             info.path or info.method, err)
                if isinstance(err, WeightsMismatch) and "refuses requests" in str(err):
                    self.slots[index].version = -1  # loaded but not applied: reload a verified version first
            if errors:
                cause = getattr(errors[0][1], "cause", None) or errors[0][1]  # Ray wraps the engine's own error
                raise WeightsLoadFailed(f"{len(errors)} of {len(live)} engines could not load version "
                                        f"{info.version}: {type(cause).__name__}: {cause}")
            # by broadcast an engine may have received a newer version than asked for
            self._weights = dataclasses.replace(info, version=min(s.version for s in live))
            for s in self.slots:  # restarting now: it loads this version when it is back
                if s.restarting:
                    s.version = -1
            return sum(results)

    def _load_deadline(self, info: WeightsInfo) -> float:
        """How long one engine's load may take: as its method's receiver says (``weights.receive``)."""
        return receiver_for(info).deadline_s(self.sync_timeout_s)

    async def _bounded_sync(self, slot: _Slot, info: WeightsInfo, own_calls: int = 0) -> int:
        """``own_calls``: calls of the caller's counted in ``slot.in_flight`` that are not sent yet. A load waits
        for the engine's calls in flight (an hf engine runs one at a time; vLLM's gate drains them: the longest
        response, under ``on_new_version: finish``); each ends within ``explorer.call_timeout_s`` or stalls the
        engine itself, so that drain is allowed on top of the transfer's deadline (issue 49, R6)."""
        drain = self.call_timeout_s if slot.in_flight > own_calls else 0.0
        deadline = self._load_deadline(info) + drain
        try:
            return await asyncio.wait_for(self._sync_slot(slot, info), deadline)
        except TimeoutError:
            waited = f" + explorer.call_timeout_s {drain:.0f}s for its calls in flight" if drain else ""
            raise self._stalled(slot, f"did not finish loading version {info.version} within {deadline:.0f}s "
                                      f"(synchronizer.sync_timeout_s {self.sync_timeout_s:.0f}s{waited})") from None

    def _stalled(self, slot: _Slot, what: str) -> EngineStalled:
        """Take an engine that stopped answering out of service: no calls, no rounds, until its health probe
        comes back; what it holds then is unknown, so it is brought up to date first."""
        slot.stalled, slot.version = True, -1
        if slot.probe is None or slot.probe.done():
            slot.probe = asyncio.ensure_future(_ray_await(slot.actor.health.remote()))
        return EngineStalled(f"engine {slot.index} {what}: taken out of service until it answers again")

    def _check_stalled(self) -> None:
        """A stalled engine whose health probe came back is in service again (it loads the fleet's weights
        before its next call); one whose process died meanwhile is restarted by Ray and answers too."""
        for slot in self.slots:
            if slot.stalled and slot.probe is not None and slot.probe.done():
                slot.stalled, slot.probe = False, None
                logger.warning("engine %d answers again: back in service after it loads version %d", slot.index,
                               self.version)

    async def _sync_slot(self, slot: _Slot, info: WeightsInfo | None = None) -> int:
        info = info or self._weights
        if slot.version >= info.version:
            return 0
        try:
            loaded = await receiver_for(info).deliver(slot.actor, info)
        except WeightsMismatch:
            slot.mismatches += 1
            raise
        slot.version, slot.fingerprint = loaded["version"], loaded.get("fingerprint", slot.fingerprint)
        return loaded["bytes"]

    def _revive(self, slot: _Slot, err: EngineCoreDied) -> None:
        """Restart ``slot``'s actor (in the background: ``slot.reviving``), once per dead process, whose inference
        engine died (``err``); past ``explorer.max_engine_restarts`` of them, stop the run (``EngineLost``)."""
        err = getattr(err, "cause", None) or err  # the engine's own error, as Ray wrapped it
        if err.pid in slot.dead_pids:
            return  # another call saw the same death first
        slot.dead_pids.add(err.pid)
        slot.core_deaths += 1
        slot.version = -1  # a restarted engine holds the initial weights
        if slot.core_deaths > self.max_engine_restarts:
            self.lost = EngineLost(
                f"engine {slot.index} ({err.engine_id or 'engine'}) is lost: its inference engine died "
                f"{slot.core_deaths} times (explorer.max_engine_restarts: {self.max_engine_restarts}), last with "
                f"{err}; the device faulted (out of memory or an illegal memory access in a forward: see the engine's "
                "log), and the run stops")
            raise self.lost
        slot.reviving = asyncio.ensure_future(self._restart(slot, err))

    async def _restart(self, slot: _Slot, err: EngineCoreDied) -> None:
        """Kill the actor (Ray starts it again), wait until its new process answers, and load the fleet's version
        into it. A restart that does not answer within ``explorer.task_timeout_s`` loses the engine."""
        import ray

        ray.kill(_process_of(slot.actor), no_restart=False)
        self.restarts += 1
        deadline = time.monotonic() + self.restart_timeout_s
        while True:
            try:
                if await slot.actor.pid.remote() != err.pid:
                    break
            except _ENGINE_GONE:
                pass
            if time.monotonic() > deadline:
                self.lost = EngineLost(
                    f"engine {slot.index} ({err.engine_id or 'engine'}) is lost: its inference engine died ({err}) "
                    f"and the restarted engine did not answer within {self.restart_timeout_s:.0f}s "
                    "(explorer.task_timeout_s); the run stops")
                return
            await asyncio.sleep(0.5)
        logger.warning("engine %d restarted after its inference engine died; loading version %d", slot.index,
                       self._weights.version)
        try:
            async with self._lock:
                await self._bounded_sync(slot, self._weights)
        except Exception as e:  # noqa: BLE001 - it stays at -1 and loads again before its next call
            logger.error("engine %d, restarted: loading version %d failed (%s: %s); it loads again before its next "
                         "call", slot.index, self._weights.version, type(e).__name__, e)

    def busy_s(self) -> float:
        """Seconds engines have held work (a call of the fleet's in flight), summed over the engines: divided by
        wall time and engine count, the engines' busy share (for an ``hf`` engine, queued calls count: it runs one
        while the others wait)."""
        return sum(s.busy_now() for s in self.slots)

    @property
    def fingerprint_mismatches(self) -> int:
        """Loads refused by their fingerprint check, over every engine, since the fleet started."""
        return sum(s.mismatches for s in self.slots)

    def engine_versions(self) -> list[dict[str, Any]]:
        """Each engine's version and fingerprint as the fleet last saw them, and whether the fingerprint is the
        one the trainer published for that version (None: not known, e.g. the initial model)."""
        expected = self._weights.fingerprint
        return [{"engine": s.index, "version": s.version, "fingerprint": s.fingerprint,
                 "verified": (s.fingerprint == expected) if expected and s.version == self.version else None,
                 "mismatches": s.mismatches, "stalled": s.stalled, "core_deaths": s.core_deaths}
                for s in self.slots]

    def _pick(self, exclude: set[int], min_version: int = 0) -> _Slot:
        """The least-loaded engine in service, not tried yet, among those holding ``min_version`` where any
        does (else it is brought up to date before the call)."""
        self._check_stalled()
        serving = ([s for s in self.slots if not s.stalled and not s.restarting]
                   or [s for s in self.slots if not s.stalled] or self.slots)
        candidates = [s for s in serving if s.index not in exclude] or serving
        current = [s for s in candidates if s.version >= min_version] or candidates
        return min(current, key=lambda s: (s.in_flight, s.index))

    async def call(self, method: str, *args: Any, engine: int | None = None, min_version: int = 0) -> Any:
        """Run ``method(*args)`` on engine ``engine`` (default: the least-loaded one holding ``min_version``);
        if that engine dies or does not answer within ``explorer.call_timeout_s`` (then it is taken out of
        service), retry on the least-loaded engine not tried yet. An engine older than the fleet's version, or
        than ``min_version`` when no engine holds it, loads it first."""
        tried: set[int] = set()
        last: BaseException | None = None
        for attempt in range(self.max_retries + 1):
            if self.lost is not None:
                raise self.lost
            pinned = attempt == 0 and engine is not None and not self.slots[engine].stalled
            slot = self.slots[engine] if pinned else self._pick(tried, min_version)
            if slot.restarting:  # the only engine left: wait until it is back with the fleet's weights
                await asyncio.shield(slot.reviving)
                if self.lost is not None:
                    raise self.lost
            slot.enter()
            try:
                target = self._offered if min_version > self.version else self._weights
                if slot.version < target.version:
                    async with self._lock:
                        await self._bounded_sync(slot, target, own_calls=1)
                ref = getattr(slot.actor, method).remote(*args)
                try:
                    return await asyncio.wait_for(_ray_await(ref), self.call_timeout_s)
                except asyncio.CancelledError:
                    self._cancel_remote(ref)
                    raise
            except EngineStalled as e:  # it could not be brought up to date in time
                last = e
                tried.add(slot.index)
                logger.error("%s; retrying on another engine", e)
            except TimeoutError:
                last = self._stalled(slot, f"did not answer {method} within {self.call_timeout_s:g}s "
                                           "(explorer.call_timeout_s)")
                tried.add(slot.index)
                logger.error("%s; retrying on another engine", last)
            except _ENGINE_GONE as e:
                last = e
                tried.add(slot.index)
                for s in self._same_process(slot):
                    s.version = -1  # it restarts from the initial weights (with the engines it hosts beside it)
                self.restarts += 1
                logger.warning("engine %d died during %s; retrying on another engine", slot.index, method)
            except EngineCoreDied as e:  # the process lives, its inference engine does not: restart it
                last = e
                tried.add(slot.index)
                logger.error("engine %d: its inference engine died during %s (%s); restarting it and retrying on "
                             "another engine", slot.index, method, e)
                self._revive(slot, e)
            finally:
                slot.leave()
        raise EngineCallFailed(f"{method} failed on {len(tried)} engine(s) after {self.max_retries} retries: {last}")

    def _cancel_remote(self, ref: Any) -> None:
        """The request behind ``ref`` is no longer wanted: stop it in the engine, so it frees its slots and a
        ``finish`` load does not wait for it (``cancels_remote``)."""
        if not self.cancels_remote:
            return
        import ray

        try:
            ray.cancel(ref)
        except Exception as e:  # already finished, or its actor gone: nothing left to stop
            logger.debug("cancelling an engine call: %s", e)

    async def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int],
                       offsets: list[int] | None = None, interruptible: bool = False,
                       min_version: int = 0) -> list[Sample]:
        """``offsets``: see ``RolloutEngine.generate`` (a continuation). ``interruptible``: an engine that cuts
        requests when a version loads (vLLM's async engine under ``on_new_version: resubmit``) may cut these.
        ``min_version``: only on an engine holding it (see ``call``). With ``pooled``, the call joins the others
        waiting with the same sampling settings in one engine call."""
        if not self.pooled:
            return await self.call("generate", prompts, sampling, seeds, offsets, interruptible,
                                   min_version=min_version)
        if not prompts or len(seeds) != len(prompts):  # refused here: in a pool it would fail the others' call
            raise ValueError(f"generate needs non-empty prompts and one seed each, got {len(prompts)} prompts and "
                             f"{len(seeds)} seeds")
        key = repr(sampling)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(self, sampling)
        return await pool.submit(prompts, seeds, offsets or [0] * len(prompts), min_version)

    async def chat(self, messages: list[dict[str, str]], sampling: SamplingConfig, seed: int,
                   interruptible: bool = False, min_version: int = 0) -> Sample:
        return await self.call("chat", messages, sampling, seed, interruptible, min_version=min_version)

    async def generate_spread(self, prompts: list[list[int]], sampling: SamplingConfig,
                              seeds: list[int]) -> list[Sample]:
        """One batch split evenly over the engines: prompt r goes to engine r % n (a fixed assignment, so the
        batches, and therefore the samples, do not depend on timing); a failed part is retried elsewhere."""
        n = len(self.slots)
        parts = [(prompts[i::n], seeds[i::n]) for i in range(n) if prompts[i::n]]
        results = await asyncio.gather(*(self.call("generate", p, sampling, s, engine=i)
                                         for i, (p, s) in enumerate(parts)))
        return [results[r % n][r // n] for r in range(len(prompts))]

    async def health(self) -> list[dict[str, Any]]:
        return await asyncio.gather(*(s.actor.health.remote() for s in self.slots))

    def _same_process(self, slot: _Slot) -> list[_Slot]:
        """``slot`` and the engines its process hosts beside it (an emulated host's; a real engine is alone)."""
        process = _process_of(slot.actor)
        return [s for s in self.slots if _process_of(s.actor) is process] if process is not slot.actor else [slot]

    def kill(self) -> None:
        import ray

        for actor in {id(_process_of(s.actor)): _process_of(s.actor) for s in self.slots}.values():
            ray.kill(actor, no_restart=True)
        for group in self.placement_groups:
            ray.util.remove_placement_group(group)
        self.placement_groups = []


class AtLeast:
    """An ``EngineFleet`` whose ``generate`` and ``chat`` go only to engines holding ``version`` or newer: what a
    streaming group admitted for ``version`` runs on, so it starts as soon as one engine has loaded it."""

    def __init__(self, fleet: EngineFleet, version: int) -> None:
        self.fleet, self.min_version = fleet, version

    def __getattr__(self, name: str) -> Any:  # version, generate_spread, ...: the fleet's own
        return getattr(self.fleet, name)

    async def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int],
                       offsets: list[int] | None = None, interruptible: bool = False) -> list[Sample]:
        return await self.fleet.generate(prompts, sampling, seeds, offsets, interruptible, self.min_version)

    async def chat(self, messages: list[dict[str, str]], sampling: SamplingConfig, seed: int,
                   interruptible: bool = False) -> Sample:
        return await self.fleet.chat(messages, sampling, seed, interruptible, self.min_version)
