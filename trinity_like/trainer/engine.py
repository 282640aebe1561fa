"""What the trainer role needs from a training engine, and how it gets one.

``TrainEngineWrapper`` is the interface (the shape of Trinity-RFT's wrapper); ``TRAINERS`` maps
``trainer.type`` to an implementation (``ppo``: ``trinity_like.trainer.ppo.PPOTrainer``); the trainer role's
``make_train_engine`` builds the one the config names, spread over ``trainer.num_workers`` data-parallel workers
when there are several (``trinity_like.trainer.workers.DataParallelTrainer``, itself a ``TrainEngineWrapper``).

Departure from the seed's API: ``save_checkpoint`` takes no ``block_until_saved`` / ``save_as_hf`` flags. Our
checkpoints always block (they are written atomically before the ledger moves on) and always hold the model in
Hugging Face format, so the flags could only be ignored. The seed's ``prepare`` and ``train_step`` are coroutines;
here they are plain methods (the trainer role calls them from its own thread) and ``as_async()`` gives the
awaitable form (``AsyncTrainEngine``) for code written against the seed.
"""

from __future__ import annotations

import abc
import asyncio
from pathlib import Path
from typing import Any

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

    def as_async(self) -> AsyncTrainEngine:
        """This engine in the seeds' awaitable shape (``await engine.prepare()``, ``await engine.train_step(...)``)."""
        return AsyncTrainEngine(self)


class PublishesWeights:
    """``save_state_dict``, ``upload_state_dict``, ``sync_weight`` and ``shutdown`` of an engine that publishes
    through ``self.publisher`` (``weights.publish.PUBLISHERS``, built with the engine) and holds ``self.synchronizer``:
    the PPO trainer and the emulated one."""

    publisher: Any
    synchronizer: Any

    def save_state_dict(self) -> Path:
        """Write this version's weights (this rank's share) as ``state_dict/version-<k>/``."""
        from trinity_like.weights.publish import write_state_dict

        return write_state_dict(self)[0]

    def upload_state_dict(self) -> object:
        """An object-store reference to the current weights (None on ranks that do not write)."""
        from trinity_like.weights.publish import upload_state_dict

        return upload_state_dict(self)[0]

    def sync_weight(self) -> dict[str, float]:
        """Publish the current weights (version = step) by ``synchronizer.method``; return ``sync/*`` metrics."""
        if self.synchronizer is None:
            raise RuntimeError("sync_weight needs a synchronizer actor")
        return self.publisher.publish()

    def shutdown(self) -> None:
        self.publisher.close()


class AsyncTrainEngine:
    """A TrainEngineWrapper in the seeds' awaitable shape (Trinity-RFT's ``async prepare()`` and ``async
    train_step(batch_exps)``). Each call runs the engine's method in a worker thread (``asyncio.to_thread``), so
    the event loop that awaits it (an async Ray actor, a server) keeps serving while a step trains."""

    def __init__(self, engine: TrainEngineWrapper) -> None:
        self.engine = engine
        self._lock = asyncio.Lock()
        """One call at a time: two steps (or a step and a checkpoint) must not interleave on one model."""

    @property
    def train_step_num(self) -> int:
        return self.engine.train_step_num

    async def _call(self, fn, *args):
        async with self._lock:
            return await asyncio.to_thread(fn, *args)

    async def prepare(self) -> None:
        await self._call(self.engine.prepare)

    async def train_step(self, batch_exps: list[Experience]) -> dict[str, float]:
        return await self._call(self.engine.train_step, batch_exps)

    async def save_checkpoint(self) -> Path:
        return await self._call(self.engine.save_checkpoint)

    async def save_state_dict(self) -> Path:
        return await self._call(self.engine.save_state_dict)

    async def upload_state_dict(self) -> object:
        return await self._call(self.engine.upload_state_dict)

    async def sync_weight(self) -> dict[str, float]:
        return await self._call(self.engine.sync_weight)

    async def shutdown(self) -> None:
        await self._call(self.engine.shutdown)
