"""RateLimitedLog: a repeated problem is logged once per interval, with the count of repeats left out."""

import logging

from trinity_like.common.logs import RateLimitedLog


def test_repeats_are_logged_once_per_interval_with_their_count(caplog):
    now = [0.0]
    log = RateLimitedLog(logging.getLogger("t.rl"), interval_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t.rl"):
        results = []
        for t in (0.0, 1.0, 2.0, 9.9, 10.0, 10.5):  # logged at 0 and 10; 1, 2 and 9.9 left out
            now[0] = t
            results.append(log.log(logging.WARNING, "hb", "heartbeat of %s failed", "r1"))
        now[0] = 10.6
        assert log.log(logging.WARNING, "other", "another problem")  # a new key is logged at once
    assert results == [True, False, False, False, True, False]
    assert [r.getMessage() for r in caplog.records] == [
        "heartbeat of r1 failed", "heartbeat of r1 failed (repeated 3 times in the last 10s)", "another problem"]


def test_forget_logs_the_next_occurrence_at_once(caplog):
    now = [0.0]
    log = RateLimitedLog(logging.getLogger("t.rl2"), interval_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.ERROR, logger="t.rl2"):
        assert log.log(logging.ERROR, "k", "load failed")
        assert not log.log(logging.ERROR, "k", "load failed")
        log.forget("k")  # the load worked again
        now[0] = 1.0
        assert log.log(logging.ERROR, "k", "load failed")
    assert [r.getMessage() for r in caplog.records] == ["load failed", "load failed"]
