"""Shared fixtures: one tiny model and one Ray instance per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    from trinity_like.common.tiny_model import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0))


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray instance shared by every test that needs one."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="pytest",
             configure_logging=False)
    yield ray
    ray.shutdown()
