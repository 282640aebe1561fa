"""Trinity-RFT-shaped configs: detected by their shape, translated into this project's config with Trinity's meaning.

A Trinity-RFT config (``trinity/common/config.py``: sections ``buffer`` with ``explorer_input`` / ``trainer_input``,
``model.model_path``, ``algorithm.algorithm_type``, ``cluster``, ``explorer.rollout_model``, ``synchronizer.sync_*``,
``stages``, ...) is read as Trinity reads it: its ``key=value`` overrides in Trinity's keys applied to the tree, its
``${oc.env:VAR,default}`` interpolations resolved by OmegaConf, then translated key by key through
``trinity_rules.RULES`` (every key of Trinity's schema has a rule: mapped, checked, derived or no effect). Keys
Trinity does not have and values with no counterpart here are all named in one message.

What Trinity's ``check_and_update`` derives is derived here the same way (``_derive``): ``train_batch_size`` =
``batch_size x repeat_times``, the run's length from ``total_epochs`` x the task set's rows (counted when the data
is local), ``max_model_len`` / ``max_prompt_tokens`` / ``max_response_tokens`` completed from each other, the GPUs
split between engines (``engine_num x tensor_parallel_size``) and trainer (the rest), ``nccl`` weight sync turned
into ``checkpoint`` where Trinity turns it (separate jobs, SFT / DPO, LoRA), the algorithm's own defaults (helper
table ``trinity_like.algorithms.trinity_algorithms``). Where Trinity's default for an omitted key differs from ours,
Trinity's applies (``TRINITY_DEFAULTS``, each a row of docs/coming-from-trinity.md). Modes: ``both`` is our ``sync``
(``sync_interval`` 1, ``sync_offset`` 0) or ``async`` bounded by ``sync_interval - 1 + sync_offset``; ``explore`` /
``train`` are the explorer / trainer roles of one async run (they meet through the run directory); ``bench`` and
``serve`` are our commands of those names; ``colocate`` is ``sync`` with trainer and engine on one GPU; a stage
list of an SFT warm-up then RFT is our warm-up. Every remaining difference of meaning is one line of
``Translation.differences`` (``config-convert`` ends with them).

The table is rendered into docs/trinity.md (``render_docs``; tests/config/test_trinity.py keeps it current).
"""

from __future__ import annotations

import difflib
import glob
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trinity_like.common.errors import ConfigError
from trinity_like.config.trees import has_key, nest
from trinity_like.config.trinity_rules import EXACT, RULES, SECTIONS, Rule, Unmapped, find_rule, normalise

TRINITY_MODES = ("both", "explore", "train", "bench", "serve", "colocate")

TRINITY_SIGNS = ("cluster", "stages", "data_processor", "service", "log", "buffer.explorer_input",
                 "buffer.trainer_input", "buffer.train_batch_size", "buffer.total_epochs", "buffer.total_steps",
                 "buffer.batch_size", "model.model_path", "algorithm.algorithm_type", "algorithm.repeat_times",
                 "algorithm.optimizer", "explorer.rollout_model", "explorer.runner_per_model",
                 "synchronizer.sync_method", "synchronizer.sync_interval", "synchronizer.sync_style",
                 "synchronizer.sync_offset", "trainer.trainer_config", "trainer.trainer_type", "monitor.monitor_type")
"""Keys only Trinity-RFT's configs have (none is a key of ours or a top-level section of verl's)."""

TRINITY_DEFAULTS: dict[str, Any] = {
    "mode": "both", "project": "Trinity-RFT", "name": "rft", "group": "", "checkpoint_root_dir": "",
    "algorithm.algorithm_type": "ppo", "algorithm.repeat_times": 1,
    "algorithm.optimizer.lr": 1e-6, "algorithm.optimizer.lr_warmup_steps": -1,
    "algorithm.optimizer.lr_warmup_steps_ratio": 0.0, "algorithm.optimizer.min_lr_ratio": 0.01,
    "algorithm.optimizer.weight_decay": 0.01, "model.temperature": 1.0, "model.top_p": 1.0, "model.top_k": -1,
    "model.enable_prompt_truncation": True, "cluster.node_num": 0, "cluster.gpu_per_node": 0,
    "buffer.batch_size": 1, "buffer.train_batch_size": 0, "buffer.total_epochs": 1,
    "explorer.max_timeout": 1800, "explorer.eval_interval": 100, "explorer.rollout_model.engine_type": "vllm",
    "explorer.rollout_model.engine_num": 1, "explorer.rollout_model.tensor_parallel_size": 1,
    "explorer.rollout_model.gpu_memory_utilization": 0.9, "trainer.use_dynamic_bsz": True,
    "synchronizer.sync_method": "nccl", "synchronizer.sync_style": "fixed", "synchronizer.sync_interval": 1,
    "synchronizer.sync_offset": 0, "synchronizer.sync_timeout": 3600,
    "buffer.trainer_input.experience_buffer.max_read_timeout": 1800,
    "buffer.trainer_input.experience_buffer.capacity": 10000, "monitor.monitor_type": "tensorboard",
}
"""Trinity-RFT's defaults (9051d63) of the keys read here."""


@dataclass(frozen=True)
class DefaultRow:
    """A key a Trinity config may omit whose Trinity default differs from ours: the translation applies Trinity's."""

    trinity: str
    trinity_default: str
    ours: str
    ours_default: str
    applied: str


DEFAULTS_WHERE_OURS_DIFFER: tuple[DefaultRow, ...] = (
    DefaultRow("algorithm.optimizer.lr", "1e-6", "trainer.optimizer.lr", "1e-4", "1e-6"),
    DefaultRow("algorithm.optimizer.weight_decay", "0.01", "trainer.optimizer.weight_decay", "0.0", "0.01"),
    DefaultRow("algorithm.optimizer.min_lr_ratio", "0.01", "trainer.optimizer.min_lr_ratio", "0.0", "0.01"),
    DefaultRow("buffer.batch_size", "1", "explorer.batch_size", "4", "1"),
    DefaultRow("algorithm.repeat_times", "1", "explorer.repeat_times", "4", "1 (DPO: 2)"),
    DefaultRow("buffer.total_epochs", "1", "trainer.total_steps", "3", "1 epoch of the task set"),
    DefaultRow("mode", "both (sync_interval 1, sync_offset 0)", "mode", "async", "sync"),
    DefaultRow("synchronizer.sync_method", "nccl", "synchronizer.method", "checkpoint",
               "broadcast (ipc on a shared GPU)"),
    DefaultRow("explorer.eval_interval", "100", "explorer.eval_interval", "0 (never)", "100"),
    DefaultRow("explorer.max_timeout", "1800", "explorer.task_timeout_s", "600", "1800"),
    DefaultRow("synchronizer.sync_timeout", "3600", "synchronizer.sync_timeout_s", "120", "3600"),
    DefaultRow("buffer.trainer_input.experience_buffer.max_read_timeout", "1800", "synchronizer.timeout_s", "600",
               "1800"),
    DefaultRow("trainer.max_checkpoints_to_keep", "null (keep all)", "trainer.keep_checkpoints", "3", "0 (keep all)"),
    DefaultRow("trainer.use_dynamic_bsz / max_token_len_per_gpu", "true / 2 x max_model_len",
               "trainer.max_token_len_per_micro_batch", "0 (by count)", "2 x max_model_len"),
    DefaultRow("model.enable_prompt_truncation", "true", "explorer.filter_overlong_prompts", "false",
               "true, at max_prompt_tokens"),
    DefaultRow("explorer.rollout_model.engine_type", "vllm", "explorer.engine", "hf", "vllm (hf without a GPU)"),
    DefaultRow("explorer.rollout_model.gpu_memory_utilization", "0.9", "explorer.vllm.gpu_memory_utilization", "0.3",
               "0.9 (0.25 on a shared GPU)"),
    DefaultRow("explorer.rollout_model.dtype", "bfloat16", "explorer.dtype", "auto", "bfloat16 (auto without a GPU)"),
    DefaultRow("eval_tasksets[].rollout_args.temperature", "model.temperature (1.0)",
               "explorer.eval_tasksets[].temperature", "0.0 (greedy)", "1.0"),
)
"""Trinity's defaults where ours differ (docs/coming-from-trinity.md; a test per row)."""


@dataclass
class Translation:
    """The outcome of translating one Trinity-RFT config."""

    native: dict[str, Any] = field(default_factory=dict)
    """Our dotted keys -> values."""
    applied: list[tuple[str, Any, str]] = field(default_factory=list)
    """(Trinity key, its value, what it set)."""
    no_effect: list[tuple[str, Any, str]] = field(default_factory=list)
    """(Trinity key, value, why it has no effect here)."""
    unmapped: list[tuple[str, Any, str]] = field(default_factory=list)
    """(Trinity key, value, reason): values with no counterpart here."""
    unknown: list[tuple[str, str]] = field(default_factory=list)
    """(key, hint): keys Trinity-RFT's config does not have."""
    differences: list[str] = field(default_factory=list)
    """One line per difference of meaning that remains."""
    role: str = "all"
    """The role Trinity's mode names: explorer (explore), trainer (train, unless offline), all."""
    command: str = "run"
    """The command Trinity's mode names: run, bench or serve."""

    def nested(self) -> dict[str, Any]:
        """``native`` as nested sections (what a YAML config of ours holds)."""
        return nest(self.native)

    def report(self) -> dict[str, Any]:
        """What the run directory keeps (``trinity_translation.yaml``)."""
        return {"applied": [{"trinity": k, "value": v, "set": s} for k, v, s in self.applied],
                "no_effect": [{"trinity": k, "value": v, "why": s} for k, v, s in self.no_effect],
                "differences": list(self.differences), "role": self.role, "command": self.command}


# ---------------------------------------------------------------- detection and reading


def is_trinity_config(tree: Any) -> bool:
    """True when a config file's top level has Trinity-RFT's shape: a key only Trinity's configs have
    (``TRINITY_SIGNS``) or one of its modes. A verl config (a section only verl has) never is."""
    if not isinstance(tree, dict):
        return False
    from trinity_like.config.verl import is_verl_config

    if is_verl_config(tree):
        return False
    if tree.get("mode") in TRINITY_MODES:
        return True
    return any(has_key(tree, key) for key in TRINITY_SIGNS)


def load_trinity_file(path: str | Path) -> Any:
    """A Trinity YAML file as plain data (interpolations stay text)."""
    from omegaconf import OmegaConf

    try:  # read by OmegaConf, as Trinity's load_config reads it (1e-6 is a number, not text)
        return OmegaConf.to_container(OmegaConf.load(Path(path)), resolve=False)
    except Exception as e:  # yaml.YAMLError and OmegaConf's own errors share no base class
        raise ConfigError(f"config file '{path}' is not valid YAML: {str(e).splitlines()[0]}") from None


def is_trinity_key(key: str) -> bool:
    """Whether an override's key is one of Trinity's (a rule names it)."""
    return find_rule(normalise(key)) is not None


def apply_overrides(tree: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Trinity's ``key=value`` overrides applied to the file's tree before anything is resolved (a list item by its
    index: ``buffer.explorer_input.eval_tasksets.0.path=...``)."""
    import copy

    import yaml

    tree = copy.deepcopy(tree) if tree else {}
    for item in overrides:
        key, _, text = item.partition("=")
        key = key.strip()
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        node: Any = tree
        *parents, leaf = key.split(".")
        for i, p in enumerate(parents):
            nxt = parents[i + 1] if i + 1 < len(parents) else leaf
            if isinstance(node, list):
                if not p.isdigit() or int(p) >= len(node):
                    raise ConfigError(f"override '{item}': {'.'.join(parents[:i])} has no item {p}")
                node = node[int(p)]
                continue
            if not isinstance(node.get(p), (dict, list)):
                node[p] = [] if nxt.isdigit() else {}
            node = node[p]
        if isinstance(node, list):
            if not leaf.isdigit() or int(leaf) >= len(node):
                raise ConfigError(f"override '{item}': the list has no item {leaf}")
            node[int(leaf)] = value
        else:
            node[leaf] = value
    return tree


def resolve(tree: dict[str, Any], source: str = "") -> dict[str, Any]:
    """The tree with its ``${...}`` interpolations resolved as OmegaConf resolves them for Trinity
    (``${oc.env:VAR,default}``: the environment variable, else the default; a variable with no default that is
    unset is an error naming it)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(OmegaConf.create(tree), resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        msg = str(e).splitlines()[0]
        key = getattr(e, "full_key", "") or "?"
        if "Environment variable" in msg:
            var = msg.split("'")[1] if "'" in msg else msg
            raise ConfigError(f"Trinity config{f' {source}' if source else ''}: '{key}' reads the environment "
                              f"variable {var}, which is not set; set it or pass {key}=VALUE") from None
        raise ConfigError(f"Trinity config{f' {source}' if source else ''}: cannot resolve '{key}': {msg}") from None


class View:
    """The resolved Trinity tree read by dotted key (list items by index), Trinity's defaults for what it omits."""

    def __init__(self, tree: dict[str, Any], source: Path | None) -> None:
        self.tree = tree
        self.source = source

    def raw(self, key: str) -> Any:
        node: Any = self.tree
        for part in key.split("."):
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                return None
        return node

    def get(self, key: str, default: Any = None) -> Any:
        value = self.raw(key)
        if value is None:
            return TRINITY_DEFAULTS.get(key, default)
        return value

    def given(self, key: str) -> bool:
        return self.raw(key) is not None

    def path(self, value: str) -> str:
        """A file named in the config: relative to the working directory, else to the config's folder."""
        p = Path(str(value)).expanduser()
        if not p.is_absolute() and not p.exists() and self.source is not None and (self.source.parent / p).exists():
            p = self.source.parent / p
        return str(p)


def _leaves(node: Any, prefix: str = ""):
    """(concrete key, normalised key, value) of every leaf; a value whose rule reads it whole stays one leaf."""
    norm = normalise(prefix) if prefix else ""
    rule = EXACT.get(norm) if prefix else None
    if prefix and rule is not None and rule.whole:
        yield prefix, norm, node
    elif node is None or (isinstance(node, (dict, list)) and not node):
        return  # null or empty: sets nothing (as Trinity's defaults)
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(node, list) and all(isinstance(x, dict) for x in node):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{prefix}.{i}")
    elif prefix:
        yield prefix, norm, node


def _hint(key: str, norm: str) -> str:
    """A close spelling among Trinity's keys beside it, written as the file writes the key."""
    parent, _, leaf = norm.rpartition(".")
    siblings = [k.rpartition(".")[2] for k in EXACT if k.rpartition(".")[0] == parent]
    siblings += [p.rpartition(".")[2] for p, _ in SECTIONS if p.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
    if not close:
        return ""
    return f"did you mean {key.rpartition('.')[0] + '.' if '.' in key else ''}{close[0]}?"


# ---------------------------------------------------------------- translation


def translate(tree: dict[str, Any] | None, source: str | Path | None = None,
              overrides: list[str] | tuple[str, ...] = ()) -> Translation:
    """Translate a Trinity-RFT config (``tree``, the file's YAML, with Trinity-key ``overrides`` applied first) into
    our dotted keys. Raises ConfigError naming, in one message, every key Trinity's config does not have (with a
    close spelling) and every value with no counterpart here (with why)."""
    src = Path(source) if source is not None else None
    where = f" {src}" if src else ""
    resolved = resolve(apply_overrides(tree or {}, overrides), str(src or ""))
    view = View(resolved, src)
    out = Translation()
    given: dict[str, Any] = {}
    trainer_config = None
    for key, norm, value in _leaves(resolved):
        rule = find_rule(norm)
        if rule is None:
            out.unknown.append((key, _hint(key, norm)))
            continue
        if norm == "trainer.trainer_config":
            trainer_config = value
            continue
        if rule.kind == "derived" or value is None:
            continue
        if rule.kind == "no effect":
            out.no_effect.append((key, value, rule.how))
            continue
        try:
            values = rule.convert(value) if rule.convert else {rule.native[0]: value}
        except Unmapped as e:
            out.unmapped.append((key, value, str(e)))
            continue
        except (TypeError, ValueError) as e:
            raise ConfigError(f"Trinity config{where}: bad value for '{key}': {value!r} ({e})") from None
        if values:
            given.update(values)
            out.applied.append((key, value, ", ".join(f"{k}={v!r}" for k, v in values.items())))
    if out.unknown or out.unmapped:
        _refuse(out, where)
    out.native = {**_defaults(view), **given}
    try:
        _derive(out, view)
        if trainer_config:
            _trainer_config(out, view, trainer_config)
    except Unmapped as e:
        raise ConfigError(f"Trinity config{where}: {e}") from None
    if out.unmapped:
        _refuse(out, where)
    return out


def _refuse(out: Translation, where: str) -> None:
    parts = []
    if out.unknown:
        names = "; ".join(f"{k}{f' ({h})' if h else ''}" for k, h in out.unknown)
        parts.append(f"{len(out.unknown)} key(s) are not Trinity-RFT's: {names}")
    if out.unmapped:
        lines = "; ".join(f"{k} = {v!r} ({why})" for k, v, why in out.unmapped)
        parts.append(f"{len(out.unmapped)} key(s) have no counterpart here: {lines}")
    raise ConfigError(f"Trinity config{where}: {'. '.join(parts)}. docs/trinity.md lists every key")


def _defaults(view: View) -> dict[str, Any]:
    """Trinity's defaults where ours differ, for the keys the file omits (the file's values go over them)."""
    return {
        "trainer.optimizer.lr": 1e-6, "trainer.optimizer.weight_decay": 0.01, "trainer.optimizer.min_lr_ratio": 0.01,
        "explorer.repeat_times": 1, "explorer.eval_interval": 100, "explorer.task_timeout_s": 1800.0,
        "synchronizer.sync_timeout_s": 3600.0, "synchronizer.timeout_s": 1800.0,
        "trainer.keep_checkpoints": 0,
    }


def _algorithm(section: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Trinity's ``algorithm`` section (minus optimizer and repeat_times) -> (our keys, differences), by Trinity's
    algorithm table (``trinity_like.algorithms.trinity_algorithms``: each type's defaults, each function's
    arguments; a type or function not here is a ConfigError naming the nearest one that is)."""
    from trinity_like.algorithms.trinity_algorithms import translate_algorithm

    return translate_algorithm(section)


def _derive(out: Translation, view: View) -> None:
    """Our keys set from several Trinity keys at once, as Trinity's check_and_update derives them."""
    n = out.native
    mode = str(view.get("mode"))
    if mode not in TRINITY_MODES:
        raise Unmapped(f"mode {mode!r}: Trinity's modes are {', '.join(TRINITY_MODES)}")
    algo = dict(view.get("algorithm", {}) or {})
    algo_type = str(view.get("algorithm.algorithm_type"))
    section = {k: v for k, v in algo.items() if k not in ("optimizer", "repeat_times")}
    section.setdefault("algorithm_type", algo_type)
    values, diffs = _algorithm(section)
    n.update(values)
    out.differences.extend(diffs)
    out.applied.append(("algorithm", algo_type, ", ".join(f"{k}={v!r}" for k, v in values.items())))
    offline_kind = algo_type in ("sft", "dpo")
    if offline_kind and mode in ("both", "explore", "colocate"):
        raise Unmapped(f"algorithm_type {algo_type} trains on stored data: Trinity refuses mode {mode} for it too; "
                       "use mode train")
    _project(n, view)
    repeat = 2 if algo_type == "dpo" else int(view.get("algorithm.repeat_times"))
    n["explorer.repeat_times"] = repeat
    if view.given("trainer.save_interval"):
        n["trainer.save_interval"] = int(view.get("trainer.save_interval"))
    eb = "buffer.trainer_input.experience_buffer"
    storage = str(view.get(f"{eb}.storage_type") or "queue").lower()
    offline = mode == "train" and (offline_kind or storage == "file")
    if offline_kind and mode == "train" and storage != "file":
        raise Unmapped(f"algorithm_type {algo_type} in mode train reads {eb} of storage_type file (a file of "
                       f"{'chat records' if algo_type == 'sft' else 'preference pairs'}); {storage} is not one here")
    _batches(n, view, mode, repeat, algo_type, offline)
    _lengths(n, view)
    _tasksets(out, view, mode)
    _modes(out, view, mode, offline, algo_type)
    _gpus(out, view, mode)
    _sync_method(out, view, mode, offline_kind)
    _micro_batches(n, view)
    _optimizer(n, view)
    _replay(out, view, offline, algo_type)
    _mix(out, view, algo_type)
    _total_steps(out, view, mode, offline, algo_type)
    _warmup_ratio(out, view)
    _stages(out, view)
    _always(out, view, mode, offline)
    if len(view.raw("model.lora_configs") or []) > 1:
        raise Unmapped("model.lora_configs of more than one adapter (Trinity refuses it too)")
    if n.get("trainer.lora.enabled") and n.get("trainer.strategy") == "fsdp2":
        n["trainer.strategy"] = "ddp"
        out.differences.append("LoRA trains with DDP here (the frozen base replicated, only the adapters reduced); "
                               "FSDP with LoRA is not supported")
    if view.given("model.critic_model_path") and view.get("model.critic_model_path") not in (
            "", view.get("model.model_path")):
        raise Unmapped("model.critic_model_path other than model_path: the critic here is the policy's backbone "
                       "with a value head")


def _always(out: Translation, view: View, mode: str, offline: bool) -> None:
    """The differences every run of Trinity's meets (said once per config, by config-convert too)."""
    if mode in ("bench", "serve"):
        return
    if view.get("continue_from_checkpoint", True):
        out.differences.append("continue_from_checkpoint true (Trinity's default): a run continues from its last "
                               "checkpoint with `trinity-like run --resume`; without it a run directory that holds a "
                               "run is refused (Trinity resumes by itself)")
    ts = "buffer.explorer_input.taskset"
    selector = view.raw(f"{ts}.data_selector.selector_type") or view.raw(f"{ts}.task_selector.selector_type")
    if not offline and view.raw(ts) is not None and selector in (None, "sequential"):
        out.differences.append("task order: tasks are drawn in a seeded shuffled order, epoch by epoch; Trinity's "
                               "sequential reader takes them in file order")


def _project(n: dict[str, Any], view: View) -> None:
    root = view.get("checkpoint_root_dir") or "."
    n["checkpoint_root_dir"] = str(root)
    n.setdefault("project", str(view.get("project")))
    n.setdefault("name", str(view.get("name")))
    group = view.get("group")
    if group:
        n["run_dir"] = str(Path(root) / str(view.get("project")) / str(group) / str(view.get("name")))


def _batches(n: dict[str, Any], view: View, mode: str, repeat: int, algo_type: str, offline: bool) -> None:
    """``buffer.batch_size`` tasks x ``repeat_times`` = ``train_batch_size`` experiences (unless given). In mode
    train without a batch_size (the trainer's file of a separate pair), the tasks per explorer step are
    train_batch_size / repeat_times, so that both jobs' configs agree."""
    train = int(view.get("buffer.train_batch_size") or 0)
    if offline:
        if not train:
            raise Unmapped(f"mode train with {algo_type}: buffer.train_batch_size is required (Trinity requires it "
                           "too)")
        rows = train * (2 if algo_type == "dpo" else 1)  # a DPO pair is two experiences (chosen, rejected)
        n["trainer.batch_size"] = rows
        n["explorer.batch_size"] = max(1, rows // repeat)
        return
    batch = int(view.get("buffer.batch_size"))
    if mode == "train" and not view.given("buffer.batch_size") and train:
        if train % repeat:
            raise Unmapped(f"buffer.train_batch_size {train} is not a multiple of algorithm.repeat_times {repeat}: "
                           "groups are never split across batches here")
        batch = train // repeat
    n["explorer.batch_size"] = batch
    n["trainer.batch_size"] = train or batch * repeat


def _lengths(n: dict[str, Any], view: View) -> None:
    """Trinity's ``_check_model_len``: max_model_len, max_prompt_tokens and max_response_tokens completed from each
    other (the rollout model's own values first)."""
    def pick(k: str) -> Any:
        own = view.raw(f"explorer.rollout_model.{k}")
        return own if own is not None else view.raw(f"model.{k}")

    mml, mpt, mrt = pick("max_model_len"), pick("max_prompt_tokens"), pick("max_response_tokens")
    mml, mpt, mrt = (None if x is None else int(x) for x in (mml, mpt, mrt))
    if mml is not None and mpt is not None and mrt is not None and mpt + mrt > mml:
        raise Unmapped(f"model.max_prompt_tokens + max_response_tokens ({mpt} + {mrt}) exceeds max_model_len ({mml}) "
                       "(Trinity refuses it too)")
    if mml is None:
        if mpt is None or mrt is None:
            raise Unmapped("model.max_model_len is not set and cannot be derived (Trinity: 'Unable to determine "
                           "max_model_len'); set model.max_model_len or both max_prompt_tokens and "
                           "max_response_tokens")
        mml = mpt + mrt
    if mpt is None and mrt is None:
        mpt = mml // 2
        mrt = mml - mpt
    elif mpt is None:
        mrt = min(mrt, mml - 1)
        mpt = mml - mrt
    elif mrt is None:
        mpt = min(mpt, mml - 1)
        mrt = mml - mpt
    truncate = pick("enable_prompt_truncation")
    truncate = True if truncate is None else bool(truncate)
    max_tokens = view.raw("buffer.explorer_input.taskset.rollout_args.max_tokens") or view.raw(
        "buffer.explorer_input.tasksets.0.rollout_args.max_tokens")
    n["explorer.sampling.max_new_tokens"] = int(max_tokens or mrt)
    # Trinity turns a prompt over max_prompt_tokens into a masked-out sample of reward 0 (no gradient): here its
    # task is dropped when the task sets load (logged), which trains on the same samples
    n["explorer.max_prompt_tokens"] = int(mpt) if truncate else 0
    n["explorer.filter_overlong_prompts"] = truncate
    n["explorer.vllm.max_model_len"] = int(mml)
    n["_max_model_len"] = int(mml)  # read by _micro_batches, dropped there


def _taskset_fields(view: View, base: str, set_default_wf: Any, default_rf: Any, chat_template: Any,
                    thinking: Any) -> dict[str, Any]:
    """One Trinity task set as our TasksetConfig / EvalTasksetConfig fields (the shared ones)."""
    ts: dict[str, Any] = {}
    if view.raw(f"{base}.path") is None:
        raise Unmapped(f"{base}.path is not set (Trinity requires it)")
    path = str(view.raw(f"{base}.path"))
    local = Path(view.path(path))
    ts["path"] = str(local) if local.exists() else path
    for k in ("split", "subset_name"):
        if view.raw(f"{base}.{k}") is not None:
            ts[k] = str(view.raw(f"{base}.{k}"))
    fmt = dict(view.raw(f"{base}.format") or {})
    for k in ("image_key", "video_key", "enable_concatenated_multi_turn"):
        fmt.pop(k, None)
    fmt = {k: v for k, v in fmt.items() if v is not None}
    if "prompt_type" in fmt:
        fmt["prompt_type"] = str(fmt["prompt_type"]).lower()
    if chat_template and "chat_template" not in fmt:
        fmt["chat_template"] = chat_template
    if thinking is not None and "enable_thinking" not in fmt:
        fmt["enable_thinking"] = bool(thinking)
    if fmt:
        ts["format"] = fmt
    wf = view.raw(f"{base}.default_workflow_type") or set_default_wf
    if wf:
        ts["workflow"] = str(wf)
    rf = view.raw(f"{base}.default_reward_fn_type") or default_rf
    if rf:
        ts["reward_fn"] = str(rf)
    for k in ("workflow_args", "reward_fn_args"):
        if view.raw(f"{base}.{k}"):
            ts[k] = dict(view.raw(f"{base}.{k}"))
    return ts


def _chat_template(view: View) -> Any:
    own = view.raw("explorer.rollout_model.chat_template")
    if own:
        return own
    if view.raw("model.custom_chat_template"):
        return view.raw("model.custom_chat_template")
    path = view.raw("model.chat_template_path")
    if path:
        p = Path(view.path(str(path)))
        if not p.is_file():
            raise Unmapped(f"model.chat_template_path '{path}' is not a file (Trinity refuses it too)")
        return p.read_text()
    return None


def _tasksets(out: Translation, view: View, mode: str) -> None:
    """``buffer.explorer_input``: the training set (``taskset``, or a ``tasksets`` list of one) -> explorer.taskset
    and explorer.sampling; ``eval_tasksets`` -> explorer.eval_tasksets; the default workflow / reward function
    types as Trinity fills them in (a set's own first, then the explorer_input's; eval sets the eval default
    first)."""
    n = out.native
    ei = "buffer.explorer_input"
    default_wf = view.raw(f"{ei}.default_workflow_type")
    default_eval_wf = view.raw(f"{ei}.default_eval_workflow_type")
    default_rf = view.raw(f"{ei}.default_reward_fn_type")
    chat_template = _chat_template(view)
    thinking = view.raw("explorer.rollout_model.enable_thinking")
    thinking = view.raw("model.enable_thinking") if thinking is None else thinking
    if default_wf:
        n["explorer.workflow"] = str(default_wf)
    many = view.raw(f"{ei}.tasksets") or []
    if view.raw(f"{ei}.taskset") is not None and many:
        raise Unmapped(f"{ei}: taskset and tasksets both set (Trinity refuses it too)")
    if len(many) > 1:
        raise Unmapped(f"{ei}.tasksets of {len(many)} sets: one training task set per run here (concatenate the "
                       "files into one, or give explorer.taskset.files of Parquet task files)")
    base = f"{ei}.taskset" if view.raw(f"{ei}.taskset") is not None else (f"{ei}.tasksets.0" if many else None)
    if base is None and mode not in ("train", "bench", "serve"):
        raise Unmapped(f"{ei}.taskset is not set: Trinity requires one training task set")
    if base is not None:
        ts = _taskset_fields(view, base, None, default_rf, chat_template, thinking)
        for k, v in ts.items():
            if isinstance(v, dict) and k == "format":
                for fk, fv in v.items():
                    n[f"explorer.taskset.format.{fk}"] = fv
            else:
                n[f"explorer.taskset.{k}"] = v
        ra = f"{base}.rollout_args"
        temperature = view.raw(f"{ra}.temperature")
        n["explorer.sampling.temperature"] = float(view.get("model.temperature") if temperature is None
                                                   else temperature)
        top_p = view.raw(f"{ra}.top_p")
        n["explorer.sampling.top_p"] = float(view.get("model.top_p") if top_p is None else top_p)
        top_k = view.raw(f"{ra}.top_k")
        top_k = int(view.get("model.top_k") if top_k is None else top_k)
        n["explorer.sampling.top_k"] = 0 if top_k < 0 else top_k
        out.no_effect.append((f"{base}.name", view.raw(f"{base}.name"), "the training set's name"))
    evals = []
    for i, _ in enumerate(view.raw(f"{ei}.eval_tasksets") or []):
        eb = f"{ei}.eval_tasksets.{i}"
        wf = view.raw(f"{eb}.default_workflow_type") or default_eval_wf or default_wf
        ev = {"name": str(view.raw(f"{eb}.name") or f"eval_taskset_{i}")}
        ev.update(_taskset_fields(view, eb, wf, default_rf, chat_template, thinking))
        ev["k"] = int(view.raw(f"{eb}.repeat_times") or 1)
        temperature = view.raw(f"{eb}.rollout_args.temperature")
        ev["temperature"] = float(view.get("model.temperature") if temperature is None else temperature)
        for k in ("top_p", "top_k"):
            own = view.raw(f"{eb}.rollout_args.{k}")
            if own is not None and own != view.get(f"model.{k}"):
                out.differences.append(f"eval set {ev['name']}: rollout_args.{k} {own!r} is not applied (an eval set "
                                       f"samples with the training set's {k})")
        evals.append(ev)
    if evals:
        n["explorer.eval_tasksets"] = evals
    else:
        n["explorer.eval_interval"] = 0  # no eval set: nothing to evaluate


def _modes(out: Translation, view: View, mode: str, offline: bool, algo_type: str) -> None:
    """Trinity's mode -> ours (mode, synchronizer schedule, role, command)."""
    n = out.native
    interval = int(view.get("synchronizer.sync_interval"))
    offset = int(view.get("synchronizer.sync_offset"))
    style = str(view.get("synchronizer.sync_style")).lower()
    style = {"dynamic_by_trainer": "trainer_driven", "dynamic_by_explorer": "explorer_driven"}.get(style, style)
    if interval < 1:
        raise Unmapped(f"synchronizer.sync_interval {interval}: must be positive (Trinity refuses it too)")
    if mode == "bench":
        out.command = "bench"
        return
    if mode == "serve":
        out.command = "serve"
        return
    if offline:
        n["mode"] = "offline"
        out.role = "all"
        return
    every = int(n.get("explorer.eval_interval") or 0)
    if every and every % interval:  # Trinity evaluates at sync points: the nearest multiple of sync_interval
        n["explorer.eval_interval"] = max(every // interval, 1) * interval
    n["synchronizer.interval"] = interval
    n["synchronizer.offset"] = offset
    n["synchronizer.style"] = "trainer_driven" if style == "trainer_driven" else "fixed"
    if style == "explorer_driven":
        out.differences.append("synchronizer.sync_style explorer_driven: the explorer loads new weights on the fixed "
                               f"schedule (every {interval} step(s)) and never runs more than max_staleness versions "
                               "ahead of the trainer; Trinity's explorer decides alone")
    if mode in ("both", "colocate") and interval == 1 and offset == 0 and style == "fixed":
        n["mode"] = "sync"
    else:
        n["mode"] = "async"
        n["synchronizer.max_staleness"] = interval - 1 + offset
    if mode == "explore":
        out.role = "explorer"
        n["mode"] = "async"
        n["synchronizer.max_staleness"] = interval - 1 + offset
        out.differences.append("mode explore: this job runs the explorer of an async run (run --role explorer); it "
                               f"waits rather than run more than {interval - 1 + offset} version(s) ahead of the "
                               "trainer job, where Trinity's explorer loads the trainer's latest checkpoint when due "
                               "and does not wait")
    elif mode == "train":
        out.role = "trainer"
        n["mode"] = "async"
        n["synchronizer.max_staleness"] = interval - 1 + offset
    elif mode == "colocate":
        out.differences.append("mode colocate: trainer and engine share one GPU as Ray fractions (0.5 each) and run "
                               "in lock-step (sync)")


def _local_gpus() -> int:
    """GPUs of this node as the NVIDIA driver lists them (Trinity asks Ray; nothing is initialised here)."""
    return len(glob.glob("/proc/driver/nvidia/gpus/*"))


def _gpus(out: Translation, view: View, mode: str) -> None:
    """Trinity's GPU split: engines take ``engine_num x tensor_parallel_size`` GPUs, the trainer the rest (one
    worker per GPU); ``node_num`` / ``gpu_per_node`` of 0 mean this node's GPUs; one GPU (or colocate) is shared
    half and half; no GPU runs all on the CPU (the hf engine). A job of the explore / train pair sets the other
    side as the other job does (the trainer on every GPU of its cluster, the engines as its rollout_model says),
    so both jobs' configs agree."""
    n = out.native
    rm = "explorer.rollout_model"
    engine_type = str(view.get(f"{rm}.engine_type")).lower()
    if n.get("explorer.engine") == "external" or engine_type == "external":
        if mode != "bench":
            raise Unmapped("an external model (model.external_model / engine_type external) is for mode bench only "
                           "(Trinity refuses it elsewhere too)")
        n["explorer.engine"] = "external"
        return
    if engine_type == "tinker":
        raise Unmapped("engine_type tinker: Tinker (a hosted trainer and sampler) is not supported")
    if engine_type != "vllm":
        raise Unmapped(f"engine_type {engine_type!r}: Trinity's engines are vllm, external and tinker")
    nodes, per_node = int(view.get("cluster.node_num")), int(view.get("cluster.gpu_per_node"))
    if not nodes or not per_node:
        nodes, per_node = (nodes or 1), (per_node or _local_gpus())
    total = nodes * per_node
    engines = int(view.get(f"{rm}.engine_num"))
    tp = int(view.get(f"{rm}.tensor_parallel_size"))
    n["explorer.num_engines"] = engines
    gmu = view.raw(f"{rm}.gpu_memory_utilization")
    if total == 0:
        n["explorer.engine"] = "hf"
        n["explorer.dtype"] = "auto"
        n["trainer.num_workers"] = 1
        out.differences.append("no GPU (cluster.gpu_per_node 0 on a node without one): the hf engine on the CPU "
                               "instead of vLLM, in float32 (rollout_model.dtype is for GPUs), and the trainer on "
                               "the CPU")
        return
    n["explorer.engine"] = "vllm"
    if not view.given(f"{rm}.dtype"):
        n["explorer.dtype"] = "bfloat16"  # Trinity's rollout dtype (on the CPU ours, float32, is kept)
    shared = mode == "colocate" or (total == 1 and mode in ("both", "train", "explore"))
    if shared:
        if engines != 1 or tp != 1:
            raise Unmapped(f"one GPU shared by trainer and engine needs engine_num 1 and tensor_parallel_size 1 (got "
                           f"{engines} and {tp}; Trinity's colocate refuses them too)")
        n.update({"trainer.num_workers": 1, "trainer.gpus_per_worker": 0.5, "explorer.gpus_per_engine": 0.5,
                  "explorer.vllm.gpu_memory_utilization": min(0.25, float(gmu or 0.25))})
        if mode != "colocate":
            out.differences.append("one GPU: trainer and engine share it (0.5 each, as Trinity's colocate), where "
                                   "Trinity's both mode refuses a single GPU")
        return
    rollout = engines * tp
    if mode in ("explore", "bench", "serve", "train"):
        if mode != "train" and rollout > total:
            raise Unmapped(f"the engines need {rollout} GPUs (engine_num {engines} x tensor_parallel_size {tp}), the "
                           f"cluster has {total} (Trinity refuses it too)")
        trainer_gpus = total  # the other job of the pair trains on every GPU of its cluster
    else:
        trainer_gpus = total - rollout
        if trainer_gpus < 1:
            raise Unmapped(f"not enough GPUs for the trainer: the engines take {rollout} (engine_num {engines} x "
                           f"tensor_parallel_size {tp}) of the cluster's {total} (Trinity refuses it too)")
    n.update({"trainer.num_workers": trainer_gpus, "trainer.gpus_per_worker": 1.0,
              "explorer.gpus_per_engine": float(tp),
              "explorer.vllm.gpu_memory_utilization": float(gmu if gmu is not None else 0.9)})


def _sync_method(out: Translation, view: View, mode: str, offline_kind: bool) -> None:
    """nccl -> broadcast (ipc on a shared GPU); Trinity itself turns nccl into checkpoint for separate jobs,
    SFT / DPO and LoRA (and into memory for colocate, ipc here)."""
    n = out.native
    method = str(view.get("synchronizer.sync_method")).lower()
    method = {"online": "nccl", "offline": "checkpoint"}.get(method, method)
    if method == "nccl":
        if mode in ("explore", "train", "bench", "serve") or offline_kind or view.raw("model.lora_configs"):
            method = "checkpoint"
        elif n.get("explorer.gpus_per_engine") == 0.5 and n.get("trainer.gpus_per_worker") == 0.5:
            method = "ipc"
        else:
            method = "broadcast"
    n["synchronizer.method"] = method


def _micro_batches(n: dict[str, Any], view: View) -> None:
    """Trinity's ``use_dynamic_bsz`` (default on) with ``max_token_len_per_gpu`` (default 2 x max_model_len):
    micro-batches by that token budget."""
    mml = n.pop("_max_model_len")
    if view.get("trainer.use_dynamic_bsz"):
        budget = view.raw("trainer.max_token_len_per_gpu")
        n["trainer.max_token_len_per_micro_batch"] = int(budget) if budget else math.ceil(2 * mml)
    if n.get("algorithm.policy_loss") == "dpo":  # pairs are never split: micro-batches by count, even sizes
        n["trainer.max_token_len_per_micro_batch"] = 0


def _optimizer(n: dict[str, Any], view: View) -> None:
    if view.raw("trainer.grad_clip") is not None:
        n["trainer.optimizer.max_grad_norm"] = float(view.raw("trainer.grad_clip"))


def _replay(out: Translation, view: View, offline: bool, algo_type: str) -> None:
    """A trainer-side file (mode train) -> the offline run's replay sources; a queue's replay buffer -> read_policy
    replay (its priority function and cooldown in seconds have no counterpart: listed)."""
    n = out.native
    eb = "buffer.trainer_input.experience_buffer"
    if offline:
        path = view.raw(f"{eb}.path")
        if not path:
            raise Unmapped(f"{eb}.path is required in mode train (Trinity requires it too)")
        local = Path(view.path(str(path)))
        n["buffer.replay_sources"] = [str(local) if local.exists() else str(path)]
        for k in ("split", "subset_name"):
            if view.raw(f"{eb}.{k}") is not None:
                n[f"buffer.replay_{k}"] = str(view.raw(f"{eb}.{k}"))
        fmt = {k: v for k, v in dict(view.raw(f"{eb}.format") or {}).items()
               if v is not None and k not in ("image_key", "video_key", "workflow_key", "reward_fn_key")}
        fmt["prompt_type"] = str(fmt.get("prompt_type", "messages")).lower()  # Trinity's default: messages
        chat_template = _chat_template(view)
        if chat_template and "chat_template" not in fmt:
            fmt["chat_template"] = chat_template
        for k, v in fmt.items():
            n[f"buffer.replay_format.{k}"] = v
        return
    if view.raw(f"{eb}.path"):
        out.no_effect.append((f"{eb}.path", view.raw(f"{eb}.path"), f"a {view.get(f'{eb}.storage_type', 'queue')} "
                              "storage's path means nothing here: the explorer writes the run's buffer, "
                              "<run_dir>/buffer"))
    if view.raw(f"{eb}.replay_buffer.enable"):
        priority = view.raw(f"{eb}.replay_buffer.priority_fn") or "linear_decay"
        out.differences.append(f"{eb}.replay_buffer: rows are reused up to buffer.replay_max_uses times with "
                               f"buffer.replay_cooldown_steps between uses, not by Trinity's priority function "
                               f"{priority!r} and cooldown in seconds")


def _mix(out: Translation, view: View, algo_type: str) -> None:
    """``auxiliary_buffers`` (mix's expert data) -> buffer.mix shares and the SFT sources: the expert rows are the
    run's ``human`` rows, ingested into its buffer."""
    n = out.native
    aux = view.raw("buffer.trainer_input.auxiliary_buffers") or {}
    if not aux:
        return
    if algo_type not in ("mix", "mix_chord"):
        raise Unmapped(f"buffer.trainer_input.auxiliary_buffers with algorithm_type {algo_type}: only the mix "
                       "algorithms read them")
    if len(aux) > 1:
        raise Unmapped(f"buffer.trainer_input.auxiliary_buffers of {len(aux)} buffers: one expert data set here")
    name, spec = next(iter(aux.items()))
    ratio = float((view.raw("algorithm.sample_strategy_args") or {}).get("expert_data_ratio", 0.5))
    if "buffer.mix" not in n:
        n["buffer.mix"] = {"explorer": round(1.0 - ratio, 6), "human": ratio}
    n.setdefault("algorithm.sft_sources", ["human"])
    if n.get("mode") == "sync":  # buffer.mix is an async setting; bound 0 is sync's result
        n["mode"] = "async"
        n["synchronizer.max_staleness"] = 0
    spec = dict(spec or {})
    path = spec.get("path")
    if not path:
        raise Unmapped(f"buffer.trainer_input.auxiliary_buffers.{name}.path is required (the expert data)")
    local = Path(view.path(str(path)))
    fmt = {k: v for k, v in dict(spec.get("format") or {}).items()
           if v is not None and k not in ("image_key", "video_key", "workflow_key", "reward_fn_key")}
    fmt["prompt_type"] = str(fmt.get("prompt_type", "messages")).lower()  # Trinity's default: messages
    chat_template = _chat_template(view)
    if chat_template and "chat_template" not in fmt:
        fmt["chat_template"] = chat_template
    n["buffer.ingest"] = [{"path": str(local) if local.exists() else str(path), "source": "human",
                           "split": str(spec.get("split") or "train"), "subset_name": str(spec.get("subset_name") or ""),
                           "format": fmt}]
    out.differences.append(f"auxiliary_buffers.{name}: the expert data are written into the run's buffer once, as "
                           "source human, when the trainer prepares the run directory (buffer.ingest); the "
                           "trainer's reads draw them by buffer.mix's shares, Trinity's expert_data_ratio; each "
                           "expert row is trained once (Trinity reads the auxiliary buffer for its total_epochs), "
                           "and once they are used up buffer.mix_fill fills their share with explorer rows")


def _task_rows(path: str, split: str | None, subset: str | None) -> tuple[int | None, str]:
    """(rows, "") of the data at ``path`` as Trinity's reader (``datasets.load_dataset``) gives them: a local file,
    a folder laid out as Hugging Face data sets are, a hub id in the local cache (read by
    ``trinity_like.common.datasets``); (None, why) when it cannot be read here."""
    from trinity_like.common.datasets import DatasetError, read_rows

    try:
        return len(read_rows(path, subset or "", split or "train").rows), ""
    except DatasetError as e:
        return None, str(e)


def _total_steps(out: Translation, view: View, mode: str, offline: bool, algo_type: str) -> None:
    """The run's length in trainer steps: ``trainer.total_steps``; else ``buffer.total_steps`` explorer steps; else
    ``total_epochs`` x the task set's rows // ``batch_size`` (rows counted from the local data; Trinity's reader
    stops when the epochs are read), explorer steps converted to trainer steps by rows (batch_size x repeat_times
    per explorer step, train_batch_size per trainer step). Offline: epochs x the file's records //
    train_batch_size."""
    n = out.native
    if mode in ("bench", "serve"):
        return
    own = view.raw("trainer.total_steps")
    buf_steps = view.raw("buffer.total_steps")
    epochs = int(view.get("buffer.total_epochs"))
    train_rows = int(n.get("trainer.batch_size") or n["explorer.batch_size"] * n["explorer.repeat_times"])
    how = ""
    steps = None
    if offline:
        eb = "buffer.trainer_input.experience_buffer"
        per_step = int(view.get("buffer.train_batch_size"))
        if buf_steps is not None:
            steps, how = int(buf_steps), "buffer.total_steps"
        else:
            rows, why = _task_rows(n["buffer.replay_sources"][0], n.get("buffer.replay_split"),
                                   n.get("buffer.replay_subset_name"))
            if rows is not None:
                steps = max(1, epochs * rows // per_step)
                how = f"buffer.total_epochs {epochs} x {rows} records // train_batch_size {per_step}"
            elif own is None:
                raise Unmapped(f"the run's length comes from buffer.total_epochs x the records of {eb}.path, which "
                               f"cannot be counted here ({why}); set buffer.total_steps or trainer.total_steps")
    else:
        per_explorer_step = n["explorer.batch_size"] * n["explorer.repeat_times"]
        if buf_steps is not None:
            steps = max(1, int(buf_steps) * per_explorer_step // train_rows)
            how = f"buffer.total_steps {buf_steps} explorer steps x {per_explorer_step} rows // {train_rows}"
        else:
            path = n.get("explorer.taskset.path")
            rows, why = _task_rows(path, n.get("explorer.taskset.split"), n.get("explorer.taskset.subset_name")) \
                if path else (None, "no task set")
            if rows is not None:
                explorer_steps = max(1, epochs * rows // n["explorer.batch_size"])
                steps = max(1, explorer_steps * per_explorer_step // train_rows)
                how = (f"buffer.total_epochs {epochs} x {rows} tasks // batch_size {n['explorer.batch_size']} = "
                       f"{explorer_steps} explorer steps")
            elif own is None:
                raise Unmapped(f"the run's length comes from buffer.total_epochs x the task set's rows, which cannot "
                               f"be counted here ({why}); set buffer.total_steps (or trainer.total_steps), or point "
                               "the task set's path at local data")
    if own is not None and (steps is None or int(own) < steps):
        steps, how = int(own), "trainer.total_steps"
    n["trainer.total_steps"] = steps
    out.applied.append(("(derived)", steps, f"trainer.total_steps={steps} from {how}"))


def _warmup_ratio(out: Translation, view: View) -> None:
    n = out.native
    ratio = float(view.get("algorithm.optimizer.lr_warmup_steps_ratio") or 0.0)
    if int(view.get("algorithm.optimizer.lr_warmup_steps")) < 0 and ratio > 0 and n.get("trainer.total_steps"):
        n["trainer.optimizer.warmup_steps"] = int(ratio * n["trainer.total_steps"])


def _stages(out: Translation, view: View) -> None:
    """``stages``: [an SFT stage (mode train, algorithm sft, a file of chat records), the RFT stage (nothing else
    set)] -> our warm-up (warmup.sft_steps on warmup.demonstrations, then the run from its last checkpoint)."""
    stages = view.raw("stages") or []
    if not stages:
        return
    why = ("stages: the stages here are one SFT warm-up (mode train, algorithm_type sft, a file of chat records "
           "under buffer.trainer_input.experience_buffer) followed by the RFT stage that adds nothing to the config")
    if len(stages) != 2 or not all(isinstance(s, dict) for s in stages):
        raise Unmapped(f"{why}; this config has {len(stages)} stage(s)")
    sft, rft = stages
    if set(rft) - {"stage_name"}:
        raise Unmapped(f"{why}; the second stage sets {', '.join(sorted(set(rft) - {'stage_name'}))}")
    if sft.get("mode") != "train" or (sft.get("algorithm") or {}).get("algorithm_type") != "sft":
        raise Unmapped(f"{why}; the first stage is mode {sft.get('mode')!r}, algorithm "
                       f"{(sft.get('algorithm') or {}).get('algorithm_type')!r}")
    extra = set(sft) - {"stage_name", "mode", "algorithm", "buffer"}
    if extra:
        raise Unmapped(f"{why}; the first stage also sets {', '.join(sorted(extra))}")
    unknown = [f"stages.0.{k}" for k, norm, _ in _leaves({k: v for k, v in sft.items() if k != "stage_name"})
               if find_rule(norm) is None]
    if unknown:
        raise Unmapped(f"stages[0]: {', '.join(unknown)} are not Trinity-RFT's keys")
    buf = sft.get("buffer") or {}
    eb = (buf.get("trainer_input") or {}).get("experience_buffer") or {}
    path = eb.get("path")
    if not path:
        raise Unmapped("stages[0].buffer.trainer_input.experience_buffer.path: the warm-up's chat records are needed")
    messages_key = ((eb.get("format") or {}).get("messages_key")) or "message"
    if messages_key != "messages":
        raise Unmapped(f"stages[0]: messages_key {messages_key!r}: the warm-up reads records of `messages`")
    n = out.native
    n["warmup.demonstrations"] = view.path(str(path))
    if buf.get("train_batch_size"):
        n["warmup.batch_size"] = int(buf["train_batch_size"])
    if buf.get("total_steps"):
        n["warmup.sft_steps"] = int(buf["total_steps"])
    rows, why = _task_rows(view.path(str(path)), None, None)
    if not buf.get("total_steps"):
        if rows is None:
            raise Unmapped(f"stages[0]: set buffer.total_steps (the warm-up's steps): its chat records cannot be "
                           f"counted here ({why})")
        n["warmup.sft_steps"] = max(1, int(buf.get("total_epochs", 1)) * rows // int(n.get("warmup.batch_size", 16)))
    if rows:
        n["warmup.num_demonstrations"] = rows
    n["warmup.lr"] = float(((sft.get("algorithm") or {}).get("optimizer") or {}).get("lr", 1e-6))
    out.differences.append("stages: the SFT stage runs as our warm-up (its own run directory <name>-warmup, evaluated "
                           "before and after on the eval task sets); the other optimizer settings are the RFT "
                           "stage's")


# ---------------------------------------------------------------- trainer.trainer_config (verl keys)

_TRINITY_SETS = {
    "actor_rollout_ref.actor.optim.": "algorithm.optimizer (Trinity sets the actor's optimizer from it)",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "buffer.train_batch_size (one update per step, as Trinity)",
    "actor_rollout_ref.rollout.": "algorithm.repeat_times and the task set's rollout_args (Trinity sets them)",
    "actor_rollout_ref.model.path": "model.model_path",
    "actor_rollout_ref.actor.loss_agg_mode": "algorithm.loss_agg_mode (Trinity's loss reads its algorithm section)",
    "actor_rollout_ref.actor.clip_ratio": "algorithm.policy_loss_fn_args (Trinity's loss reads them)",
    "actor_rollout_ref.actor.clip_ratio_low": "algorithm.policy_loss_fn_args (Trinity's loss reads them)",
    "actor_rollout_ref.actor.clip_ratio_high": "algorithm.policy_loss_fn_args (Trinity's loss reads them)",
    "actor_rollout_ref.actor.clip_ratio_c": "algorithm.policy_loss_fn_args (Trinity's loss reads them)",
    "actor_rollout_ref.actor.policy_loss.": "algorithm.policy_loss_fn (Trinity's loss reads its algorithm section)",
    "actor_rollout_ref.actor.kl_loss_coef": "algorithm.kl_loss_fn_args (Trinity's loss reads them)",
    "actor_rollout_ref.actor.kl_loss_type": "algorithm.kl_loss_fn (Trinity's loss reads it)",
    "actor_rollout_ref.actor.loss_scale_factor": "Trinity's loss (its algorithm section)",
    "actor_rollout_ref.actor.entropy_coeff": "algorithm.entropy_loss_fn_args (Trinity's loss reads them)",
    "actor_rollout_ref.actor.use_kl_loss": "algorithm.kl_loss_fn (Trinity sets it)",
    "algorithm.": "algorithm.* (Trinity's advantage reads advantage_fn_args)",
    "critic.enable": "algorithm.algorithm_type (Trinity sets it)",
    "critic.model.path": "model.critic_model_path", "critic.ppo_mini_batch_size": "buffer.train_batch_size",
    "critic.rollout_n": "algorithm.repeat_times", "data.": "buffer.* (Trinity sets it)",
    "trainer.total_training_steps": "trainer.total_steps", "trainer.total_epochs": "buffer.total_epochs",
    "trainer.project_name": "project", "trainer.experiment_name": "name", "trainer.group_name": "group",
    "trainer.default_local_dir": "checkpoint_root_dir", "trainer.nnodes": "cluster",
    "trainer.n_gpus_per_node": "cluster", "trainer.save_freq": "trainer.save_interval",
    "trainer.sync_freq": "synchronizer.sync_interval", "trainer.resume_mode": "continue_from_checkpoint",
    "trainer.logger": "monitor.monitor_type", "actor_rollout_ref.nccl_timeout": "synchronizer.sync_timeout",
    "critic.nccl_timeout": "synchronizer.sync_timeout", "actor_rollout_ref.synchronizer": "synchronizer",
    "synchronizer": "synchronizer", "actor_rollout_ref.explorer_name": "Trinity sets it",
    "critic.ray_namespace": "Trinity sets it", "enable_preview": "trainer.enable_preview",
    "trainer.enable_exp_buffer": "Trinity's trainer", "trainer.training_rollout_mode": "Trinity's trainer",
    "trainer.val_generations_to_log_to_wandb": "evaluation samples are not logged",
}
"""verl keys under trainer.trainer_config that Trinity's ``synchronize_config`` sets from its own keys (so a value
there has no effect in Trinity either) -> where it comes from."""


def _trainer_config(out: Translation, view: View, tc: Any) -> None:
    """``trainer.trainer_config``: verl keys, translated by trinity_like.config.verl's rules (a key they refuse is
    refused here, named ``trainer.trainer_config.<key>``); those Trinity sets from its own keys, and Megatron's
    under another strategy, have no effect as in Trinity."""
    from trinity_like.config import verl as V
    from trinity_like.config.verl_compose import default_leaves, leaves

    if not isinstance(tc, dict):
        raise Unmapped("trainer.trainer_config must be a section of verl keys")
    flat = {k: v for k, v in leaves(tc) if k}
    vview = V.View(flat, view.source, default_leaves(), changed=set(flat))
    vout = V.Translation()
    megatron = str(view.get("trainer.trainer_strategy", "fsdp")) == "megatron"
    for key, value in flat.items():
        name = f"trainer.trainer_config.{key}"
        owner = next((why for p, why in _TRINITY_SETS.items() if key == p.rstrip(".") or
                      (p.endswith(".") and key.startswith(p)) or key.startswith(p + ".")), None)
        if owner is not None:
            out.no_effect.append((name, value, f"Trinity sets it from {owner}"))
            continue
        if ".megatron." in f".{key}." and not megatron:
            out.no_effect.append((name, value, "Megatron's setting: read only with trainer.trainer_strategy megatron"))
            continue
        before = len(vout.unmapped)
        values = V._convert(key, value, vview, vout, given=True)
        if len(vout.unmapped) > before:
            k, v, why = vout.unmapped[-1]
            out.unmapped.append((name, v, why))
            continue
        if values:
            out.native.update(values)
            out.applied.append((name, value, ", ".join(f"{k}={v!r}" for k, v in values.items())))
    for k, v, why in vout.no_effect:
        out.no_effect.append((f"trainer.trainer_config.{k}", v, why))
    if out.native.get("algorithm.policy_loss") == "dpo" and "trainer.micro_batch_size" in out.native:
        out.native["trainer.micro_batch_size"] *= 2  # Trinity doubles DPO's micro-batch: a pair is two sequences
    if view.raw("trainer.max_checkpoints_to_keep") is not None:  # Trinity's own key wins over the verl one
        out.native["trainer.keep_checkpoints"] = int(view.raw("trainer.max_checkpoints_to_keep"))


def native_yaml(tr: Translation) -> str:
    """The translation as a config file of ours (``trinity-like config-convert``)."""
    import yaml

    return yaml.safe_dump(tr.nested(), sort_keys=False, default_flow_style=False)


# ---------------------------------------------------------------- docs/trinity.md

DOCS_PATH = Path(__file__).resolve().parents[2] / "docs" / "trinity.md"


def render_docs() -> str:
    """docs/trinity.md: the whole key table, from ``RULES``."""
    rows = []
    for r in RULES:
        ours = ", ".join(f"`{k}`" for k in r.native) or "-"
        default = TRINITY_DEFAULTS.get(r.key)
        rows.append(f"| `{r.key}` | {ours} | {r.kind} | {r.how}"
                    f"{f' (Trinity default {default!r})' if default is not None else ''} |")
    defaults = [f"| `{d.trinity}` | {d.trinity_default} | `{d.ours}` | {d.ours_default} | {d.applied} |"
                for d in DEFAULTS_WHERE_OURS_DIFFER]
    return "\n".join([
        "# Trinity-RFT's config keys",
        "",
        "<!-- Generated from trinity_like/config/trinity_rules.py and trinity.py by `python -m "
        "trinity_like.config.trinity`; do not edit by hand. -->",
        "",
        "`trinity-like run FILE` (or `-c FILE` / `--config FILE`) runs a Trinity-RFT config as it is, and",
        "`trinity-like config-convert FILE` prints the config of ours it becomes, ending with one line per",
        "difference of meaning that remains. How to bring a config, a workflow, a reward function and data:",
        "[coming-from-trinity.md](coming-from-trinity.md). Every key of Trinity-RFT's schema (9051d63) has a row",
        "below. `<taskset>` stands for `buffer.explorer_input.taskset`, `buffer.explorer_input.tasksets[]` and",
        "`buffer.explorer_input.eval_tasksets[]`; `<buffer>` for `buffer.trainer_input.experience_buffer` and",
        "`buffer.trainer_input.auxiliary_buffers.<name>`; `trainer.trainer_config` holds verl keys, translated by",
        "[verl.md](verl.md)'s table. A key that is not Trinity's, and a value that has no counterpart here, is",
        "refused: every one of them named in one message.",
        "",
        "Kinds: *mapped* sets our keys; *checked* is accepted only at the values that behave like ours (others are",
        "refused, with the reason); *derived* is read with other keys, as Trinity's `check_and_update` derives",
        "them (the how column says how); *no effect* is accepted and recorded with the reason.",
        "",
        "## Trinity's defaults where ours differ",
        "",
        "A key the file omits takes Trinity's default, which the translation writes into our config:",
        "",
        "| Trinity key | Trinity default | our key | our default | translated to |",
        "|---|---|---|---|---|",
        *defaults,
        "",
        "## Every key",
        "",
        "| Trinity key | ours | kind | how |",
        "|---|---|---|---|",
        *rows,
        "",
    ])


if __name__ == "__main__":
    import sys

    text = render_docs()
    if "--check" in sys.argv:
        sys.exit(0 if DOCS_PATH.read_text() == text else 1)
    DOCS_PATH.write_text(text)
    print(f"wrote {DOCS_PATH}")


__all__ = ["DEFAULTS_WHERE_OURS_DIFFER", "Rule", "Translation", "apply_overrides", "is_trinity_config",
           "is_trinity_key", "load_trinity_file", "native_yaml", "render_docs", "resolve", "translate"]
