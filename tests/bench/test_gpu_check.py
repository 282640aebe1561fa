"""tools/gpu-check, the GPU lease's one command: its dry run (what make test can check without a GPU), how it reads
pytest's and the benchmarks' output, its time budgets and its report."""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("tools_gpu_check", ROOT / "tools" / "gpu_check.py")
gc = importlib.util.module_from_spec(_spec)
sys.modules["tools_gpu_check"] = gc  # dataclasses resolve their module by name
_spec.loader.exec_module(gc)

pytestmark = pytest.mark.slow


def test_the_dry_run_of_the_lease_command_finds_every_step_ready():
    proc = subprocess.run(["bash", "tools/gpu-check", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable}, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    n = len(gc.STEPS)
    assert f"{n} of {n} steps would start" in proc.stdout
    # leaves the 600 s device call room for the install (the vLLM step runs alone, after vLLM's own calls)
    assert sum(s.budget_s for s in gc.STEPS if not getattr(s, "needs", "") and not getattr(s, "only", False)) <= 560
    assert all(s.budget_s <= 560 for s in gc.STEPS)
    names = " ".join(s.name for s in gc.STEPS)
    for wanted in ("pytest -m gpu", "CUDA visible", "trainer.py Qwen2.5-0.5B", "trainer.py Qwen2.5-1.5B", "sync.py",
                   "engine.py", "e2e async", "e2e sync", "e2e 1.5B memory"):
        assert wanted in names
    # the end-to-end steps need vLLM and run only when named (after vLLM's carries): never in the default call
    e2e = [s for s in gc.STEPS if "e2e" in s.name]
    assert e2e and all(s.needs == "vllm" and s.only and s.script == "e2e_gpu.py" for s in e2e)
    assert "ok   bench/e2e_gpu.py e2e async" in proc.stdout and "ok   bench/e2e_gpu.py e2e 1.5B memory" in proc.stdout


def test_without_the_bundle_the_lease_command_says_what_to_do(tmp_path):
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "gpu-check").write_text((ROOT / "tools" / "gpu-check").read_text())
    proc = subprocess.run(["bash", "tools/gpu-check"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 2 and "run 'make gpu-check'" in proc.stdout and "carry" in proc.stdout


def test_the_dry_run_catches_a_step_that_would_not_start():
    assert gc.BenchStep("bad flag", "trainer.py", ("--no-such-flag",), 10).dry_run().startswith(
        "bench/trainer.py refused the arguments --no-such-flag")
    assert gc.BenchStep("bad value", "trainer.py", ("--shape", "qwen9"), 10).dry_run() is not None
    assert gc.BenchStep("gone", "no_such.py", (), 10).dry_run() == "no such benchmark: bench/no_such.py"
    assert gc.PytestStep("gone", ("tests/no_such_dir",), "gpu", 10).dry_run() == \
        "no such test path: tests/no_such_dir"
    assert "collected 0 tests" in gc.PytestStep("empty", ("tests/bench/test_gpu_check.py",), "gpu", 10).dry_run()
    assert gc.dry_run([gc.BenchStep("ok", "simulate.py", ("--project",), 10),
                       gc.BenchStep("bad", "simulate.py", ("--nope",), 10)]) == 1


def test_a_benchmark_step_whose_module_is_missing_is_skipped_and_a_failed_check_is_its_reason():
    missing = gc.BenchStep("needs a module", "simulate.py", ("--smoke",), 60, needs="no_such_module_here")
    assert gc.run_step(missing, 60, io.StringIO()).status.startswith("skipped (no no_such_module_here here")
    step, outcome = gc.BenchStep("e2e", "e2e_gpu.py", (), 10), gc.Outcome("e2e", "failed (exit 1)")
    step.read("noise\nFAILED: peak GPU memory 80.0 GB of 80.0 (>= 90%)\nRESULT e2e ok=0\n", outcome)
    assert outcome.results == ["RESULT e2e ok=0"]
    assert outcome.reasons == {"e2e_gpu.py": "FAILED: peak GPU memory 80.0 GB of 80.0 (>= 90%)"}
    crashed = gc.Outcome("e2e", "failed (exit 1)")
    step.read("Traceback (most recent call last):\n  File x\nRuntimeError: CUDA error: out of memory\n", crashed)
    assert crashed.reasons["e2e_gpu.py"].endswith("RuntimeError: CUDA error: out of memory")


def test_pytest_output_is_read_test_by_test_with_and_without_xdist():
    plain = ("tests/a/test_x.py::test_one PASSED                        [ 33%]\n"
             "tests/a/test_x.py::test_two[bf16] FAILED                  [ 66%]\n"
             "tests/a/test_x.py::test_three SKIPPED (needs a GPU)       [100%]\n"
             "=========================== short test summary info ============================\n"
             "FAILED tests/a/test_x.py::test_two[bf16] - assert 0.5 < 0.001\n")
    xdist = ("[gw1] [ 50%] PASSED tests/b/test_y.py::test_four \n"
             "[gw0] [100%] ERROR tests/b/test_y.py::test_five \n"
             "ERROR tests/b/test_y.py::test_five - RuntimeError: CUDA error: out of memory\n")
    step, outcome = gc.PytestStep("s", ("tests",), "gpu", 10), gc.Outcome("s", "passed")
    step.read(plain + xdist, outcome)
    assert outcome.tests == {"tests/a/test_x.py::test_one": "PASSED", "tests/a/test_x.py::test_two[bf16]": "FAILED",
                             "tests/a/test_x.py::test_three": "SKIPPED", "tests/b/test_y.py::test_four": "PASSED",
                             "tests/b/test_y.py::test_five": "ERROR"}
    assert outcome.reasons == {"tests/a/test_x.py::test_two[bf16]": "assert 0.5 < 0.001",
                               "tests/b/test_y.py::test_five": "RuntimeError: CUDA error: out of memory"}
    text = gc.report({"gpu": "NVIDIA H100 80GB HBM3"}, [outcome], 12.0)
    assert "| s | passed (1 error, 1 failed, 2 passed, 1 skipped) | 0 | - |" in text
    assert "- FAILED `tests/a/test_x.py::test_two[bf16]`: assert 0.5 < 0.001" in text


def test_a_step_runs_to_its_result_line_and_one_over_budget_is_stopped():
    log = io.StringIO()
    done = gc.run_step(gc.BenchStep("simulate", "simulate.py", ("--smoke",), 60), 60, log)
    assert done.status == "passed" and [r.split()[1] for r in done.results] == [
        "simulate", "simulate_modes", "simulate_against", "simulate_stream"]  # every RESULT line of its smoke
    assert "===== simulate: passed" in log.getvalue()

    class Sleeper(gc.BenchStep):
        def argv(self):
            return [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]

    stopped = gc.run_step(Sleeper("sleeper", "simulate.py", (), 10), 10, log)
    assert stopped.status == "timed out" and 9 < stopped.seconds < 30
    assert gc.run_step(Sleeper("late", "simulate.py", (), 10), 5, log).status == "skipped (out of time)"
    text = gc.report({"gpu": "none"}, [done, stopped], 20.0)
    assert "| sleeper | timed out |" in text and "RESULT simulate " in text


def test_a_failure_comes_back_with_its_reason_when_the_step_is_cut_off(tmp_path):
    """pytest prints its failure summary only at the end; on the lent H100 a step cut off by its budget brought back
    the bare word FAILED. tools/gpu_check_plugin.py prints each failure's reason the moment it happens."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_cut.py").write_text("import time\n\n\ndef test_fails():\n"
                                                    "    assert 1 + 1 == 3, 'sums are off'\n\n\n"
                                                    "def test_hangs():\n    time.sleep(120)\n")

    class Cut(gc.PytestStep):
        def argv(self):
            return [*super().argv()[:4], "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "gpu_check_plugin",
                    "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "tests" / "test_cut.py")]

    outcome = gc.run_step(Cut("cut", ("tests",), "gpu", 12), 12, io.StringIO())
    assert outcome.status == "timed out"
    assert outcome.tests["tests/test_cut.py::test_fails"] == "FAILED"
    assert "sums are off" in outcome.reasons["tests/test_cut.py::test_fails"]
