"""The prompt token limit (``explorer.max_prompt_tokens``, ``prompt_truncation``, ``filter_overlong_prompts``;
verl's ``data.max_prompt_length``, ``data.truncation``, ``data.filter_overlong_prompts``) with the tiny model's
tokenizer, which encodes every digit as one token (no BOS), so a prompt of digits is cut at digit boundaries
that can be worked out by hand."""

import asyncio

import pytest

from trinity_like.algorithms.rewards import load_reward_manager
from trinity_like.common.chat import render_ids
from trinity_like.common.errors import ConfigError, RunError
from trinity_like.common.tasks import Task, limit_prompts, prompt_ids, truncate_ids
from trinity_like.common.tokenizer import hf_tokenizer
from trinity_like.config import Config, EvalTasksetConfig, SamplingConfig, load_config
from trinity_like.explorer.engines.hf_engine import HFEngine
from trinity_like.explorer.evaluation import apply_prompt_limit, evaluate
from trinity_like.explorer.workflows import WorkflowContext, load_workflow

LONG = Task("long", "1234567890", "0")  # 10 tokens
SHORT = Task("short", "1+2=", "3")  # 4 tokens


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    return hf_tokenizer(tiny_model_path)


def test_the_digits_are_one_token_each(tok):
    assert len(tok.encode(LONG.prompt)) == 10 and tok.decode(tok.encode(LONG.prompt)) == LONG.prompt
    assert len(tok.encode(SHORT.prompt)) == 4


@pytest.mark.parametrize(("truncation", "limit", "kept"), [
    ("left", 4, "7890"),  # the last 4
    ("right", 4, "1234"),  # the first 4
    ("middle", 4, "12" + "90"),  # first 4 // 2 = 2, last 4 - 2 = 2
    ("middle", 5, "12" + "890"),  # first 5 // 2 = 2, last 5 - 2 = 3
])
def test_truncation_keeps_the_hand_worked_slice(tok, truncation, limit, kept):
    [cut, short] = limit_prompts([LONG, SHORT], tok, limit, truncation, source="t")
    assert prompt_ids(cut, tok) == tok.encode(kept) and cut.prompt == kept
    assert (cut.task_id, cut.answer) == (LONG.task_id, LONG.answer)
    assert short is SHORT  # within the limit: untouched
    assert truncate_ids(tok.encode(LONG.prompt), limit, truncation) == tok.encode(kept)


def test_a_prompt_exactly_at_the_limit_is_kept_whole(tok):
    assert limit_prompts([LONG], tok, 10, "error") == [LONG]


def test_filtering_drops_exactly_the_overlong_tasks(tok, caplog):
    tasks = [SHORT, LONG, Task("five", "12345", "0"), Task("twelve", "123456789012", "0"), Task("six", "123456", "0")]
    with caplog.at_level("WARNING"):
        kept = limit_prompts(tasks, tok, 6, "error", filter_overlong=True, source="the training task set")
    assert [t.task_id for t in kept] == ["short", "five", "six"]
    assert kept == [tasks[0], tasks[2], tasks[4]]  # the others are not cut
    assert "dropped 2 of 5 tasks" in caplog.text and "the training task set" in caplog.text
    with pytest.raises(RunError, match="dropped all 2 tasks of eval task set 'x'.*shortest has 10 tokens"):
        limit_prompts([LONG, tasks[3]], tok, 6, "left", filter_overlong=True, source="eval task set 'x'")


def test_error_names_the_task_its_length_the_limit_and_the_fixes(tok):
    tasks = [SHORT, LONG, Task("twelve", "123456789012", "0")]
    with pytest.raises(RunError) as e:
        limit_prompts(tasks, tok, 6, "error", source="the training task set")
    msg = str(e.value)
    assert "task 'long' of the training task set has a prompt of 10 tokens" in msg
    assert "explorer.max_prompt_tokens=6 (and 1 more" in msg
    assert "prompt_truncation" in msg and "filter_overlong_prompts" in msg


def test_no_limit_leaves_every_task_as_it_was(tok):
    tasks = [SHORT, LONG]
    assert limit_prompts(tasks, tok, 0, "left", filter_overlong=True) is tasks
    assert apply_prompt_limit(Config(), tok, tasks, "t") is tasks  # the default is no limit
    assert prompt_ids(LONG, tok) == tok.encode(LONG.prompt)


def test_chat_message_tasks_are_counted_after_the_chat_template(tok):
    chat = Task("chat", "1+2=", "3", messages=({"role": "system", "content": "Add."}, {"role": "user", "content": "1+2="}))
    rendered = render_ids(list(chat.messages), tok, add_generation_prompt=True)
    assert len(rendered) > 10 > len(tok.encode(chat.prompt))  # over the limit only with the template
    with pytest.raises(RunError, match=f"task 'chat' of t has a prompt of {len(rendered)} tokens"):
        limit_prompts([chat], tok, 10, "error", source="t")
    [cut] = limit_prompts([chat], tok, 10, "right")
    assert prompt_ids(cut, tok) == rendered[:10]
    assert cut.prompt == tok.decode(rendered[:10], skip_special_tokens=True)
    with pytest.raises(RunError, match="dropped all 1 tasks"):
        limit_prompts([chat], tok, 10, "right", filter_overlong=True)


def test_config_names_the_valid_truncations_and_refuses_a_policy_without_a_limit():
    with pytest.raises(ConfigError, match="explorer.prompt_truncation.*'top'.*error, left, right, middle"):
        load_config(None, ["explorer.max_prompt_tokens=8", "explorer.prompt_truncation=top"])
    for override in ("explorer.prompt_truncation=left", "explorer.filter_overlong_prompts=true"):
        with pytest.raises(ConfigError, match="max_prompt_tokens, which is 0"):
            load_config(None, [override])
    cfg = load_config(None, ["explorer.max_prompt_tokens=8", "explorer.prompt_truncation=middle",
                             "explorer.filter_overlong_prompts=true"])
    assert (cfg.explorer.max_prompt_tokens, cfg.explorer.prompt_truncation) == (8, "middle")


class RecordingEngine:
    """The fleet's ``generate`` / ``generate_spread`` over one in-process HFEngine, recording the prompts."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine, self.prompts = engine, []

    async def generate(self, prompts, sampling, seeds):
        self.prompts += [list(p) for p in prompts]
        return self.engine.generate(prompts, sampling, seeds)

    generate_spread = generate


def test_rollouts_and_evaluation_see_the_same_cut_prompt(tok, tiny_model_path):
    cfg = load_config(None, ["explorer.max_prompt_tokens=4", "explorer.prompt_truncation=left"])
    [cut] = apply_prompt_limit(cfg, tok, [LONG], "t")
    kept = tok.encode("7890")
    engine = RecordingEngine(HFEngine(tiny_model_path, device="cpu"))
    reward_manager = load_reward_manager(cfg, tok)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=2)

    def ctx():
        return WorkflowContext(sampling=sampling, repeat_times=2, seeds=[1, 2], tokenizer=tok,
                               reward_manager=reward_manager, max_turns=1)

    for name in ("single_turn", "tool_agent"):  # tool_agent without tools: its first prompt is the task's
        exps = asyncio.run(load_workflow(name).run(cut, engine, ctx()))
        assert [list(e.prompt_ids) for e in exps] == [kept, kept]
    [group] = asyncio.run(load_workflow("single_turn").run_batch([cut], engine, [ctx()]))
    assert [list(e.prompt_ids) for e in group] == [kept, kept]
    engine.prompts.clear()
    asyncio.run(evaluate(engine, ctx(), "t", [cut], EvalTasksetConfig(name="t", k=1)))
    assert engine.prompts == [kept]
    guess = asyncio.run(load_workflow("guess_number").run(cut, engine, ctx()))[0]
    assert tok.decode(list(guess.prompt_ids)).endswith(" 7890")  # its instruction, then the cut prompt
