"""Task sets: Parquet files with columns ``task_id``, ``prompt``, ``answer`` (and optionally ``data_source``,
which picks the reward scorer); a generator for one, and demonstrations (the correct answers as chat
records) for a supervised warm-up.

The built-in ``arithmetic`` set asks for the sum of two small numbers ("7+12=") and has an exact answer, so
the reward is checkable and a tiny model can improve on it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from trinity_like.common.fs import atomic_write_with

TASK_COLUMNS = ("task_id", "prompt", "answer")


@dataclass(frozen=True)
class Task:
    task_id: str
    prompt: str
    answer: str
    data_source: str = ""
    """Which scorer judges the answer (e.g. ``arithmetic``, ``math``); empty = the reward config decides."""


def generate_arithmetic(size: int, max_operand: int, seed: int) -> list[Task]:
    """``size`` distinct-as-possible addition tasks ``a+b=`` with 0 <= a, b <= max_operand."""
    rng = random.Random(seed)
    return [
        Task(task_id=f"add-{i:06d}", prompt=f"{a}+{b}=", answer=str(a + b), data_source="arithmetic")
        for i, (a, b) in enumerate((rng.randint(0, max_operand), rng.randint(0, max_operand))
                                   for _ in range(size))
    ]


TASKSET_GENERATORS = {"arithmetic": generate_arithmetic}
"""``explorer.taskset.generate`` / ``eval_tasksets[].generate`` name -> generator ``(size, max_operand, seed)``."""


def demonstrations(tasks: list[Task]) -> list[dict]:
    """One demonstration per task: a chat record whose user turn is the task's prompt and whose assistant turn
    is its answer, ``{"task_id", "messages": [{"role": "user", ...}, {"role": "assistant", ...}], "reward":
    1.0}`` (the import format of ``buffer ingest``)."""
    return [{"task_id": t.task_id,
             "messages": [{"role": "user", "content": t.prompt}, {"role": "assistant", "content": t.answer}],
             "reward": 1.0} for t in tasks]


def write_taskset(path: str | Path, tasks: list[Task]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({c: [getattr(t, c) for t in tasks] for c in (*TASK_COLUMNS, "data_source")})
    return atomic_write_with(path, lambda tmp: pq.write_table(table, tmp))


def load_taskset(path: str | Path) -> list[Task]:
    """Read a task file; raise ValueError naming the file and the missing columns if it is wrong."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file '{path}' does not exist; set explorer.taskset.path to a Parquet "
                                f"file with columns {', '.join(TASK_COLUMNS)}, or leave it empty to generate one")
    import pyarrow as pa

    try:
        table = pq.read_table(path)
    except pa.ArrowException:
        raise ValueError(f"task file '{path}' cannot be read as Parquet; write the tasks as a Parquet file with "
                         f"columns {', '.join(TASK_COLUMNS)}") from None
    missing = [c for c in TASK_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"task file '{path}' lacks column(s) {', '.join(missing)} (it has "
                         f"{', '.join(table.column_names) or 'none'}); a task file needs columns "
                         f"{', '.join(TASK_COLUMNS)} (and optionally data_source)")
    if table.num_rows == 0:
        raise ValueError(f"task file '{path}' has no rows")
    rows = table.to_pylist()
    return [Task(str(r["task_id"]), str(r["prompt"]), str(r["answer"]), str(r.get("data_source") or ""))
            for r in rows]
