"""Reading a mix of sources (explorer, agent, human) from a real buffer on disk, and the staleness rule for rows
that this run's policy did not generate (``model_version -1``)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trinity_like.buffer import BufferConsumer, BufferWriter
from trinity_like.buffer.mix import choose_mix, mix_quotas, normalise_mix
from trinity_like.buffer.sql import consumption_table
from trinity_like.common.experience import SOURCES, Experience
from trinity_like.config import ConfigError, load_config, to_yaml
from trinity_like.runtime.run_dir import config_differences


def _group(gid: str, n: int, source: str = "explorer", version: int = 0) -> list[Experience]:
    return [Experience(prompt_ids=[1, 2], response_ids=[3, i], group_id=gid, source=source, model_version=version,
                       reward=float(i)) for i in range(n)]


# ---------------------------------------------------------------- staleness of rows from outside the run


def test_rows_of_version_minus_one_are_never_stale(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("demo", 2, source="human", version=-1))  # a segment holding only -1 rows
    w.write(_group("old", 2, version=0) + _group("imp", 2, source="import", version=-1))  # mixed segment
    c = BufferConsumer(tmp_path)
    got = c.try_read(4, min_version=5)  # an async trainer long past max_staleness
    assert [e.group_id for e in got] == ["demo", "demo", "imp", "imp"]
    assert c.stats()["buffer/skipped_stale"] == 2  # only the explorer rows of version 0
    assert c.try_read(2, min_version=5) is None


def test_a_segment_of_only_minus_one_rows_is_not_skipped_as_stale_later(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("g0", 2, version=0))
    w.write(_group("demo", 2, source="human", version=-1))
    c = BufferConsumer(tmp_path)
    assert [e.group_id for e in c.try_read(2, min_version=0, step=1)] == ["g0", "g0"]
    for step in range(2, 5):  # min_version rises past every explorer version; the demo segment stays live
        assert c.try_read(4, min_version=step, step=step) is None
    assert [e.group_id for e in c.try_read(2, min_version=10, step=5)] == ["demo", "demo"]
    c.commit(5)
    assert sorted(r["step"] for r in consumption_table(tmp_path).to_pylist()) == [1, 1, 5, 5]


# ---------------------------------------------------------------- quotas (pure)


def test_quotas_by_largest_remainder_worked_by_hand():
    # exact 5.5, 2.5, 2.0 -> floors 5, 2, 2, one row left; remainders tie at .5, the larger share takes it
    assert mix_quotas(10, {"explorer": 0.55, "agent": 0.25, "human": 0.2}) == {"explorer": 6, "agent": 2, "human": 2}
    # exact 2.667, 1.333 -> floors 2, 1; the larger remainder (.667) takes the row left
    assert mix_quotas(4, normalise_mix({"explorer": 2, "human": 1})) == {"explorer": 3, "human": 1}
    assert normalise_mix({"human": 1, "explorer": 3}) == {"explorer": 0.75, "human": 0.25}  # SOURCES order
    with pytest.raises(ValueError, match="unknown experience source 'bot'"):
        normalise_mix({"bot": 1.0})
    with pytest.raises(ValueError, match="> 0"):
        normalise_mix({"human": 0.0})


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 512), st.lists(st.floats(0.01, 100), min_size=1, max_size=4))
def test_quotas_add_up_and_stay_within_one_row_of_the_exact_share(n, weights):
    shares = normalise_mix(dict(zip(SOURCES, weights, strict=False)))
    quotas = mix_quotas(n, shares)
    assert sum(quotas.values()) == n
    assert all(abs(quotas[s] - n * p) < 1 for s, p in shares.items())


def test_choose_mix_is_lazy_and_closes_on_overflow():
    pulled = []

    def stream():
        for k, source in enumerate(["explorer", "explorer", "human", "explorer", "human", "human"]):
            pulled.append(k)
            yield source, [f"{source}{k}.{i}" for i in range(2)]

    got = choose_mix(stream(), 4, {"explorer": 0.5, "human": 0.5})
    assert got == ["explorer0.0", "explorer0.1", "human2.0", "human2.1"]
    assert pulled == [0, 1, 2]  # the quotas were met: nothing further was looked at


# ---------------------------------------------------------------- mixed reads on real segments


def _sources(exps: list[Experience]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in exps:
        out[e.source] = out.get(e.source, 0) + 1
    return out


def test_each_quota_is_filled_with_whole_groups_of_its_source(tmp_path):
    w = BufferWriter(tmp_path)
    for k in range(3):
        w.write(_group(f"e{k}", 4))  # explorer groups of 4, written first (fifo would take only these)
    w.write(_group("h0", 2, source="human", version=-1) + _group("h1", 2, source="human", version=-1))
    c = BufferConsumer(tmp_path, mix={"explorer": 0.5, "human": 0.5})
    got = c.try_read(8, min_version=0, step=1)
    assert [e.group_id for e in got] == ["e0"] * 4 + ["h0"] * 2 + ["h1"] * 2  # policy order
    assert c.stats()["buffer/mix_explorer"] == 0.5 and c.stats()["buffer/mix_human"] == 0.5
    # no human rows left: with fill (the default) the explorer takes the whole batch
    got = c.try_read(8, min_version=0, step=2)
    assert [e.group_id for e in got] == ["e1"] * 4 + ["e2"] * 4
    assert c.stats()["buffer/mix_explorer"] == 1.0 and c.stats()["buffer/mix_human"] == 0.0


def test_largest_remainder_quotas_on_singleton_rows(tmp_path):
    w = BufferWriter(tmp_path)
    w.write([e for k in range(10) for e in _group(f"e{k}", 1)])
    w.write([e for k in range(10) for e in _group(f"a{k}", 1, source="agent", version=-1)])
    w.write([e for k in range(5) for e in _group(f"h{k}", 1, source="human", version=-1)])
    w.write(_group("i", 1, source="import", version=-1))  # not in the mix: never read
    c = BufferConsumer(tmp_path, mix={"explorer": 0.55, "agent": 0.25, "human": 0.2})
    assert _sources(c.try_read(10)) == {"explorer": 6, "agent": 2, "human": 2}
    assert c.try_read(10) is None  # 4 explorer rows left for a quota of 6: explorer quotas are waited for
    w.write([e for k in range(10, 12) for e in _group(f"e{k}", 1)])
    assert _sources(c.try_read(10)) == {"explorer": 6, "agent": 2, "human": 2}
    w.write([e for k in range(12, 20) for e in _group(f"e{k}", 1)])
    # human has 1 row for its quota of 2: the row left goes to the source furthest below its exact share that
    # has one (explorer 6 - 6 = 0, agent 2.5 - 2 = 0.5): agent
    assert _sources(c.try_read(10)) == {"explorer": 6, "agent": 3, "human": 1}
    assert c.stats()["buffer/mix_human"] == 0.1 and c.stats()["buffer/mix_explorer"] == 0.6
    assert c.try_read(10) is None  # 2 explorer rows left; the import row is never read


def test_fill_never_gives_away_the_explorer_quota(tmp_path):
    # at a run's start the explorer has written nothing yet: spending the scarce demonstrations on whole batches
    # then would leave none for later, so the read waits for the explorer even with fill
    w = BufferWriter(tmp_path)
    w.write(_group("h0", 4, source="human", version=-1) + _group("h1", 4, source="human", version=-1))
    c = BufferConsumer(tmp_path, mix={"explorer": 0.5, "human": 0.5})
    assert c.try_read(8, min_version=0) is None
    w.write(_group("e0", 4))
    assert [e.group_id for e in c.try_read(8, min_version=0)] == ["h0"] * 4 + ["e0"] * 4


def test_a_group_that_overflows_its_quota_is_not_split_and_the_rest_is_filled(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("e0", 4) + _group("e1", 4))
    w.write(_group("h0", 3, source="human", version=-1))  # quota 2: a group of 3 never fits it
    w.write([e for k in range(4) for e in _group(f"a{k}", 1, source="agent", version=-1)])
    # n=8, quotas explorer 4, human 2, agent 2; human's group of 3 overflows its quota, so its 2 rows go to the
    # source furthest below its exact share that fits: agent (2 - 2 = 0) vs human (2 - 0 = 2): human's group
    # of 3 does not fit the 2 rows left, so agent takes them
    c = BufferConsumer(tmp_path, mix={"explorer": 0.5, "human": 0.25, "agent": 0.25})
    got = c.try_read(8)
    assert _sources(got) == {"explorer": 4, "agent": 4}
    assert {e.group_id for e in got if e.source == "explorer"} == {"e0"}
    # next: explorer 4 (e1), agent none left, human's 3 fit the 4 rows left: 7 rows, and the rows ran out
    # before the batch was full (no group overflowed it), so it waits, as a plain read does
    assert c.try_read(8) is None
    w.write(_group("a4", 1, source="agent", version=-1))
    assert [e.group_id for e in c.try_read(8)] == ["e1"] * 4 + ["h0"] * 3 + ["a4"]


def test_without_fill_the_read_waits_for_every_quota(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("e0", 4) + _group("e1", 4))
    w.write(_group("h0", 2, source="human", version=-1))
    wait = BufferConsumer(tmp_path, name="wait", mix={"explorer": 0.5, "human": 0.5}, mix_fill=False)
    fill = BufferConsumer(tmp_path, name="fill", mix={"explorer": 0.5, "human": 0.5})
    assert wait.try_read(8) is None  # human has 2 of its 4 rows
    assert wait.stats()["buffer/delivered"] == 0 and not wait.ledger.pending().num_rows  # nothing handed out
    # fill: explorer 4, human 2 of its 4; e1 does not fit the 2 rows left, so the batch closes with 6
    assert [e.group_id for e in fill.try_read(8)] == ["e0"] * 4 + ["h0"] * 2
    w.write(_group("h1", 2, source="human", version=-1))
    assert [e.group_id for e in wait.try_read(8)] == ["e0"] * 4 + ["h0"] * 2 + ["h1"] * 2
    with pytest.raises(TimeoutError, match="mix_fill false"):
        wait.read(8, timeout_s=0.05)


def test_fill_gives_a_scarce_source_quota_to_the_others_but_never_returns_a_short_batch_early(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("e0", 4))
    w.write(_group("h0", 2, source="human", version=-1))
    c = BufferConsumer(tmp_path, mix={"explorer": 0.5, "human": 0.5})
    assert c.try_read(8) is None  # 6 rows in all: the batch waits for rows of any source, as a plain read does
    w.write(_group("e1", 4))
    got = c.try_read(8)
    # explorer 4 (quota), human 2 of 4; the 2 rows left: e1 (4) does not fit, so the batch closes with 6
    assert [e.group_id for e in got] == ["e0"] * 4 + ["h0"] * 2
    w.write(_group("e2", 2))
    assert c.try_read(8) is None  # e1 + e2 = 6 rows, no human: still short of 8
    w.write(_group("e3", 2))
    assert [e.group_id for e in c.try_read(8)] == ["e1"] * 4 + ["e2"] * 2 + ["e3"] * 2
    assert c.stats()["buffer/mix_explorer"] == 1.0


def test_mix_honours_min_version_where_and_the_ledger_across_resume(tmp_path):
    w = BufferWriter(tmp_path)
    w.write(_group("stale", 2, version=0))
    for k in range(4):
        w.write(_group(f"e{k}", 2, version=3) + _group(f"h{k}", 2, source="human", version=-1))
    w.write(_group("hbad", 2, source="human", version=-1)[:1])  # reward 0 only: filtered out by where
    mix = {"explorer": 0.5, "human": 0.5}
    c = BufferConsumer(tmp_path, mix=mix, where="NOT (group_id = 'hbad')")
    step1 = c.read(4, min_version=2, timeout_s=1, step=1)
    assert [e.group_id for e in step1] == ["e0", "e0", "h0", "h0"]
    assert c.stats()["buffer/skipped_stale"] == 2
    c.commit(1)
    step2 = c.read(4, min_version=2, timeout_s=1, step=2)  # never committed: a crash loses it
    assert [e.group_id for e in step2] == ["e1", "e1", "h1", "h1"]
    del c
    resumed = BufferConsumer(tmp_path, mix=mix, where="NOT (group_id = 'hbad')", resume_step=1)
    again = resumed.read(4, min_version=2, timeout_s=1, step=2)
    assert [e.eid for e in again] == [e.eid for e in step2]  # exactly the uncommitted hand-outs again
    resumed.read(4, min_version=2, timeout_s=1, step=3)
    resumed.commit(3)
    rows = consumption_table(tmp_path).to_pylist()
    assert sorted(r["step"] for r in rows) == [1] * 4 + [2] * 4 + [3] * 4  # every row handed out, once
    assert len({r["eid"] for r in rows}) == 12
    # the last group of each source is left; hbad and the stale group never come
    assert [e.group_id for e in resumed.try_read(4, min_version=2, step=4)] == ["e3", "e3", "h3", "h3"]
    assert resumed.try_read(2, min_version=2, step=5) is None


@pytest.mark.parametrize("policy", ["newest", "replay", "priority"])
def test_mix_follows_the_read_policy_within_each_source(tmp_path, policy):
    w = BufferWriter(tmp_path)
    for k in range(2):
        w.write(_group(f"e{k}", 2, version=k) + _group(f"h{k}", 2, source="human", version=-1))
    extra = {"priority": "model_version + reward"} if policy == "priority" else {}
    c = BufferConsumer(tmp_path, policy=policy, mix={"explorer": 0.5, "human": 0.5}, **extra)
    got = [e.group_id for e in c.try_read(4, step=1)]
    first = {"newest": ["e1", "h1"], "replay": ["e0", "h0"], "priority": ["e1", "h0"]}[policy]
    assert sorted(set(got)) == sorted(first)


# ---------------------------------------------------------------- config


def test_mix_config_forms_round_trip_and_compare(tmp_path):
    cfg = load_config(None, ["buffer.mix={explorer:3,human:1}"])  # the shell form, without spaces
    assert cfg.buffer.mix == {"explorer": 3.0, "human": 1.0} and cfg.buffer.mix_fill is True
    # a whole dict replaces the one before it; one entry adds to it
    cfg = load_config(None, ["buffer.mix={explorer: 0.5, agent: 0.5}", "buffer.mix={explorer: 0.75, human: 0.25}"])
    assert cfg.buffer.mix == {"explorer": 0.75, "human": 0.25}
    assert load_config(None, ["buffer.mix={explorer: 1}", "buffer.mix.agent=1"]).buffer.mix == {"explorer": 1.0,
                                                                                                "agent": 1.0}
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("buffer:\n  mix: {explorer: 0.75, agent: 0.25}\n")
    assert load_config(yaml_file, ["buffer.mix={}"]).buffer.mix == {}
    saved = tmp_path / "saved.yaml"
    saved.write_text(to_yaml(load_config(yaml_file)))
    assert load_config(saved) == load_config(yaml_file)
    diff = config_differences(load_config(yaml_file), load_config(yaml_file, ["buffer.mix.human=0.5"]))
    assert diff == ["buffer.mix.human"]  # an entry in one config only is a difference too
    assert config_differences(load_config(None), load_config(yaml_file)) == ["buffer.mix.explorer", "buffer.mix.agent"]


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["buffer.mix={explorer: 1, bot: 1}"], "bad source 'bot' in 'buffer.mix'; use experience sources: explorer"),
        (["buffer.mix.human=0"], "'buffer.mix.human': 0.0; shares must be > 0"),
        (["buffer.mix.human=-1"], "leave a source out of buffer.mix"),
        (["buffer.mix.human=lots"], "bad value for 'buffer.mix.human'"),
        (["buffer.mix=0.5"], "bad value for 'buffer.mix' (expected dict[str, float])"),
        (["buffer.mix={explorer"], "write it as key={name: value, ...}"),
        (["mode=offline", "buffer.replay_sources=[x]", "buffer.mix.human=1"], "select sources with buffer.where"),
        (["mode=sync", "buffer.mix.human=1"], "set mode=async"),
    ],
)
def test_bad_mix_is_a_config_error_that_says_how_to_fix_it(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert needle in str(err.value) and "\n" not in str(err.value)
