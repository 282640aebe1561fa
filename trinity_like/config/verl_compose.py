"""verl's config as verl builds it: its composed defaults, a user's file over them, Hydra command-line overrides,
then OmegaConf interpolations resolved; the result is what ``trinity_like.config.verl.translate`` reads.

verl's ``python3 -m verl.trainer.main_ppo key=value ...`` composes ``ppo_trainer.yaml`` from the config groups of
its ``defaults:`` list (actor, rollout, ref, model, critic, data, reward model, ...), applies the overrides, and
resolves ``${...}`` interpolations when a value is read. The composed defaults live here as data
(``verl_ppo_trainer.yaml``, and ``verl_dapo_trainer.yaml`` for DAPO's entry point ``recipe.dapo.main_dapo``, over
it; each file's header names the verl commit it comes from). Order, as in verl: defaults, then the file, then the
overrides, then resolution, so an override of ``data.max_response_length`` reaches every key that interpolates it.

Override grammar (Hydra's, the subset verl's scripts use): ``key=value`` sets a key verl's config has (an
unknown key is refused, as Hydra refuses it: add it with ``+``); ``+key=value`` adds a key; ``++key=value`` sets
or adds; ``~key`` (or ``~key=value``) deletes. Values: ``null``, ``true``/``false``, numbers (``1e-6`` included),
quoted strings, ``[a,b]`` lists, ``{k: v}`` dicts, ``${...}`` interpolations; anything else is a string.
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

from trinity_like.common.errors import ConfigError

HERE = Path(__file__).resolve().parent

ENTRIES: dict[str, tuple[str, ...]] = {
    "verl.trainer.main_ppo": ("verl_ppo_trainer.yaml",),
    "recipe.dapo.main_dapo": ("verl_ppo_trainer.yaml", "verl_dapo_trainer.yaml"),
}
"""verl entry points (the module a verl script runs with ``python3 -m``) -> the composed default files, in order."""
DEFAULT_ENTRY = "verl.trainer.main_ppo"

DEFAULTS_ITEMS = ("ppo_trainer", "dapo_trainer", "_self_")
"""Entries of a user file's ``defaults:`` list that name what the composed defaults already hold."""


def default_tree(entry: str = DEFAULT_ENTRY) -> dict[str, Any]:
    """verl's composed default config for ``entry``, interpolations unresolved (a fresh copy)."""
    return copy.deepcopy(_default_tree(entry))


@functools.cache
def _default_tree(entry: str) -> dict[str, Any]:
    import yaml

    if entry not in ENTRIES:
        raise ConfigError(f"verl entry point {entry!r} is not known here; the entry points are "
                          f"{', '.join(ENTRIES)}")
    tree: dict[str, Any] = {}
    for name in ENTRIES[entry]:
        tree = merge(tree, yaml.safe_load((HERE / name).read_text()) or {})
    return tree


@functools.cache
def default_leaves(entry: str = DEFAULT_ENTRY) -> dict[str, Any]:
    """verl's composed defaults for ``entry``, resolved, by dotted key."""
    return dict(leaves(resolve(default_tree(entry), "verl's defaults")))


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into a copy of ``base``: dicts key by key, anything else (lists included) replaced."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def leaves(node: Any, prefix: str = ""):
    """(dotted key, value) for every leaf; an empty dict is a leaf."""
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from leaves(v, f"{prefix}{k}.")
    else:
        yield prefix.rstrip("."), node


def drop_defaults_list(tree: dict[str, Any], source: str) -> dict[str, Any]:
    """A user file's own ``defaults:`` list, checked and removed: it may name verl's ppo_trainer (what the composed
    defaults are), ``_self_``, and the config groups verl's own defaults list chooses (``group@package: option``
    as ppo_trainer.yaml has them); any other choice is a composition this project does not hold."""
    items = tree.get("defaults")
    if items is None:
        return tree
    known = set(_group_choices())
    strange = []
    for item in items if isinstance(items, list) else [items]:
        if isinstance(item, str):
            if item.lstrip("/").removesuffix(".yaml") not in DEFAULTS_ITEMS and (item, "") not in known:
                strange.append(item)
        elif isinstance(item, dict):
            strange.extend(f"{k}: {v}" for k, v in item.items() if (str(k), str(v)) not in known)
        else:
            strange.append(repr(item))
    if strange:
        choices = ", ".join(f"{k}: {v}" if v else k for k, v in sorted(known))
        raise ConfigError(f"verl config {source}: its defaults list names {', '.join(strange)}, which verl's "
                          f"composed defaults here do not hold (they are ppo_trainer with {choices}); merge that "
                          "group's keys into the file by hand and drop it from defaults")
    return {k: v for k, v in tree.items() if k != "defaults"}


@functools.cache
def _group_choices() -> tuple[tuple[str, str], ...]:
    """The ``group@package: option`` choices of verl's ppo_trainer.yaml defaults list (kept in the data file's
    ``# defaults:`` comment lines)."""
    text = (HERE / ENTRIES[DEFAULT_ENTRY][0]).read_text()
    return tuple((m.group(1), m.group(2) or "")
                 for m in re.finditer(r"^#\s+-\s+([\w.]+@[\w.]+)(?::\s*([\w.]+))?\s*$", text, re.M))


def apply_overrides(tree: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Hydra command-line overrides applied to ``tree`` (a copy), in order."""
    tree = copy.deepcopy(tree)
    for item in overrides:
        text = item.strip()
        if text.startswith("~"):
            key = text[1:].partition("=")[0].strip()
            parent, leaf = _parent(tree, key, item, create=False)
            if parent is None or leaf not in parent:
                raise ConfigError(f"verl override {item!r}: there is no key {key!r} to delete")
            del parent[leaf]
            continue
        if "=" not in text:
            raise ConfigError(f"verl override {item!r} is not of the form key=value (+key=value adds a key, "
                              "~key deletes one)")
        key, _, raw = text.partition("=")
        add = force = False
        if key.startswith("++"):
            key, force = key[2:], True
        elif key.startswith("+"):
            key, add = key[1:], True
        key = key.strip()
        if not re.fullmatch(r"[A-Za-z_][\w-]*(\.[A-Za-z_0-9][\w-]*)*", key):
            raise ConfigError(f"verl override {item!r}: {key!r} is not a dotted key")
        parent, leaf = _parent(tree, key, item, create=add or force)
        if parent is None or (leaf not in parent and not (add or force)):
            raise ConfigError(f"verl override {item!r}: verl's config has no key {key!r} (Hydra refuses it too); "
                              f"check the spelling, or add a new key with +{key}=...")
        parent[leaf] = parse_value(raw)
    return tree


def _parent(tree: dict[str, Any], key: str, item: str, create: bool) -> tuple[dict[str, Any] | None, str]:
    *parents, leaf = key.split(".")
    node: Any = tree
    for p in parents:
        if not isinstance(node, dict):
            raise ConfigError(f"verl override {item!r}: {p!r} is not a section")
        if p not in node or node[p] is None:
            if not create:
                return None, leaf
            node[p] = {}
        node = node[p]
    if not isinstance(node, dict):
        raise ConfigError(f"verl override {item!r}: the key's parent is not a section")
    return node, leaf


_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf|nan)", re.I)


def parse_value(raw: str) -> Any:
    """One override value as Hydra reads it (the subset in the module docstring)."""
    import yaml

    s = raw.strip()
    if s == "":
        return ""
    if s[0] in "[{" and not s.startswith("${"):
        try:
            value = yaml.safe_load(s)
        except yaml.YAMLError:
            raise ConfigError(f"verl override value {raw!r} is not a valid list or dict") from None
        return _numbers(value)
    return _scalar(s)


def _scalar(s: str) -> Any:
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    low = s.lower()
    if low == "null":
        return None
    if low in ("true", "false"):
        return low == "true"
    if _INT.fullmatch(s):
        return int(s)
    if _FLOAT.fullmatch(s):
        return float(s)
    return s


def _numbers(value: Any) -> Any:
    """Inside a list or dict YAML leaves ``1e-6`` a string; Hydra reads it as a float."""
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, str) and _FLOAT.fullmatch(value) and not _INT.fullmatch(value):
        return float(value)
    return value


def resolve(tree: dict[str, Any], source: str) -> dict[str, Any]:
    """Every ``${...}`` interpolation of ``tree`` resolved (OmegaConf's, with ``oc.select`` and ``oc.env``)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(OmegaConf.create(tree), resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        where = f" at '{key}'" if key else ""
        raise ConfigError(f"verl config {source}: an interpolation{where} cannot be resolved: "
                          f"{str(e).splitlines()[0]}") from None


def compose(file_tree: dict[str, Any] | None, overrides: list[str] | tuple[str, ...] = (),
            entry: str = DEFAULT_ENTRY, source: str = "") -> dict[str, Any]:
    """The config verl would run: ``entry``'s composed defaults, the file over them (its ``defaults:`` list
    checked), the overrides, every interpolation resolved."""
    return compose_raw(file_tree, overrides, entry, source)[1]


def compose_raw(file_tree: dict[str, Any] | None, overrides: list[str] | tuple[str, ...] = (),
                entry: str = DEFAULT_ENTRY, source: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """``compose``, and before it the same tree with its interpolations as written (what tells a key the user
    set from one that follows another through an interpolation) -> (as written, resolved)."""
    tree = default_tree(entry)
    if file_tree:
        tree = merge(tree, drop_defaults_list(file_tree, source or "file"))
    tree = apply_overrides(tree, overrides)
    return tree, resolve(tree, source or "(command line)")


@functools.cache
def default_raw_leaves(entry: str = DEFAULT_ENTRY) -> dict[str, Any]:
    """verl's composed defaults for ``entry`` by dotted key, interpolations as written."""
    return dict(leaves(default_tree(entry)))
