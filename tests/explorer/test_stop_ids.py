"""Where a response ends: every EOS of config.json and generation_config.json (what vLLM stops at), and the token
that closes a turn in the chat template (a base model under Qwen2.5's template ends turns with ``<|im_end|>``, not
with its EOS). A response ending in another token is labelled truncated (``length``). Real tiny model and
tokenizer, real ``hf`` engine; the vLLM engine shares ``response_stop_ids`` (tests/explorer/test_vllm_engine.py)."""

import json
import shutil

import pytest

from trinity_like.common.chat import render_ids, turn_end_ids
from trinity_like.common.tokenizer import eos_token_ids, hf_tokenizer
from trinity_like.config import SamplingConfig
from trinity_like.explorer.engines.base import response_stop_ids

# The non-tool branch of Qwen2.5's chat template (tokenizer_config.json of Qwen2.5-0.5B/1.5B/7B, base and Instruct
# alike): a default system turn, every message as <|im_start|>role\ncontent<|im_end|>\n, then the generation prompt.
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _copy(model_path, tmp_path, name="model"):
    out = tmp_path / name
    shutil.copytree(model_path, out)
    return out


def test_eos_ids_come_from_config_and_generation_config(tmp_path):
    # Qwen2.5-Instruct's files: 151645 (<|im_end|>) in config.json, 151645 and 151643 in generation_config.json
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 151645}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    assert eos_token_ids(tmp_path) == [151645, 151643]
    (tmp_path / "generation_config.json").unlink()
    assert eos_token_ids(tmp_path) == [151645]


def test_a_response_ending_in_generation_configs_eos_is_finished_not_truncated(tmp_path, tiny_model_path):
    from trinity_like.explorer.engines.hf_engine import HFEngine

    prompt = hf_tokenizer(tiny_model_path).encode("1+2=")
    greedy = SamplingConfig(temperature=0, max_new_tokens=8)
    (first,) = HFEngine(tiny_model_path, device="cpu").generate([prompt], greedy, [0])
    eos = json.loads(open(f"{tiny_model_path}/config.json").read())["eos_token_id"]
    token = int(first.response_ids[0])
    assert token != eos and len(first.response_ids) > 1 and first.finish_reason == "length"
    # the same model whose generation_config.json also names that first token as an EOS (as Qwen2.5 names 151643)
    folder = _copy(tiny_model_path, tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, token]}))
    (sample,) = HFEngine(folder, device="cpu").generate([prompt], greedy, [0])
    assert sample.response_ids.tolist() == [token] and sample.finish_reason == "stop"


@pytest.fixture
def qwen_base_like(tmp_path, tiny_model_path):
    """The tiny model as a Qwen2.5 base model ships: EOS ``<|endoftext|>`` in config.json and
    generation_config.json, ``<|im_start|>``/``<|im_end|>`` special tokens, Qwen2.5's chat template."""
    folder = _copy(tiny_model_path, tmp_path, "qwen-base-like")
    tok = hf_tokenizer(tiny_model_path)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = QWEN25_TEMPLATE
    tok.save_pretrained(folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # as make_tiny_model pins it
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": tok.eos_token_id}))
    return folder


def test_under_qwen25s_chat_template_the_engine_stops_where_a_turn_ends(qwen_base_like):
    tok = hf_tokenizer(str(qwen_base_like))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert eos_token_ids(qwen_base_like) == [tok.eos_token_id] != [im_end]  # a base model: EOS is not <|im_end|>
    # the template on this tokenizer ends an assistant turn with <|im_end|>, one special token ...
    turn = render_ids([{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"}], tok, False)
    assert turn[-2:] == [im_end, tok.encode("\n")[0]]
    assert turn_end_ids(tok) == [im_end]
    # ... and the engines stop at it: a response ending there is finished, not truncated
    assert response_stop_ids(qwen_base_like) == [tok.eos_token_id, im_end]


def test_qwen25s_template_on_the_plain_tiny_tokenizer_has_no_turn_end_token(tiny_model_path):
    """Without <|im_end|> in its vocabulary the template's turn end is plain text, several tokens: no stop id
    (the engines stop at EOS only, which the tiny model's own plain chat format ends every turn with)."""
    tok = hf_tokenizer(tiny_model_path)
    assert turn_end_ids(tok) == []  # no template
    tok.chat_template = QWEN25_TEMPLATE
    assert len(tok.encode("<|im_end|>")) > 1 and turn_end_ids(tok) == []
    assert response_stop_ids(tiny_model_path) == [tok.eos_token_id]
