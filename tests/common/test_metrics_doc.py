"""docs/metrics.md lists every metric the code emits, and nothing it does not.

Two sources of the emitted names: a static scan of trinity_like/ (every string literal or f-string that is a
whole ``area/metric`` key; f-string holes become patterns), and a short real run with a critic, an off-policy
correction, the KL and entropy terms and an eval task set, whose metrics.jsonl keys are checked too (that
catches keys assembled in ways the scan cannot see); that run also feeds every installed monitor from the
two roles' own processes.
"""

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"
AREAS = ("rollout", "eval", "actor", "critic", "off_policy", "mismatch", "buffer", "sync", "time", "train", "trainer",
         "replay", "timeline", "response_length", "prompt_length", "perf")
KEY = re.compile(rf"(?:{'|'.join(AREAS)})/[\w@<>/.*]+")
HOLE = "<*>"

NOT_EMITTED = {
    # the NCCL broadcaster's last_round; the trainer logs these renamed as sync/broadcast_<name>
    "sync/receivers": "trinity_like/weights/broadcast.py",
}
"""Scanned literals that look like metric keys but never reach a record as such, with where they live."""


def _doc_names() -> set[str]:
    """The first cell of every table row of docs/metrics.md that is a backticked metric name."""
    names = set()
    for line in DOC.read_text().splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|", line)
        if m and KEY.fullmatch(m.group(1)):
            names.add(m.group(1))
    return names


def _regex(name: str) -> re.Pattern:
    """A documented name or scanned pattern as a regex: each ``<part>`` matches one or more characters."""
    return re.compile("".join(".+" if p.startswith("<") else re.escape(p)
                              for p in re.split(r"(<[^>]*>)", name) if p))


def _normal(name: str) -> str:
    return re.sub(r"<[^>]*>", HOLE, name)


def _scanned_keys() -> set[str]:
    """Whole-string ``area/metric`` literals and f-strings in trinity_like/ (f-string holes as ``<*>``)."""
    found = set()
    for path in (ROOT / "trinity_like").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            if KEY.fullmatch(text) and not text.endswith("/"):
                found.add(text)
    # the parts of an f-string are Constants too: keep only whole keys, not the literal head of a pattern
    heads = {_normal(k).split(HOLE)[0] for k in found if HOLE in k}
    return {k for k in found if HOLE in k or k not in heads} - set(NOT_EMITTED)


def _documented(key: str, doc: set[str]) -> bool:
    if HOLE in key:  # a pattern: the same pattern documented, or it generates documented names
        return any(_normal(d) == key for d in doc) or any(_regex(key).fullmatch(d) for d in doc)
    return key in doc or any(_regex(d).fullmatch(key) for d in doc if "<" in d)


def test_doc_lists_areas_and_names():
    doc = _doc_names()
    assert len(doc) > 60
    text = DOC.read_text()
    for area in ("rollout", "eval", "actor", "critic", "off_policy", "buffer", "sync", "time"):
        assert f"## {area}/*" in text, f"docs/metrics.md has no section for {area}/*"


def test_every_scanned_key_is_documented():
    doc, scanned = _doc_names(), _scanned_keys()
    assert {"actor/pg_loss", "off_policy/ess", "critic/vf_loss", "buffer/mix_<*>"} <= scanned  # the scan works
    missing = sorted(k for k in scanned if not _documented(k, doc))
    assert not missing, f"emitted but not in docs/metrics.md: {missing}"


def test_every_documented_name_is_emitted():
    scanned = _scanned_keys()
    literal = {k for k in scanned if HOLE not in k}
    patterns = [_regex(k) for k in scanned if HOLE in k]
    stale = sorted(d for d in _doc_names()
                   if d not in literal and _normal(d) not in scanned and not any(p.fullmatch(d) for p in patterns))
    assert not stale, f"in docs/metrics.md but emitted nowhere in trinity_like/: {stale}"


@pytest.mark.slow
def test_keys_of_a_real_run_are_documented(tmp_path, tiny_model_path, ray_session, monkeypatch):
    from trinity_like.common.monitors import monitor_problem
    from trinity_like.config import load_config
    from trinity_like.launcher import run
    from trinity_like.runtime.paths import RunPaths

    backends = [b for b in ("tensorboard", "wandb", "mlflow") if monitor_problem(b) is None]
    cfg = load_config(None, [f"monitor.backends=[{','.join(backends)}]",
        f"checkpoint_root_dir={tmp_path}", "project=doc", "name=all", f"model.path={tiny_model_path}",
        "mode=async", "synchronizer.max_staleness=1", "trainer.total_steps=2",
        "explorer.batch_size=2", "explorer.repeat_times=4", "explorer.sampling.max_new_tokens=4",
        "explorer.taskset.size=16", "explorer.taskset.max_operand=9", "trainer.micro_batch_size=4",
        "algorithm.adv_estimator=gae", "algorithm.off_policy.correction=tis",
        "algorithm.use_kl_loss=true", "algorithm.entropy_coeff=0.01",
        "explorer.eval_interval=1", "explorer.eval_tasksets=[{name: heldout, size: 4, k: 2, temperature: 1.0}]",
    ])
    assert run(cfg)["exit_reason"] == "completed"
    records = [json.loads(x) for x in RunPaths.of(cfg).metrics.read_text().splitlines()]
    keys = {k for r in records for k in r} - {"role", "step", "time"}
    for area in ("rollout", "eval", "actor", "critic", "off_policy", "buffer", "sync", "time", "train"):
        assert any(k.startswith(f"{area}/") for k in keys), f"the run logged no {area}/* key"
    doc = _doc_names()
    missing = sorted(k for k in keys if not _documented(k, doc))
    assert not missing, f"logged by a real run but not in docs/metrics.md: {missing}"
    # the monitors saw the same run, each role (its own process) under its own prefix
    run_dir = RunPaths.of(cfg).run_dir
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    assert {"trainer/actor/pg_loss", "explorer/rollout/reward_mean"} <= set(acc.Tags()["scalars"])
    assert [e.step for e in acc.Scalars("trainer/actor/pg_loss")] == [1, 2]
    if "wandb" in backends:
        assert len(list((run_dir / "wandb").glob("offline-run-*/*.wandb"))) == 2
    if "mlflow" in backends:
        from mlflow.tracking import MlflowClient

        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks readers of a file store too
        client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
        runs = client.search_runs([client.get_experiment_by_name("doc/all").experiment_id])
        assert sorted(r.info.run_name for r in runs) == ["explorer", "trainer"]
        trainer = next(r for r in runs if r.info.run_name == "trainer")
        assert len(client.get_metric_history(trainer.info.run_id, "trainer/actor/pg_loss")) == 2
