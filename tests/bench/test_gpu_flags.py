"""The flags of a GPU run (issue 51 item 8), without a GPU: bench/async_speedup.py's ``--modes``, ``--engine-gpus``,
``--trainer-gpus``, ``--cpus``, ``--gpus`` and bench/engine.py's ``--shape`` / ``--device``. Their CPU paths run in
the smokes (tests/bench/test_smoke.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import async_speedup  # noqa: E402
import engine  # noqa: E402


def _settings(args) -> dict[str, str]:
    items = async_speedup.overrides(args, Path("/runs"), Path("/model"), [7], "async", 1, "x", stream=True)
    return dict(o.split("=", 1) for o in items)


def test_modes_name_the_runs_of_a_repeat_in_order():
    args = async_speedup.parse_args(["--modes", "sync", "stream1", "async1", "async2"])
    assert async_speedup.default_modes(args) == [("sync", "sync", 0, False), ("stream1", "async", 1, True),
                                                 ("async1", "async", 1, False), ("async2", "async", 2, False)]
    # the report reads the async bounds and whether anything streams from these
    assert args.staleness == [1, 2] and args.streaming
    # a bound-0 async run beside a stream at another bound is allowed
    assert async_speedup.parse_args(["--modes", "sync", "async0", "async1", "stream1"]).staleness == [0, 1]


def test_without_modes_the_runs_are_as_before():
    args = async_speedup.parse_args(["--staleness", "1", "2", "--streaming"])
    assert [k for k, *_ in async_speedup.default_modes(args)] == ["sync", "async1", "stream1", "async2", "stream2"]
    smoke = async_speedup.parse_args(["--smoke"])
    assert [k for k, *_ in async_speedup.default_modes(smoke)] == ["sync", "async1", "stream1"]


@pytest.mark.parametrize(("modes", "says"), [
    (["async1"], "needs sync"),
    (["sync", "stream2"], "add async2"),
    (["sync", "async1", "stream0", "async0"], "staleness >= 1"),
    (["sync", "async1", "async1"], "twice"),
    (["sync", "fast"], "unknown mode 'fast'"),
])
def test_bad_modes_are_refused_in_one_line(modes, says, capsys):
    with pytest.raises(SystemExit):
        async_speedup.parse_args(["--modes", *modes])
    assert says in capsys.readouterr().err


def test_gpu_shares_reach_the_config_and_ray():
    cpu = async_speedup.parse_args([])
    assert {k: _settings(cpu)[k] for k in ("explorer.gpus_per_engine", "trainer.gpus_per_worker", "explorer.device",
                                          "trainer.device")} == {
        "explorer.gpus_per_engine": "0", "trainer.gpus_per_worker": "0", "explorer.device": "cpu",
        "trainer.device": "cpu"}
    assert async_speedup.ray_resources(cpu) == {"num_cpus": 2}  # Ray counts the GPUs itself, as before
    gpu = async_speedup.parse_args(["--engine", "vllm", "--engine-gpus", "0.5", "--trainer-gpus", "0.5", "--cpus", "16"])
    s = _settings(gpu)
    assert (s["explorer.gpus_per_engine"], s["trainer.gpus_per_worker"]) == ("0.5", "0.5")
    assert (s["explorer.device"], s["trainer.device"]) == ("auto", "auto")
    assert s["explorer.engine"] == "vllm"
    assert async_speedup.ray_resources(gpu) == {"num_cpus": 16, "num_gpus": 1}
    two = async_speedup.parse_args(["--engine-gpus", "1", "--trainer-gpus", "1", "--gpus", "2"])
    assert async_speedup.ray_resources(two) == {"num_cpus": 2, "num_gpus": 2}
    # the settings load as a config (the schema takes every key)
    from trinity_like.config import load_config

    cfg = load_config(None, [o for o in async_speedup.overrides(gpu, Path("/runs"), Path("/model"), [7], "async", 1,
                                                                "x", stream=True) if not o.startswith("model.path")])
    assert cfg.explorer.gpus_per_engine == 0.5 and cfg.trainer.gpus_per_worker == 0.5


@pytest.mark.parametrize("argv", [["--engine-gpus", "2", "--gpus", "1"], ["--cpus", "0"], ["--trainer-gpus", "-1"]])
def test_impossible_shares_are_refused(argv):
    with pytest.raises(SystemExit):
        async_speedup.parse_args(argv)


def test_the_engine_bench_follows_the_device_it_sees():
    args = engine.parse_args([])
    assert args.device == "auto" and args.shape == "tiny" and engine.vllm_kwargs(args) == {}
    assert engine.model_dims(args) == (128, 2)
    gpu = engine.parse_args(["--cost-fit", "--vllm", "--shape", "qwen2.5-0.5b", "--vllm-gpu-memory", "0.4"])
    assert gpu.shape == "qwen2.5-0.5b" and engine.vllm_kwargs(gpu) == {"gpu_memory_utilization": 0.4}
    assert engine.model_dims(gpu) == (896, 24)
    with pytest.raises(SystemExit):
        engine.parse_args(["--shape", "qwen9"])
