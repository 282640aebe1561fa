"""Tokenizer loading that keeps a folder's own tokenizer and always has a pad token."""

from __future__ import annotations

import json
import warnings
from pathlib import Path


def hf_tokenizer(name_or_path: str, correct_pad_token: bool = True, correct_gemma2: bool = True, **kwargs):
    """Load a Hugging Face tokenizer offline-safely, with a pad token.

    A folder whose ``tokenizer_config.json`` names ``PreTrainedTokenizerFast`` is loaded with exactly that
    class: ``AutoTokenizer`` would pick the model architecture's tokenizer (for a qwen2 folder, Qwen2's) and
    re-apply its pre-tokenizer, silently changing the ids of a tokenizer trained with other rules.
    ``correct_pad_token`` sets ``pad_token = eos_token`` when the tokenizer has none (with a warning).
    ``correct_gemma2`` makes Gemma-2 tokenizers end sequences with ``<end_of_turn>``, as chat models expect.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg_file = Path(name_or_path) / "tokenizer_config.json"
    cls = AutoTokenizer
    if cfg_file.is_file() and json.loads(cfg_file.read_text()).get("tokenizer_class") == "PreTrainedTokenizerFast":
        cls = PreTrainedTokenizerFast
    if correct_gemma2 and "gemma-2" in str(name_or_path).lower():
        kwargs.setdefault("eos_token", "<end_of_turn>")
    tokenizer = cls.from_pretrained(name_or_path, **kwargs)
    if correct_pad_token and tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
        warnings.warn(f"tokenizer of {name_or_path} has no pad token; using eos {tokenizer.eos_token!r}",
                      stacklevel=2)
    return tokenizer
