"""``bench --all-checkpoints`` and ``bench --follow`` (evaluation.bench_checkpoints), and
``explorer.bench_on_latest_checkpoint``: each checkpoint of a run benched once, in step order, as it lands.

The checkpoints are laid out as the trainer lays them out (``checkpoints/step_<k>/model``, a Hugging Face model
folder, and ``trainer_state.json``; the folder published by renaming it complete, then ``checkpoints/latest``
moved), each step a tiny model of another seed, so each step's answers, and rows, differ. The engines are real
(Ray actors of the hf engine); the reward tells any two answers apart (the tiny models never answer right)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from trinity_like.config import load_config
from trinity_like.runtime.paths import RunPaths

TEXT_REWARD = ("def compute_score(responses, ground_truths, **kwargs):\n"
               "    return [len(r) + sum(map(ord, r)) % 7 / 10 for r in responses]\n")


@pytest.fixture(scope="module")
def seeded_models(tmp_path_factory, tiny_model_path):
    """The tiny model as training might leave it at steps 1..4: the same tokenizer and shapes, its weights moved
    by seeded noise (another seed, other weights, other answers)."""
    import torch
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("trained")
    base = load_file(str(Path(tiny_model_path) / "model.safetensors"))
    out = {}
    for k in range(1, 5):
        folder = root / f"tiny-{k}"
        shutil.copytree(tiny_model_path, folder)
        gen = torch.Generator().manual_seed(k)
        moved = {name: t + 0.5 * torch.randn(t.shape, generator=gen, dtype=t.dtype) if t.is_floating_point() else t
                 for name, t in base.items()}
        save_file(moved, str(folder / "model.safetensors"), metadata={"format": "pt"})
        out[k] = folder
    return out


def _cfg(tmp_path, model_path, *overrides):
    reward = tmp_path / "text_reward.py"
    reward.write_text(TEXT_REWARD)
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}", "project=t",
                              "name=run", "explorer.sampling.max_new_tokens=5", f"reward.function_path={reward}",
                              "explorer.eval_tasksets=[{name: a, size: 6, max_operand: 9}, {name: b, size: 4}]",
                              *overrides])


def _save_checkpoint(cfg, step: int, model: Path) -> Path:
    """A checkpoint of ``step`` as the trainer publishes it: complete under a temporary name, renamed, then
    ``latest`` moved to it."""
    from trinity_like.common.fs import atomic_publish_dir
    from trinity_like.runtime.checkpoints import TRAINER_STATE, write_checksums, write_pointer

    checkpoint_dir = RunPaths.of(cfg).checkpoint_dir

    def fill(tmp: Path) -> None:
        shutil.copytree(model, tmp / "model")
        write_checksums(tmp)
        (tmp / TRAINER_STATE).write_text(json.dumps({"step": step}) + "\n")

    path = atomic_publish_dir(checkpoint_dir / f"step_{step}", fill)
    write_pointer(checkpoint_dir / "latest", step)
    return path


def _results(cfg) -> list[dict]:
    return [json.loads(line) for line in (RunPaths.of(cfg).run_dir / "bench_results.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_all_checkpoints_each_once_in_step_order(ray_session, tmp_path, tiny_model_path, seeded_models):
    from trinity_like.explorer.evaluation import bench, bench_checkpoints

    cfg = _cfg(tmp_path, tiny_model_path)
    for step in (2, 1):  # the order they land in does not matter
        _save_checkpoint(cfg, step, seeded_models[step])
    lines: list[str] = []
    rows = bench_checkpoints(cfg, say=lines.append)
    assert [(r["step"], r["taskset"]) for r in rows] == [(1, "a"), (1, "b"), (2, "a"), (2, "b")]
    assert _results(cfg) == rows
    assert rows[0]["checkpoint"] == str(RunPaths.of(cfg).checkpoint_dir / "step_1")
    # each row is that checkpoint's evaluation: step 1's are those of bench --checkpoint step_1, step 2's differ
    alone = bench(cfg, str(RunPaths.of(cfg).checkpoint_dir / "step_1"))
    assert [{k: v for k, v in r.items() if k not in ("step", "checkpoint")} for r in rows[:2]] == alone
    assert rows[0]["reward_mean"] != rows[2]["reward_mean"]
    assert any(line.startswith("step 2 b: mean@1") for line in lines)

    # again: nothing new is benched; a new checkpoint is, and only it
    assert bench_checkpoints(cfg, say=lines.append) == []
    _save_checkpoint(cfg, 3, seeded_models[3])
    rows3 = bench_checkpoints(cfg, say=lines.append)
    assert [(r["step"], r["taskset"]) for r in rows3] == [(3, "a"), (3, "b")]
    assert [r["step"] for r in _results(cfg)] == [1, 1, 2, 2, 3, 3]

    # a damaged checkpoint stops the bench in one line saying what is wrong with it; the rows so far stay
    from trinity_like.common.errors import RunError

    weights = _save_checkpoint(cfg, 4, seeded_models[4]) / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(RunError, match=r"step_4 could not be loaded \(model/model.safetensors has 1000 bytes") as e:
        bench_checkpoints(cfg, say=lines.append)
    assert "\n" not in str(e.value)
    assert [r["step"] for r in _results(cfg)] == [1, 1, 2, 2, 3, 3]
    shutil.rmtree(weights.parent.parent)
    from trinity_like.runtime.checkpoints import write_pointer

    write_pointer(RunPaths.of(cfg).checkpoint_dir / "latest", 3)

    # explorer.bench_on_latest_checkpoint: `bench` takes checkpoints/latest (step 3 now)
    latest = bench(load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}",
                                      "project=t", "name=run", "explorer.sampling.max_new_tokens=5",
                                      f"reward.function_path={tmp_path / 'text_reward.py'}",
                                      "explorer.eval_tasksets=[{name: a, size: 6, max_operand: 9}, {name: b, size: 4}]",
                                      "explorer.bench_on_latest_checkpoint=true"]))
    assert latest == [{k: v for k, v in r.items() if k not in ("step", "checkpoint")} for r in rows3]


@pytest.mark.slow
def test_follow_benches_each_checkpoint_as_it_lands_until_the_run_ends(ray_session, tmp_path, tiny_model_path,
                                                                       seeded_models, capsys):
    """``trinity-like bench --follow``: a checkpoint already there, two that land while it waits (the second
    with the run's end right after it): three steps benched, and it returns once the run has ended."""
    from trinity_like.cli import main

    cfg = _cfg(tmp_path, tiny_model_path, "explorer.eval_tasksets=[{name: a, size: 4, max_operand: 9}]")
    paths = RunPaths.of(cfg)
    _save_checkpoint(cfg, 1, seeded_models[1])

    def trainer() -> None:  # lands step 2 while bench waits, then step 4 and the run's summary
        deadline = time.monotonic() + 120
        while not (paths.run_dir / "bench_results.jsonl").is_file() and time.monotonic() < deadline:
            time.sleep(0.2)
        _save_checkpoint(cfg, 2, seeded_models[2])
        while len(_results(cfg)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        _save_checkpoint(cfg, 4, seeded_models[4])
        paths.summary.write_text(json.dumps({"exit_reason": "completed"}))

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    from trinity_like.config import to_yaml

    config = tmp_path / "run.yaml"
    config.write_text(to_yaml(cfg))
    overrides = [str(config)]
    assert main(["bench", *overrides, "--follow", "--timeout", "300", "--json"]) == 0
    thread.join(10)
    printed = json.loads(capsys.readouterr().out)
    assert [r["step"] for r in printed] == [1, 2, 4] == [r["step"] for r in _results(cfg)]
    assert len({(r["reward_mean"], r["mean@k"]) for r in printed}) >= 2

    # the run resumed (its earlier summary stays until it ends again; its trainer is alive) and nothing lands:
    # --timeout ends the wait
    from trinity_like.runtime.ray_cluster import register_role

    trainer_record = register_role(paths.run_dir, "trainer", "127.0.0.1:1")
    try:
        start = time.monotonic()
        assert main(["bench", *overrides, "--follow", "--timeout", "0.5"]) == 0
        assert time.monotonic() - start < 30
    finally:
        trainer_record.close()
    assert "stopped following after 0.5s" in capsys.readouterr().out
    # and the flags that do not go together are refused in one line
    assert main(["bench", *overrides, "--all-checkpoints", "--checkpoint", str(paths.checkpoint_dir / "step_1")]) == 2
    assert main(["bench", *overrides, "--all-checkpoints", "--timeout", "3"]) == 2
    err = capsys.readouterr().err
    assert "--checkpoint names one model" in err and "--timeout goes with --follow" in err


def test_bench_on_latest_checkpoint_without_one_is_refused(tmp_path, tiny_model_path):
    from trinity_like.common.errors import UserError
    from trinity_like.explorer.evaluation import bench

    with pytest.raises(UserError, match="the run has no checkpoint yet"):
        bench(_cfg(tmp_path, tiny_model_path, "explorer.bench_on_latest_checkpoint=true"))
