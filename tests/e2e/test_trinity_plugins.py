"""A Trinity-RFT user's workflow from a plugin folder runs end to end through the real command line: imported in
the explorer's own Ray process (``explorer.plugin_dirs``), its reward parts logged per step; and a workflow that
raises the same error on every task stops the run in one line with that error (not step after step of reward 0
with the error only in failed_tasks.jsonl)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent

PLUGIN = '''from trinity_like.explorer.trinity_api import WORKFLOWS, MathWorkflow, Workflow


@WORKFLOWS.register_module("plugin_math_workflow")
class PluginMathWorkflow(MathWorkflow):
    """Trinity's math_workflow, as a user's subclass."""


@WORKFLOWS.register_module("plugin_broken_workflow")
class BrokenWorkflow(Workflow):
    def run(self):
        return self.model.chat([{"role": "user", "content": self.task.task_desc}], n="two")
'''


def _run(tmp_path, tiny_model_path, workflow: str):
    plugins = tmp_path / "plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / "my_workflows.py").write_text(PLUGIN)
    config = tmp_path / "run.yaml"
    config.write_text(f"mode: sync\nexplorer:\n  plugin_dirs: [{plugins}]\n  workflow: {workflow}\n")
    args = [str(BIN / "trinity-like"), "run", str(config), f"checkpoint_root_dir={tmp_path}", "project=tp",
            f"name={workflow}", f"model.path={tiny_model_path}", "explorer.batch_size=2", "explorer.repeat_times=2",
            "explorer.sampling.max_new_tokens=4", "explorer.taskset.size=8", "explorer.taskset.max_operand=9",
            "explorer.max_retries=0", "trainer.total_steps=2"]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_a_plugin_folders_trinity_workflow_runs_and_logs_its_reward_parts(tmp_path, tiny_model_path):
    proc = _run(tmp_path, tiny_model_path, "plugin_math_workflow")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "tp" / "plugin_math_workflow" / "metrics.jsonl").read_text().splitlines()]
    explorer = [r for r in rows if "rollout/experiences" in r]
    assert len(explorer) >= 2 and all(r["rollout/experiences"] == 4 for r in explorer)
    # math_reward's parts, averaged per step; the tiny model writes no <think>/<answer>: format -0.1
    assert all(r["rollout/reward/format_score"] == pytest.approx(-0.1) for r in explorer)
    assert all("rollout/reward/accuracy" in r for r in explorer)


def test_a_workflow_that_fails_on_every_task_stops_the_run_in_one_line(tmp_path, tiny_model_path):
    proc = _run(tmp_path, tiny_model_path, "plugin_broken_workflow")
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "explorer step 0: the workflow failed on all 2 tasks" in errors[0]
    assert "ValueError: invalid literal for int() with base 10: 'two'" in errors[0]
