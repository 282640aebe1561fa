import hashlib

import pytest
import torch

from trinity_like.common.tiny_model import build_tokenizer, make_tiny_model
from trinity_like.common.tokenizer import hf_tokenizer

TEXTS = ["12+34=46", "the answer is 7", "  policy reward\tmodel  ", "ünïcode ✓ 1+1=2", ""]


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_build_is_deterministic(tmp_path, tiny_model_path):
    from pathlib import Path

    again = make_tiny_model(tmp_path / "again", seed=0)
    assert _digest(again) == _digest(Path(tiny_model_path))
    other = make_tiny_model(tmp_path / "other", seed=1)
    assert _digest(other)["model.safetensors"] != _digest(again)["model.safetensors"]


def test_model_reloads_identically_and_is_small(tiny_model_path, monkeypatch):
    from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    a = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    b = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert isinstance(a, Qwen2ForCausalLM)
    assert sum(p.numel() for p in a.parameters()) < 10_000_000
    x = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.equal(a(x).logits, b(x).logits)


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trip_is_stable(tiny_model_path, text):
    tok = hf_tokenizer(tiny_model_path)
    ids = tok.encode(text)
    assert tok.encode(tok.decode(ids)) == ids
    assert tok.decode(ids) == text


def test_loaded_tokenizer_keeps_trained_ids(tiny_model_path):
    raw = build_tokenizer(seed=0)
    tok = hf_tokenizer(tiny_model_path)
    for text in TEXTS:
        assert tok.encode(text) == raw.encode(text).ids
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    # digits are single tokens, so every sum tokenizes one digit at a time
    assert len(tok.encode("123")) == 3


def test_hf_tokenizer_sets_missing_pad_token(tmp_path, tiny_model_path):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(tiny_model_path)
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="no pad token"):
        fixed = hf_tokenizer(str(tmp_path))
    assert fixed.pad_token == fixed.eos_token


def test_make_tiny_model_command(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "m"
    proc = subprocess.run([sys.executable, "-m", "trinity_like.cli", "make-tiny-model", str(out), "--layers", "1",
                           "--hidden", "64", "--seed", "3"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["hidden_size"] == 64
    assert config["architectures"] == ["Qwen2ForCausalLM"]
