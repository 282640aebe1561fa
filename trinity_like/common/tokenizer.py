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
    cfg_file = Path(name_or_path) / "tokenizer_config.json"
    if cfg_file.is_file() and json.loads(cfg_file.read_text()).get("tokenizer_class") == "PreTrainedTokenizerFast":
        from transformers import PreTrainedTokenizerFast as cls
    else:
        from transformers import AutoTokenizer as cls
    if correct_gemma2 and "gemma-2" in str(name_or_path).lower():
        kwargs.setdefault("eos_token", "<end_of_turn>")
    tokenizer = cls.from_pretrained(name_or_path, **kwargs)
    if correct_pad_token and tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
        warnings.warn(f"tokenizer of {name_or_path} has no pad token; using eos {tokenizer.eos_token!r}",
                      stacklevel=2)
    return tokenizer


def model_vocab_size(path: str | Path) -> int | None:
    """The number of embedding rows of the model in folder ``path`` (``vocab_size`` in its ``config.json``, or in
    its ``text_config`` for multimodal models): token ids at or above it cannot be trained on. None when the
    folder has no readable config.json or it does not say."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    rows = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(rows) if rows else None


def eos_token_ids(path: str | Path) -> list[int]:
    """Every EOS id of the model in folder ``path``: ``eos_token_id`` of its ``config.json`` (or its
    ``text_config``) first, then those of its ``generation_config.json``, which vLLM also stops at (Qwen2.5-Instruct:
    151645 in config.json, 151645 and 151643 in generation_config.json). Each may be one id or a list."""
    ids: list[int] = []
    for name in ("config.json", "generation_config.json"):
        try:
            cfg = json.loads((Path(path) / name).read_text())
        except (OSError, ValueError):
            continue
        eos = cfg.get("eos_token_id")
        if eos is None:
            eos = (cfg.get("text_config") or {}).get("eos_token_id")
        for e in eos if isinstance(eos, list) else [] if eos is None else [eos]:
            if int(e) not in ids:
                ids.append(int(e))
    return ids


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
"""A model folder holds its tokenizer in at least one of these (fast, sentencepiece, BPE vocabulary)."""


def check_tokenizer_fits_model(path: str | Path) -> None:
    """Refuse a model folder whose tokenizer cannot drive its model; raise UserError saying how to fix it.

    A mismatch is (1) no tokenizer files at all: ``transformers`` then quietly builds an empty tokenizer from
    the model type (for qwen2, one token), and every prompt becomes unknown tokens; or (2) a tokenizer with
    more tokens than the model has embedding rows (``vocab_size`` in ``config.json``): those ids index past the
    embedding, which fails deep inside an engine, or on a GPU as a device-side assert. Fewer tokens than rows
    is normal (embeddings are often padded)."""
    from trinity_like.common.errors import UserError

    path = Path(path)
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise UserError(f"model.path '{path}' has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); copy the "
                        "tokenizer files that came with this model into the folder (tokenizer.save_pretrained)")
    rows = model_vocab_size(path)
    try:
        tokens = _token_count(path)
    except (OSError, ValueError) as e:
        raise UserError(f"the tokenizer in model.path '{path}' does not load ({str(e).splitlines()[0][:160]}); "
                        "replace it with the tokenizer files that came with this model") from None
    if rows and tokens > rows:
        raise UserError(f"the tokenizer in model.path '{path}' has {tokens} tokens but the model has only {rows} "
                        "embedding rows (vocab_size in config.json), so the model and tokenizer do not belong "
                        "together; use the tokenizer the model was trained with")


def _token_count(path: Path) -> int:
    """The tokenizer's size with its added tokens (``len`` of the Hugging Face tokenizer). A ``tokenizer.json`` is
    read by the ``tokenizers`` library alone, which is what a fast tokenizer's ``len`` counts: importing
    transformers (and torch) would cost seconds in every process that only checks a run's model folder."""
    if (path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        try:
            return Tokenizer.from_file(str(path / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception for a malformed file
            raise ValueError(str(e)) from None
    return len(hf_tokenizer(str(path), correct_pad_token=False))
