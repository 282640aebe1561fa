"""`status`'s buffer summary on a real buffer with rows of several sources (no Ray needed)."""

import json

from trinity_like.buffer import BufferConsumer, BufferWriter
from trinity_like.common.experience import Experience
from trinity_like.status import buffer_status, format_status


def _rows(n, source, version, group):
    return [Experience(prompt_ids=[1, 2], response_ids=[3], source=source, model_version=version, group_id=group)
            for _ in range(n)]


def test_buffer_status_counts_sources_and_leaves_imported_rows_out_of_staleness(tmp_path):
    writer = BufferWriter(tmp_path)
    writer.write(_rows(4, "explorer", 0, "a"))
    writer.write(_rows(4, "explorer", 1, "b"))
    writer.write(_rows(2, "human", -1, "h"))
    consumer = BufferConsumer(tmp_path)
    assert len(consumer.read(4, step=1)) == 4  # the version-0 group, fifo
    consumer.commit(1)
    st = buffer_status(tmp_path, trainer_version=3)
    assert st["rows"] == 10 and st["unconsumed"] == 6
    assert st["by_source"] == {"explorer": {"rows": 8, "unconsumed": 4}, "human": {"rows": 2, "unconsumed": 2}}
    # untrained explorer rows are all version 1: staleness 2 at version 3; the human rows (-1) do not count
    assert st["unconsumed_versions"] == [1, 1] and st["unconsumed_staleness"] == [2, 2]
    text = format_status({"namespace": "p/n", "cluster": "connected", "synchronizer": True, "roles": [], "buffer": st,
                          "trainer_version": 3})
    assert "buffer: 10 rows, 6 not yet trained (explorer 8/4, human 2/2: rows/untrained)" in text
    assert buffer_status(tmp_path / "empty", None) == {"rows": 0, "unconsumed": 0, "quarantined": 0, "by_source": {}}


def _report(step, total=10):
    return {"namespace": "p/n", "cluster": "connected", "synchronizer": True, "latest_version": step,
            "explore_steps": {"next": step + 1, "claimed": [], "returned": []},
            "roles": [{"kind": "trainer", "role_id": "trainer-1", "state": "running", "version": step,
                       "seconds_since_heartbeat": 0.4}],
            "last_trainer_step": {"step": step, "total_steps": total, "reward_mean": 0.5, "staleness_mean": 1.0}}


def test_watch_redraws_each_report_with_the_trainers_progress(monkeypatch):
    import io

    from trinity_like.status import watch_status

    reports = iter([_report(2), _report(5)])
    out = io.StringIO()
    watch_status(lambda: next(reports), 0.01, stream=out, iterations=2)
    text = out.getvalue()
    assert text.count("refreshed every 0.01s (Ctrl-C to stop)") == 2
    assert "trainer [#####-------------------] 2/10" in text and "trainer [############------------] 5/10" in text
    assert "trainer  trainer-1" in text and "latest published version 5" in text

    from trinity_like.status import format_status

    said = format_status({**_report(5), "latest_method": "broadcast", "latest_transport": "gloo"})
    assert "latest published version 5 (by broadcast over gloo)" in said

    monkeypatch.setenv("COLUMNS", "200")
    reports = iter([_report(2), _report(5)])
    screen = io.StringIO()
    watch_status(lambda: next(reports), 0.01, stream=screen, live=True, iterations=2)
    assert "5/10" in screen.getvalue()
    lines = io.StringIO()
    watch_status(lambda: _report(3), 0.01, as_json=True, stream=lines, iterations=3)
    assert [json.loads(x)["latest_version"] for x in lines.getvalue().splitlines()] == [3, 3, 3]


def test_watch_rejects_a_bad_interval(capsys):
    from trinity_like.cli import main

    assert main(["status", "--namespace", "p/n", "--watch", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --watch takes a positive number of seconds, got 0"


def test_status_takes_the_overrides_the_run_was_started_with(tmp_path, tiny_model_path, capsys, ray_session):
    """`status CONFIG key=value ...` finds the run directory the overrides name (the session's Ray instance
    is joined as it is; no synchronizer runs there for this namespace)."""
    from trinity_like.cli import main
    from trinity_like.config import load_config
    from trinity_like.runtime.paths import RunPaths
    config = tmp_path / "run.yaml"
    config.write_text("project: st\nname: over\n")
    cfg = load_config(str(config), [f"checkpoint_root_dir={tmp_path}"])
    BufferWriter(RunPaths.of(cfg).buffer_dir).write(_rows(3, "explorer", 0, "g"))
    assert main(["status", str(config), f"checkpoint_root_dir={tmp_path}", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["run_dir"] == str(RunPaths.of(cfg).run_dir) and report["buffer"]["rows"] == 3
    assert report["namespace"] == "st/over" and not report["synchronizer"]
