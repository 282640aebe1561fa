"""What the trainer role needs from a training engine, and how it gets one.

``TrainEngineWrapper`` is the interface (the shape of Trinity-RFT's wrapper); ``TRAINERS`` maps
``trainer.type`` to an implementation (``ppo``: ``trinity_like.trainer.ppo.PPOTrainer``); the trainer role's
``make_train_engine`` builds the one the config names, spread over ``trainer.num_workers`` data-parallel workers
when there are several (``trinity_like.trainer.workers.DataParallelTrainer``, itself a ``TrainEngineWrapper``).

Departure from the seed's API: ``save_checkpoint`` takes no ``block_until_saved`` / ``save_as_hf`` flags. Our
checkpoints always block (they are written atomically before the ledger moves on) and always hold the model in
Hugging Face format, so the flags could only be ignored.
"""

from __future__ import annotations

import abc
from pathlib import Path

from trinity_like.common.experience import Experience
from trinity_like.common.registry import Registry

TRAINERS: Registry = Registry("trainer type")
"""``trainer.type`` -> a TrainEngineWrapper class taking ``(cfg, synchronizer)``."""


class TrainEngineWrapper(abc.ABC):
    """What the trainer role needs from a training engine."""

    @abc.abstractmethod
    def prepare(self) -> None:
        """Load the model and optimizer."""

    @property
    @abc.abstractmethod
    def train_step_num(self) -> int:
        """Trainer steps done; also the version of the weights held now."""

    @abc.abstractmethod
    def train_step(self, batch_exps: list[Experience]) -> dict[str, float]:
        """Train one step on ``batch_exps``; return metrics with namespaced keys."""

    @abc.abstractmethod
    def save_checkpoint(self) -> Path:
        """Write a full checkpoint (weights, optimizer, step) and move ``checkpoints/latest`` to it."""

    @abc.abstractmethod
    def load_checkpoint(self, path: Path) -> None:
        """Restore everything ``save_checkpoint`` wrote."""

    @abc.abstractmethod
    def save_state_dict(self) -> Path:
        """Write the weights of the current version for the synchronizer (method ``checkpoint``)."""

    @abc.abstractmethod
    def upload_state_dict(self) -> object:
        """Hand the current weights to the synchronizer without a file (method ``memory``)."""

    @abc.abstractmethod
    def sync_weight(self) -> dict[str, float]:
        """Publish the current weights by the configured synchronizer method; return ``sync/*`` metrics."""

    def shutdown(self) -> None:  # noqa: B027 (optional: most engines hold nothing to release)
        """Release what ``prepare`` started."""
