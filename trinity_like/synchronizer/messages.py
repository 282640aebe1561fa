"""What crosses actor boundaries around weight synchronisation: the named actors' names and ``WeightsInfo``.
Kept apart from the actors so that the Synchronizer, the CheckpointMonitor, trainers and explorers can name each
other without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
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
    """``checkpoint``, ``memory``, ``nccl`` or ``ipc`` (empty for version 0, the initial model)."""
    fingerprint: str = ""
    """``weights_fingerprint`` of the weights as the trainer published them; every engine checks what it
    received and what it serves against it."""
