"""The schedule: how explorer steps and trainer steps relate (placeholder, filled in the next commit)."""

from __future__ import annotations

from trinity_like.config import Config


def explore_steps_needed(cfg: Config) -> int:
    """Explorer steps whose output covers ``trainer.total_steps`` trainer batches."""
    rows_per_step = cfg.explorer.batch_size * cfg.explorer.repeat_times
    return -(-cfg.trainer.total_steps * cfg.train_batch_size // rows_per_step)
