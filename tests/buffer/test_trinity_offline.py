"""SFT/DPO data as Trinity-RFT reads it (its `trainer_input.experience_buffer` of storage_type file with a `format`)
given as an offline run's `buffer.replay_sources`: tokenised as it is read, as Trinity's SFTFormatter and
DPOFormatter tokenise it, never a traceback. Trinity's own data files (tests/common/data/trinity)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trinity_like.buffer.ingest import replay_table
from trinity_like.buffer.replay import ReplayReader, replay_data
from trinity_like.common.errors import UserError
from trinity_like.common.experience import table_to_experiences
from trinity_like.config import load_config
from trinity_like.config.schema import TaskFormatConfig

DATA = Path(__file__).parents[1] / "common" / "data" / "trinity"
TEMPLATE = (DATA / "custom_chat_template.j2").read_text()


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(tiny_model_path)
    t.chat_template = TEMPLATE
    return t


def _exps(path, model, **fmt):
    return table_to_experiences(replay_table(path, model, TaskFormatConfig(**fmt)))


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_messages_file_given_as_replay_data_is_refused_in_one_line_without_the_runs_model(tmp_path):
    # what used to crash with a traceback (Experience.from_json on a chat record)
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                             {"role": "assistant", "content": "Hello"}]}) + "\n")
    with pytest.raises(UserError, match=r"holds no Experience rows .*replay it in an offline run") as e:
        ReplayReader([path])
    assert "\n" not in str(e.value)


def test_plaintext_sft_is_tokenised_as_trinitys_sft_formatter_does(tiny_model_path, tok):
    rows = _rows(DATA / "sft_for_gsm8k" / "sft.jsonl")
    exps = _exps(DATA / "sft_for_gsm8k", tiny_model_path, prompt_type="plaintext", system_prompt="Be exact.",
                 chat_template=TEMPLATE)
    assert len(exps) == len(rows) == 8  # a row written twice is two samples, as Trinity reads it
    assert len({e.eid for e in exps}) == 8 and [e.info["row"] for e in exps] == list(range(8))
    for e, row in zip(exps, rows, strict=True):
        messages = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": row["prompt"]},
                    {"role": "assistant", "content": row["response"]}]
        # SFTFormatter: the whole conversation, prompt_length = the conversation but its last message with a
        # generation prompt
        full = tok.apply_chat_template(messages, tokenize=False)
        prompt = tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        assert tok.decode(list(e.prompt_ids) + list(e.response_ids)) == full
        trained = tok.decode([t for t, m in zip(e.response_ids, e.action_mask, strict=True) if m])
        # what Trinity trains: every token after prompt_length (the reply, its end token and the template's newline)
        assert trained == full[len(prompt):] == row["response"] + "<|im_end|>\n"
        assert e.source == "import" and e.reward is None


def test_messages_with_tools_trains_the_last_turn_or_every_turn(tiny_model_path, tok):
    rows = _rows(DATA / "sft_with_tools" / "sft_with_tools.jsonl")
    last = _exps(DATA / "sft_with_tools", tiny_model_path, prompt_type="messages", messages_key="messages",
                 chat_template=TEMPLATE)
    every = _exps(DATA / "sft_with_tools", tiny_model_path, prompt_type="messages", messages_key="messages",
                  chat_template=TEMPLATE, enable_concatenated_multi_turn=True)
    assert len(last) == len(every) == len(rows) == 4
    messages, tools = json.loads(rows[0]["messages"]), json.loads(rows[0]["tools"])
    assert last[0].info["tools"] == tools and "# Tools" in tok.decode(last[0].prompt_ids)
    masked = [tok.decode([t for t, m in zip(e.response_ids, e.action_mask, strict=True) if m]) for e in (last[0], every[0])]
    assert masked[0] == messages[-1]["content"] + "<|im_end|>\n"  # the last message only
    assert masked[1].startswith(messages[2]["content"]) and masked[1].endswith(messages[-1]["content"] + "<|im_end|>\n")
    assert "22" in tok.decode(every[0].response_ids)  # the tool's result (a JSON object in the file) as JSON text


def test_dpo_pairs_plaintext_and_messages(tmp_path, tiny_model_path):
    rows = _rows(DATA / "human_like" / "train.jsonl")
    exps = _exps(DATA / "human_like" / "train.jsonl", tiny_model_path)  # defaults: the columns decide
    assert len(exps) == 2 * len(rows) == 34
    assert [e.reward for e in exps[:4]] == [1.0, 0.0, 1.0, 0.0] and exps[0].group_id == exps[1].group_id
    assert list(exps[0].prompt_ids) == list(exps[1].prompt_ids) and list(exps[0].response_ids) != list(exps[1].response_ids)
    assert [e.info["preference"] for e in exps[:2]] == ["chosen", "rejected"] and exps[0].source == "human"
    # DPOFormatter's messages form: the prompt conversation, chosen/rejected as lists of assistant messages
    path = tmp_path / "dpo.jsonl"
    path.write_text(json.dumps({"conv": [{"role": "user", "content": "Name?"}],
                                "good": [{"role": "assistant", "content": "Assistant."}],
                                "bad": [{"role": "assistant", "content": "No."}]}) + "\n")
    pair = _exps(path, tiny_model_path, prompt_type="messages", messages_key="conv", chosen_key="good",
                 rejected_key="bad")
    assert [e.reward for e in pair] == [1.0, 0.0] and pair[0].messages[-1]["content"] == "Assistant."


def test_bad_sft_data_is_one_line_naming_the_file_row_and_fix(tmp_path, tiny_model_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "q", "solution": "s"}) + "\n")
    with pytest.raises(UserError, match=r"d.jsonl': its columns \(question, solution\) are neither Experience rows "
                                        r".*name its columns in buffer.replay_format"):
        replay_table(path, tiny_model_path, TaskFormatConfig())
    with pytest.raises(UserError, match=r"row 0 \(read as plaintext SFT/DPO data\): column 'answer' "
                                        r"\(format.response_key\) is missing or null"):
        replay_table(path, tiny_model_path, TaskFormatConfig(prompt_key="question", response_key="answer"))
    path.write_text(json.dumps({"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "u"}]})
                    + "\n")
    with pytest.raises(UserError, match=r"row 0 .*ends with a 'user' message"):
        replay_table(path, tiny_model_path, TaskFormatConfig())
    with pytest.raises(UserError, match=r"replay source 'nowhere.jsonl' does not exist"):
        ReplayReader(["nowhere.jsonl"])


def test_an_offline_trainer_trains_on_trinitys_sft_and_dpo_files(tmp_path, tiny_model_path):
    from trinity_like.trainer.ppo import PPOTrainer

    def trainer_and_batch(source, *overrides):
        cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}",
                                 "trainer.device=cpu", "explorer.device=cpu", "mode=offline",
                                 f"buffer.replay_sources=[{source}]", "trainer.optimizer.lr=0.01", *overrides])
        trainer = PPOTrainer(cfg)
        trainer.prepare()
        reader = ReplayReader(cfg.buffer.replay_sources, batch_size=cfg.train_batch_size, seed=cfg.seed,
                              data=replay_data(cfg))
        return trainer, next(reader.epoch(0))

    trainer, batch = trainer_and_batch(DATA / "sft_for_gsm8k", "algorithm.policy_loss=sft", "explorer.repeat_times=1",
                                       "explorer.batch_size=8", "buffer.replay_format.prompt_type=plaintext")
    assert len(batch) == 8
    nll = [trainer.train_step(batch)["actor/sft_nll"] for _ in range(2)]
    assert all(math.isfinite(x) for x in nll) and nll[1] < nll[0]
    trainer, batch = trainer_and_batch(DATA / "human_like", "algorithm.policy_loss=dpo", "explorer.repeat_times=2",
                                       "explorer.batch_size=4", "trainer.micro_batch_size=4", "algorithm.dpo_beta=0.5",
                                       "algorithm.off_policy.correction=none")
    assert len(batch) == 8
    assert trainer.train_step(batch)["actor/pg_loss"] == pytest.approx(math.log(2), abs=1e-5)


def _offline_cfg(tmp_path, model, *overrides):
    quickstart = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    return load_config(str(quickstart), [f"checkpoint_root_dir={tmp_path}", f"model.path={model}", "mode=offline",
                                         "warmup.sft_steps=0", "explorer.eval_tasksets=[]", "trainer.total_steps=2",
                                         "algorithm.policy_loss=sft", *overrides])


def test_replay_data_of_no_known_shape_is_refused_before_the_run_starts(tmp_path, tiny_model_path):
    from trinity_like.runtime.run_dir import prepare_run_dir

    cfg = _offline_cfg(tmp_path, tiny_model_path, f"buffer.replay_sources=[{DATA / 'gsm8k'}]")
    with pytest.raises(UserError, match=r"gsm8k/train.jsonl': its columns \(question, answer\) are neither") as e:
        prepare_run_dir(cfg)
    assert "\n" not in str(e.value) and not (tmp_path / "quickstart").exists()
    prepare_run_dir(_offline_cfg(tmp_path, tiny_model_path, f"buffer.replay_sources=[{DATA / 'gsm8k'}]",
                                 "buffer.replay_format.prompt_key=question", "buffer.replay_format.response_key=answer"))


@pytest.mark.slow
def test_an_offline_run_trains_on_trinitys_sft_folder(tmp_path, tiny_model_path, ray_session):
    from trinity_like.launcher import run

    cfg = _offline_cfg(tmp_path, tiny_model_path, f"buffer.replay_sources=[{DATA / 'sft_for_gsm8k'}]",
                       "buffer.replay_format.prompt_type=plaintext", "explorer.batch_size=4", "explorer.repeat_times=1",
                       "trainer.micro_batch_size=4")
    summary = run(cfg)
    assert summary["exit_reason"] == "completed" and summary["trainer_steps"] == 2


def test_buffer_ingest_takes_trinitys_sft_rows(tmp_path, tiny_model_path):
    from trinity_like.buffer.ingest import ingest_files

    report = ingest_files([DATA / "sft_for_gsm8k" / "sft.jsonl"], tmp_path / "buf", tokenizer_path=tiny_model_path)
    assert (report.accepted, report.duplicates, report.rejected) == (4, 4, [])  # the file holds each row twice
    report = ingest_files([DATA / "sft_for_gsm8k" / "sft.jsonl"], tmp_path / "buf2")
    assert report.accepted == 0 and "needs --tokenizer" in report.rejected[0]["reason"]
