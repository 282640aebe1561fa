"""A reward that cannot be computed is never a silent zero (issue 36, item 0): through the real command line, a
reward function that raises on every sample stops the run in one line naming the reason, before its rows are
written; failures below `reward.max_failure_frac` are trained with `failure_value` and said on the console."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent

ALWAYS_FAILS = ("def compute_score(responses, ground_truths, **kwargs):\n"
                "    raise KeyError('expected a data_source this function knows')\n")


def _run(tmp_path, tiny_model_path, *overrides):
    config = tmp_path / "run.yaml"
    config.write_text("mode: sync\n")
    args = [str(BIN / "trinity-like"), "run", str(config), f"checkpoint_root_dir={tmp_path}", "project=rf", "name=rf",
            f"model.path={tiny_model_path}", "explorer.batch_size=2", "explorer.repeat_times=2",
            "explorer.sampling.max_new_tokens=4", "explorer.taskset.size=8", "explorer.taskset.max_operand=9",
            "trainer.total_steps=2", *overrides]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_a_reward_that_fails_on_every_sample_stops_the_run_in_one_line(tmp_path, tiny_model_path):
    reward = tmp_path / "reward.py"
    reward.write_text(ALWAYS_FAILS)
    proc = _run(tmp_path, tiny_model_path, f"reward.function_path={reward}")
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "explorer step 0: the reward failed on 4 of 4 samples" in errors[0]
    assert "KeyError" in errors[0] and "expected a data_source this function knows" in errors[0]
    assert str(reward) in errors[0]
    # nothing of that step reached the buffer, so nothing was trained on it
    from trinity_like.buffer import query

    buffer = tmp_path / "rf" / "rf" / "buffer"
    assert not buffer.exists() or query(buffer).num_rows == 0


SOMETIMES_FAILS = ("calls = [0]\n"
                   "def compute_score(responses, ground_truths, **kwargs):\n"
                   "    calls[0] += 1\n"
                   "    if len(responses) == 1 or calls[0] % 2 == 0:\n"
                   "        raise ValueError('every other task')\n"
                   "    return [float(len(r) % 2) for r in responses]\n")
"""Fails on every other call of a task's samples, and on each sample re-scored alone: about half of a step's
samples fail, never all (the tasks between pass)."""


def test_failures_below_the_bound_are_trained_and_said_on_the_console(tmp_path, tiny_model_path):
    reward = tmp_path / "reward.py"
    reward.write_text(SOMETIMES_FAILS)
    proc = _run(tmp_path, tiny_model_path, f"reward.function_path={reward}", "reward.max_failure_frac=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "the reward failed on" in line]
    assert warnings and all(w.startswith("warning: explorer step") for w in warnings)
