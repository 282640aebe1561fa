import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trinity_like.common.tasks import generate_arithmetic, load_taskset, write_taskset


def test_arithmetic_tasks_are_deterministic_and_correct(tmp_path):
    a = generate_arithmetic(50, 9, seed=3)
    assert a == generate_arithmetic(50, 9, seed=3)
    assert a != generate_arithmetic(50, 9, seed=4)
    for t in a:
        x, y = t.prompt.rstrip("=").split("+")
        assert int(x) + int(y) == int(t.answer) and 0 <= int(x) <= 9
    write_taskset(tmp_path / "t.parquet", a)
    assert load_taskset(tmp_path / "t.parquet") == a


def test_bad_task_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_taskset(tmp_path / "missing.parquet")
    pq.write_table(pa.table({"task_id": ["1"], "question": ["1+1="]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="lacks column"):
        load_taskset(tmp_path / "bad.parquet")
