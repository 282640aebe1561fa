"""The explorer's side of weight delivery: one receiver per ``synchronizer.method``, which the fleet asks to bring
an engine (its Ray actor) to a published version. The fleet holds no knowledge of the methods: it looks the
receiver up by ``WeightsInfo.method`` and keeps each load within the receiver's deadline.

An engine actor answers every receiver with ``{"version", "bytes", "fingerprint"}``: the version it holds now
(by broadcast perhaps newer than asked for), the bytes it loaded, and the fingerprint of what it serves.
"""

from __future__ import annotations

from typing import Any

from trinity_like.common.registry import Registry
from trinity_like.weights.messages import WeightsInfo

RECEIVERS: Registry = Registry("weight receiver")
"""``WeightsInfo.method`` -> a Receiver (``""``: version 0, the initial model)."""


class Receiver:
    """Brings one engine to a version. Stateless: one instance serves every engine of a fleet."""

    def deadline_s(self, sync_timeout_s: float) -> float:
        """How long one engine's load may take (``synchronizer.sync_timeout_s``)."""
        return sync_timeout_s

    async def deliver(self, actor, info: WeightsInfo) -> dict[str, Any]:
        raise NotImplementedError


@RECEIVERS.register("")
class InitialModel(Receiver):
    """Version 0: the model every engine starts with, so there is nothing to load; an engine Ray restarted is
    there again, and says which version it holds."""

    async def deliver(self, actor, info: WeightsInfo) -> dict[str, Any]:
        health = await actor.health.remote()
        return {"version": health["model_version"], "bytes": 0}


class Load(Receiver):
    """The engine reads the version itself: from its files (``checkpoint``), the object store (``memory``) or a
    shared buffer on its node (``ipc``), checks it against the published fingerprint, and applies it."""

    async def deliver(self, actor, info: WeightsInfo) -> dict[str, Any]:
        return await actor.update_weights.remote(info.version, info.path, info.refs, info.fingerprint, info.shared)


for _method in ("checkpoint", "memory", "ipc"):
    RECEIVERS.register(_method)(Load)


@RECEIVERS.register("broadcast")
class JoinRound(Receiver):
    """The engine waits for the next broadcast round of a version at least ``info.version`` and receives it
    (``broadcast.WeightReceiver``); it may receive a newer one."""

    def deadline_s(self, sync_timeout_s: float) -> float:
        """Twice ``sync_timeout_s`` and a margin: a round under way, perhaps failing at its own deadline, may
        hold the broadcaster before ours starts."""
        return 2 * sync_timeout_s + 10

    async def deliver(self, actor, info: WeightsInfo) -> dict[str, Any]:
        return await actor.receive_weights.remote(info.version)


def receiver_for(info: WeightsInfo) -> Receiver:
    return RECEIVERS.get(info.method)()


def read_source(path: str | None, shared: dict[str, Any] | None) -> tuple[dict, int, str]:
    """Inside an engine (or a vLLM worker): the tensors of a version it reads itself, the bytes, and the
    fingerprint they were checked against as they were read ("" where none was): a version folder, each part's
    tensors checked against its manifest (``files.load_version``), or this process's own copy of a shared buffer
    (``shared.open_shared``), which the caller checks: the copy cannot change under it, the buffer can."""
    if path is not None:
        from trinity_like.weights.files import load_version

        return load_version(path)
    from trinity_like.weights.shared import open_shared

    return open_shared(shared, copy=True), int(shared["size"]), ""
