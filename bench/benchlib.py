"""What every benchmark in ``bench/`` shares, so that none can break unseen (issue 33).

A benchmark script

- declares ``RESULT_FIELDS``, a literal dict from each ``RESULT`` line's name to the fields that line always
  holds (read with ``ast`` by tests/bench and tools/gpu_check.py, without importing the script);
- builds its arguments with ``parse_args(argv)`` (tools/gpu_check.py's dry run parses the exact arguments a
  GPU lease would pass) and takes ``--smoke``: the same code path as the full run, on the tiny model and small
  sizes, done in seconds;
- prints each ``RESULT`` line with ``result_line``.

tests/bench/test_smoke.py runs every script's ``--smoke`` in ``make test`` and checks that each declared line is
printed, parses, and holds its fields.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
_FIELD = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\S*)")


def add_smoke(parser: argparse.ArgumentParser, what: str) -> None:
    """``--smoke``: ``what`` the smoke run does (the same code path as the full run, smaller)."""
    parser.add_argument("--smoke", action="store_true", help=f"smoke run, seconds ({what}); make test runs it")


def result_line(name: str, fields: dict[str, object]) -> str:
    """``RESULT name k=v ...``; floats get 4 significant decimals unless the caller formatted them already."""
    def text(v: object) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    for k, v in fields.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) or not text(v) or re.search(r"\s", text(v)):
            raise ValueError(f"RESULT field {k}={v!r}: a name of letters, digits and _, and a value without spaces")
    return f"RESULT {name} " + " ".join(f"{k}={text(v)}" for k, v in fields.items())


def parse_result_lines(output: str) -> list[tuple[str, dict[str, str]]]:
    """Every ``RESULT name k=v ...`` line of ``output`` as (name, fields); text that is not ``k=v`` (a note in
    parentheses, say) is ignored."""
    out = []
    for line in output.splitlines():
        if line.startswith("RESULT "):
            words = line.split()
            out.append((words[1], dict(_FIELD.findall(" ".join(words[2:])))))
    return out


def declared_fields(script: Path) -> dict[str, tuple[str, ...]]:
    """A script's ``RESULT_FIELDS`` literal, read without importing it (KeyError when it has none)."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "RESULT_FIELDS" for t in targets):
                return {k: tuple(v) for k, v in ast.literal_eval(node.value).items()}
    raise KeyError(f"{script} declares no RESULT_FIELDS")


def benchmark_scripts() -> list[Path]:
    """The scripts of ``bench/`` that run as a program (a workflow module such as env_latency.py does not)."""
    return sorted(p for p in BENCH_DIR.glob("*.py") if p.name != "benchlib.py" and "__main__" in p.read_text())
