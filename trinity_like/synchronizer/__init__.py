"""Weight synchronisation between trainer and explorers: the Synchronizer actor and its transports."""

from trinity_like.synchronizer.synchronizer import (
    SYNCHRONIZER_NAME,
    Synchronizer,
    WeightsInfo,
    get_synchronizer,
)

__all__ = ["SYNCHRONIZER_NAME", "Synchronizer", "WeightsInfo", "get_synchronizer"]
