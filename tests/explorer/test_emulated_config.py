"""The config's checks of the EMULATED engine and of ``on_new_version: keep`` (issue 51): each refusal one line that
says what to change; the emulated engine refused where its tokens would be handed out or scored (``serve``,
``bench``, evaluation), through the real command line."""

from __future__ import annotations

import pytest

from trinity_like.cli import main
from trinity_like.config import ConfigError, load_config
from trinity_like.config.validation import vllm_pause_keeps


def _cfg(tmp_path, model_path, *overrides):
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}", "project=emu",
                              *overrides])


EMULATED = ("explorer.engine=emulated", "mode=async", "explorer.rollout=stream")


def test_an_unknown_curve_is_refused_naming_the_known_ones(tmp_path, tiny_model_path):
    with pytest.raises(ConfigError, match=r"explorer.emulated.curve 'h100x' is not a known cost curve; known: 7b_h100"):
        _cfg(tmp_path, tiny_model_path, *EMULATED, "explorer.emulated.curve=h100x")


def test_emulated_engines_use_no_device_read_versions_themselves_and_are_not_evaluated(tmp_path, tiny_model_path):
    with pytest.raises(ConfigError, match="uses no device .* set explorer.gpus_per_engine=0"):
        _cfg(tmp_path, tiny_model_path, *EMULATED, "explorer.gpus_per_engine=1")
    with pytest.raises(ConfigError, match="set synchronizer.method=memory"):
        _cfg(tmp_path, tiny_model_path, *EMULATED, "synchronizer.method=broadcast")
    with pytest.raises(ConfigError, match="explorer.eval_tasksets .evaluation. would give meaningless outputs"):
        _cfg(tmp_path, tiny_model_path, *EMULATED, "explorer.eval_tasksets=[{name: heldout, size: 8}]")
    # resubmit needs no chunk_tokens: the emulated engine cuts its requests at once, as vLLM's async engine does
    for policy in ("finish", "resubmit", "keep"):
        assert _cfg(tmp_path, tiny_model_path, *EMULATED, f"explorer.stream.on_new_version={policy}").explorer.stream


def test_keep_needs_an_engine_that_loads_under_running_requests(tmp_path, tiny_model_path):
    keep = ("mode=async", "explorer.rollout=stream", "explorer.stream.on_new_version=keep")
    with pytest.raises(ConfigError, match="hf engine loads weights only between calls; set on_new_version=resubmit "
                                          "with explorer.stream.chunk_tokens"):
        _cfg(tmp_path, tiny_model_path, *keep)
    with pytest.raises(ConfigError, match=r"engine vllm \(synchronous\) cannot load .* explorer.vllm.async_engine=true"):
        _cfg(tmp_path, tiny_model_path, *keep, "explorer.engine=vllm", "explorer.vllm.async_engine=false",
             "explorer.gpus_per_engine=1")
    assert vllm_pause_keeps() is None  # no vLLM in this venv: accepted, the engine checks at start
    _cfg(tmp_path, tiny_model_path, *keep, "explorer.engine=vllm", "explorer.gpus_per_engine=1")


@pytest.mark.parametrize("has_mode", [True, False])
def test_vllms_pause_generation_is_read_from_its_source(tmp_path, tiny_model_path, monkeypatch, has_mode):
    """A vLLM package tree (its async_llm.py as 0.32 writes it, or as an older one without ``mode``) on the path."""
    engine = tmp_path / "site" / "vllm" / "v1" / "engine"
    engine.mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("")
    args = "self, *, mode: PauseMode = 'abort', clear_cache: bool = True" if has_mode else "self, wait_for_inflight=False"
    (engine / "async_llm.py").write_text(f"class AsyncLLM:\n    async def pause_generation({args}) -> None:\n"
                                         "        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert vllm_pause_keeps() is has_mode
    overrides = ("mode=async", "explorer.rollout=stream", "explorer.stream.on_new_version=keep", "explorer.engine=vllm",
                 "explorer.gpus_per_engine=1")
    if has_mode:
        _cfg(tmp_path, tiny_model_path, *overrides)
    else:
        with pytest.raises(ConfigError, match="pause_generation.mode='keep'., which the vLLM installed here lacks"):
            _cfg(tmp_path, tiny_model_path, *overrides)


@pytest.mark.parametrize("command", ["serve", "bench"])
def test_serve_and_bench_refuse_the_emulated_engine_in_one_line(tmp_path, tiny_model_path, capsys, monkeypatch,
                                                                 command):
    monkeypatch.setenv("RAY_ADDRESS", "local")
    config = tmp_path / "run.yaml"
    config.write_text(f"checkpoint_root_dir: {tmp_path / 'runs'}\nproject: emu\nname: run\n"
                      f"model:\n  path: {tiny_model_path}\nexplorer:\n  engine: emulated\n")
    assert main([command, str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"`{command}` would give meaningless outputs; use explorer.engine hf or vllm" in err[0]
