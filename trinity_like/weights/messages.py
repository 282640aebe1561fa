"""What crosses process boundaries in weight delivery: the named actors' names, the published version
(``WeightsInfo``) and a broadcast round (``BroadcastRound``). Kept apart from the actors so that the Synchronizer,
the CheckpointMonitor, trainers and explorers can name each other without importing each other."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SYNCHRONIZER_NAME = "synchronizer"
"""The Synchronizer actor's name in the run's Ray namespace."""
MONITOR_NAME = "checkpoint_monitor"
"""The CheckpointMonitor actor's name in the run's Ray namespace."""


@dataclass
class WeightsInfo:
    """Where the weights of one published version are."""

    version: int
    path: str | None = None
    """safetensors file (method ``checkpoint``)."""
    refs: list[Any] = field(default_factory=list)
    """One Ray ObjectRef of the state dict (method ``memory``); wrapped in a list so Ray does not
    dereference it when the message crosses an actor boundary."""
    shared: dict[str, Any] | None = None
    """Handle of the shared buffer holding the version (method ``ipc``: ``shared_weights.open_shared``)."""
    bytes: int = 0
    """Size of the weights of this version."""
    method: str = ""
    """``checkpoint``, ``memory``, ``broadcast`` or ``ipc`` (empty for version 0, the initial model): which
    receiver brings an engine to it (``trinity_like.weights.receive``)."""
    transport: str = ""
    """What the bytes travel over, as the publisher knows it: ``files``, ``object store``, ``gloo``, ``nccl``,
    ``shared memory`` or ``CUDA IPC``; ``trinity-like status`` shows it."""
    fingerprint: str = ""
    """``weights_fingerprint`` of the weights as the trainer published them; every engine checks what it
    received and what it serves against it."""

    def __post_init__(self) -> None:
        if not self.method:  # a caller that names only where the weights are (evaluation, tools)
            self.method = "checkpoint" if self.path else "memory" if self.refs else "ipc" if self.shared else ""


@dataclass(frozen=True)
class BroadcastRound:
    """One round of method ``broadcast``, as the Synchronizer hands it to the broadcaster (rank 0) and to each
    engine (its own ``rank``). Crosses into vLLM's worker processes as ``plain()`` (numbers, strings, lists)."""

    round: int
    version: int
    generation: int
    """Members and sender unchanged: same generation, the process group is reused."""
    world: int
    addr: str
    """The broadcaster's TCPStore."""
    port: int
    bucket_bytes: int
    backend: str
    """``gloo`` or ``nccl``: what the round runs over."""
    meta: list[dict[str, Any]] | None = None
    """The flat buffer's layout (``broadcast.TensorMeta`` fields), only when the generation is new."""
    fingerprint: str = ""
    rank: int = 0

    def plain(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> BroadcastRound:
        return cls(**plain)

    def for_rank(self, rank: int) -> BroadcastRound:
        return BroadcastRound(**{**asdict(self), "rank": rank})
