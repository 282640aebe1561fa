"""The Synchronizer: a named Ray actor that holds the latest published policy version.

The trainer publishes version v (a safetensors file for ``checkpoint``, an object-store reference for
``memory``); explorers ask for the latest version at a step boundary, or wait until one is new enough for
their staleness bound. No weights pass through this actor's memory: it holds a path or a reference only.

It also records which roles have finished or failed, so a role waiting on the other can stop instead of
waiting for its timeout.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import ray

SYNCHRONIZER_NAME = "synchronizer"


@dataclass
class WeightsInfo:
    """Where the weights of one published version are."""

    version: int
    path: str | None = None
    """safetensors file (method ``checkpoint``)."""
    refs: list[Any] = field(default_factory=list)
    """One Ray ObjectRef of the state dict (method ``memory``); wrapped in a list so Ray does not
    dereference it when the message crosses an actor boundary."""


class Synchronizer:
    """State: the latest ``WeightsInfo`` and the roles that ended. All methods run on the actor's event
    loop, one at a time, so no lock is needed; ``_changed`` wakes waiters when either changes."""

    def __init__(self) -> None:
        self._latest = WeightsInfo(version=0)
        self._ended: dict[str, str] = {}
        """role -> "finished" or the error text of a failed role."""
        self._changed = asyncio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def publish(self, info: WeightsInfo) -> None:
        if info.version < self._latest.version:
            raise ValueError(f"version {info.version} is older than the published {self._latest.version}")
        self._latest = info
        self._notify()

    async def latest(self) -> WeightsInfo:
        return self._latest

    async def wait_for_version(self, min_version: int, timeout_s: float) -> WeightsInfo:
        """Return the latest info once its version is >= ``min_version``. Raise TimeoutError after
        ``timeout_s``, or RuntimeError if the trainer ended without publishing it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._latest.version < min_version:
            if "trainer" in self._ended:
                raise RuntimeError(f"trainer ended ({self._ended['trainer']}) before publishing version "
                                   f"{min_version}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"no policy version >= {min_version} was published within {timeout_s:.0f}s "
                                   f"(latest is {self._latest.version})")
            event = self._changed
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                pass
        return self._latest

    async def mark_ended(self, role: str, reason: str = "finished") -> None:
        self._ended[role] = reason
        self._notify()

    async def ended(self) -> dict[str, str]:
        return dict(self._ended)


def get_synchronizer(namespace: str):
    """The run's Synchronizer actor, created by whichever role asks first."""
    actor_cls = ray.remote(num_cpus=0)(Synchronizer)
    return actor_cls.options(name=SYNCHRONIZER_NAME, namespace=namespace, get_if_exists=True,
                             max_concurrency=64).remote()
