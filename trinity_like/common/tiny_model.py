"""The tiny model: a byte-level BPE tokenizer and a small Qwen2 causal LM, built offline and deterministically.

Tests and the demo use it because nothing can be downloaded at run time. The tokenizer is trained with the
``tokenizers`` library on text this module generates (the arithmetic task format plus plain words), with
digits split one per token so that numbers tokenize uniformly. The model is ``Qwen2ForCausalLM`` built from a
config with seeded initialisation; the same arguments give byte-identical files.

The folder records ``tokenizer_class: PreTrainedTokenizerFast``; :func:`trinity_like.common.tokenizer.
hf_tokenizer` honours it, because ``AutoTokenizer`` on a qwen2 folder would return Qwen2's own tokenizer class
and re-apply Qwen2's pre-tokenizer, changing the ids.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from trinity_like.common.fs import atomic_publish_dir

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
_WORDS = (
    "the answer is what plus minus times equals number sum of and a to question solve compute result "
    "policy reward model train sample group token value step learn good bad yes no"
).split()


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        out.append(f"{a}+{b}={a + b}")
        out.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 9))))
    return out


def build_tokenizer(seed: int = 0, vocab_size: int = 512):
    """Train a byte-level BPE tokenizer (``tokenizers.Tokenizer``) on the generated corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    return tok


def make_tiny_model(
    out_dir: str | Path,
    seed: int = 0,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    vocab_size: int = 512,
    max_positions: int = 512,
    reward_head: bool = False,
) -> Path:
    """Build the tokenizer and model into ``out_dir`` (published atomically) and return the path.

    ``reward_head``: a ``Qwen2ForSequenceClassification`` with one label (a reward model's scalar head on the
    same backbone shape) instead of the causal LM."""
    import torch
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen2ForSequenceClassification,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads}), and heads by kv_heads "
                         f"({kv_heads})")
    raw = build_tokenizer(seed, vocab_size)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
    config = Qwen2Config(
        vocab_size=raw.get_vocab_size(),
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
        **({"num_labels": 1} if reward_head else {}),
    )
    devices_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = (Qwen2ForSequenceClassification if reward_head else Qwen2ForCausalLM)(config)
    finally:
        torch.random.set_rng_state(devices_state)

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        # Pin the tokenizer class so loaders keep our trained pre-tokenizer (see module docstring).
        cfg_path = tmp / "tokenizer_config.json"
        tok_cfg = json.loads(cfg_path.read_text())
        tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        cfg_path.write_text(json.dumps(tok_cfg, indent=2, sort_keys=True) + "\n")

    return atomic_publish_dir(out_dir, fill)


def ensure_tiny_model(path: str | Path, seed: int = 0) -> Path:
    """Build the default tiny model at ``path`` unless a model is already there."""
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    return make_tiny_model(path, seed=seed)
