"""Where a run keeps its files and how its roles find each other (Ray namespace, Redis stream)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trinity_like.common.tasks import reads_rows
from trinity_like.config import Config


@dataclass(frozen=True)
class RunPaths:
    """Where a run keeps its files; derived from a config, never set by users."""

    run_dir: Path
    buffer_dir: Path
    checkpoint_dir: Path
    taskset: Path
    metrics: Path
    summary: Path
    config: Path
    run_id: Path
    """A random id written when the run directory is first prepared; names this run to its Synchronizer."""

    @classmethod
    def of(cls, cfg: Config) -> RunPaths:
        run_dir = (Path(cfg.run_dir).expanduser().absolute() if cfg.run_dir
                   else Path(cfg.checkpoint_root_dir).expanduser().absolute() / cfg.project / cfg.name)
        return cls(
            run_dir=run_dir,
            buffer_dir=Path(cfg.buffer.path).absolute() if cfg.buffer.path else run_dir / "buffer",
            checkpoint_dir=run_dir / "checkpoints",
            taskset=Path(cfg.explorer.taskset.path).absolute()
            if cfg.explorer.taskset.path and not reads_rows(cfg.explorer.taskset)  # else read and written there
            else run_dir / "tasks.parquet",
            metrics=run_dir / "metrics.jsonl",
            summary=run_dir / "summary.json",
            config=run_dir / "config.yaml",
            run_id=run_dir / "run_id",
        )


def read_run_id(paths: RunPaths) -> str | None:
    """The run's id (None before the run directory is prepared)."""
    try:
        return paths.run_id.read_text().strip() or None
    except FileNotFoundError:
        return None


def namespace_of(cfg: Config) -> str:
    """The Ray namespace in which the roles of one run meet."""
    return f"{cfg.project}/{cfg.name}"


def redis_stream(cfg: Config) -> str:
    """The Redis Stream that carries this run's experiences (transport ``redis``)."""
    return cfg.buffer.redis_stream or f"{namespace_of(cfg)}/experiences"


REDIS_PORT = 6380
"""Port of the Redis server that an empty ``buffer.redis_url`` means, on the Ray head node."""


def redis_url(cfg: Config) -> str:
    """The ``redis`` transport's server: ``buffer.redis_url``, or port ``REDIS_PORT`` on the Ray head node (the
    address every node of the cluster reaches it by). Call within a Ray job."""
    if cfg.buffer.redis_url:
        return cfg.buffer.redis_url
    import ray

    head = ray.get_runtime_context().gcs_address.rpartition(":")[0]
    return f"redis://{head}:{REDIS_PORT}/0"
