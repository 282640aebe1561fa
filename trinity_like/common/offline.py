"""Nothing may download at run time (kept apart from ``modeling`` so that setting it up costs no torch import)."""

from __future__ import annotations

import os


def set_offline_env() -> None:
    """Nothing may download at run time: make Hugging Face libraries fail fast instead of trying."""
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false"),
                       ("HF_HUB_DISABLE_PROGRESS_BARS", "1")):
        os.environ.setdefault(key, value)
