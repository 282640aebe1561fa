"""What `run` shows: plain lines when not on a terminal, a live bar with the run's numbers when on one."""

import io
import json
import re

from trinity_like.progress import RunProgress


def _trainer(step, reward, staleness=1.0):
    return {"role": "trainer", "step": step, "time": 0.0, "train/reward_mean": reward,
            "train/staleness_mean": staleness, "train/staleness_max": 1.0, "actor/pg_loss": -0.01,
            "time/train_step_s": 0.25, "trainer/version": float(step)}


def _explorer(step, reward, version, **extra):
    return {"role": "explorer", "step": step, "time": 0.0, "rollout/reward_mean": reward,
            "rollout/model_version": float(version), "time/explore_step_s": 0.5, **extra}


def _append(path, *records):
    with open(path, "a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)


def test_plain_lines_one_per_step_and_only_new_records(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    _append(metrics, _trainer(1, 0.9))  # an earlier stage's record: not this job's
    out = io.StringIO()
    progress = RunProgress(metrics, {"trainer": 10, "explorer": 10}, ("trainer", "explorer"), stream=out)
    assert not progress.live  # a StringIO is no terminal
    _append(metrics, _explorer(1, 0.25, 0, **{"eval/heldout/accuracy/mean@1": 0.75}), _trainer(1, 0.5))
    progress.poll()
    progress.poll()  # nothing new: nothing printed twice
    assert out.getvalue().splitlines() == [
        "eval     step    1       heldout mean@1 0.750",
        "explorer step    1       reward 0.250  version 0  0.50s",
        "trainer  step    1/10  reward 0.500  staleness 1.00  pg_loss -0.0100  0.25s",
    ]
    assert [r["role"] for r in progress.records] == ["explorer", "trainer"]
    # streaming rollout's records say how many groups are written and generating
    _append(metrics, _explorer(2, 0.5, 1, **{"rollout/groups_written": 8.0, "rollout/groups_in_flight": 3.0}))
    progress.poll()
    assert out.getvalue().splitlines()[-1] == (
        "explorer step    2       reward 0.500  version 1  0.50s  groups 8 written, 3 in flight")


def test_live_bar_shows_steps_reward_staleness_versions_and_eval(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal: nothing truncated
    metrics = tmp_path / "metrics.jsonl"
    out = io.StringIO()
    progress = RunProgress(metrics, {"trainer": 10, "explorer": 12}, ("trainer", "explorer"), stream=out, live=True)
    _append(metrics, _explorer(4, 0.25, 2, **{"eval/heldout/accuracy/mean@1": 0.75}), _trainer(3, 0.5, 0.5))
    progress.poll()
    progress.close()
    screen = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue())
    assert re.search(r"trainer .* 3/10 .*reward 0\.500  staleness 0\.50/1  version 3  eval heldout mean@1 0\.750",
                     screen), screen
    assert re.search(r"explorer .* 4/12 .*reward 0\.250  generating with version 2", screen), screen
    assert "eta" in screen
    assert len(progress.records) == 2
