"""The actors of weight synchronisation: the Synchronizer (the published version, the explorers' steps, the
broadcast rounds) and the CheckpointMonitor (completes a version once its last writer is in). How a version
travels (messages, version files, shared buffers, broadcast, fingerprints, publishers) is ``trinity_like.weights``."""

from trinity_like.synchronizer.monitor import CheckpointMonitor, SaveStrategy
from trinity_like.synchronizer.synchronizer import Heartbeat, Synchronizer, get_synchronizer

__all__ = ["CheckpointMonitor", "Heartbeat", "SaveStrategy", "Synchronizer", "get_synchronizer"]
