"""Weights by collective broadcast (``synchronizer.method: broadcast``). The trainer exports its weights to the CPU
and engines load them there, so rounds run over gloo today, also on a GPU machine (the round's ``backend``
travels in its spec; a receiver puts NCCL rounds on the GPU, gloo rounds on the CPU).

One process group joins trainer rank 0 (rank 0 of the group) with every engine that wants the new version
(ranks 1..n). It is a stand-alone ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` on a ``TCPStore`` that the
trainer hosts, independent of any default group (the trainer's data-parallel group, vLLM's own groups).

Rounds, arranged by the Synchronizer (``collective_ready`` / ``collective_next_round``):

1. The trainer's ``WeightBroadcaster`` copies the weights of version v into one flat byte buffer (a snapshot:
   training goes on at once) and offers v. A background thread serves rounds from the newest snapshot.
2. An explorer at a sync boundary has each engine call ``collective_ready(engine, incarnation, v)``. The
   Synchronizer gathers the engines that are ready (a short window), fixes the round's members, and gives
   every member its rank. The members are a *generation*: the same members as the last round reuse its
   group; an engine that joins, restarts (new incarnation) or leaves makes a new generation and a new group.
   The parameter metadata (names, dtypes, shapes, byte offsets) travels with the first round of a generation
   only.
3. The flat buffer is broadcast in slices of ``synchronizer.bucket_mb``; each engine receives into its own
   staging buffer and applies the version only when every slice is in (an engine never serves a mix of
   versions). A transfer that fails (a member died, a timeout) raises on every side: the engines keep their
   previous version, the broadcaster drops the group, and the next round forms a new one.
"""

from __future__ import annotations

import datetime
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from trinity_like.common.logs import RateLimitedLog
from trinity_like.weights.messages import BroadcastRound

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @classmethod
    def from_plain(cls, plain: dict) -> TensorMeta:
        """From its fields as they travel (``m.__dict__``; the shape a list after msgpack or JSON)."""
        return cls(**{**plain, "shape": tuple(plain["shape"])})


def describe(state_dict: dict[str, torch.Tensor]) -> list[TensorMeta]:
    """Byte layout of the flat buffer: tensors in name order, each aligned to 16 bytes."""
    out, offset = [], 0
    for name in sorted(state_dict):
        t = state_dict[name]
        nbytes = t.numel() * t.element_size()
        out.append(TensorMeta(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
        offset += (nbytes + 15) // 16 * 16
    return out


def flat_size(meta: list[TensorMeta]) -> int:
    return max((m.offset + m.nbytes for m in meta), default=0)


def pack(state_dict: dict[str, torch.Tensor], meta: list[TensorMeta], device: str | torch.device = "cpu",
         out: torch.Tensor | None = None) -> torch.Tensor:
    """Copy the tensors into one flat byte buffer laid out by ``meta`` (a new one on ``device``, or ``out``)."""
    flat = torch.empty(flat_size(meta), dtype=torch.uint8, device=device) if out is None else out
    for m in meta:
        t = state_dict[m.name].detach().contiguous()
        flat[m.offset:m.offset + m.nbytes].copy_(t.reshape(-1).view(torch.uint8))
    return flat


def unpack(flat: torch.Tensor, meta: list[TensorMeta]) -> dict[str, torch.Tensor]:
    """Views into ``flat`` (no copy)."""
    return {m.name: flat[m.offset:m.offset + m.nbytes].view(getattr(torch, m.dtype)).view(m.shape) for m in meta}


def slices(total: int, bucket_bytes: int) -> list[tuple[int, int]]:
    bucket_bytes = max(1, bucket_bytes)
    return [(lo, min(lo + bucket_bytes, total)) for lo in range(0, total, bucket_bytes)]


def device_of_backend(backend: str) -> str:
    """Where a round's tensors live: NCCL moves GPU tensors, gloo CPU tensors (never NCCL with CPU tensors)."""
    return "cuda" if backend == "nccl" else "cpu"


def _timeout(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=max(1.0, seconds))


def make_group(store, generation: int, rank: int, world: int, backend: str, timeout_s: float):
    """A stand-alone process group for one generation (a fresh key prefix on the shared store)."""
    import torch.distributed as dist

    prefix = dist.PrefixStore(f"weights/gen{generation}", store)
    if backend == "nccl":
        return dist.ProcessGroupNCCL(prefix, rank, world)
    return dist.ProcessGroupGloo(prefix, rank, world, _timeout(timeout_s))


def broadcast_flat(group, flat: torch.Tensor, bucket_bytes: int, timeout_s: float) -> None:
    """Send (rank 0) or receive (others) ``flat`` slice by slice, a bounded number of slices in flight."""
    pending = []
    for lo, hi in slices(flat.numel(), bucket_bytes):
        pending.append(group.broadcast(flat[lo:hi], 0))
        if len(pending) >= 4:
            pending.pop(0).wait(_timeout(timeout_s))
    for work in pending:
        work.wait(_timeout(timeout_s))


class BroadcasterStopped(RuntimeError):
    """The broadcaster's thread gave up: the Synchronizer stayed unreachable past the deadline."""


class WeightBroadcaster:
    """Trainer rank 0's side: hosts the store, keeps the newest snapshot, serves rounds from a thread."""

    def __init__(self, synchronizer, bucket_mb: float, timeout_s: float, round_timeout_s: float | None = None) -> None:
        """``timeout_s``: how long the Synchronizer may stay unreachable; ``round_timeout_s`` (default
        ``timeout_s``): the deadline of one round, group forming and transfer (``synchronizer.sync_timeout_s``)."""
        import ray
        import torch.distributed as dist

        self.synchronizer = synchronizer
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.timeout_s = timeout_s
        self.round_timeout_s = round_timeout_s or timeout_s
        # The trainer hands over its weights on the CPU (``trainer.weights_dtype``) and engines load them there,
        # so rounds run over gloo whether or not this process sees a GPU (NCCL would need GPU tensors on both
        # sides, and cannot join two ranks on one GPU).
        self.backend = "gloo"
        self.device = device_of_backend(self.backend)
        self.addr = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind(("", 0))
            self.port = s.getsockname()[1]
        self.store = dist.TCPStore(self.addr, self.port, is_master=True, wait_for_workers=False,
                                   timeout=_timeout(timeout_s))
        self._snapshot: tuple[int, list[TensorMeta], torch.Tensor, str] | None = None
        self._cond = threading.Condition()
        self._stop = False
        self._group: tuple[int, Any] | None = None
        self._failed_generation = -1
        self.rounds = self.failures = 0
        self.last_round: dict[str, float] = {}
        self.error: BroadcasterStopped | None = None
        """Set when the thread gave up (the Synchronizer unreachable for ``timeout_s``); ``offer`` raises it."""
        self._log = RateLimitedLog(logger)
        self._thread = threading.Thread(target=self._serve, name="weight-broadcaster", daemon=True)
        self._thread.start()

    def offer(self, version: int, state_dict: dict[str, torch.Tensor], fingerprint: str = "") -> int:
        """Snapshot ``state_dict`` as version ``version`` (replacing an older snapshot) with its fingerprint
        (sent with every round, for the engines to check what they received); return its bytes. Raises
        ``BroadcasterStopped`` once the serving thread has given up."""
        if self.error is not None:
            raise self.error
        meta = describe(state_dict)
        flat = pack(state_dict, meta, self.device)
        with self._cond:
            self._snapshot = (version, meta, flat, fingerprint)
            self._cond.notify_all()
        return flat.numel()

    def _serve(self) -> None:
        """Serve rounds until closed. The Synchronizer may restart (its calls fail for a while): retried each
        second, logged at most once a minute, and given up after ``timeout_s`` without reaching it."""
        import ray

        unreachable_since: float | None = None
        while True:
            with self._cond:
                while self._snapshot is None and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                version, meta, flat, fingerprint = self._snapshot
            try:
                spec = ray.get(self.synchronizer.collective_next_round.remote(
                    version, [m.__dict__ for m in meta], self.addr, self.port, self.bucket_bytes, self.backend, 1.0,
                    self._failed_generation, fingerprint))
            except Exception as e:  # the synchronizer restarting: try again, within the deadline
                if self._stop:
                    return
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > self.timeout_s:
                    first = str(e).splitlines()[0][:160] if str(e) else ""
                    self.error = BroadcasterStopped(
                        f"the weight broadcaster could not reach the Synchronizer for {self.timeout_s:.0f}s "
                        f"(synchronizer.timeout_s; last error {type(e).__name__}: {first}); is the run's "
                        "Synchronizer alive (`trinity-like status`)?")
                    logger.error("%s", self.error)
                    return
                self._log.log(logging.WARNING, "unreachable", "weight broadcaster could not reach the synchronizer "
                              "(retrying for up to %.0fs): %s", self.timeout_s, type(e).__name__)
                time.sleep(1.0)
                continue
            if unreachable_since is not None:
                unreachable_since = None
                self._log.forget("unreachable")
            if spec is None:  # nobody waits for this version (yet), or someone wants a newer one
                self._wait_for_newer(version, 0.2)
                continue
            self._run_round(spec, flat)

    def _wait_for_newer(self, version: int, timeout_s: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._stop or self._snapshot[0] != version, timeout=timeout_s)

    def _run_round(self, spec: BroadcastRound, flat: torch.Tensor) -> None:
        start = time.perf_counter()
        try:
            if self._group is None or self._group[0] != spec.generation:
                self._group = None
                self._group = (spec.generation, make_group(self.store, spec.generation, 0, spec.world,
                                                              self.backend, self.round_timeout_s))
            broadcast_flat(self._group[1], flat, self.bucket_bytes, self.round_timeout_s)
            self.rounds += 1
            seconds = time.perf_counter() - start
            self.last_round = {"sync/version": float(spec.version), "sync/seconds": seconds,
                               "sync/bytes": float(flat.numel()), "sync/receivers": float(spec.world - 1)}
        except Exception as e:
            self.failures += 1
            self._group = None  # the next round forms a new group, under a new generation
            self._failed_generation = spec.generation
            logger.error("broadcast of version %d to %d engines failed after %.1fs (deadline %.0fs, "
                         "synchronizer.sync_timeout_s): %s; the engines keep their previous version and the next "
                         "round forms a new group", spec.version, spec.world - 1, time.perf_counter() - start,
                         self.round_timeout_s, e)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()


class WeightReceiver:
    """An engine's side: joins the round's group, receives into a staging buffer, returns the tensors."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._store = None
        self._store_addr: tuple[str, int] | None = None
        self._group: tuple[int, Any] | None = None
        self._meta: tuple[int, list[TensorMeta]] | None = None
        self._staging: torch.Tensor | None = None

    def receive(self, spec: BroadcastRound, device: str | None = None) -> tuple[dict[str, torch.Tensor], int]:
        """The tensors of the round's version (views into a staging buffer: copy them before the next
        round) and the bytes received. Raises on a failed transfer; nothing is applied here."""
        import torch.distributed as dist

        device = device or device_of_backend(spec.backend)
        generation = spec.generation
        if spec.meta is not None:
            self._meta = (generation, [TensorMeta.from_plain(m) for m in spec.meta])
        if self._meta is None or self._meta[0] != generation:
            raise RuntimeError(f"round of generation {generation} came without parameter metadata")
        addr = (spec.addr, spec.port)
        if self._store_addr != addr:
            self._store = dist.TCPStore(spec.addr, spec.port, is_master=False, timeout=_timeout(self.timeout_s))
            self._store_addr, self._group = addr, None
        if self._group is None or self._group[0] != generation:
            self._group = None
            self._group = (generation, make_group(self._store, generation, spec.rank, spec.world,
                                                  spec.backend, self.timeout_s))
        meta = self._meta[1]
        size = flat_size(meta)
        if self._staging is None or self._staging.numel() != size or self._staging.device.type != device:
            self._staging = torch.empty(size, dtype=torch.uint8, device=device)
        try:
            broadcast_flat(self._group[1], self._staging, spec.bucket_bytes, self.timeout_s)
        except Exception:
            self._group = None
            raise
        return unpack(self._staging, meta), size
