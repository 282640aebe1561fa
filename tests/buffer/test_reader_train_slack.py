"""The buffer reader under ``synchronizer.train_slack``: a row is skipped as stale only when its newest token is past
``min_version - train_slack`` (slack 0: its oldest past ``min_version``), alike on the fifo path and the SQL path,
for segments of every schema version; the response tokens of skipped and handed-out rows are counted."""

import shutil
import zlib
from pathlib import Path

import pytest

from trinity_like.buffer import BufferConsumer, BufferWriter
from trinity_like.common.experience import Experience

V1 = Path(__file__).parent / "data" / "segment-v1.arrow"
"""A real schema-1 segment (see test_schema_versions.py): rows v1-a0, v1-a1 (version 0), v1-b0, v1-b1 (version 1)."""


def _v1_buffer(buffer_dir: Path) -> None:
    data = V1.read_bytes()
    (buffer_dir / "segments").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(V1, buffer_dir / "segments" / f"{0:020d}-v1fixture-000000-4-{zlib.crc32(data):08x}.arrow")


def _row(gid: str, i: int, versions: list[int]) -> Experience:
    """A row whose response tokens carry ``versions`` (oldest first: its model_version)."""
    return Experience(prompt_ids=[1, 2], response_ids=[10 + k for k in range(len(versions))], group_id=gid,
                      eid=f"{gid}-{i}", model_version=versions[0], token_versions=versions, reward=float(i))


ORIGINAL = {"fresh-0": [3, 3, 4], "fresh-1": [4, 4], "edge-0": [2, 2, 3, 3], "edge-1": [2, 3], "late-0": [1, 2, 2],
            "late-1": [1, 1, 2], "old-0": [1, 1, 1, 1, 1], "old-1": [1], "mixed-0": [2, 3], "mixed-1": [1, 1, 1]}


def _late_buffer(path) -> None:
    """Trainer at version 5, max_staleness 2 -> min_version 3. Groups (each written as one segment):
    ``fresh`` all 3..4; ``edge`` admitted at 2, finished on 3 (newest 3); ``late`` 1 then 2 (newest 2);
    ``old`` all 1 (newest 1); ``mixed``: one row 2..3, one row 1 only (a group is kept or dropped per row)."""
    w = BufferWriter(path)
    for gid in ("fresh", "edge", "late", "old", "mixed"):
        w.write([_row(gid, i, ORIGINAL[f"{gid}-{i}"]) for i in range(2)])


# eid -> kept at min_version 3, per slack (slack 0: oldest >= 3; slack 1: newest >= 2; slack 2: newest >= 1)
KEPT = {
    0: ["fresh-0", "fresh-1"],
    1: ["fresh-0", "fresh-1", "edge-0", "edge-1", "late-0", "late-1", "mixed-0"],
    2: ["fresh-0", "fresh-1", "edge-0", "edge-1", "late-0", "late-1", "old-0", "old-1", "mixed-0", "mixed-1"],
}
TOKENS = {"fresh-0": 3, "fresh-1": 2, "edge-0": 4, "edge-1": 2, "late-0": 3, "late-1": 3, "old-0": 5, "old-1": 1,
          "mixed-0": 2, "mixed-1": 3}


@pytest.mark.parametrize("slack", [0, 1, 2])
@pytest.mark.parametrize("path", ["fifo", "sql"])
def test_rows_are_skipped_only_when_no_token_is_within_the_slack(tmp_path, slack, path):
    _late_buffer(tmp_path)
    # the SQL path (a where filter, or the priority policy) and the fifo path judge rows by the same rule
    kw = {"where": "TRUE"} if path == "sql" else {}
    c = BufferConsumer(tmp_path, train_slack=slack, **kw)
    got = c.try_read(len(KEPT[slack]), min_version=3)
    assert sorted(e.eid for e in got) == sorted(KEPT[slack])
    dropped = [e for e in TOKENS if e not in KEPT[slack]]
    st = c.stats()
    assert st["buffer/skipped_stale"] == len(dropped)
    assert st["buffer/skipped_stale_tokens"] == sum(TOKENS[e] for e in dropped)
    assert st["buffer/delivered"] == len(KEPT[slack])
    assert st["buffer/delivered_tokens"] == sum(TOKENS[e] for e in KEPT[slack])
    # the rows handed out keep their versions: the trainer masks the old tokens itself
    for e in got:
        assert e.token_versions is None or e.token_versions.tolist() == ORIGINAL[e.eid]
    assert c.try_read(1, min_version=3) is None
    assert c.stats()["buffer/skipped_stale"] == len(dropped)  # counted once


def test_slack_zero_is_the_rule_before(tmp_path):
    """A consumer without ``train_slack`` (0) reads exactly as before: every row whose model_version is older than
    ``min_version`` is skipped, whatever its newer tokens."""
    _late_buffer(tmp_path)
    default, zero = BufferConsumer(tmp_path, name="a"), BufferConsumer(tmp_path, name="b", train_slack=0)
    for min_version in (0, 1, 2, 3, 4, 5):
        a, b = default.try_read(2, min_version=min_version), zero.try_read(2, min_version=min_version)
        assert [e.eid for e in a or []] == [e.eid for e in b or []]
        assert all(e.model_version >= min_version for e in a or [])
    assert default.stats() == zero.stats()


def test_a_segment_wholly_past_the_slack_is_skipped_and_counted_once(tmp_path):
    w = BufferWriter(tmp_path)
    w.write([_row("old", 0, [0, 0]), _row("old", 1, [0, 1])])  # newest 1
    w.write([_row("new", 0, [4]), _row("new", 1, [4])])
    c = BufferConsumer(tmp_path, train_slack=1)
    # min_version 3: tokens down to 2 are trained; "old"'s newest is 1 -> the whole segment is stale
    assert [e.eid for e in c.try_read(2, min_version=3)] == ["new-0", "new-1"]
    assert c.stats()["buffer/skipped_stale"] == 2 and c.stats()["buffer/skipped_stale_tokens"] == 4
    assert c.try_read(2, min_version=4) is None
    assert c.stats()["buffer/skipped_stale"] == 2
    # min_version 2 (a slack of 1 reaches version 1): old-1 (0, 1) is read, its version-0 token for the trainer
    # to mask; old-0 (0, 0) has none left
    other = BufferConsumer(tmp_path, name="other", train_slack=1)
    assert [e.eid for e in other.try_read(1, min_version=2)] == ["old-1"]
    assert other.stats()["buffer/skipped_stale"] == 1


def test_old_segments_without_token_versions_read_right(tmp_path):
    """A schema-1 segment (no token_versions column; rows of model_version 0, 0, 1, 1 with 3, 2, 4 and 1 response
    tokens): each row's newest version is its model_version."""
    _v1_buffer(tmp_path)
    c = BufferConsumer(tmp_path, train_slack=1)
    # min_version 2, slack 1: versions >= 1 are trained -> group b kept, group a (version 0) skipped
    assert [e.eid for e in c.try_read(2, min_version=2)] == ["v1-b0", "v1-b1"]
    st = c.stats()
    assert st["buffer/skipped_stale"] == 2 and st["buffer/skipped_stale_tokens"] == 5
    assert st["buffer/delivered_tokens"] == 5
    # slack 0 at min_version 1: the version-0 rows go, as before
    zero = BufferConsumer(tmp_path, name="zero")
    assert [e.eid for e in zero.try_read(2, min_version=1)] == ["v1-b0", "v1-b1"]
    assert zero.stats()["buffer/skipped_stale"] == 2
