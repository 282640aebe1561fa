"""Every benchmark's ``--smoke`` runs here, so a benchmark broken by a later change fails ``make test`` (issue 33).

Each script in bench/ that runs as a program declares ``RESULT_FIELDS`` (bench/benchlib.py); its smoke run must
exit 0 and print every declared ``RESULT`` line, each parsing as ``RESULT name k=v ...`` and holding at least the
declared fields, with at least one field. The scripts run as a user runs them: ``python bench/NAME.py --smoke``
from the project root, in a process of their own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from benchlib import benchmark_scripts, declared_fields, parse_result_lines, result_line  # noqa: E402

SCRIPTS = benchmark_scripts()
RAY_SCRIPTS = {"async_speedup.py", "e2e_gpu.py", "learning.py", "scale.py", "serve_load.py", "sync.py"}
"""Smokes that start a Ray instance of their own: one at a time (one xdist group), beside the suite's Ray tests."""


def test_the_benchmarks_are_all_found():
    names = {p.name for p in SCRIPTS}
    assert {"async_speedup.py", "buffer.py", "engine.py", "learning.py", "logprob_memory.py", "scale.py",
            "segment_format.py", "serve_load.py", "simulate.py", "sync.py", "trainer.py"} <= names
    assert "env_latency.py" not in names and "benchlib.py" not in names  # a workflow module and the helpers


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_every_benchmark_declares_its_result_fields_and_takes_smoke(script):
    fields = declared_fields(script)
    assert fields and all(isinstance(v, tuple) for v in fields.values())
    text = script.read_text()
    assert "add_smoke(" in text and "def parse_args(" in text and "def main(argv" in text


def test_result_lines_round_trip_and_refuse_what_would_not_parse():
    line = result_line("x", {"a": 1, "b": 0.123456, "c": "4:4"})
    assert line == "RESULT x a=1 b=0.1235 c=4:4"
    assert parse_result_lines(f"noise\n{line}\nRESULT y k=v (target 2.0) n=3\n") == [
        ("x", {"a": "1", "b": "0.1235", "c": "4:4"}), ("y", {"k": "v", "n": "3"})]
    with pytest.raises(ValueError, match="without spaces"):
        result_line("x", {"a": "two words"})
    with pytest.raises(ValueError, match="a name of letters"):
        result_line("x", {"a-b": 1})


def _params():
    for script in SCRIPTS:
        marks = [pytest.mark.slow]
        if script.name in RAY_SCRIPTS:
            marks += [pytest.mark.ray, pytest.mark.xdist_group("bench_ray")]
        yield pytest.param(script, marks=marks, id=script.stem)


@pytest.mark.parametrize("script", list(_params()))
def test_smoke_prints_every_declared_result_line_with_its_fields(script):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run([sys.executable, str(script), "--smoke"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=420)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, f"{script.name} --smoke failed ({proc.returncode}):\n{tail}"
    lines = parse_result_lines(proc.stdout)
    for name, fields in declared_fields(script).items():
        printed = [f for n, f in lines if n == name]
        assert printed, f"{script.name} --smoke printed no 'RESULT {name}' line:\n{tail}"
        for got in printed:
            missing = [f for f in fields if f not in got]
            assert got and not missing, f"RESULT {name} of {script.name} lacks {missing}:\n{tail}"
