"""The partial-rollout journal store on a real folder: newest record wins, crash leftovers are ignored or cleaned."""

import pyarrow as pa

from trinity_like.buffer.partial import PARTIAL_SCHEMA, PartialStore


def _journal(tokens: list[int], call: int = 0) -> pa.Table:
    return pa.Table.from_pylist([{"call": call, "request": 0, "seed": 7, "prompt_ids": None, "response_ids": tokens,
                                  "logprobs": [-1.0] * len(tokens), "token_versions": [0] * len(tokens),
                                  "finish_reason": "length"}], schema=PARTIAL_SCHEMA)


def test_the_newest_record_is_the_journal_and_older_ones_go(tmp_path):
    store = PartialStore(tmp_path)
    assert store.steps() == [] and store.load(0, 0) is None
    store.open_step(3)
    store.record(3, 1, _journal([5, 6]))
    store.record(3, 1, _journal([5, 6, 7, 8]))
    store.record(3, 2, _journal([9]))
    assert store.load(3, 1).column("response_ids").to_pylist() == [[5, 6, 7, 8]]
    assert sorted(p.name for p in (tmp_path / "partial" / "step-00000003").iterdir()) == [
        "g00001-000000000001.arrow", "g00002-000000000000.arrow"]
    store.drop_group(3, 1)
    assert store.load(3, 1) is None and store.load(3, 2) is not None and store.steps() == [3]
    store.drop_step(3)
    assert store.steps() == [] and store.load(3, 2) is None


def test_crash_leftovers_a_stale_record_a_temp_file_and_another_layout_are_not_the_journal(tmp_path):
    store = PartialStore(tmp_path)
    store.record(0, 0, _journal([1]))
    d = tmp_path / "partial" / "step-00000000"
    older = (d / "g00000-000000000000.arrow").read_bytes()
    store.record(0, 0, _journal([1, 2]))
    (d / "g00000-000000000000.arrow").write_bytes(older)  # killed between the rename and the clean-up
    (d / ".g00000-000000000002.arrow.tmp").write_bytes(b"half")  # killed mid-write: never renamed
    assert store.load(0, 0).column("response_ids").to_pylist() == [[1, 2]]
    other = _journal([3]).replace_schema_metadata({"partial_version": "0"})
    with pa.OSFile(str(d / "g00000-000000000005.arrow"), "wb") as sink, pa.ipc.new_file(sink, other.schema) as w:
        w.write_table(other)  # a journal of another layout (an older release): regenerated, never misread
    assert store.load(0, 0).column("response_ids").to_pylist() == [[1, 2]]


def test_a_step_claimed_but_never_begun_leaves_no_folder_and_one_with_journals_stays(tmp_path):
    store = PartialStore(tmp_path)
    store.open_step(4)  # claimed as the run stopped: no group started
    store.open_step(5)
    store.record(5, 0, _journal([1, 2]))
    store.drop_step_if_empty(4)
    store.drop_step_if_empty(5)
    store.drop_step_if_empty(6)  # never opened: nothing to do
    assert store.steps() == [5] and store.load(5, 0) is not None
