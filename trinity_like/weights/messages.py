"""What crosses process boundaries in weight delivery: the named actors' names, the published version
(``WeightsInfo``, with a shared buffer's ``SharedHandle`` for method ``ipc``) and a broadcast round
(``BroadcastRound``). Kept apart from the actors so that the Synchronizer,
the CheckpointMonitor, trainers and explorers can name each other without importing each other."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

SYNCHRONIZER_NAME = "synchronizer"
"""The Synchronizer actor's name in the run's Ray namespace."""
MONITOR_NAME = "checkpoint_monitor"
"""The CheckpointMonitor actor's name in the run's Ray namespace."""


@dataclass(frozen=True)
class CudaIpcHandle:
    """torch's CUDA IPC handle of a shared buffer in GPU memory, in plain form (``shared.cuda_handle_to_plain``):
    the arguments of torch's ``rebuild_cuda_tensor`` but its two classes, in its order, and the GPU's UUID (Ray
    may number the GPU differently in each process). As the trainer hands it out (``shared._export_cuda``) it names
    no reference counter (``ref_counter_handle``: a file that does not exist, ``ref_counter_offset`` 0) and asks
    for no wait on the export's CUDA event (``event_sync_required`` False)."""

    size: list[int]
    stride: list[int]
    tensor_offset: int
    dtype: str
    """A torch dtype's name (``uint8``)."""
    storage_device: int
    storage_handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    requires_grad: bool
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool
    device_uuid: str = ""

    def torch_fields(self) -> dict[str, Any]:
        """The fields of ``rebuild_cuda_tensor`` (``shared.cuda_handle_from_plain``'s input): all but the UUID."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "device_uuid"}


SHARED_KINDS = ("cuda", "shm")
"""Where a shared buffer lives: GPU memory (a CUDA IPC handle) or a shared-memory file."""


@dataclass(frozen=True)
class SharedHandle:
    """A version in a shared buffer on the trainer's node (method ``ipc``), as ``shared.SharedWeights.publish``
    makes it and ``shared.open_shared`` maps it. Crosses Ray as is, and vLLM's msgpack encoder into its worker
    processes as ``plain()`` (numbers, strings, bytes, lists, dicts)."""

    version: int
    kind: str
    """``cuda`` (``cuda`` is set) or ``shm`` (``path`` is set)."""
    size: int
    """Bytes of the buffer."""
    node: str
    """``shared.node_identity()`` of the trainer's host."""
    fingerprint: str
    meta: list[dict[str, Any]]
    """The buffer's layout (``broadcast.TensorMeta`` fields)."""
    path: str | None = None
    """The shared-memory file (kind ``shm``)."""
    cuda: CudaIpcHandle | None = None
    """The CUDA IPC handle (kind ``cuda``)."""

    def __post_init__(self) -> None:
        if self.kind not in SHARED_KINDS:
            raise ValueError(f"unknown shared buffer kind {self.kind!r}; valid kinds: {', '.join(SHARED_KINDS)}")
        if (self.kind == "cuda") != (self.cuda is not None) or (self.kind == "shm") != (self.path is not None):
            raise ValueError(f"a shared buffer of kind {self.kind} needs "
                             f"{'a CUDA IPC handle' if self.kind == 'cuda' else 'a path'} and nothing else")

    def names(self) -> list[str]:
        return [m["name"] for m in self.meta]

    def plain(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> SharedHandle:
        cuda = plain.get("cuda")
        return cls(**{**plain, "meta": [dict(m) for m in plain["meta"]],
                      "cuda": CudaIpcHandle(**cuda) if cuda is not None else None})


SOURCE_FIELDS = ("path", "state_dict", "shared")
"""Where an engine's new weights are, one per update: a version's files, tensors (in this process, or one Ray
ObjectRef of them in ``refs``), a shared buffer."""


@dataclass
class WeightsInfo:
    """Where the weights of one published version are. The fleet hands it whole to each engine, which reads it
    through ``trinity_like.weights.receive.read_weights`` (the reader is chosen by ``method``)."""

    version: int
    path: str | None = None
    """safetensors file (method ``checkpoint``)."""
    refs: list[Any] = field(default_factory=list)
    """One Ray ObjectRef of the state dict (method ``memory``); wrapped in a list so Ray does not
    dereference it when the message crosses an actor boundary."""
    shared: SharedHandle | None = None
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
    received and what it serves against it (empty: not checked)."""
    state_dict: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    """The tensors themselves, already in this process (method ``memory``: what a broadcast round received, a
    test's or a tool's own weights); never published."""

    def __post_init__(self) -> None:
        if not self.method:  # a caller that names only where the weights are (evaluation, tools, engines' callers)
            self.method = ("checkpoint" if self.path else "memory" if self.refs or self.state_dict is not None
                           else "ipc" if self.shared else "")

    def sources(self) -> list[str]:
        """Which of ``SOURCE_FIELDS`` this message names (an engine's update names exactly one)."""
        return [k for k, given in zip(SOURCE_FIELDS, (self.path is not None,
                                                      self.state_dict is not None or bool(self.refs),
                                                      self.shared is not None), strict=True) if given]

    def plain(self) -> dict[str, Any]:
        """What a process of this node needs to read the version itself (a path or a shared buffer's handle),
        as plain data for vLLM's serializer; tensors and ObjectRefs stay behind."""
        return {"version": self.version, "path": None if self.path is None else str(self.path), "method": self.method, "fingerprint": self.fingerprint,
                "shared": self.shared.plain() if self.shared is not None else None}

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> WeightsInfo:
        shared = plain.get("shared")
        return cls(**{**plain, "shared": SharedHandle.from_plain(shared) if shared is not None else None})


def check_one_source(update: WeightsInfo) -> None:
    given = update.sources()
    if len(given) != 1:
        raise ValueError(f"a WeightUpdate needs exactly one of path, state_dict and shared, got {given or 'none'}")


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
