"""Render ``docs/config.md``, the configuration reference, from the config dataclasses.

The dataclasses in ``trinity_like/config/schema.py`` are the one source of truth: each key's description is the
docstring under its field (an attribute docstring, which Python drops at run time, so the module's source is
parsed with ``ast``), its type the annotation, its default the field's default, its allowed values the field's
metadata. ``tests/test_config_docs.py`` fails when the committed file differs from what this module renders.

Regenerate with ``trinity-like config-docs`` (or ``python -m trinity_like.config_docs``).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import sys
from pathlib import Path
from typing import Any

from trinity_like.config import Config, allowed_values
from trinity_like.config import schema as config_module

DOCS_PATH = Path(__file__).resolve().parents[1] / "docs" / "config.md"
REGENERATE = "trinity-like config-docs"

INTRO = f"""\
# Configuration reference

<!-- Generated from the dataclasses in trinity_like/config/schema.py by `{REGENERATE}`; do not edit by hand. -->

Every setting of `trinity-like run`, `bench` and `serve` is a field of a dataclass in `trinity_like/config/schema.py`,
described once, by the docstring under the field. This page is generated from them, and a test fails when it
is out of date: after changing a field, run `{REGENERATE}`.

A config is a YAML file whose sections mirror the tables below (`explorer:` holds `sampling:`, and so on); a
key left out keeps its default. An unknown key or a bad value stops the command with one line
`error: ...` and exit status 2.

## Overrides

`trinity-like run CONFIG key=value ...` (also `bench`, `serve`) sets any key by its dotted name, after the file:

- scalars: `trainer.total_steps=5`, `mode=sync`, `explorer.sampling.temperature=0.7`; `null` clears an
  optional key (`trainer.batch_size=null`);
- lists, whole: `explorer.sampling.stop_token_ids=[1,2]`,
  `explorer.eval_tasksets=[{{name: heldout, size: 64}}]` (one element of a list cannot be set alone);
- dicts, whole (`buffer.mix={{explorer: 0.75, human: 0.25}}`, which replaces the dict) or one entry
  (`buffer.mix.human=0.25`, which merges).

`--print-config` prints the resolved config and exits. Keys of list items are written `key[].field` below.

Columns: *default* is the value when the key is not set (`null` = empty, see the description); *allowed* is
the set of values or the range the loader enforces (rules that tie keys together are checked too and name both
keys when they fail).
"""


def field_docs(module: Any = config_module) -> dict[str, dict[str, str]]:
    """``{class name: {field name: docstring}}`` for every class of ``module``, from its source."""
    tree = ast.parse(inspect.getsource(module))
    out: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs: dict[str, str] = {}
        for stmt, nxt in zip(node.body, [*node.body[1:], None], strict=True):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                docs[stmt.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
        out[node.name] = docs
    return out


@dataclasses.dataclass(frozen=True)
class KeyDoc:
    key: str
    type: str
    default: str
    allowed: str
    doc: str


@dataclasses.dataclass
class SectionDoc:
    name: str
    """Dotted name ("" = the top level)."""
    doc: str
    keys: list[KeyDoc] = dataclasses.field(default_factory=list)


def _section_class(f: dataclasses.Field) -> tuple[type, str] | None:
    """The dataclass a field holds (a section) or holds a list of (``key[]``), with the key suffix."""
    factory = f.default_factory
    if isinstance(factory, type) and dataclasses.is_dataclass(factory):
        return factory, ""
    item = _list_item_class(str(f.type))
    return (item, "[]") if item is not None else None


def _list_item_class(annotation: str) -> type | None:
    if annotation.startswith("list[") and annotation.endswith("]"):
        cls = getattr(config_module, annotation[5:-1], None)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            return cls
    return None


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def format_value(value: Any) -> str:
    """A value as it is written in YAML or an override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value) if value == "" or any(c in value for c in ":#{}[],") else value
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def format_allowed(meta: Any) -> str:
    choices = allowed_values(meta)
    if choices is not None:
        return ", ".join(f"`{c}`" for c in choices)
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and hi is not None:
        return f"{lo} to {hi}"
    if lo is not None:
        return f">= {lo}"
    if hi is not None:
        return f"<= {hi}"
    return ""


def sections(root: type = Config) -> list[SectionDoc]:
    """Every section in the order of the dataclasses: a section's own keys, then its subsections."""
    docs = field_docs()
    out: list[SectionDoc] = []

    def walk(cls: type, name: str, doc: str) -> None:
        section = SectionDoc(name, doc)
        out.append(section)
        subsections = []
        for f in dataclasses.fields(cls):
            key = f"{name}.{f.name}" if name else f.name
            description = docs.get(cls.__name__, {}).get(f.name, "")
            sub = _section_class(f)
            if sub is not None:
                if sub[1]:  # a list of sections: say so, and give the list's own default
                    description += f" A list (default `{format_value(_default(f))}`); each item takes the keys below."
                subsections.append((sub[0], key + sub[1], description))
                continue
            section.keys.append(KeyDoc(key, str(f.type), format_value(_default(f)), format_allowed(f.metadata),
                                       description))
        for cls_, key, description in subsections:
            walk(cls_, key, description)

    walk(root, "", "Run identity, mode and seed.")
    return out


def missing_docstrings(root: type = Config) -> list[str]:
    """Dotted keys (and sections) whose field has no docstring."""
    missing = [s.name for s in sections(root) if s.name and not s.doc]
    return missing + [k.key for s in sections(root) for k in s.keys if not k.doc]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(root: type = Config) -> str:
    """The whole of ``docs/config.md``."""
    parts = [INTRO]
    for section in sections(root):
        title = f"`{section.name}`" if section.name else "Top level"
        parts.append(f"\n## {title}\n\n{section.doc}\n")
        if not section.keys:
            continue
        parts.append("\n| key | type | default | allowed | description |\n|---|---|---|---|---|\n")
        for k in section.keys:
            allowed = _cell(k.allowed) if k.allowed else ""
            parts.append(f"| `{k.key}` | `{_cell(k.type)}` | `{_cell(k.default)}` | {allowed} | {_cell(k.doc)} |\n")
    return "".join(parts)


def write(path: str | Path = DOCS_PATH) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render())
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trinity_like.config_docs", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DOCS_PATH), help="where to write (default: docs/config.md)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if --out is out of date")
    args = parser.parse_args(argv)
    return run(args.out, args.check)


def run(out: str | Path, check: bool = False) -> int:
    """Write (or with ``check`` compare) the reference; 0 when it is (now) up to date."""
    out = Path(out)
    if check:
        if out.is_file() and out.read_text() == render():
            print(f"{out} is up to date")
            return 0
        print(f"{out} is out of date; regenerate it with `{REGENERATE}`", file=sys.stderr)
        return 1
    print(f"configuration reference written to {write(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
