"""The self-setting staleness bound (``synchronizer.max_staleness: auto``): the controller's rules on signals
worked by hand (times are passed in, so each window's waits and rows per second are exact), and the config."""

import pytest

from trinity_like.config import ConfigError, load_config
from trinity_like.synchronizer.staleness import StalenessController

PARAMS = {"min": 0, "max": 3, "start": 1, "window": 2, "ess_target": 0.9, "clip_target": 0.2, "wait_frac": 0.1,
          "min_gain": 0.05, "cooldown": 2, "window_s": 0.0, "patience": 1}


def _window(c, first_step, start_s, *, rows=100, step_s=1.0, trainer_wait=0.0, explorer_wait=0.0, ess=0.99,
            clip=0.05):
    """Two trainer steps of ``step_s`` seconds each (the window), ``rows`` rows each, with the waits given for
    the whole window; returns the bound after it and the window's end."""
    c.observe_explore(explorer_wait)
    bound = None
    t = start_s
    for k in range(2):
        t += step_s
        bound = c.observe_train(first_step + k, t, rows, {"off_policy/ess": ess, "actor/pg_clipfrac": clip,
                                                          "time/wait_data_s": trainer_wait / 2,
                                                          "time/train_step_s": step_s - trainer_wait / 2})
    return bound, t


def test_both_roles_waiting_widens_and_a_widening_that_pays_stays():
    c = StalenessController(PARAMS)
    assert c.bound == 1
    # window 1 (2 s): the trainer waited 0.5 s (25%) and the explorers 0.4 s (20%): widen to 2, on trial
    bound, t = _window(c, 1, 0.0, trainer_wait=0.5, explorer_wait=0.4)
    assert bound == 2 and "both roles waited in 1 window(s) running (trainer 25%, explorers 20% of 2.0s)" in c.history[-1]["reason"]
    # window 2 settles (steps claimed under the old bound still run): no decision, whatever the waits
    bound, t = _window(c, 3, t, step_s=1.0, trainer_wait=0.5, explorer_wait=0.5)
    assert bound == 2 and len(c.history) == 2
    # window 3: 100 rows/s -> 125 rows/s (same rows in 1.6 s): +25% > 5%, the widening stays; still both wait
    bound, t = _window(c, 3, t, step_s=0.8, trainer_wait=0.3, explorer_wait=0.3)
    assert bound == 3
    bound, t = _window(c, 5, t, step_s=0.8, trainer_wait=0.3, explorer_wait=0.3)  # settling
    assert bound == 3
    # window 3 at the max: both still wait, nothing to widen; 125 -> 125 rows/s fails the trial of 3
    bound, t = _window(c, 5, t, step_s=0.8, trainer_wait=0.3, explorer_wait=0.3)
    assert bound == 2 and "bought no throughput (125.0 rows/s against 125.0 before)" in c.history[-1]["reason"]
    # cooldown: two windows of waiting roles do not widen again; the third does
    for _ in range(2):
        bound, t = _window(c, 7, t, trainer_wait=0.5, explorer_wait=0.5)
        assert bound == 2
    bound, t = _window(c, 11, t, trainer_wait=0.5, explorer_wait=0.5)
    assert bound == 3 and c.bound <= PARAMS["max"]
    assert [h["bound"] for h in c.history] == [1, 2, 3, 2, 3]


def test_with_patience_one_noisy_window_does_not_widen_and_a_trial_is_judged_over_several_windows():
    c = StalenessController({**PARAMS, "patience": 2})
    bound, t = _window(c, 1, 0.0, trainer_wait=0.5, explorer_wait=0.5)  # one slow step made both roles wait
    assert bound == 1
    bound, t = _window(c, 3, t)  # and then neither waits: the streak is broken
    bound, t = _window(c, 5, t, trainer_wait=0.5, explorer_wait=0.5)
    assert bound == 1 and len(c.history) == 1
    # two windows in a row (100 rows/s each): widen, the base of the trial is 100 rows/s
    bound, t = _window(c, 7, t, trainer_wait=0.5, explorer_wait=0.5)
    assert bound == 2 and "in 2 window(s) running (trainer 25%, explorers 25% of 4.0s)" in c.history[-1]["reason"]
    bound, t = _window(c, 9, t, step_s=0.5)  # settling: not measured, fast or not
    # measured: 200 rows in 2.4 s, then 200 rows in 1.6 s: 100 rows/s together (not 125 as the last alone)
    bound, t = _window(c, 11, t, step_s=1.2)
    assert bound == 2 and len(c.history) == 2  # one window measured of two: no verdict yet
    bound, t = _window(c, 13, t, step_s=0.8)
    assert bound == 1 and "(100.0 rows/s against 100.0 before)" in c.history[-1]["reason"]


def test_a_window_lasts_at_least_window_s():
    c = StalenessController({**PARAMS, "window": 1, "window_s": 3.0})
    t = 0.0
    for step in range(1, 3):  # two 1 s steps of waiting roles: still one open window (2 s < 3 s)
        t += 1.0
        c.observe_explore(0.5)
        assert c.observe_train(step, t, 100, {"time/wait_data_s": 0.5, "time/train_step_s": 0.5}) == 1
    t += 1.0
    assert c.observe_train(3, t, 100, {"time/wait_data_s": 0.5, "time/train_step_s": 0.5}) == 2
    assert "of 3.0s" in c.history[-1]["reason"]


def test_only_one_role_waiting_holds_the_bound():
    c = StalenessController(PARAMS)
    _window(c, 1, 0.0, trainer_wait=1.0)  # generation is the bottleneck and the bound never held it back
    _window(c, 3, 2.0, explorer_wait=1.0)  # training is the bottleneck: running further ahead buys nothing
    assert c.bound == 1 and len(c.history) == 1


@pytest.mark.parametrize(("ess", "clip", "why"), [(0.6, 0.05, "ESS 0.600 < 0.9"), (0.99, 0.4, "clip fraction 0.400 > 0.2")])
def test_a_degraded_off_policy_signal_narrows_down_to_the_min_even_while_both_wait(ess, clip, why):
    c = StalenessController({**PARAMS, "start": 3, "min": 1})
    t = 0.0
    for expected in (2, 1, 1):
        bound, t = _window(c, 1, t, ess=ess, clip=clip, trainer_wait=0.5, explorer_wait=0.5)
        assert bound == expected
    assert why in c.history[-1]["reason"] and len(c.history) == 3


def test_max_zero_keeps_the_bound_at_zero_and_bad_params_are_refused():
    c = StalenessController({**PARAMS, "max": 0})
    t = 0.0
    for step in range(1, 20, 2):
        bound, t = _window(c, step, t, trainer_wait=1.0, explorer_wait=1.0)
        assert bound == 0
    with pytest.raises(ValueError, match="min=2 is above auto_staleness.max=1"):
        StalenessController({**PARAMS, "min": 2, "max": 1})


def test_max_staleness_auto_in_the_config():
    cfg = load_config(None, ["mode=async", "synchronizer.max_staleness=auto", "synchronizer.auto_staleness.max=6"])
    auto = cfg.synchronizer.auto_staleness
    assert auto.enabled and cfg.synchronizer.max_staleness == 6  # the hard bound no trained row exceeds
    assert not load_config(None, ["synchronizer.max_staleness=2"]).synchronizer.auto_staleness.enabled
    with pytest.raises(ConfigError, match="auto moves the staleness bound of mode async"):
        load_config(None, ["mode=sync", "synchronizer.max_staleness=auto"])
    with pytest.raises(ConfigError, match="auto_staleness.min=3 is above auto_staleness.max=2"):
        load_config(None, ["mode=async", "synchronizer.max_staleness=auto", "synchronizer.auto_staleness.min=3",
                           "synchronizer.auto_staleness.max=2"])


def test_status_shows_the_bound_and_why_it_last_moved():
    from trinity_like.status import format_status

    c = StalenessController(PARAMS)
    _window(c, 1, 0.0, ess=0.5)
    report = {"namespace": "auto", "cluster": "connected", "synchronizer": True, "roles": [],
              "latest_version": 2, "explore_steps": {}, "staleness": c.state()}
    assert ("staleness bound 0 (auto, within [0, 3]); last change at trainer step 2: off-policy signal degraded: "
            "ESS 0.500 < 0.9") in format_status(report)
