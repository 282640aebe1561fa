"""A pytest plugin for tools/gpu_check.py: each failure's reason and traceback printed the moment it happens.

pytest prints its failure summary at the end of a session; a step cut off by its time budget never gets there,
and a lease would bring back only the word FAILED. Loaded with ``-p gpu_check_plugin`` (tools/ on PYTHONPATH);
under xdist the controller sees every worker's reports, so it prints them all."""

from __future__ import annotations

import sys

MARK = "GPU-CHECK"


def pytest_runtest_logreport(report) -> None:
    if not report.failed:
        return
    text = report.longreprtext or ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("E ")]
    reason = (errors[0][1:].strip() if errors else (lines[-1] if lines else "no message"))[:300]
    word = "FAILED" if report.when == "call" else "ERROR"
    out = sys.__stdout__
    out.write(f"\n{MARK} {word} {report.nodeid} :: {reason}\n")
    out.write("\n".join(text.splitlines()[-60:]) + f"\n{MARK} end\n")
    out.flush()
