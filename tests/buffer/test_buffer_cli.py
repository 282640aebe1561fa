"""`trinity-like buffer ...` commands, ingest validation, export and offline replay, on real files."""

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from trinity_like.buffer import BufferConsumer, BufferWriter, ReplayReader, count_rows, list_segments, query
from trinity_like.buffer.ingest import chat_to_tokens, ingest_files
from trinity_like.common.experience import Experience
from trinity_like.common.tokenizer import hf_tokenizer


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "trinity_like.cli", "buffer", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def _write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


GOOD = {"prompt_ids": [5, 6], "response_ids": [7, 8, 0], "reward": 1.0, "logprobs": [-0.1, -0.2, -0.3]}


def test_ingest_validates_each_record_and_is_idempotent(tmp_path, tiny_model_path):
    src = _write_jsonl(tmp_path / "in.jsonl", [
        GOOD,                                                               # line 1: ok
        {**GOOD, "response_ids": [7, 99999, 0]},                            # line 2: id outside the vocab
        {**GOOD, "logprobs": [-0.1]},                                       # line 3: wrong length
        {**GOOD, "reward": float("nan")},                                   # line 4 (NaN in JSON): not finite
        "{not json",                                                        # line 5
        {"response_ids": [1]},                                              # line 6: no prompt_ids
        {**GOOD, "eid": "same"}, {**GOOD, "eid": "same", "reward": 0.0},    # lines 7-8: duplicate eid
        {**GOOD, "colour": "red"},                                          # line 9: unknown field
    ])
    buf = tmp_path / "buf"
    proc = _cli("ingest", src, "--buffer", buf, "--tokenizer", tiny_model_path, "--source", "human", "--json")
    assert proc.returncode == 1, proc.stderr  # some rows were rejected
    report = json.loads(proc.stdout)
    assert report["accepted"] == 2 and report["duplicates"] == 1 and report["rejected"] == 6
    reasons = {r["line"]: r["reason"] for r in report["rejects"]}
    assert "outside the vocabulary" in reasons[2] and "one entry per response token" in reasons[3]
    assert "finite" in reasons[4] and "not valid JSON" in reasons[5] and "prompt_ids" in reasons[6]
    assert "unknown field(s) colour" in reasons[9]
    rejects = [json.loads(x) for x in open(report["rejects_file"])]
    assert [r["line"] for r in rejects] == [2, 3, 4, 5, 6, 9]
    assert set(query(buf).column("source").to_pylist()) == {"human"}
    # the same file again adds nothing
    again = json.loads(_cli("ingest", src, "--buffer", buf, "--tokenizer", tiny_model_path, "--json").stdout)
    assert again["accepted"] == 0 and again["duplicates"] == 3  # lines 1, 7 and 8
    assert count_rows(buf) == 2 and len(list_segments(buf)) == 1


def test_strict_ingest_takes_nothing_when_a_row_is_bad(tmp_path):
    src = _write_jsonl(tmp_path / "in.jsonl", [GOOD, {**GOOD, "logprobs": "x"}])
    report = ingest_files([src], tmp_path / "buf", strict=True)
    assert report.accepted == 0 and len(report.rejected) == 1
    assert count_rows(tmp_path / "buf") == 0


def test_chat_records_mask_only_assistant_tokens(tmp_path, tiny_model_path):
    tok = hf_tokenizer(tiny_model_path)
    messages = [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"},
                {"role": "user", "content": "and 2+2="}, {"role": "assistant", "content": "4"}]
    prompt, response, mask = chat_to_tokens(messages, tok)
    assert tok.decode(prompt).startswith("<|user|>\n1+2=")
    learned = tok.decode([t for t, m in zip(response, mask, strict=True) if m])
    assert learned == "3" + tok.eos_token + "4" + tok.eos_token  # assistant contents and their end tokens
    src = _write_jsonl(tmp_path / "chat.jsonl", [{"messages": messages, "reward": 1.0}])
    report = ingest_files([src], tmp_path / "buf", source="human", tokenizer_path=tiny_model_path)
    assert report.accepted == 1
    e = query(tmp_path / "buf").to_pylist()[0]
    assert e["action_mask"] == mask and e["model_version"] == -1 and e["logprobs"] is None
    no_tok = ingest_files([src], tmp_path / "buf2")
    assert "needs --tokenizer" in no_tok.rejected[0]["reason"]


def test_export_query_stats_verify(tmp_path):
    buf = tmp_path / "buf"
    w = BufferWriter(buf)
    for v in range(3):
        w.write([Experience(prompt_ids=[1], response_ids=[2, 3], group_id=f"g{v}", model_version=v, reward=v)
                 for _ in range(2)])
    c = BufferConsumer(buf)
    c.try_read(2, step=1)
    c.commit(1)
    assert _cli("export", buf, tmp_path / "out.parquet", "--where", "model_version >= 1").returncode == 0
    assert pq.read_table(tmp_path / "out.parquet").num_rows == 4
    assert _cli("export", buf, tmp_path / "out.jsonl").returncode == 0
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert [Experience.from_json(x).model_version for x in lines] == [0, 0, 1, 1, 2, 2]
    # exported rows ingest back as duplicates of themselves
    assert ingest_files([tmp_path / "out.parquet"], buf).duplicates == 4

    out = _cli("query", buf, "SELECT count(*) AS n FROM consumption WHERE committed", "--json")
    assert json.loads(out.stdout) == [{"n": 2}]
    refused = _cli("query", buf, "COPY experiences TO 'x.csv'")
    assert refused.returncode == 2 and "read-only" in refused.stderr and "Traceback" not in refused.stderr

    stats = json.loads(_cli("stats", buf, "--json").stdout)
    assert stats["rows"] == 6 and stats["segments"] == 3 and stats["by_model_version"] == {"0": 2, "1": 2, "2": 2}
    assert stats["consumers"]["trainer"] == {"committed": 2, "pending": 0, "quarantined_rows": 0, "unconsumed": 4,
                                             "last_committed_step": 1}

    victim = list_segments(buf)[1]
    with open(victim.path, "r+b") as fh:
        fh.seek(100)
        fh.write(b"\x00garbage\x00")
    report = _cli("verify", buf, "--json")
    assert report.returncode == 1
    bad = json.loads(report.stdout)["bad"]
    assert [b["segment"] for b in bad] == [victim.name] and "corrupt" in bad[0]["problem"]
    assert (buf / "quarantine" / victim.name).is_file() and len(list_segments(buf)) == 2
    assert _cli("verify", buf).returncode == 0


def test_replay_reader_epochs_filter_and_sources(tmp_path):
    buf = tmp_path / "buf"
    w = BufferWriter(buf)
    for g in range(4):
        w.write([Experience(prompt_ids=[1], response_ids=[2], group_id=f"g{g}", reward=float(g))
                 for _ in range(2)])
    BufferConsumer(buf).try_read(8, step=1)  # replay is read-only and ignores consumers
    (tmp_path / "extra.jsonl").write_text(Experience(prompt_ids=[1], response_ids=[2], group_id="x",
                                                     reward=9.0).to_json() + "\n")
    r = ReplayReader([buf, tmp_path / "extra.jsonl"], where="reward >= 1", batch_size=4, seed=3)
    assert len(r) == 7  # groups g1..g3 (6 rows) and x (1)
    e0 = [[e.group_id for e in batch] for batch in r.epoch(0)]
    assert sorted(g for b in e0 for g in b) == sorted(["g1", "g1", "g2", "g2", "g3", "g3", "x"])
    for batch in e0:
        for g in set(batch):  # whole groups per batch
            assert batch.count(g) in (1, 2) and (g == "x" or batch.count(g) == 2)
    assert e0 == [[e.group_id for e in b] for b in r.epoch(0)]  # same epoch, same order
    with pytest.raises(Exception, match="does not exist"):
        ReplayReader([tmp_path / "nope"])
    with pytest.raises(Exception, match="replay filter failed"):
        ReplayReader([buf], where="nope > 1")
