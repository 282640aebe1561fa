"""The explorer's side of weight delivery, in two registries keyed by ``WeightsInfo.method``:

- ``RECEIVERS``: one receiver per ``synchronizer.method``, which the fleet asks to bring an engine (its Ray actor)
  to a published version. The fleet holds no knowledge of the methods: it looks the receiver up and keeps each
  load within the receiver's deadline. An engine actor answers every receiver with ``{"version", "bytes",
  "fingerprint"}``: the version it holds now (by broadcast perhaps newer than asked for), the bytes it loaded,
  and the fingerprint of what it serves.
- ``SOURCES``: for the methods whose engine reads the version itself (the ``WeightsInfo`` handed to it whole),
  where the tensors are read from (``read_weights``): a version's files, the tensors in this process (or the
  object store), a shared buffer on this node. Every engine reads through it (hf in its process, vLLM in its
  workers for the sources they can read themselves, ``WeightSource.by_reference``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trinity_like.common.registry import Registry
from trinity_like.weights.messages import WeightsInfo, check_one_source

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
        return await actor.update_weights.remote(info)


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


@dataclass
class Received:
    """The tensors of a version as an engine (or a vLLM worker) read them."""

    state_dict: dict[str, Any]
    bytes: int
    checked: str = ""
    """The fingerprint these tensors were checked against as they were read ("" where none was: the caller
    checks them)."""


class WeightSource:
    """Where an engine reads the versions of one method from. Stateless."""

    field = ""
    """The ``WeightsInfo`` field (``messages.SOURCE_FIELDS``) that names where the version is."""
    by_reference = False
    """Whether another process of this node reads the version from what the message names (a path, a shared
    buffer's handle: ``WeightsInfo.plain()``), so that vLLM's workers read it themselves; else the tensors are in
    this process and are sent to them."""
    read_as = ""
    """How an engine's workers got the tensors, in the message of a version they refused."""

    def layout(self, info: WeightsInfo) -> tuple[Iterable[str], int]:
        """The version's tensor names and bytes, without reading the tensors (``by_reference`` sources)."""
        raise NotImplementedError

    def read(self, info: WeightsInfo) -> Received:
        raise NotImplementedError


SOURCES: Registry = Registry("weight source")
"""``WeightsInfo.method`` -> the WeightSource an engine reads that method's versions from."""


@SOURCES.register("checkpoint")
class VersionFiles(WeightSource):
    """A version folder (or a safetensors file): each part's tensors checked against its manifest as they are
    read (``files.load_version``)."""

    field, by_reference, read_as = "path", True, "read from its files"

    def layout(self, info: WeightsInfo) -> tuple[Iterable[str], int]:
        from trinity_like.weights.files import read_manifest, tensor_names

        path = Path(info.path)
        if not path.exists():
            raise FileNotFoundError(f"no weights at '{info.path}'")
        return tensor_names(info.path), read_manifest(path)["bytes"] if path.is_dir() else path.stat().st_size

    def read(self, info: WeightsInfo) -> Received:
        from trinity_like.weights.files import load_version

        return Received(*load_version(info.path))


@SOURCES.register("ipc")
class SharedBuffer(WeightSource):
    """This process's own copy of a shared buffer on its node (``shared.open_shared``), which the caller checks:
    the copy cannot change under it, the buffer can."""

    field, by_reference, read_as = "shared", True, "mapped from shared memory"

    def layout(self, info: WeightsInfo) -> tuple[Iterable[str], int]:
        return info.shared.names(), int(info.shared.size)

    def read(self, info: WeightsInfo) -> Received:
        from trinity_like.weights.shared import open_shared

        return Received(open_shared(info.shared, copy=True), int(info.shared.size))


@SOURCES.register("memory")
class Tensors(WeightSource):
    """The tensors themselves: in this process already, or fetched from the object store (its one ObjectRef)."""

    field, by_reference, read_as = "state_dict", False, "sent to its workers"

    def read(self, info: WeightsInfo) -> Received:
        if info.state_dict is not None:
            state_dict = info.state_dict
        else:
            import ray

            state_dict = ray.get(info.refs[0])
        return Received(state_dict, sum(t.numel() * t.element_size() for t in state_dict.values()))


def weight_source(info: WeightsInfo) -> WeightSource:
    """The source an engine reads ``info`` from, once it is sure the update names exactly one (``ValueError``
    otherwise) and the one its method reads (``KeyError`` listing the methods for an unknown one)."""
    check_one_source(info)
    source = SOURCES.get(info.method)()
    if info.sources() != [source.field]:
        raise ValueError(f"a version of method {info.method!r} is read from {source.field}, this update names "
                         f"{info.sources()[0]}")
    return source


def read_weights(info: WeightsInfo) -> Received:
    """Inside an engine (or a vLLM worker): the tensors of a version it reads itself (``weight_source``)."""
    return weight_source(info).read(info)
