"""Loading: YAML plus ``key=value`` overrides through OmegaConf structured configs, errors explained in one
sentence, and the resolved config back to YAML."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity_like.common.errors import ConfigError
from trinity_like.config.schema import RENAMED_KEYS, Config
from trinity_like.config.trees import has_key
from trinity_like.config.validation import validate

if TYPE_CHECKING:
    from trinity_like.config import trinity, verl

    Translation = verl.Translation | trinity.Translation


def load_config(path: str | os.PathLike | None, overrides: list[str] | tuple[str, ...] = (),
                allow_unmapped: bool = False) -> Config:
    """Load ``path`` (YAML; None = defaults), apply ``key=value`` overrides, validate, return a Config. A
    verl-shaped file (``trinity_like.config.verl``) is translated first; ``allow_unmapped`` lets its keys with no
    counterpart here be ignored instead of refused."""
    return load_config_with_translation(path, overrides, allow_unmapped)[0]


def load_config_with_translation(path: str | os.PathLike | None, overrides: list[str] | tuple[str, ...] = (),
                                 allow_unmapped: bool = False, verl: bool = False,
                                 entry: str | None = None) -> tuple[Config, Translation | None]:
    """``load_config``, and the ``Translation`` of a verl config (None for a config of ours), so that a caller
    that keeps the translation report (``trinity-like run``) does not translate it a second time.

    ``verl`` (``run --verl``), or a verl-shaped file: the config is verl's, built as verl builds it (its
    composed defaults for ``entry``, the file, the overrides that are verl keys, interpolations resolved) and
    then translated; the overrides that are keys of ours only (``mode``, ``synchronizer.*``, ``explorer.*``, ...)
    apply after the translation (``split_verl_overrides``).

    A Trinity-RFT-shaped file (``trinity_like.config.trinity.is_trinity_config``) is translated the same way: the
    overrides in Trinity's keys (``buffer.batch_size=4``) apply to its tree first, those in keys only ours has
    after the translation (``split_trinity_overrides``)."""
    from omegaconf import OmegaConf

    schema = OmegaConf.structured(Config)
    layers = []
    translation = None
    tree = None
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file '{path}' does not exist; pass the path of a YAML file such as "
                              "configs/quickstart.yaml")
        tree = _verl_tree(p)
        trinity_tree = _trinity_tree(p) if tree is None and not verl else None
        if trinity_tree is not None:
            from trinity_like.config.trinity import translate as translate_trinity

            trinity_items, overrides = split_trinity_overrides(overrides, schema)
            translation = translate_trinity(trinity_tree, path, trinity_items)
            layers.append(OmegaConf.create(translation.nested()))
        if tree is None and verl:
            raise ConfigError(f"run --verl: '{path}' is not a verl-shaped config (no data, actor_rollout_ref, "
                              "critic, reward_model or custom_reward_function section); drop --verl to run it as "
                              "a config of ours")
        if tree is None and trinity_tree is None:
            try:
                layers.append(OmegaConf.load(p))
            except Exception as e:  # yaml.YAMLError and OmegaConf's own errors share no base class
                raise ConfigError(f"config file '{path}' is not valid YAML: {str(e).splitlines()[0]}") from None
    if verl or tree is not None:
        from trinity_like.config.verl import translate
        from trinity_like.config.verl_compose import DEFAULT_ENTRY

        verl_items, overrides = split_verl_overrides(overrides, entry or DEFAULT_ENTRY, schema)
        translation = translate(tree, path, allow_unmapped, verl_items, entry or DEFAULT_ENTRY)
        layers.append(OmegaConf.create(translation.nested()))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value (for example trainer.total_steps=5)")
    layers = [_auto_staleness(layer) for layer in layers]
    cfg = _merge(schema, layers, overrides)
    if cfg.algorithm.adv_estimator == "dapo":  # DAPO's parts, under the values the file and overrides give
        cfg = _merge(schema, [OmegaConf.create(dapo_preset(cfg)), *layers], overrides)
    validate(cfg)
    return cfg, translation


def split_verl_overrides(overrides: list[str] | tuple[str, ...], entry: str, schema: Any) -> tuple[list[str], list[str]]:
    """A verl run's overrides, split into verl's (a key verl's config has, or Hydra's ``+``/``++``/``~`` forms)
    and ours (a key only our config has in ``schema``: ``mode=async``, ``synchronizer.max_staleness=2``, ...); a
    key in neither is refused, named with both places it was looked for."""
    from omegaconf import OmegaConf

    from trinity_like.config.verl_compose import default_tree

    verl_tree = default_tree(entry)
    verl_items, ours = [], []
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key.startswith(("+", "~")) or has_key(verl_tree, key):
            verl_items.append(item)
        elif OmegaConf.select(schema, key, default=_MISSING) is not _MISSING or key in RENAMED_KEYS:
            ours.append(item)
        else:
            raise ConfigError(f"override '{item}': neither verl's config nor ours has the key {key!r}; check the "
                              f"spelling (verl: add a new key with +{key}=...)")
    return verl_items, ours


_MISSING = object()


def split_trinity_overrides(overrides: list[str] | tuple[str, ...], schema: Any) -> tuple[list[str], list[str]]:
    """A Trinity run's overrides, split into Trinity's (a key of Trinity's schema: applied to its tree before the
    translation; ``mode`` when its value is one of Trinity's modes) and ours (a key only our config has:
    ``mode=async``, ``synchronizer.max_staleness=2``, ``explorer.plugin_dirs=[...]``: applied after it); a key in
    neither is refused."""
    from omegaconf import OmegaConf

    from trinity_like.config.trinity import TRINITY_MODES, is_trinity_key

    trinity_items, ours = [], []
    for item in overrides:
        key, _, value = item.partition("=")
        key = key.strip()
        if key == "mode":
            (trinity_items if value.strip() in TRINITY_MODES else ours).append(item)
        elif is_trinity_key(key):
            trinity_items.append(item)
        elif OmegaConf.select(schema, key, default=_MISSING) is not _MISSING or key in RENAMED_KEYS:
            ours.append(item)
        else:
            raise ConfigError(f"override '{item}': neither Trinity-RFT's config nor ours has the key {key!r}; check "
                              "the spelling (docs/trinity.md lists Trinity's keys, docs/config.md ours)")
    return trinity_items, ours


def _verl_tree(path: Path) -> dict[str, Any] | None:
    """A verl-shaped config file's parsed YAML, or None when the file is a config of ours."""
    from trinity_like.config.verl import is_verl_config, load_verl_file

    tree = load_verl_file(path)
    return tree if is_verl_config(tree) else None


def _trinity_tree(path: Path) -> dict[str, Any] | None:
    """A Trinity-RFT-shaped config file's parsed YAML, or None when the file is a config of ours."""
    from trinity_like.config.trinity import is_trinity_config, load_trinity_file

    tree = load_trinity_file(path)
    return tree if is_trinity_config(tree) else None


def _merge(schema: Any, layers: list[Any], overrides: list[str] | tuple[str, ...]) -> Config:
    """The schema, the file's layers and the overrides merged into a Config (errors explained in one line)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    layers = list(layers)
    try:
        merged = OmegaConf.merge(schema, *layers)
        for whole, items in _override_runs(overrides):
            if whole:  # key={...} on a dict field replaces the dict (a merge would keep the keys it does not name)
                key, _, value = items[0].partition("=")
                OmegaConf.update(merged, key.strip(), _flow_mapping(items[0], value), merge=False)
            else:
                layers.append(_auto_staleness(OmegaConf.from_dotlist(items)))
                merged = OmegaConf.merge(merged, layers[-1])
        cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
        auto = cfg.synchronizer.auto_staleness
        if auto.enabled:  # the hard bound: no trained row is ever staler than auto_staleness.max
            cfg.synchronizer.max_staleness = auto.max
    except OmegaConfBaseException as e:
        raise ConfigError(_explain_omegaconf_error(e, schema, layers)) from None
    except (TypeError, AttributeError) as e:  # e.g. a list index in a dotted override (OmegaConf's own error)
        raise ConfigError(f"cannot apply the overrides {' '.join(overrides) or '(none)'}: {str(e).splitlines()[0]}; "
                          "set a list as a whole (key=[...]) rather than one element") from None
    return cfg


def dapo_preset(cfg: Config) -> dict[str, Any]:
    """What ``algorithm.adv_estimator: dapo`` turns on (Yu et al. 2025, arXiv:2503.14476), each part a setting of
    its own that the file or an override may still change: clip-higher (``clip_ratio_high`` 0.28), token-level
    loss aggregation, dynamic sampling (groups with one reward for all samples dropped) and the soft overlong
    penalty (reward manager ``dapo`` with an overlong buffer of the last fifth of ``max_new_tokens``, as the
    paper's 4,096 of 20,480); no KL term. The advantage is GRPO's."""
    buffer_len = max(1, (cfg.reward.max_resp_len or cfg.explorer.sampling.max_new_tokens) // 5)
    return {"algorithm": {"clip_ratio_high": 0.28, "loss_agg_mode": "token-mean", "use_kl_loss": False,
                          "use_kl_in_reward": False},
            "explorer": {"dynamic_sampling": True},
            "reward": {"manager": "dapo", "overlong_buffer": {"enable": True, "len": buffer_len,
                                                              "penalty_factor": 1.0}}}


def _auto_staleness(layer: Any) -> Any:
    """``synchronizer.max_staleness: auto`` in a layer becomes ``synchronizer.auto_staleness.enabled: true``
    (``max_staleness`` itself stays an integer: the hard bound, set to ``auto_staleness.max``)."""
    from omegaconf import OmegaConf

    sync = layer.get("synchronizer") if OmegaConf.is_dict(layer) else None
    if OmegaConf.is_dict(sync) and sync.get("max_staleness") == "auto":
        del sync["max_staleness"]
        OmegaConf.update(layer, "synchronizer.auto_staleness.enabled", True, merge=True)
    return layer


def _override_runs(overrides) -> list[tuple[bool, list[str]]]:
    """The overrides in order, as runs of plain ``key=value`` items (merged as one layer) and single whole-dict
    items ``key={...}`` on a dict field such as ``buffer.mix`` (which replace the dict)."""
    runs: list[tuple[bool, list[str]]] = []
    for item in overrides:
        key, _, value = item.partition("=")
        whole = _is_dict_field(key.strip()) and value.lstrip().startswith("{")
        if whole or not runs or runs[-1][0]:
            runs.append((whole, [item]))
        else:
            runs[-1][1].append(item)
    return runs


def _is_dict_field(key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = _dataclass_at(parent)
    ftype = _field_type(node, leaf) if node is not None else None
    return ftype is not None and ftype.startswith("dict[")


def _flow_mapping(item: str, value: str) -> dict:
    """``{explorer:0.5,human:0.5}`` (the shell-friendly form, no spaces) or ``{explorer: 0.5, human: 0.5}`` as a
    dict. YAML alone reads ``explorer:0.5`` as one key, so a colon gets its space first."""
    import re

    import yaml

    try:
        parsed = yaml.safe_load(re.sub(r":(?!\s)", ": ", value))
    except yaml.YAMLError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ConfigError(f"override '{item}' is not a mapping; write it as key={{name: value, ...}}, for "
                          "example buffer.mix={explorer: 0.75, agent: 0.25}")
    return parsed


def _explain_omegaconf_error(e: Exception, schema: Any, layers: list[Any]) -> str:
    key = getattr(e, "full_key", None)
    msg = str(getattr(e, "msg", None) or e).splitlines()[0]
    if not key:
        # Some merge errors (a scalar where a section belongs) carry no key: find it by trying each leaf.
        key = _locate_bad_key(schema, layers) or "?"
        section = _dataclass_at(key) if key != "?" else None
        if section is not None:
            keys = ", ".join(f.name for f in dataclasses.fields(section))
            return f"'{key}' is a section, not a value; set its keys instead ({keys})"
    parent, _, leaf = key.rpartition(".")
    node = _dataclass_at(parent)
    if type(e).__name__ == "ConfigKeyError" or "not in" in msg:
        if key in RENAMED_KEYS:
            return f"config key '{key}' was replaced: {RENAMED_KEYS[key]}"
        if node is None:
            return f"unknown config key '{key}'"
        valid = ", ".join(f.name for f in dataclasses.fields(node))
        where = f"under '{parent}'" if parent else "at the top level"
        return f"unknown config key '{key}'; valid keys {where}: {valid}"
    ftype = _field_type(node, leaf) if node is not None else None
    expected = f" (expected {ftype})" if ftype else ""
    return f"bad value for '{key}'{expected}: {msg}"


def _leaves(node: Any, prefix: str = ""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix.rstrip("."), node


def _locate_bad_key(schema: Any, layers: list[Any]) -> str | None:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for layer in layers:
        for key, value in _leaves(OmegaConf.to_container(layer)):
            try:
                OmegaConf.update(schema.copy(), key, value, merge=True)
            except OmegaConfBaseException:
                return key
    return None


def _dataclass_at(dotted: str) -> type | None:
    """The config dataclass of section ``dotted`` ("" = the top level), or None if it names no section."""
    node: type = Config
    for part in filter(None, dotted.split(".")):
        sub = {f.name: f for f in dataclasses.fields(node)}.get(part)
        factory = sub.default_factory if sub is not None else None
        if not (isinstance(factory, type) and dataclasses.is_dataclass(factory)):
            return None
        node = factory
    return node


def _field_type(node: type, name: str) -> str | None:
    for f in dataclasses.fields(node):
        if f.name == name:
            return str(f.type)
    return None


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML, the form saved into the run directory."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Leaf values of a config (or any part of it) by dotted key; a dict field gives one key per entry."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out.update(flatten(value, f"{prefix}{f.name}."))
        elif isinstance(value, dict):  # e.g. buffer.mix: one key per entry, so a difference names the entry
            out.update({f"{prefix}{f.name}.{k}": v for k, v in value.items()})
        else:
            out[f"{prefix}{f.name}"] = value
    return out
