"""A task set whose workflow builds its prompt from the row (Trinity's frozen_lake_workflow reads `seed`, `size`,
`p`) loads without a prompt column; one whose workflow sends the prompt still needs it, named in one line."""

from __future__ import annotations

import pytest

from trinity_like.common.tasks import rows_to_tasks
from trinity_like.config.schema import TaskFormatConfig

ROWS = [{"seed": 7, "size": 4, "p": 0.8, "index": 0}, {"seed": 9, "size": 3, "p": 0.7, "index": 1}]


def test_rows_without_a_prompt_column_load_for_a_workflow_that_builds_its_prompt():
    tasks = rows_to_tasks(ROWS, TaskFormatConfig(), "train", answer_optional=True, prompt_optional=True)
    assert [t.task_id for t in tasks] == ["train-0", "train-1"]
    assert all(t.prompt == "" and t.messages is None and t.answer == "" for t in tasks)
    assert tasks[1].raw_task == ROWS[1]
    with pytest.raises(ValueError, match=r"has no column 'prompt' .*its columns: seed, size, p, index"):
        rows_to_tasks(ROWS, TaskFormatConfig(), "train", answer_optional=True)


def test_run_dir_reads_prompt_less_rows_only_for_such_workflows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trinity_like.common.errors import RunError
    from trinity_like.config import load_config
    from trinity_like.runtime.run_dir import tasks_of_rows

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "train.parquet")
    cfg = load_config(None, [f"explorer.taskset.path={tmp_path}", "explorer.workflow=frozen_lake_workflow"])
    assert [t.raw_task["seed"] for t in tasks_of_rows(cfg, cfg.explorer.taskset, "explorer.taskset")] == [7, 9]
    cfg = load_config(None, [f"explorer.taskset.path={tmp_path}", "explorer.workflow=math_workflow"])
    with pytest.raises(RunError, match="has no column 'prompt'"):
        tasks_of_rows(cfg, cfg.explorer.taskset, "explorer.taskset")
