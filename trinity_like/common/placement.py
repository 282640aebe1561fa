"""Placing a part's Ray actors on the nodes its config names (``explorer.node``, ``trainer.node``,
``synchronizer.node``: custom resources and node labels), and refusing at start a placement no node can take
(Ray would otherwise keep the actor pending forever)."""

from __future__ import annotations

from typing import Any, Protocol

from trinity_like.common.errors import RunError


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
