"""Placing a part's Ray actors on the nodes its config names (``explorer.node``, ``trainer.node``,
``synchronizer.node``: custom resources and node labels), refusing at start a placement no node can take
(Ray would otherwise keep the actor pending forever), and the device a computing process takes for its
``device: auto`` (the GPU Ray assigned it, never merely a GPU it can see)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from trinity_like.common.errors import RunError, UserError

if TYPE_CHECKING:
    import torch


class NodeSettings(Protocol):
    """The part of ``trinity_like.config.NodeConfig`` placement reads (duck-typed: ``common`` imports no
    config)."""

    resources: dict[str, float]
    """Custom Ray resources each actor asks for."""
    labels: dict[str, str]
    """Node labels each actor requires (a Ray label selector)."""


def actor_options(node: NodeSettings) -> dict[str, Any]:
    """``.options(...)`` keywords that pin one actor to the nodes ``node`` names (none when it names none)."""
    options: dict[str, Any] = {}
    if node.resources:
        options["resources"] = dict(node.resources)
    if node.labels:
        options["label_selector"] = dict(node.labels)
    return options


def bundle(node: NodeSettings, base: dict[str, float]) -> dict[str, float]:
    """A placement-group bundle of ``base`` (CPU, GPU) plus the custom resources ``node`` asks for."""
    return {**base, **node.resources}


def bundle_label_selector(node: NodeSettings, bundles: int) -> list[dict[str, str]] | None:
    """The ``bundle_label_selector`` of a placement group of ``bundles`` bundles (None without labels)."""
    return [dict(node.labels) for _ in range(bundles)] if node.labels else None


def check_placeable(node: NodeSettings, what: str) -> None:
    """Raise RunError unless some live node of the cluster offers every resource and label ``node`` names
    (``what``: the config key, for the message)."""
    import ray

    if not node.resources and not node.labels:
        return
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    for n in nodes:
        have, labels = n.get("Resources", {}), n.get("Labels", {}) or {}
        if (all(have.get(k, 0.0) >= v for k, v in node.resources.items())
                and all(labels.get(k) == v for k, v in node.labels.items())):
            return
    offered = sorted({k for n in nodes for k in n.get("Resources", {}) if not _builtin(k)})
    labels = sorted({f"{k}={v}" for n in nodes for k, v in (n.get("Labels") or {}).items()
                     if not k.startswith("ray.io/")})
    wanted = ", ".join([f"resource {k}>={v:g}" for k, v in node.resources.items()]
                       + [f"label {k}={v}" for k, v in node.labels.items()])
    raise RunError(f"{what} asks for a node with {wanted}, and none of the {len(nodes)} live nodes has it (custom "
                   f"resources: {', '.join(offered) or 'none'}; labels: {', '.join(labels) or 'none'}); start one "
                   "with `ray start --address HEAD --resources '{\"NAME\": N}' --labels KEY=VALUE`, or change "
                   f"{what}")


def _builtin(resource: str) -> bool:
    """Ray's own resources: CPU, GPU, memory, object_store_memory, node:<ip>, accelerator types."""
    return (resource in ("CPU", "GPU", "memory", "object_store_memory") or resource.startswith("node:")
            or resource.startswith("accelerator_type:"))


def ray_gpu_ids() -> list[str] | None:
    """The GPU ids Ray assigned this process when it is a Ray worker, an actor or a task (empty: it asked for no
    GPU); None outside one (a driver, a process without Ray). Ray's GPU shares are bookkeeping: since Ray 2.4x an actor that asks
    for ``num_gpus=0`` keeps the node's ``CUDA_VISIBLE_DEVICES`` and sees every GPU, so these ids, not
    ``torch.cuda.is_available()``, say whether it was given one. Ray is not imported here: a process that has
    not imported it is no Ray actor."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    if context.worker.mode != ray.WORKER_MODE:  # a driver: Ray assigned it nothing, it uses what it sees
        return None
    return [str(i) for i in context.get_accelerator_ids().get("GPU", [])]


_GPU_KEYS = {"trainer": ("trainer.gpus_per_worker", "trainer worker"),
             "explorer": ("explorer.gpus_per_engine", "rollout engine")}
"""``role`` -> (the key that asks Ray for its GPUs, what the process is called in messages)."""


def device_kind(setting: str, role: str, gpu_ids: list[str] | None, cuda_visible: bool) -> str:
    """``cpu`` or ``cuda`` for a ``<role>.device`` setting (``auto``, ``cpu`` or ``cuda``) of a process that Ray
    assigned ``gpu_ids`` (None: not a Ray actor) and that sees a CUDA device or not (``cuda_visible``).

    ``auto`` is the GPU Ray gave the actor: with no ids it is the CPU even where CUDA is visible (an actor that
    asked for no share would otherwise take memory nobody accounted for, beside the parts that did ask); outside
    Ray it is whatever the process sees. ``cuda`` without a GPU of its own is a UserError naming the key."""
    if setting not in ("auto", "cpu", "cuda"):  # before any branch: a typo must not pass where a GPU is visible
        raise ValueError(f"device must be auto, cpu or cuda, got {setting!r}")
    if setting == "cpu":
        return "cpu"
    given = cuda_visible and (gpu_ids is None or bool(gpu_ids))
    if given:
        return "cuda"
    if setting == "cuda":
        key, who = _GPU_KEYS[role]
        why = ("sees no GPU" if not cuda_visible or gpu_ids is None else
               f"was given no GPU by Ray ({key} is 0; it sees the node's GPUs, but Ray shares them by what each "
               "actor asks for)")
        raise UserError(f"{role}.device is cuda but this {who} {why}: Ray shows an actor only the GPUs it asks for, "
                        f"so set {key} (e.g. 1, or 0.5 to share one GPU), or set {role}.device=auto to run on the "
                        "CPU when there is none")
    return "cpu"


def resolve_device(setting: str, role: str = "trainer",
                   cuda_visible: Callable[[], bool] | None = None) -> torch.device:
    """The device of a computing process (a train worker, an ``hf`` rollout engine) for its ``<role>.device``, in
    the process itself (``device_kind`` says which); ``cuda_visible`` defaults to ``torch.cuda.is_available``."""
    import torch

    visible = (cuda_visible or torch.cuda.is_available)()
    if device_kind(setting, role, ray_gpu_ids(), visible) == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())
