"""Weight synchronisation between trainer and explorers: the Synchronizer actor, the CheckpointMonitor and the
on-disk version format."""

from trinity_like.synchronizer.messages import MONITOR_NAME, SYNCHRONIZER_NAME, WeightsInfo
from trinity_like.synchronizer.monitor import STATE_DICT_DIR, CheckpointMonitor, SaveStrategy
from trinity_like.synchronizer.synchronizer import Heartbeat, Synchronizer, get_synchronizer
from trinity_like.synchronizer.weights_files import (
    CorruptWeightsError,
    IncompleteWeightsError,
    WeightsAccessError,
    read_weights,
)

__all__ = ["MONITOR_NAME", "STATE_DICT_DIR", "SYNCHRONIZER_NAME", "CheckpointMonitor", "SaveStrategy", "CorruptWeightsError", "IncompleteWeightsError", "WeightsAccessError",
           "Heartbeat", "Synchronizer", "WeightsInfo", "get_synchronizer", "read_weights"]
