"""Explorer groups are trained once, whole: a group written twice (two explorers on one step) keeps its first copy;
the groups of a part-written step are found by position; ``group_consumption`` names any group a step split."""

import json
import subprocess
import sys

from trinity_like.buffer import BufferConsumer, BufferWriter, explore_group_rows, list_segments
from trinity_like.buffer.ledger import Ledger
from trinity_like.buffer.sql import group_consumption
from trinity_like.common.experience import Experience


def _group(gid: str, n: int = 2, source: str = "explorer", step: int | None = None, position: int | None = None,
           tag: str = "") -> list[Experience]:
    info = {} if step is None else {"explore_step": step, "explore_position": position}
    return [Experience(prompt_ids=[1, 2], response_ids=[3, 4], group_id=gid, eid=f"{gid}-{i}{tag}", source=source,
                       info=dict(info)) for i in range(n)]


def test_a_group_written_twice_is_trained_once_from_its_first_copy(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("s0-t1-0") + _group("s0-t2-1"))
    w.write(_group("s0-t2-1", tag="again") + _group("s0-t3-2"))  # a second explorer wrote group 1 again
    w.write(_group("imported", source="human") + _group("imported", source="human", tag="b"))  # ids reused on purpose
    c = BufferConsumer(tmp_path)
    got = [e.eid for e in c.read(10, step=1, timeout_s=5)]
    assert got == ["s0-t1-0-0", "s0-t1-0-1", "s0-t2-1-0", "s0-t2-1-1", "s0-t3-2-0", "s0-t3-2-1",
                   "imported-0", "imported-1", "imported-0b", "imported-1b"]
    assert c.try_read(1, step=2) is None
    c.commit(1)
    q = Ledger(tmp_path, "trainer").quarantined().to_pylist()
    assert [r["eid"] for r in q] == ["s0-t2-1-0again", "s0-t2-1-1again"]
    assert "group s0-t2-1 was written twice" in q[0]["problem"]
    assert group_consumption(tmp_path) == []  # the copy is quarantined: every kept group went into step 1 whole
    resumed = BufferConsumer(tmp_path, resume_step=1)  # a restarted trainer makes the same choice, silently
    assert resumed.try_read(1, step=2) is None and len(Ledger(tmp_path, "trainer").quarantined()) == 2


def test_group_consumption_names_a_group_split_over_steps_and_buffer_verify_fails_on_it(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("s0-g-0", n=4) + _group("s0-h-1", n=2))
    # a consumer that handed out rows, not groups: g's rows went into steps 1 and 2
    ledger = Ledger(tmp_path, "trainer")
    seg = list_segments(tmp_path)[0].name
    ledger.add_pending(1, [("s0-g-0-0", 1, seg, 0), ("s0-g-0-1", 1, seg, 1)])
    ledger.add_pending(2, [("s0-g-0-2", 2, seg, 2), ("s0-g-0-3", 2, seg, 3), ("s0-h-1-0", 2, seg, 4), ("s0-h-1-1", 2, seg, 5)])
    ledger.commit(2)
    assert group_consumption(tmp_path) == [{"group_id": "s0-g-0", "rows": 4, "step": 1, "trained": 2},
                                           {"group_id": "s0-g-0", "rows": 4, "step": 2, "trained": 2}]
    proc = subprocess.run([sys.executable, "-m", "trinity_like.cli", "buffer", "verify", str(tmp_path), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert [g["step"] for g in json.loads(proc.stdout)["groups_not_trained_once"]] == [1, 2]


def test_the_groups_of_a_part_written_step_are_found_by_position(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("s3-a-0", step=3, position=0) + _group("s2-b-1", step=2, position=1))
    w.write(_group("s3-c-2", n=3, step=3, position=2))
    w.write(_group("s4-d-0", step=4, position=0))
    assert explore_group_rows(tmp_path, 3) == {0: 2, 2: 3}
    assert explore_group_rows(tmp_path, 2) == {1: 2}
    assert explore_group_rows(tmp_path, 5) == {}
