"""The tool config file (``explorer.tool_config_path``, YAML or JSON): its format, the built-in tools it may name
with their settings, and reading it into checked specs. Nothing here builds or runs a tool: config validation
reads the file on load (a bad file stops the run there, not every task later), and
:func:`trinity_like.explorer.tools.load_tools` builds the tools from the same specs.

The file has verl's shape (``actor_rollout_ref.rollout.multi_turn.tool_config_path``)::

    tools:
      - class_name: calculator          # a built-in tool of ours (see below)
        config: {max_exponent: 64}      # that tool's settings (optional)
        tool_schema:                    # an OpenAI function schema: what the model is told
          type: function
          function:
            name: calculator
            description: Evaluate an arithmetic expression.
            parameters: {type: object, properties: {expression: {type: string}}, required: [expression]}

``class_name`` names a built-in tool (``BUILTIN_TOOLS``: ``calculator``, ``python``). verl names a Python
class there; a dotted path whose last part is a built-in's name, with or without a ``Tool`` suffix and in any
case (``verl.tools.calculator_tool.CalculatorTool``), maps to that built-in. Nothing named there is ever
imported: a class that maps to no built-in is refused, with the built-in to use instead when there is one
(verl's code sandbox -> ``python``). verl's ``config.type: native`` is accepted and ignored; ``mcp`` is refused.
Each built-in reads ONE string argument (calculator ``expression``, python ``code``), which the schema must
declare.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trinity_like.common.errors import UserError

INVALID = "_invalid"
"""The name under which calls to no configured tool (malformed, unknown name) are counted; no tool may take it."""

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""OpenAI's rule for function names."""


@dataclass
class CalculatorSettings:
    """The settings (``config``) of the built-in ``calculator``."""

    max_exponent: int = 100
    """Largest absolute exponent of ``**``."""
    max_magnitude: float = 1e18
    """Largest absolute value of any intermediate result."""
    max_length: int = 500
    """Longest expression, in characters."""


SANDBOXES = ("bwrap", "guard")
"""``PythonSettings.sandbox``: ``bwrap`` a bubblewrap sandbox (kernel namespaces, read-only file system, an
unprivileged user), ``guard`` the weaker in-process guard (see ``trinity_like.explorer.tools.PythonTool``)."""


@dataclass
class PythonSettings:
    """The settings (``config``) of the built-in ``python``."""

    timeout_s: float = 5.0
    """Wall-clock limit of one run; the process group is killed then."""
    memory_mb: int = 256
    """Address-space limit (RLIMIT_AS) of the process."""
    file_size_mb: int = 16
    """Largest file the process may write (RLIMIT_FSIZE), its stdout and stderr included; under ``bwrap`` also
    the size of its working directory (a tmpfs)."""
    max_output_chars: int = 2000
    """Output returned to the model: stdout cut to this, and on failure the end of stderr too."""
    sandbox: str = "bwrap"
    """``bwrap`` (bubblewrap: no network, read-only file system, unprivileged user; the tool refuses to load
    without it) or ``guard`` (in-process guards only, which code can get round; for machines without bwrap)."""
    bwrap_path: str = "bwrap"
    """The bubblewrap binary, looked up on PATH unless it is a path."""
    max_processes: int = 32
    """Processes (and threads) the code may have at once (RLIMIT_NPROC), under ``bwrap`` only: a fork bomb stops
    there. ``guard`` runs as the explorer's user, whose other processes would count too."""

    def __post_init__(self) -> None:
        if self.sandbox not in SANDBOXES:
            raise ValueError(f"sandbox must be one of {', '.join(SANDBOXES)}, got {self.sandbox!r}")


def find_bwrap(settings: PythonSettings) -> str:
    """The bubblewrap binary ``settings`` names, resolved; UserError saying how to install it or do without."""
    found = shutil.which(settings.bwrap_path)
    if found is None:
        raise UserError(f"the python tool runs code under bubblewrap and {settings.bwrap_path!r} is not on this "
                        "machine: install it (apt-get install bubblewrap) or set the tool's config sandbox: guard "
                        "to accept the weaker in-process guard")
    return found


@dataclass(frozen=True)
class BuiltinTool:
    """What a tool config file may say about one built-in tool; its implementation is the entry of the same name
    in ``trinity_like.explorer.tools.TOOLS``."""

    name: str
    class_name: str
    """Its class, as a verl-shaped file may name it (``class_name: CalculatorTool``) and as messages call it."""
    argument: str
    """The one string argument it reads; the tool's schema must declare it."""
    description: str
    """Used when the schema gives no description."""
    settings: type
    """The dataclass of its ``config`` mapping (each value checked against its field's type)."""


CALCULATOR = BuiltinTool("calculator", "CalculatorTool", "expression", "Evaluate an arithmetic expression.",
                         CalculatorSettings)
PYTHON = BuiltinTool("python", "PythonTool", "code", "Run Python code and return what it prints.", PythonSettings)
BUILTIN_TOOLS: dict[str, BuiltinTool] = {tool.name: tool for tool in (CALCULATOR, PYTHON)}
"""Built-in tool name -> its declaration."""


@dataclass(frozen=True)
class ToolSpec:
    """One configured tool: what the model is told, and which built-in runs it."""

    name: str
    description: str
    parameters: dict[str, Any]
    builtin: str
    """The ``BUILTIN_TOOLS`` entry that runs it."""

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema (what chat templates take as ``tools``)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def builtin_for(class_name: str) -> str | None:
    """The built-in a ``class_name`` names: itself, or the last part of a dotted path with any ``Tool`` suffix
    dropped, case-insensitively (``verl.tools.calculator_tool.CalculatorTool`` -> ``calculator``)."""
    last = class_name.rsplit(".", 1)[-1].lower()
    for candidate in (last, last.removesuffix("tool").rstrip("_")):
        if candidate in BUILTIN_TOOLS:
            return candidate
    return None


_HINTS = {"sandboxfusion": "python", "sandbox": "python", "code": "python", "codeinterpreter": "python",
          "gsm8k": "calculator"}
"""verl tools with no built-in of their own, and the built-in that does their job here."""


def read_tool_config(path: str | Path) -> list[tuple[ToolSpec, Any]]:
    """The tools of a tool config file, each as its spec and its built-in's settings (an instance of
    ``BuiltinTool.settings``); UserError naming the file, what is wrong and how to fix it."""
    path = Path(path).expanduser()
    where = f"tool config '{path}'"
    if not path.is_file():
        raise UserError(f"{where} does not exist; set explorer.tool_config_path to a YAML or JSON file of tools "
                        "(examples/tool_calculator/tools.yaml shows the format), or to '' for none")
    data = _read(path, where)
    entries = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{where} must be a mapping with a non-empty list 'tools' (entries with class_name, "
                        "config, tool_schema); see examples/tool_calculator/tools.yaml")
    specs: list[tuple[ToolSpec, Any]] = []
    for i, entry in enumerate(entries):
        spec, settings = _entry(entry, f"{where}: tools[{i}]")
        if spec.name in (s.name for s, _ in specs):
            raise UserError(f"{where}: tools[{i}] is named {spec.name!r} like an earlier tool; give every tool "
                            "its own function.name")
        specs.append((spec, settings))
    return specs


def _read(path: Path, where: str) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{where} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise UserError(f"{where} is not valid YAML: {getattr(e, 'problem', None) or e}{at}") from None


def _entry(entry: Any, where: str) -> tuple[ToolSpec, Any]:
    if not isinstance(entry, dict):
        raise UserError(f"{where} must be a mapping with class_name, config and tool_schema")
    unknown = sorted(set(entry) - {"class_name", "config", "tool_schema"})
    if unknown:
        raise UserError(f"{where} has unknown key(s) {', '.join(unknown)}; an entry has class_name, config and "
                        "tool_schema")
    names = ", ".join(sorted(BUILTIN_TOOLS))
    class_name = entry.get("class_name")
    if not isinstance(class_name, str) or not class_name:
        raise UserError(f"{where} needs class_name: one of the built-in tools {names}")
    builtin = builtin_for(class_name)
    if builtin is None:
        key = class_name.rsplit(".", 1)[-1].lower().removesuffix("tool").replace("_", "")
        hint = f" (for what {class_name} does, use {_HINTS[key]})" if key in _HINTS else ""
        raise UserError(f"{where}: class_name {class_name!r} names no built-in tool; only built-in tools run "
                        f"here and nothing named in class_name is imported: use one of {names}{hint}")
    tool = BUILTIN_TOOLS[builtin]
    fn = _function(entry.get("tool_schema"), where)
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name == INVALID:
        raise UserError(f"{where}: tool_schema.function.name must be the tool's name, 1-64 letters, digits, _ or - "
                        f"(and not {INVALID!r}), got {name!r}")
    description = fn.get("description", tool.description)
    parameters = fn.get("parameters", {"type": "object", "properties": {tool.argument: {"type": "string"}},
                                       "required": [tool.argument]})
    if not isinstance(description, str) or not isinstance(parameters, dict):
        raise UserError(f"{where}: tool_schema.function.description must be text and parameters a JSON schema "
                        "object")
    if tool.argument not in (parameters.get("properties") or {}):
        raise UserError(f"{where} ({name!r}): tool_schema.function.parameters.properties must declare "
                        f"{tool.argument!r}, the argument the built-in {builtin} tool reads")
    return ToolSpec(name, description, parameters, builtin), _settings(tool, entry.get("config"), where)


def _function(schema: Any, where: str) -> dict[str, Any]:
    fn = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(fn, dict) or schema.get("type", "function") != "function":
        raise UserError(f"{where} needs tool_schema: {{type: function, function: {{name, description, "
                        "parameters}}}} (an OpenAI function schema)")
    return fn


def _settings(tool: BuiltinTool, config: Any, where: str) -> Any:
    """``tool.settings`` from an entry's ``config`` mapping, each value checked against its field's type."""
    config = dict(config or {}) if isinstance(config, dict) or config is None else None
    if config is None:
        raise UserError(f"{where}: config must be a mapping of the tool's settings")
    kind = config.pop("type", "native")
    if kind != "native":
        raise UserError(f"{where}: config.type {kind!r} is not supported; only built-in (verl: native) tools run "
                        "here; drop config.type")
    fields = {f.name: f for f in dataclasses.fields(tool.settings)}
    unknown = sorted(set(config) - set(fields))
    if unknown:
        raise UserError(f"{where}: unknown config key(s) {', '.join(unknown)}; the {tool.class_name} settings are "
                        f"{', '.join(fields) or 'none'}")
    for key, value in config.items():
        if fields[key].type == "str":
            if not isinstance(value, str) or not value:
                raise UserError(f"{where}: config.{key} must be non-empty text, got {value!r}")
            continue
        want = (int, float) if fields[key].type == "float" else (int,)
        if float in want and isinstance(value, str):  # YAML 1.1 reads 1.0e18 (no exponent sign) as text
            try:
                config[key] = value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, want) or value <= 0:
            raise UserError(f"{where}: config.{key} must be a positive {fields[key].type}, got {value!r}")
    try:
        settings = tool.settings(**config)
    except ValueError as e:
        raise UserError(f"{where}: config.{e}") from None
    if isinstance(settings, PythonSettings) and settings.sandbox == "bwrap":
        try:
            find_bwrap(settings)
        except UserError as e:
            raise UserError(f"{where}: {e}") from None
    return settings
