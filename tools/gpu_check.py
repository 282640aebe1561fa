"""The GPU check: everything a GPU lease should run, in one device call of under 10 minutes, with one report.

A GPU machine is lent to about one session in twenty, for 30 minutes of device time; none of that may go on
working out what to run. ``make gpu-check`` (here) builds the offline bundle ``.device/`` and runs this script's
dry run; the device call is then

    run(command="bash tools/gpu-check", carry=[".device"], timeout_s=600)

which installs the bundle there and runs the steps below in order, each under its own time budget and all of
them under ``--budget-s``, and writes under ``$OUT``:

    gpu-check.md    the report: the machine, each step's outcome, time and peak GPU memory, each test's outcome
                    (failures with their one-line reason), every RESULT line
    gpu-check.json  the same, for tools
    gpu-check.log   every step's whole output

``--only WORD`` runs the steps whose name holds WORD (again after a fix). ``--dry-run`` (run by ``make test``)
checks without a GPU that every command exists and parses its arguments: each benchmark's ``parse_args`` takes the
exact arguments, and each pytest selection collects at least one test.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))  # the benchmarks import bench/benchlib.py as their neighbour

ENV = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "RAY_USAGE_STATS_ENABLED": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
OUTCOME = re.compile(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
NODE = re.compile(r"(tests/\S+?\.py::\S+)")
SUMMARY = re.compile(r"^(FAILED|ERROR) (tests/\S+)(?: - (.*))?$")
EARLY = re.compile(r"^GPU-CHECK (FAILED|ERROR) (tests/\S+) :: (.*)$")
"""A failure as tools/gpu_check_plugin.py prints it when it happens (a step cut off never reaches pytest's summary)."""


@dataclass
class Outcome:
    """What one step did: ``status`` is passed, failed, timed out or skipped (out of time, or not chosen)."""

    name: str
    status: str
    seconds: float = 0.0
    peak_gpu_mem_gb: float | None = None
    tests: dict[str, str] = field(default_factory=dict)
    """pytest steps: node id -> PASSED / FAILED / ERROR / SKIPPED / XFAIL / XPASS."""
    reasons: dict[str, str] = field(default_factory=dict)
    """pytest steps: node id -> the one-line reason of a failure or error."""
    results: list[str] = field(default_factory=list)
    """benchmark steps: the RESULT lines printed."""
    command: str = ""


@dataclass(frozen=True)
class PytestStep:
    """A pytest selection: ``paths`` under ``marker``, over ``workers`` xdist workers (0: in one process)."""

    name: str
    paths: tuple[str, ...]
    marker: str
    budget_s: int
    workers: int = 0
    ignore: tuple[str, ...] = ()
    """Test files left out (run by a step of their own)."""
    needs: str = ""
    """A module the tests import or skip (vllm): where this machine lacks it, the dry run checks only the paths."""
    test_timeout_s: int = 90
    """pytest-timeout for one test: a hung test fails with its stack, and the step goes on to the next."""

    def argv(self) -> list[str]:
        xdist = ["-n", str(self.workers), "--dist", "loadgroup"] if self.workers else ["-p", "no:xdist"]
        return [sys.executable, "-m", "pytest", "-v", "-rfE", "--tb=short", "-p", "no:cacheprovider", "-p",
                "gpu_check_plugin", f"--timeout={self.test_timeout_s}", *xdist,
                *(f"--ignore={p}" for p in self.ignore), "-m", self.marker, *self.paths]

    def dry_run(self) -> str | None:
        """None when the selection collects at least one test, else why not."""
        missing = [p for p in self.paths if not (ROOT / p).exists()]
        if missing:
            return f"no such test path: {', '.join(missing)}"
        if self.needs and importlib.util.find_spec(self.needs) is None:
            return None
        from _pytest.mark.expression import Expression  # pytest's own -m matching

        rc, items, tail = collect(self.paths)
        selected = Expression.compile(self.marker)
        collected = sum(selected.evaluate(lambda name, marks=marks: name in marks) for marks in items)
        if rc != 0 or not collected:
            return f"pytest collected {collected} tests (exit {rc}): {tail}"
        return None

    def read(self, output: str, outcome: Outcome) -> None:
        for line in output.splitlines():
            early = EARLY.match(line)
            if early:
                outcome.tests[early.group(2)] = early.group(1)
                outcome.reasons[early.group(2)] = early.group(3).strip()
                continue
            summary = SUMMARY.match(line)
            if summary:
                outcome.reasons[summary.group(2)] = (summary.group(3) or "").strip()
                continue
            node, word = NODE.search(line), OUTCOME.search(line)
            if node and word and not line.startswith(("FAILED ", "ERROR ")):
                outcome.tests[node.group(1)] = word.group(1)


_COLLECT = """
import sys, pytest
class Report:
    def pytest_collection_finish(self, session):
        for item in session.items:
            print("ITEM", ",".join(sorted({m.name for m in item.iter_markers()})), flush=True)
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *sys.argv[1:]],
                     plugins=[Report()]))
"""


@functools.cache
def collect(paths: tuple[str, ...]) -> tuple[int, list[set[str]], str]:
    """pytest's collection of ``paths`` in a child process, once per set of paths: (exit code, the marker names of
    each test, the output's tail)."""
    proc = subprocess.run([sys.executable, "-c", _COLLECT, *paths], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **ENV})
    items = [set(filter(None, line[5:].split(","))) for line in proc.stdout.splitlines() if line.startswith("ITEM ")]
    return proc.returncode, items, (proc.stdout[-500:] + proc.stderr[-500:]).strip()


@dataclass(frozen=True)
class BenchStep:
    """A benchmark script of bench/ with its arguments."""

    name: str
    script: str
    args: tuple[str, ...]
    budget_s: int
    only: bool = False
    """Runs only when ``--only`` names it (measured already; left out of the default call's budget)."""
    needs: str = ""
    """A module the script cannot run without (vllm): where this machine lacks it the step is skipped."""

    def argv(self) -> list[str]:
        return [sys.executable, str(BENCH / self.script), *self.args]

    def dry_run(self) -> str | None:
        """None when the script exists and its ``parse_args`` takes the arguments, else why not."""
        path = BENCH / self.script
        if not path.is_file():
            return f"no such benchmark: bench/{self.script}"
        spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses resolve their module by name
        spec.loader.exec_module(module)
        try:
            with contextlib.redirect_stderr(sys.stdout):
                module.parse_args(list(self.args))
        except SystemExit as e:
            return f"bench/{self.script} refused the arguments {' '.join(self.args)} (exit {e.code})"
        return None

    def read(self, output: str, outcome: Outcome) -> None:
        lines = output.splitlines()
        outcome.results = [line for line in lines if line.startswith("RESULT ")]
        failed = [line for line in lines if line.startswith("FAILED: ")]  # bench/e2e_gpu.py's checks
        if failed:
            outcome.reasons[self.script] = failed[0]
        elif not outcome.results and lines:  # it crashed: its last words (a traceback's last line)
            outcome.reasons[self.script] = " | ".join(line.strip() for line in lines[-3:])[:600]


QWEN_TRAIN = ("--device", "cuda", "--dtype", "bfloat16", "--batch", "64", "--micro", "8", "--response-len", "1008",
              "--repeats", "3")
VLLM_TESTS = "tests/explorer/test_vllm_engine.py"
GPU_TESTS = ("tests/trainer", "tests/synchronizer", "tests/weights", "tests/explorer")
"""The test folders whose code runs on a GPU where one is there."""
STEPS = (
    PytestStep("pytest -m gpu", GPU_TESTS, "gpu", budget_s=150),
    PytestStep("trainer, synchronizer, weights and explorer tests with CUDA visible", GPU_TESTS, "not gpu",
               budget_s=150, workers=12, ignore=(VLLM_TESTS,)),
    PytestStep("vLLM engine tests on CUDA (skipped unless vLLM was carried: docs/vllm-on-a-lease.md)",
               (VLLM_TESTS,), "not gpu", budget_s=360, needs="vllm"),
    BenchStep("bench/trainer.py Qwen2.5-0.5B shape, bf16", "trainer.py", ("--shape", "qwen2.5-0.5b", *QWEN_TRAIN),
              budget_s=48),
    BenchStep("bench/realsize.py Qwen2.5-0.5B shape, bf16, 32 long-tailed rows, before/after 4462d03", "realsize.py",
              ("--device", "cuda", "--dtype", "bfloat16", "--layers", "24", "--rows", "32", "--micro", "8",
               "--variants", "after,before"), budget_s=60),
    BenchStep("bench/trainer.py Qwen2.5-1.5B shape, bf16", "trainer.py", ("--shape", "qwen2.5-1.5b", *QWEN_TRAIN),
              budget_s=85, only=True),
    BenchStep("bench/e2e_gpu.py e2e async: trinity-like run, vLLM + trainer on one GPU, ipc, Qwen2.5-0.5B shape",
              "e2e_gpu.py", ("--out", "e2e-async.json"), budget_s=300, only=True, needs="vllm"),
    BenchStep("bench/e2e_gpu.py e2e sync: the same in mode sync (R5: sync vs async on one GPU)", "e2e_gpu.py",
              ("--mode", "sync", "--out", "e2e-sync.json"), budget_s=240, only=True, needs="vllm"),
    BenchStep("bench/e2e_gpu.py e2e 1.5B memory: Qwen2.5-1.5B shape, 2 steps, peak memory per process",
              "e2e_gpu.py", ("--shape", "qwen2.5-1.5b", "--steps", "2", "--out", "e2e-1.5b.json"), budget_s=240,
              only=True, needs="vllm"),
    BenchStep("bench/sync.py on CUDA", "sync.py", ("--device", "cuda", "--repeats", "1"), budget_s=60),
    BenchStep("bench/engine.py on CUDA", "engine.py", ("--device", "cuda", "--batch", "64", "--new-tokens", "128"),
              budget_s=30),
    BenchStep("bench/logprob_memory.py on CUDA, bf16", "logprob_memory.py",
              ("--device", "cuda", "--dtype", "bfloat16", "--batch", "8", "--response-len", "2048"), budget_s=30),
)
"""The lease's steps, in the order they run (the most telling first); without vLLM and the 1.5B step their budgets
add up to 528 s, within one call's 540 s default (from the leases: the CUDA-visible tests 240 in 135 s on an H100,
bench/sync.py 55 s; on the H200 of 2026-11-26 bench/realsize.py after+before ~40 s with its warm-ups). The 1.5B
trainer step (~75 s on the H200, measured there) runs only when asked (``--only 1.5B``). The vLLM step runs only
where docs/vllm-on-a-lease.md's calls installed vLLM, and then alone (``--only vLLM``): its 22 tests took 346 s on
the H200 (an engine starts in ~28 s, 12 s of it compiling)."""


class GpuMemorySampler:
    """The GPU's used memory (nvidia-smi, every ``every_s``) while a step runs; ``peak_gb`` is its maximum, None
    where nvidia-smi is missing. nvidia-smi sees every process's memory, Ray actors' included."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s, self.peak_gb = every_s, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read_gb(self) -> float | None:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10).stdout
            return sum(float(x) for x in out.split()) / 1024
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return None

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            gb = self._read_gb()
            if gb is not None:
                self.peak_gb = max(self.peak_gb or 0.0, gb)

    def __enter__(self) -> GpuMemorySampler:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def run_step(step, budget_s: float, log) -> Outcome:
    """Run one step under ``budget_s``: its output goes to ``log`` as it comes and is read into an Outcome."""
    argv = step.argv()
    outcome = Outcome(step.name, "skipped", command=" ".join(argv[1:]))
    if budget_s < 10:
        outcome.status = "skipped (out of time)"
        return outcome
    if getattr(step, "needs", "") and isinstance(step, BenchStep) and importlib.util.find_spec(step.needs) is None:
        outcome.status = f"skipped (no {step.needs} here: docs/vllm-on-a-lease.md)"
        return outcome
    log.write(f"\n===== {step.name} (budget {budget_s:.0f} s)\n$ {outcome.command}\n")
    log.flush()
    start = time.monotonic()
    chunks: list[str] = []
    with GpuMemorySampler() as memory:
        env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tools"),
                                                                                 os.environ.get("PYTHONPATH")]))}
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        timer = threading.Timer(budget_s, lambda: os.killpg(proc.pid, 9))
        timer.start()
        for line in proc.stdout:
            chunks.append(line)
            log.write(line)
        rc = proc.wait()
        timed_out = not timer.is_alive() and rc != 0
        timer.cancel()
    outcome.seconds, outcome.peak_gpu_mem_gb = time.monotonic() - start, memory.peak_gb
    step.read("".join(chunks), outcome)
    outcome.status = "timed out" if timed_out else ("passed" if rc == 0 else f"failed (exit {rc})")
    log.write(f"===== {step.name}: {outcome.status} in {outcome.seconds:.0f} s\n")
    log.flush()
    return outcome


def machine() -> dict[str, str]:
    """The machine, read in a child process (no CUDA context in this one)."""
    probe = ("import json, platform, torch; c = torch.cuda.is_available(); print(json.dumps({"
             "'gpu': torch.cuda.get_device_name(0) if c else 'none', 'gpu_count': torch.cuda.device_count(), "
             "'gpu_mem_gb': round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if c else 0, "
             "'torch': torch.__version__, 'cuda': str(torch.version.cuda), 'python': platform.python_version()}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    info = json.loads(out.stdout) if out.returncode == 0 else {"probe_error": out.stderr[-300:]}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                         text=True) if shutil.which("nvidia-smi") else None
    info["driver"] = smi.stdout.strip() if smi is not None and smi.returncode == 0 else "unknown"
    info["cpus"] = str(os.cpu_count())
    commit = ROOT / ".device" / "commit"
    info["commit"] = commit.read_text().strip() if commit.is_file() else "unknown"
    info["date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return {k: str(v) for k, v in info.items()}


def report(info: dict[str, str], outcomes: list[Outcome], wall_s: float) -> str:
    """The markdown report."""
    gb = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    lines = ["# GPU check", "", f"{info.get('gpu')} ({info.get('gpu_mem_gb')} GiB, driver {info.get('driver')}), "
             f"torch {info.get('torch')} CUDA {info.get('cuda')}, Python {info.get('python')}, {info.get('cpus')} "
             f"CPUs; commit {info.get('commit')}; {info.get('date')}; {wall_s:.0f} s in all.", "",
             "| step | outcome | seconds | peak GPU memory (GB) |", "|---|---|---|---|"]
    for o in outcomes:
        counts = ""
        if o.tests:
            tally: dict[str, int] = {}
            for v in o.tests.values():
                tally[v] = tally.get(v, 0) + 1
            counts = " (" + ", ".join(f"{n} {k.lower()}" for k, n in sorted(tally.items())) + ")"
        lines.append(f"| {o.name} | {o.status}{counts} | {o.seconds:.0f} | {gb(o.peak_gpu_mem_gb)} |")
    for o in outcomes:
        bad = {k: v for k, v in o.tests.items() if v in ("FAILED", "ERROR")}
        if bad or o.results:
            lines += ["", f"## {o.name}", ""]
        for node, word in sorted(bad.items()):
            lines.append(f"- {word} `{node}`: {o.reasons.get(node, '(see gpu-check.log)')}")
        if o.results:
            lines += ["```", *o.results, "```"]
    return "\n".join(lines) + "\n"


def dry_run(steps) -> int:
    """Check every step without running it; the number of steps that would fail to start."""
    bad = 0
    for step in steps:
        error = step.dry_run()
        bad += error is not None
        print(f"{'ok  ' if error is None else 'FAIL'} {step.name}: {' '.join(step.argv()[1:])}"
              + ("" if error is None else f"\n     {error}"), flush=True)
    total = sum(s.budget_s for s in steps)
    print(f"{len(steps) - bad} of {len(steps)} steps would start; budgets add up to {total} s", flush=True)
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="check that every command exists and takes its arguments")
    ap.add_argument("--only", action="append", default=[], help="run only the steps whose name holds this (repeatable)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="all steps together (the device call allows 600 s)")
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"), help="report folder (default $OUT)")
    args = ap.parse_args(argv)
    named = [s for s in STEPS if not args.only or any(w.lower() in s.name.lower() for w in args.only)]
    if not named:
        ap.error(f"--only {args.only} matches none of: {', '.join(s.name for s in STEPS)}")
    if args.dry_run:  # every step, the ones run only when asked too, so none breaks unseen
        return 1 if dry_run(named) else 0
    steps = named if args.only else [s for s in named if not getattr(s, "only", False)]

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    info = machine()
    print(f"GPU check on {info.get('gpu')}, torch {info.get('torch')}; report under {out}", flush=True)
    outcomes = []
    with open(out / "gpu-check.log", "w") as log:
        for step in steps:
            left = args.budget_s - (time.monotonic() - start)
            outcomes.append(run_step(step, min(step.budget_s, left), log))
            o = outcomes[-1]
            print(f"{o.status:>22}  {o.seconds:5.0f} s  {o.name}", flush=True)
            for line in o.results:
                print(f"    {line}", flush=True)
            text = report(info, outcomes, time.monotonic() - start)  # rewritten after each step: a cut-off call
            (out / "gpu-check.md").write_text(text)                   # still brings back what ran
            (out / "gpu-check.json").write_text(json.dumps({"machine": info, "steps": [vars(o) for o in outcomes]},
                                                           indent=1))
    print(report(info, outcomes, time.monotonic() - start), flush=True)
    return 0 if all(o.status == "passed" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
