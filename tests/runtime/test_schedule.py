"""The schedule's pure functions against tables worked by hand."""

from trinity_like.config import load_config
from trinity_like.runtime.schedule import (
    Schedule,
    on_new_version,
    rollout_mode,
    rollout_mode_note,
    train_slack,
)


def _schedule(mode: str, **kw) -> Schedule:
    # batch_size 4 x repeat_times 2 = 8 planned rows per explorer step; 12 rows per trainer step
    args = dict(mode=mode, rows_per_step=8, train_batch_size=12, total_steps=4, interval=1, offset=0, max_staleness=1)
    return Schedule(**{**args, **kw})


def test_of_config_states_each_quantity_once():
    cfg = load_config(None, ["explorer.batch_size=4", "explorer.repeat_times=2", "trainer.batch_size=12",
                             "trainer.total_steps=4", "synchronizer.interval=2", "synchronizer.max_staleness=3"])
    s = Schedule.of(cfg)
    assert (s.rows_per_step, s.train_batch_size, s.total_steps, s.interval, s.max_staleness) == (8, 12, 4, 2, 3)
    assert s.rows_needed == 48
    assert s.planned_explore_steps == 6  # ceil(48 / 8)
    assert Schedule.of(load_config(None, ["explorer.batch_size=4", "explorer.repeat_times=2"])).train_batch_size == 8


def test_trainer_step_fed_and_admission_by_rows_written():
    # rows before  0  8 16 24 32 40 |  11 (step 1 wrote only 3 rows)
    # fed (//12)   0  0  1  2  2  3 |   0
    # async (-1)   0  0  0  1  1  2 |   0
    # sync         0  0  1  2  2  3 |   0
    a, s = _schedule("async"), _schedule("sync")
    rows = [0, 8, 16, 24, 32, 40, 11]
    assert [a.trainer_step_fed(r) for r in rows] == [0, 0, 1, 2, 2, 3, 0]
    assert [a.version_needed(r) for r in rows] == [0, 0, 0, 1, 1, 2, 0]
    assert [s.version_needed(r) for r in rows] == [0, 0, 1, 2, 2, 3, 0]
    # sync with interval 2: the newest version published on the interval before the fed step
    assert [_schedule("sync", interval=2).version_needed(r) for r in rows] == [0, 0, 0, 2, 2, 2, 0]
    # async with max_staleness 0 admits like sync
    assert [_schedule("async", max_staleness=0).version_needed(r) for r in rows] == [0, 0, 1, 2, 2, 3, 0]


def test_each_group_of_a_step_is_admitted_by_the_rows_before_it():
    # batch_size 4 x repeat_times 2; train batch 12; S = 1. Step 1 has 8 rows before it; its groups 0..3 have
    # 8, 10, 12, 14 rows before them, feed trainer steps 0, 0, 1, 1 and need versions 0, 0, 0, 0 at S = 1;
    # step 2 (16 rows before): 16, 18, 20, 22 -> fed 1, 1, 1, 1 -> need 0; step 3 (24): 24, 26, 28, 30 -> fed
    # 2, 2, 2, 2 -> need 1. At S = 0 step 1's groups need 0, 0, 1, 1: half a step is admitted on version 0.
    a = _schedule("async", group_size=2)
    assert [a.rows_before_group(8, p) for p in range(4)] == [8, 10, 12, 14]
    assert [a.version_needed(a.rows_before_group(24, p)) for p in range(4)] == [1, 1, 1, 1]
    assert [a.version_needed(a.rows_before_group(8, p), bound=0) for p in range(4)] == [0, 0, 1, 1]
    # AReaL's capacity rule: admitted on version v iff rows before < (v + S + 1) * train batch
    for r in range(0, 100, 2):
        for v in range(6):
            assert (v >= a.version_needed(r)) == (r < (v + 1 + 1) * 12)
    assert Schedule.of(load_config(None, ["explorer.repeat_times=3", "trainer.batch_size=6"])).group_size == 3


def test_explore_more_counts_rows_written_running_and_dropped():
    s = _schedule("async")  # 48 rows needed
    assert s.explore_more(0, 0)
    assert s.explore_more(40, 0) and not s.explore_more(40, 1)  # 40 + 8 planned = 48
    assert s.explore_more(47, 0) and not s.explore_more(48, 0)
    assert s.explore_more(48, 0, rows_dropped=1)  # a row the trainer will never train is explored again
    assert not s.explore_more(49, 0, rows_dropped=1)


def test_sync_due_table():
    # explorer step k (steps done) loads when (k - offset) % interval == 0, k >= offset, and before its first step
    def due(interval, offset):
        return [k for k in range(10) if _schedule("async", interval=interval, offset=offset).sync_due(k)]

    assert due(1, 0) == list(range(10))
    assert due(2, 0) == [0, 2, 4, 6, 8]
    assert due(3, 1) == [0, 1, 4, 7]
    assert due(2, 5) == [0, 5, 7, 9]


def test_rollout_mode_streams_only_in_async_with_a_bound():
    def mode(*overrides):
        cfg = load_config(None, ["trainer.total_steps=1", *overrides])
        return rollout_mode(cfg), rollout_mode_note(cfg)

    assert mode("mode=async", "explorer.rollout=stream", "synchronizer.max_staleness=1") == ("stream", None)
    # bound 0: nothing to overlap; sync: lock-step. Both run as step, and say so
    kind, note = mode("mode=async", "explorer.rollout=stream", "synchronizer.max_staleness=0")
    assert kind == "step" and "runs as rollout=step" in note and "mode async" in note
    kind, note = mode("mode=sync", "explorer.rollout=stream")
    assert kind == "step" and "mode sync" in note
    assert mode("mode=async", "explorer.rollout=step", "synchronizer.max_staleness=2") == ("step", None)


def test_train_slack_applies_only_in_async_with_a_bound():
    def slack(*overrides):
        return train_slack(load_config(None, ["trainer.total_steps=1", *overrides]))

    assert slack("mode=async", "synchronizer.max_staleness=2") == 1  # the default
    assert slack("mode=async", "synchronizer.max_staleness=2", "synchronizer.train_slack=3") == 3
    # bound 0 is sync bit for bit: a row a version late is dropped whole, never trained masked
    assert slack("mode=async", "synchronizer.max_staleness=0", "synchronizer.train_slack=3") == 0
    assert slack("mode=sync", "synchronizer.train_slack=3") == 0


def test_on_new_version_auto_cuts_where_the_engine_can_and_finishes_elsewhere():
    def policy(*overrides):
        return on_new_version(load_config(None, ["trainer.total_steps=1", "mode=async", *overrides]))

    stream = ("explorer.rollout=stream", "synchronizer.max_staleness=2")
    assert policy(*stream, "explorer.engine=vllm") == "resubmit"  # vLLM's async engine cuts at once
    assert policy(*stream, "explorer.engine=vllm", "explorer.vllm.async_engine=false") == "finish"
    assert policy(*stream) == "finish"  # hf: calls end before a load
    assert policy(*stream, "explorer.stream.chunk_tokens=16") == "resubmit"  # pieces: cut between them
    assert policy(*stream, "explorer.engine=vllm", "explorer.stream.on_new_version=finish") == "finish"  # as asked
    assert policy(*stream, "explorer.engine=vllm", "explorer.stream.on_new_version=keep") == "keep"
    assert policy("explorer.rollout=step", "explorer.engine=vllm") == "finish"  # weights change between steps only
