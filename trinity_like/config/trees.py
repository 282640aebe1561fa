"""Dotted keys over nested config trees (plain dicts, as YAML reads them), shared by the translators of foreign
configs (``verl``, ``trinity``) and the loader."""

from __future__ import annotations

from typing import Any


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1, "a.c": 2}`` as ``{"a": {"b": 1, "c": 2}}``: a translation's keys of ours as the sections a YAML
    config of ours holds."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def has_key(tree: dict[str, Any], key: str) -> bool:
    """Whether the dotted ``key`` is present in ``tree`` (its value may be anything, None included)."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True
