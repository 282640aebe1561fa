"""Conversations as token ids (``common/chat.py``) and what ``buffer ingest`` makes of human demonstrations,
preference pairs and agent trajectories with tool calls; the example files, and offline SFT/DPO steps on them."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from trinity_like.buffer import ReplayReader, count_rows, list_segments, query
from trinity_like.buffer.ingest import RecordError, ingest_files, record_to_experiences
from trinity_like.common.chat import (
    ChatFormatError,
    continuation_ids,
    normalize_messages,
    render_ids,
    split_conversation,
    split_conversation_turns,
)
from trinity_like.common.tokenizer import hf_tokenizer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}}}}]


def _call(cid, expr):
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": cid, "type": "function", "function": {"name": "calculator",
                                                     "arguments": json.dumps({"expression": expr})}}]}


AGENT = [{"role": "user", "content": "12+30="}, _call("c0", "12+30"),
         {"role": "tool", "tool_call_id": "c0", "content": "42"}, {"role": "assistant", "content": "42"}]


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    return hf_tokenizer(tiny_model_path)


@pytest.fixture(scope="module")
def template_tok(tiny_model_path):
    """A fresh copy of the tiny tokenizer with a small chat template (the tiny model has none)."""
    t = hf_tokenizer(tiny_model_path)
    t.chat_template = (
        "{% if tools %}### tools: {{ tools | length }}<|endoftext|>{% endif %}"
        "{% for m in messages %}### {{ m.role }}: {{ m.content }}"
        "{% for c in m.tool_calls or [] %}[call {{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}"
        "<|endoftext|>{% endfor %}"
        "{% if add_generation_prompt %}### assistant:{% endif %}"
        "{% if messages[-1].role == 'developer' %}{{ raise_exception('no developer role') }}{% endif %}")
    return t


def _masked(tok, response, mask):
    return tok.decode([t for t, m in zip(response, mask, strict=True) if m])


def _write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


# ---------------------------------------------------------------- common/chat.py


def test_plain_format_masks_by_hand(tok):
    msgs = normalize_messages([{"role": "system", "content": "add"}, {"role": "user", "content": "3+4="},
                               {"role": "assistant", "content": "7"}])
    prompt, response, mask = split_conversation(msgs, tok)
    assert tok.decode(prompt) == "<|system|>\nadd<|endoftext|><|user|>\n3+4=<|endoftext|>"
    header = tok.encode("<|assistant|>\n", add_special_tokens=False)
    # the response is the assistant header (context), then "7" and EOS (the policy's)
    assert response == header + tok.encode("7", add_special_tokens=False) + [tok.eos_token_id]
    assert mask == [False] * len(header) + [True, True]
    assert sum(mask) == len(tok.encode("7", add_special_tokens=False)) + 1


def test_plain_render_then_continuation_is_the_whole_render(tok):
    history = normalize_messages(AGENT[:2])
    new = normalize_messages(AGENT[2:3])
    for tools in (None, TOOLS):
        whole = render_ids(history + new, tok, tools=tools)
        assert render_ids(history, tok, add_generation_prompt=False, tools=tools) + \
            continuation_ids(history, new, tok, tools=tools) == whole
        assert tok.decode(whole).endswith("<|tool|>\n42<|endoftext|><|assistant|>\n")
    # a multi-turn chat, extended one user turn at a time
    chat = normalize_messages([{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"},
                               {"role": "user", "content": "and 2+2="}, {"role": "assistant", "content": "4"},
                               {"role": "user", "content": "good"}])
    for k in (2, 4):
        assert render_ids(chat[:k], tok, add_generation_prompt=False) + \
            continuation_ids(chat[:k], chat[k:k + 1], tok) == render_ids(chat[:k + 1], tok)


def test_tool_calls_render_hermes_style_and_only_the_agent_is_trained(tok):
    msgs = normalize_messages(AGENT)
    prompt, response, mask, ends = split_conversation_turns(msgs, tok, TOOLS)
    assert tok.decode(prompt) == ("<|system|>\nTools:\n" + json.dumps(TOOLS[0]) + "<|endoftext|>"
                                  "<|user|>\n12+30=<|endoftext|>")
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12+30"}}</tool_call>'
    assert tok.decode(response) == (f"<|assistant|>\n{call}<|endoftext|><|tool|>\n42<|endoftext|>"
                                    "<|assistant|>\n42<|endoftext|>")
    # trained: the tool call and its EOS, the final answer and its EOS; never the tool's answer or headers
    assert _masked(tok, response, mask) == f"{call}<|endoftext|>42<|endoftext|>"
    n_call = len(tok.encode(call, add_special_tokens=False))
    assert sum(mask) == n_call + 1 + len(tok.encode("42", add_special_tokens=False)) + 1
    assert ends == [i for i, t in enumerate(response) if t == tok.eos_token_id and mask[i]]
    assert len(ends) == 2 and ends[-1] == len(response) - 1


def test_chat_template_masks_and_continuation(template_tok):
    t = template_tok
    msgs = normalize_messages(AGENT)
    prompt, response, mask, ends = split_conversation_turns(msgs, t, TOOLS)
    assert t.decode(prompt) == "### tools: 1<|endoftext|>### user: 12+30=<|endoftext|>"
    call = '[call calculator {"expression": "12+30"}]'
    assert t.decode(response) == (f"### assistant: {call}<|endoftext|>### tool: 42<|endoftext|>"
                                  "### assistant: 42<|endoftext|>")
    # the generation prompt "### assistant:" is context; the assistant's text and its end token are trained
    assert _masked(t, response, mask) == f" {call}<|endoftext|> 42<|endoftext|>"
    assert [response[i] for i in ends] == [t.eos_token_id] * 2
    # an explicit prompt length keeps earlier assistant turns as context
    _, response2, mask2 = split_conversation(msgs, t, TOOLS, prompt_messages=3)
    assert _masked(t, response2, mask2) == " 42<|endoftext|>"

    history, new = msgs[:2], msgs[2:3]
    cont = continuation_ids(history, new, t, tools=TOOLS)
    assert t.decode(cont) == "### tool: 42<|endoftext|>### assistant:"
    # the seams fall on the special end token, so piecewise and whole tokenisation agree here
    assert render_ids(history, t, add_generation_prompt=False, tools=TOOLS) + cont == \
        render_ids(history + new, t, tools=TOOLS)
    # the template's own refusal is a format error (a rejected record in ingest), not a crash
    with pytest.raises(ChatFormatError, match="refuses this conversation: no developer role"):
        split_conversation(normalize_messages([{"role": "developer", "content": "x"},
                                               {"role": "assistant", "content": "y"}]), t)


# ---------------------------------------------------------------- agent trajectories


def test_turn_rewards_sit_on_the_end_token_of_each_assistant_turn(tmp_path, tok, tiny_model_path):
    # two assistant turns in a row leave no gap in the mask: the ends still come from the rendering
    msgs = AGENT + [{"role": "assistant", "content": "done"}]
    rec = {"messages": msgs, "tools": TOOLS, "reward": 1.0, "turn_rewards": [0.25, 0.5, -1.0]}
    [e] = record_to_experiences(rec, "agent", len(tok), tok)
    _, _, _, ends = split_conversation_turns(normalize_messages(msgs), tok, TOOLS)
    assert e.token_rewards.tolist() == [{ends[0]: 0.25, ends[1]: 0.5, ends[2]: -1.0}.get(i, 0.0)
                                        for i in range(len(e.response_ids))]
    assert ends[2] == ends[1] + 1 + len(tok.encode("<|assistant|>\n", add_special_tokens=False)) + \
        len(tok.encode("done", add_special_tokens=False))
    assert e.info == {"tools": TOOLS} and e.source == "agent" and e.reward == 1.0 and e.model_version == -1

    bad = [
        {**rec, "turn_rewards": [1.0]},                                 # 1: one per assistant turn
        {**rec, "turn_rewards": [1.0, "x", 0.0]},                       # 2: numbers
        {**rec, "tools": {"name": "calculator"}},                       # 3: a list
        {"prompt_ids": [5], "response_ids": [6], "turn_rewards": [1]},  # 4: chat records only
        {**rec, "colour": "red"},                                       # 5: still no unknown fields
        {**rec, "messages": [{"role": "user", "content": "x"}]},        # 6: no assistant
    ]
    report = ingest_files([_write(tmp_path / "bad.jsonl", bad)], tmp_path / "buf", source="agent",
                          tokenizer_path=tiny_model_path)
    reasons = {r["line"]: r["reason"] for r in report.rejected}
    assert report.accepted == 0 and sorted(reasons) == [1, 2, 3, 4, 5, 6]
    assert "one per assistant turn" in reasons[1] and "finite numbers" in reasons[2]
    assert "tools must be a list" in reasons[3] and "belong to chat records" in reasons[4]
    assert "unknown field(s) colour" in reasons[5] and reasons[6].startswith("messages:")


# ---------------------------------------------------------------- preference pairs


PAIR = {"prompt": "2+3=", "chosen": "5", "rejected": "6"}


def test_a_preference_pair_is_two_rows_of_one_group(tmp_path, tok, tiny_model_path):
    chosen, rejected = record_to_experiences(PAIR, None, len(tok), tok)
    assert chosen.group_id == rejected.group_id and chosen.eid != rejected.eid
    assert (chosen.reward, rejected.reward) == (1.0, 0.0)
    assert (chosen.info["preference"], rejected.info["preference"]) == ("chosen", "rejected")
    assert chosen.source == rejected.source == "human"
    assert list(chosen.prompt_ids) == list(rejected.prompt_ids) == tok.encode("<|user|>\n2+3=<|endoftext|>")
    assert _masked(tok, chosen.response_ids, chosen.action_mask) == "5<|endoftext|>"
    assert _masked(tok, rejected.response_ids, rejected.action_mask) == "6<|endoftext|>"
    assert chosen.messages == [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"}]
    # --source and the record's own source win over the default
    assert {e.source for e in record_to_experiences(PAIR, "agent", len(tok), tok)} == {"agent"}
    assert {e.source for e in record_to_experiences({**PAIR, "source": "import"}, "agent", len(tok), tok)} == \
        {"import"}
    # a prompt with history (under `messages`): the earlier assistant turn is context, not trained
    hist = {"messages": [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"},
                         {"role": "user", "content": "2+2="}],
            "chosen": [{"role": "assistant", "content": "4"}], "rejected": {"content": "5"}, "tools": TOOLS}
    c, r = record_to_experiences(hist, None, len(tok), tok)
    assert _masked(tok, c.response_ids, c.action_mask) == "4<|endoftext|>"
    assert _masked(tok, r.response_ids, r.action_mask) == "5<|endoftext|>"
    assert "<|assistant|>\n2<|endoftext|>" in tok.decode(c.prompt_ids) and c.info["tools"] == TOOLS


def test_pairs_dedupe_on_reingest_and_a_bad_pair_is_rejected_whole(tmp_path, tok, tiny_model_path):
    src = _write(tmp_path / "pairs.jsonl", [
        PAIR,                                                                      # 1: ok
        {**PAIR, "prompt": "1+1=", "rejected": [{"role": "assistant", "content": "3"}, {"role": "critic"}]},  # 2
        {"prompt": "4+4=", "chosen": "8"},                                         # 3: no rejected
        {**PAIR, "prompt": "3+3=", "chosen": "6", "rejected": [{"role": "user", "content": "7"}]},  # 4
        {**PAIR, "reward": 1.0},                                                   # 5: the pair sets rewards
        {**PAIR, "messages": "2+3="},                                              # 6: two prompts
        {"prompt": "4+0=", "chosen": "4", "rejected": "40"},                       # 7: ok
    ])
    buf = tmp_path / "buf"
    report = ingest_files([src], buf, tokenizer_path=tiny_model_path)
    reasons = {r["line"]: r["reason"] for r in report.rejected}
    assert report.accepted == 4 and sorted(reasons) == [2, 3, 4, 5, 6]
    assert reasons[2].startswith("rejected[1]: role must be one of")  # the field and the message at fault
    assert "rejected is missing" in reasons[3]
    assert reasons[4].startswith("rejected[0]: the completion must start with an assistant message")
    assert "unknown field(s) reward" in reasons[5] and "prompt or messages" in reasons[6]
    rows = query(buf).to_pylist()
    groups = {}
    for row in rows:
        groups.setdefault(row["group_id"], []).append((row["reward"], json.loads(row["info"])["preference"]))
    assert sorted(map(sorted, groups.values())) == [[(0.0, "rejected"), (1.0, "chosen")]] * 2  # never half a pair
    again = ingest_files([src], buf, tokenizer_path=tiny_model_path)
    assert again.accepted == 0 and again.duplicates == 4 and count_rows(buf) == 4 and len(list_segments(buf)) == 1


# ---------------------------------------------------------------- the example files


def test_every_example_file_ingests_without_rejects(tmp_path, tiny_model_path):
    expected = {"human/demonstrations.jsonl": (8, "human"), "human/preferences.jsonl": (12, "human"),
                "agent/trajectories.jsonl": (3, "agent")}
    for name, (rows, source) in expected.items():
        buf = tmp_path / name.replace("/", "-")
        report = ingest_files([EXAMPLES / name], buf, source=None if "preferences" in name else source,
                              tokenizer_path=tiny_model_path)
        assert (report.accepted, report.rejected) == (rows, []), name
        assert set(query(buf).column("source").to_pylist()) == {source}
    agent = query(tmp_path / "agent-trajectories.jsonl").to_pylist()
    assert all(json.loads(r["info"])["tools"][0]["function"]["name"] == "calculator" for r in agent)
    assert sum(r["token_rewards"] is not None for r in agent) == 2
    # the CLI: the pairs default to source human, and a second ingest adds nothing
    cli = [sys.executable, "-m", "trinity_like.cli", "buffer", "ingest", str(EXAMPLES / "human/preferences.jsonl"),
           "--buffer", str(tmp_path / "human-preferences.jsonl"), "--tokenizer", tiny_model_path, "--json"]
    proc = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["duplicates"] == 12


def test_example_demonstrations_load_as_warmup_demonstrations(tok):
    from trinity_like.buffer.ingest import read_records
    from trinity_like.warmup import demonstration_experiences

    exps = demonstration_experiences(read_records(EXAMPLES / "human/demonstrations.jsonl"), tok, "examples")
    assert len(exps) == 8 and tok.decode(exps[0].prompt_ids) == "3+4="
    assert list(exps[0].response_ids) == tok.encode("7") + [tok.eos_token_id]


# ---------------------------------------------------------------- offline trainer steps on them


def _offline_trainer(tmp_path, model_path, source, *overrides):
    from trinity_like.config import load_config
    from trinity_like.trainer.ppo import PPOTrainer

    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}",
                             "trainer.device=cpu", "explorer.device=cpu",
                             "mode=offline",
                             f"buffer.replay_sources=[{source}]", "trainer.optimizer.lr=0.01", *overrides])
    trainer = PPOTrainer(cfg)
    trainer.prepare()
    batches = ReplayReader(cfg.buffer.replay_sources, batch_size=cfg.train_batch_size, seed=cfg.seed).epoch(0)
    return trainer, next(batches)


def test_offline_dpo_on_ingested_pairs_and_sft_on_ingested_demos(tmp_path, tiny_model_path):
    prefs, demos = tmp_path / "prefs", tmp_path / "demos"
    assert ingest_files([EXAMPLES / "human/preferences.jsonl"], prefs, tokenizer_path=tiny_model_path).accepted == 12
    assert ingest_files([EXAMPLES / "human/demonstrations.jsonl"], demos, "human", tiny_model_path).accepted == 8

    trainer, batch = _offline_trainer(tmp_path / "dpo", tiny_model_path, prefs, "algorithm.policy_loss=dpo",
                                      "explorer.repeat_times=2", "explorer.batch_size=6",
                                      "trainer.micro_batch_size=4", "algorithm.dpo_beta=0.5")
    assert len(batch) == 12 and all(e.logprobs is None and e.model_version == -1 for e in batch)
    first = trainer.train_step(batch)
    # before any update the policy is the reference: h = 0 for every pair, so the loss is log 2
    assert first["actor/pg_loss"] == pytest.approx(math.log(2), abs=1e-5)
    second = trainer.train_step(batch)
    assert second["actor/pg_loss"] < math.log(2) and second["actor/dpo_accuracy"] > 0.5

    trainer, batch = _offline_trainer(tmp_path / "sft", tiny_model_path, demos, "algorithm.policy_loss=sft",
                                      "explorer.repeat_times=1", "explorer.batch_size=8")
    assert len(batch) == 8 and {e.source for e in batch} == {"human"}
    nll = [trainer.train_step(batch)["actor/sft_nll"] for _ in range(2)]
    assert all(math.isfinite(x) for x in nll) and nll[1] < nll[0]


def test_record_errors_are_record_errors(tok):
    with pytest.raises(RecordError, match="needs --tokenizer"):
        record_to_experiences(PAIR, None, None, None)


def test_dpo_with_an_off_policy_correction_is_refused_on_load(tmp_path):
    from trinity_like.config import ConfigError, load_config

    # quickstart sets algorithm.off_policy.correction=decoupled; dpo_loss takes no IS weights
    with pytest.raises(ConfigError, match="off_policy.correction=none"):
        load_config(None, ["algorithm.policy_loss=dpo", "explorer.repeat_times=2",
                           "algorithm.off_policy.correction=decoupled"])
