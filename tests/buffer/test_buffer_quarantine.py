"""Untrainable rows in a buffer (a token id past the vocabulary, a NaN, a per-token field of the wrong length)
are quarantined by the readers: kept, never handed out, recorded once, counted; never fatal."""

import json
import logging

import pyarrow as pa

from trinity_like.buffer import BufferConsumer, BufferWriter
from trinity_like.buffer.ledger import Ledger
from trinity_like.buffer.maintenance import buffer_stats
from trinity_like.buffer.replay import ReplayReader
from trinity_like.buffer.sql import read_only_sql
from trinity_like.common.experience import EXPERIENCE_SCHEMA, Experience, experiences_to_table
from trinity_like.status import buffer_status, format_status

VOCAB = 100


def _row(gid: str, i: int, response=(3, 4), **kw) -> Experience:
    return Experience(prompt_ids=[1, 2], response_ids=list(response), group_id=gid, eid=f"{gid}-{i}", **kw)


def _poisoned_buffer(buf) -> None:
    """Segment 1: group a (4 rows, a-1 has id 99999); segment 2: group b (2 good rows) and row c-0 whose
    logprobs have the wrong length (only a foreign writer can store that: the Experience constructor refuses it)."""
    w = BufferWriter(buf)
    w.write([_row("a", 0), _row("a", 1, response=(3, 99999)), _row("a", 2), _row("a", 3)])
    rows = experiences_to_table([_row("b", 0), _row("b", 1), _row("c", 0)]).to_pylist()
    rows[2]["logprobs"] = [-0.5]
    w.write_table(pa.Table.from_pylist(rows, schema=EXPERIENCE_SCHEMA))


def test_consumer_never_hands_out_a_quarantined_row_and_records_it_once(tmp_path, caplog):
    _poisoned_buffer(tmp_path)
    c = BufferConsumer(tmp_path, vocab_size=VOCAB)
    with caplog.at_level(logging.ERROR, logger="trinity_like.buffer.reader"):
        first = c.read(3, step=1, timeout_s=5)
        second = c.read(2, step=2, timeout_s=5)
    assert [e.eid for e in first] == ["a-0", "a-2", "a-3"]  # the rest of the poisoned group is still trained
    assert [e.eid for e in second] == ["b-0", "b-1"]
    assert c.try_read(1, step=3) is None  # c-0 is the only row left, and it is quarantined
    named = [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()]
    assert len(named) == 2 and "a-1" in named[0] and "99999" in named[0] and "c-0" in named[1]
    st = c.stats()
    assert st["buffer/quarantined"] == 2 and st["buffer/unconsumed"] == 0 and st["buffer/delivered"] == 5
    c.commit(1)  # step 2 stays pending: a resume from step 1 delivers b again, never a quarantined row
    q = Ledger(tmp_path, "trainer").quarantined().to_pylist()
    assert [(r["eid"], r["row"]) for r in q] == [("a-1", 1), ("c-0", 2)]
    assert "logprobs has 1 entries for 2 response tokens" in q[1]["problem"]

    caplog.clear()
    resumed = BufferConsumer(tmp_path, vocab_size=VOCAB, resume_step=1)
    with caplog.at_level(logging.ERROR, logger="trinity_like.buffer.reader"):
        assert [e.eid for e in resumed.read(2, step=2, timeout_s=5)] == ["b-0", "b-1"]
        assert resumed.try_read(1, step=3) is None
    assert not [r for r in caplog.records if "quarantined" in r.getMessage()]  # named once, not per resume
    assert resumed.stats()["buffer/quarantined"] == 2
    assert len(Ledger(tmp_path, "trainer").quarantined()) == 2
    # a writer's back-pressure counts a quarantined row as consumed: it will never be
    assert BufferWriter(tmp_path, capacity=10).unconsumed() == 7 - 3 - 2 - 2


def test_without_a_vocabulary_only_what_is_wrong_anyway_is_quarantined(tmp_path):
    _poisoned_buffer(tmp_path)
    c = BufferConsumer(tmp_path)
    assert [e.eid for e in c.read(4, step=1, timeout_s=5)] == ["a-0", "a-1", "a-2", "a-3"]
    assert c.stats()["buffer/quarantined"] == 1  # c-0's lengths are wrong for any model


def test_buffer_stats_status_and_sql_show_the_quarantine(tmp_path):
    _poisoned_buffer(tmp_path)
    c = BufferConsumer(tmp_path, vocab_size=VOCAB)
    c.read(3, step=1, timeout_s=5)
    c.commit(1)
    stats = buffer_stats(tmp_path)["consumers"]["trainer"]
    assert stats["quarantined_rows"] == 2 and stats["committed"] == 3 and stats["unconsumed"] == 2
    st = buffer_status(tmp_path, trainer_version=1)
    assert st["quarantined"] == 2 and st["unconsumed"] == 2  # b-0, b-1; the quarantined rows are not "untrained"
    text = format_status({"namespace": "p/n", "cluster": "connected", "synchronizer": True, "roles": [], "buffer": st,
                          "trainer_version": 1})
    assert "2 row(s) quarantined as untrainable" in text
    eids = read_only_sql(tmp_path, "SELECT eid FROM quarantine ORDER BY eid").column("eid").to_pylist()
    assert eids == ["a-1", "c-0"]


def test_replay_leaves_untrainable_rows_out_and_records_them_in_its_own_ledger(tmp_path, caplog):
    src = tmp_path / "src.jsonl"
    rows = [_row("a", 0), _row("a", 1, response=(3, 99999)), _row("b", 0, reward=1.0)]
    src.write_text("".join(e.to_json() + "\n" for e in rows))
    ledger = Ledger(tmp_path / "run-buffer", "trainer")
    with caplog.at_level(logging.ERROR, logger="trinity_like.buffer.replay"):
        r = ReplayReader([src], batch_size=8, vocab_size=VOCAB, quarantine=ledger)
        again = ReplayReader([src], batch_size=8, vocab_size=VOCAB, quarantine=ledger)  # a resumed run
    assert len(r) == len(again) == 2 and r.quarantined == again.quarantined == 1
    assert sorted(e.eid for batch in r.epoch(0) for e in batch) == ["a-0", "b-0"]
    assert len([x for x in caplog.records if "a-1" in x.getMessage()]) == 1
    assert ledger.quarantined().column("segment").to_pylist() == [str(src)]
    assert json.loads(src.read_text().splitlines()[1])["response_ids"] == [3, 99999]  # the source is untouched


def test_token_versions_of_the_wrong_length_are_quarantined(tmp_path):
    rows = experiences_to_table([_row("v", 0, model_version=1, token_versions=[1, 2]),
                                 _row("v", 1, model_version=1)]).to_pylist()
    rows[1]["token_versions"] = [1]  # one entry for two response tokens: only a foreign writer can store that
    BufferWriter(tmp_path).write_table(pa.Table.from_pylist(rows, schema=EXPERIENCE_SCHEMA))
    c = BufferConsumer(tmp_path)
    (good,) = c.read(1, step=1, timeout_s=5)
    assert good.eid == "v-0" and good.token_versions.tolist() == [1, 2]
    assert c.try_read(1, step=2) is None and c.stats()["buffer/quarantined"] == 1
    (q,) = Ledger(tmp_path, "trainer").quarantined().to_pylist()
    assert q["eid"] == "v-1" and "token_versions has 1 entries for 2 response tokens" in q["problem"]
