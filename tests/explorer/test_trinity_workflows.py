"""Trinity-RFT workflows run here (``trinity_like.explorer.trinity_api``): the built-ins under Trinity's names, and
users' own files (tests/explorer/trinity_user/, only their imports changed), on the real tiny model in an
in-process HFEngine (no Ray)."""

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from trinity_like.algorithms.trinity_rewards import MathRewardFn
from trinity_like.common.errors import ConfigError, RunError
from trinity_like.common.plugins import PLUGIN_DIRS_ENV, PluginError, import_plugins
from trinity_like.common.tasks import Task
from trinity_like.common.tokenizer import hf_tokenizer
from trinity_like.config import Config, SamplingConfig
from trinity_like.config.schema import TasksetConfig
from trinity_like.explorer.engines.base import render_chat
from trinity_like.explorer.engines.hf_engine import HFEngine
from trinity_like.explorer.rollout import RolloutParts
from trinity_like.explorer.trinity_api import MATH_SYSTEM_PROMPT
from trinity_like.explorer.trinity_envs import FrozenLake, parse_action, random_map
from trinity_like.explorer.workflow_base import WORKFLOWS, WorkflowContext, workflow_metrics
from trinity_like.explorer.workflows import check_workflow_config, load_workflow

USER = Path(__file__).parent / "trinity_user"
SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=6)
GSM8K = Task("gsm8k-0", "Natalia sold 48 clips in April and half as many in May. How many in all?",
             "Natalia sold 48/2 = 24 clips in May.\n#### 72", "openai/gsm8k")


class LocalEngine:
    """The fleet's ``generate`` over one in-process engine; records every call's (prompts, seeds, sampling)."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine
        self.calls: list[tuple[list[list[int]], list[int], SamplingConfig]] = []
        self.version = 0

    async def generate(self, prompts, sampling, seeds):
        self.calls.append(([list(p) for p in prompts], list(seeds), sampling))
        return self.engine.generate(prompts, sampling, seeds)


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return HFEngine(tiny_model_path, device="cpu"), hf_tokenizer(tiny_model_path)


def _ctx(tokenizer, taskset=None, repeat=3, sampling=SAMPLING):
    return WorkflowContext(sampling=sampling, repeat_times=repeat, seeds=[100 + j for j in range(repeat)],
                           tokenizer=tokenizer, reward_manager=SimpleNamespace(), taskset=taskset)


def _gsm8k_taskset(**kw) -> TasksetConfig:
    ts = TasksetConfig(**kw)
    ts.format.prompt_key, ts.format.response_key = "prompt", "answer"
    return ts


def test_math_workflow_sends_trinitys_system_prompt_and_scores_with_math_reward(model):
    hf, tok = model
    engine = LocalEngine(hf)
    exps = asyncio.run(load_workflow("math_workflow").run(GSM8K, engine, _ctx(tok, _gsm8k_taskset())))
    # one chat call of n=3 samples, the conversation Trinity sends: its system prompt, then the question
    prompt = render_chat([{"role": "system", "content": MATH_SYSTEM_PROMPT},
                          {"role": "user", "content": GSM8K.prompt}], tok)
    assert [c[0] for c in engine.calls] == [[prompt] * 3]
    assert engine.calls[0][1] == [100, 101, 102]  # the task's seeds, as single_turn uses them
    direct = hf.generate([prompt] * 3, SAMPLING, [100, 101, 102])
    fn = MathRewardFn()
    assert len(exps) == 3
    for e, s in zip(exps, direct, strict=True):
        assert e.prompt_ids.tolist() == prompt
        assert e.response_ids.tolist() == s.response_ids.tolist()
        np.testing.assert_allclose(e.logprobs, s.logprobs, rtol=1e-6)
        parts = fn(response=e.response_text, truth=GSM8K.answer)
        assert e.info["reward_parts"] == parts and e.reward == pytest.approx(sum(parts.values()))
        assert e.action_mask is None and e.model_version == 0 and e.task_id == GSM8K.task_id
    metrics = workflow_metrics(e.info for e in exps)
    assert metrics["rollout/reward/format_score"] == pytest.approx(np.mean([e.info["reward_parts"]["format_score"]
                                                                           for e in exps]))


def test_single_turn_scores_with_the_tasksets_trinity_reward_fn(model):
    hf, tok = model
    ts = _gsm8k_taskset(reward_fn="format_reward", reward_fn_args={"pattern": r".*"})  # every response: +0.1
    exps = asyncio.run(load_workflow("single_turn").run(GSM8K, LocalEngine(hf), _ctx(tok, ts)))
    assert [e.reward for e in exps] == [pytest.approx(0.1)] * 3
    assert all(e.info["reward_parts"] == {"format_score": 0.1} for e in exps)


def test_math_boxed_workflow_use_base_prompts_with_plain_text(model):
    hf, tok = model
    engine = LocalEngine(hf)
    ts = _gsm8k_taskset(workflow_args={"use_base": True})
    exps = asyncio.run(load_workflow("math_boxed_workflow").run(GSM8K, engine, _ctx(tok, ts, repeat=2)))
    text = ("System:Please reason step by step, and put your final answer within \\boxed{}.\nUser:\n"
            f"{GSM8K.prompt}\nAssistant:\n")
    assert engine.calls[0][0] == [tok.encode(text)] * 2
    assert [set(e.info["reward_parts"]) for e in exps] == [{"accuracy", "format_score"}] * 2


def test_users_example_workflow_from_the_docs(model):
    hf, tok = model
    task = Task("q0", "What is 1+1?", "2", extra_info={"question": "What is 1+1?"})
    exps = asyncio.run(load_workflow(f"{USER / 'example_workflow.py'}:ExampleWorkflow").run(
        task, LocalEngine(hf), _ctx(tok)))
    prompt = render_chat([{"role": "user", "content": "Question:\nWhat is 1+1?"}], tok)
    direct = hf.generate([prompt] * 3, SAMPLING, [100, 101, 102])
    assert [e.response_ids.tolist() for e in exps] == [s.response_ids.tolist() for s in direct]
    # the workflow built its own Experiences: the version is the one its samples came from
    assert [e.model_version for e in exps] == [0, 0, 0]
    assert [e.reward for e in exps] == [float(tok.decode(s.response_ids.tolist(), skip_special_tokens=True) == "2")
                                        for s in direct]


def test_users_async_openai_workflow_records_history_one_run_per_sample(model):
    hf, tok = model
    engine = LocalEngine(hf)
    exps = asyncio.run(load_workflow(f"{USER / 'api_workflow.py'}:APIWorkflow").run(
        Task("h0", "hi", ""), engine, _ctx(tok)))
    # not repeatable: three runs, each its own instance, model wrapper and seed; eid.run numbers them
    assert [e.reward for e in exps] == [0.5] * 3
    assert [e.info["trinity_run"] for e in exps] == [0, 1, 2]
    assert sorted(c[1] for c in engine.calls) == [[100], [101], [102]]
    prompt = render_chat([{"role": "user", "content": "Hello!"}], tok)
    for e in exps:
        run = e.info["trinity_run"]
        s = hf.generate([prompt], SAMPLING, [100 + run])[0]
        assert e.response_ids.tolist() == s.response_ids.tolist()


def test_users_multi_turn_workflow_masks_the_assistant_turns(model):
    hf, tok = model
    task = Task("m0", "", "", extra_info={"contents": ["hello", "bye"]})
    exps = asyncio.run(load_workflow(f"{USER / 'multi_turn_workflow.py'}:DummyMultiTurnWorkflow").run(
        task, LocalEngine(hf), _ctx(tok, repeat=1)))
    assert len(exps) == 2  # one per content, as the workflow builds them
    last = exps[-1]
    # written by the workflow, not generated: the assistant messages' tokens are the trained ones, log-probs unknown
    assert last.logprobs is None and last.reward == 0.0
    masked = [t for t, m in zip(last.response_ids.tolist(), last.action_mask.tolist(), strict=True) if m]
    text = tok.decode(masked, skip_special_tokens=True)
    assert "HELLO" in text and "BYE" in text and "hello" not in text


def test_check_workflow_config_says_what_is_wrong_in_one_line(tmp_path):
    cfg = Config()
    check_workflow_config(cfg)  # single_turn: nothing to say
    for name, words in [("alfworld_workflow", "needs the alfworld package"), ("no_such_flow", "unknown workflow"),
                        ("email_search_workflow", "Enron")]:
        cfg.explorer.workflow = name
        with pytest.raises(ConfigError, match=words):
            check_workflow_config(cfg)
    bad = tmp_path / "bad.py"
    bad.write_text("from trinity_like.explorer.trinity_api import Workflow\n"
                   "class NoRun(Workflow):\n    is_async = True\n"
                   "class OldInit(Workflow):\n    def __init__(self, config):\n        pass\n    def run(self):\n"
                   "        return []\n")
    cfg.explorer.workflow = f"{bad}:NoRun"
    with pytest.raises(ConfigError, match="does not implement run_async"):
        check_workflow_config(cfg)
    cfg.explorer.workflow = f"{bad}:OldInit"
    with pytest.raises(ConfigError, match="task, model, auxiliary_models"):
        check_workflow_config(cfg)
    cfg.explorer.workflow = "simple_workflow"  # scores with the task set's reward function: it needs one
    with pytest.raises(ConfigError, match="set explorer.taskset.reward_fn"):
        check_workflow_config(cfg)
    cfg.explorer.taskset.reward_fn = "accuracy_reward"
    check_workflow_config(cfg)
    cfg.explorer.workflow = "math_workflow"
    cfg.explorer.taskset.reward_fn = f"{USER / 'bots_math_boxed_reward.py'}:BOTSMathBoxedRewardFn"
    check_workflow_config(cfg)  # the user's reward function builds and takes Trinity's call
    cfg.explorer.taskset.reward_fn = "rm_gallery_reward"
    with pytest.raises(ConfigError, match="rm-gallery"):
        check_workflow_config(cfg)


def test_users_reward_fn_from_a_file_scores_through_trinity_keywords():
    from trinity_like.algorithms.trinity_rewards import build_reward_fn, reward_parts

    fn = build_reward_fn(f"{USER / 'bots_math_boxed_reward.py'}:BOTSMathBoxedRewardFn")
    assert reward_parts(fn, "so \\boxed{5}", "5", with_think=True) == {"accuracy": 1.0, "format_score": -0.1}


def test_plugin_folders_register_trinity_workflows(tmp_path, monkeypatch):
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "my_flow.py").write_text(
        "from trinity_like.explorer.trinity_api import WORKFLOWS, Workflow\n"
        "@WORKFLOWS.register_module('my_plugin_flow_for_test')\n"
        "class MyFlow(Workflow):\n    def run(self):\n        return []\n")
    (folder / "__init__.py").write_text("raise RuntimeError('never imported')\n")
    monkeypatch.setenv(PLUGIN_DIRS_ENV, str(folder))
    assert import_plugins() == ["trinity_like_plugins.my_flow"]
    assert import_plugins([str(folder)]) == []  # once per process
    assert "my_plugin_flow_for_test" in WORKFLOWS
    with pytest.raises(PluginError, match="is not a folder"):
        import_plugins([str(tmp_path / "missing")])
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "oops.py").write_text("import no_such_module_here\n")
    monkeypatch.delenv(PLUGIN_DIRS_ENV)
    cfg = Config()
    cfg.explorer.plugin_dirs = [str(broken)]
    with pytest.raises(ConfigError, match="oops.py' failed to import: ModuleNotFoundError"):
        check_workflow_config(cfg)


def test_frozen_lake_plays_a_known_episode():
    lake = FrozenLake(["SFFF", "FHFH", "FFFH", "HFFG"])
    lake.reset(0)
    assert lake.render().split("\n")[0] == " P \t _ \t _ \t _ \t"
    down, right = 2, 3
    # (0,0) -D-> (1,0) -D-> (2,0) -R-> (2,1) -R-> (2,2) -D-> (3,2) -R-> (3,3) goal
    steps = [lake.step(a) for a in (down, down, right, right, down, right)]
    assert steps == [(0.0, False)] * 5 + [(1.0, True)]
    assert lake.success() and lake.render().split("\n")[3] == " O \t _ \t _ \t √ \t"
    lake.reset(0)
    assert [lake.step(a) for a in (right, down)] == [(0.0, False), (0.0, True)]  # (0,1) then the hole at (1,1)
    assert lake.render().split("\n")[1] == " _ \t X \t _ \t O \t"
    lake.reset(0)
    assert lake.step(1) == (0.0, False) and lake.pos == (0, 0)  # left at the edge: no move
    # a map from a seed is the same every time, with a start, a goal and a path of at most 8 steps
    assert random_map(4, 0.8, 42, 8) == random_map(4, 0.8, 42, 8)
    assert "".join(random_map(4, 0.8, 42, 8)).count("S") == 1
    assert parse_action("think\n```Up```") == 4 and parse_action("```left``` then ```2```") == 2
    assert parse_action("up") == 0


def test_frozen_lake_workflow_is_one_multi_turn_experience(model):
    hf, tok = model
    ts = _gsm8k_taskset(workflow_args={"desc": ["SFFF", "FHFH", "FFFH", "HFFG"], "agent_max_steps": 2})
    engine = LocalEngine(hf)
    exps = asyncio.run(load_workflow("frozen_lake_workflow").run(Task("f0", "", ""), engine, _ctx(tok, ts, 1)))
    (e,) = exps
    assert len(engine.calls) == 2 and e.info["env_steps"] == 2  # the tiny model never reaches the goal in two
    assert e.reward == e.info["test_score"] == 0.0
    # every generated token is trained (with its log-prob), the environment's turn is not
    generated = sum(len(hf.generate(c[0], c[2], c[1])[0].response_ids) for c in engine.calls)
    assert int(e.action_mask.sum()) == generated
    assert np.all(e.logprobs[~e.action_mask] == 0.0)
    # turn 2's prompt is turn 1's prompt + its response + the environment's message: one token sequence
    first, second = engine.calls[0][0][0], engine.calls[1][0][0]
    assert e.prompt_ids.tolist() == first and second[:len(first)] == first


def test_a_step_whose_every_task_fails_with_one_error_stops_the_run():
    cfg = Config()
    parts = SimpleNamespace(cfg=cfg, task_errors={3: ["TypeError: f() takes 1 argument"] * cfg.explorer.batch_size},
                            ok_steps=set())
    finished = [(3, i, None, None) for i in range(cfg.explorer.batch_size)]
    with pytest.raises(RunError, match="failed on all 4 tasks .* TypeError: f\\(\\) takes 1 argument"):
        RolloutParts.check_task_errors(parts, finished)
    parts.task_errors[3][0] = "ValueError: other"  # two errors: the step goes on
    RolloutParts.check_task_errors(parts, finished)
    parts.task_errors[3] = ["TypeError: x"] * 4
    parts.ok_steps.add(3)  # a task of the step succeeded: the workflow works
    RolloutParts.check_task_errors(parts, finished)


SYNC_CLIENT_WORKFLOW = '''
from trinity_like.explorer.trinity_api import Workflow


class SyncClientWorkflow(Workflow):
    can_repeat = True

    def set_repeat_times(self, repeat_times, run_id_base):
        self.n = repeat_times

    def run(self):
        client = self.model.get_openai_client()
        model = client.models.list().data[0].id
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "2+2="}], n=self.n)
        exps = self.model.extract_experience_from_history()
        for exp, choice in zip(exps, reply.choices):
            exp.reward = float(len(choice.message.content))
            exp.info["logprob_sum"] = sum(t.logprob for t in choice.logprobs.content)
        return exps
'''


def test_a_sync_workflow_through_the_in_process_openai_client(model, tmp_path):
    hf, tok = model
    path = tmp_path / "client_flow.py"
    path.write_text(SYNC_CLIENT_WORKFLOW)
    exps = asyncio.run(load_workflow(f"{path}:SyncClientWorkflow").run(Task("c0", "", ""), LocalEngine(hf), _ctx(tok)))
    prompt = render_chat([{"role": "user", "content": "2+2="}], tok)
    direct = hf.generate([prompt] * 3, SAMPLING, [100, 101, 102])
    for e, s in zip(exps, direct, strict=True):
        text = tok.decode(s.response_ids.tolist(), skip_special_tokens=True)
        assert e.response_ids.tolist() == s.response_ids.tolist() and e.reward == float(len(text))
        # the completion's token log-probs are the engine's behaviour log-probs
        assert e.info["logprob_sum"] == pytest.approx(float(s.logprobs.sum()), rel=1e-5)


def test_reply_prefix_is_continued_not_closed(model):
    hf, tok = model
    ts = _gsm8k_taskset(reward_fn="format_reward")
    ts.format.reply_prefix = "The answer is"
    engine = LocalEngine(hf)
    asyncio.run(load_workflow("simple_workflow").run(GSM8K, engine, _ctx(tok, ts, repeat=1)))
    sent = engine.calls[0][0][0]
    opened = render_chat([{"role": "user", "content": GSM8K.prompt}], tok)  # ... <|assistant|>\n
    assert sent[:len(opened)] == opened
    assert tok.decode(sent[len(opened):]) == "The answer is"  # no end of turn after the prefix


def test_a_rows_own_workflow_reward_fn_and_raw_task(model):
    from trinity_like.explorer.workflows import PerTaskWorkflow

    hf, tok = model
    ts = _gsm8k_taskset()
    ts.format.prompt_key, ts.format.response_key = "question", "answer"
    row = {"question": "How many legs has a cat?", "answer": "4"}
    plain = Task("r0", "ignored", "4", raw_task=row)
    boxed = dataclasses.replace(plain, task_id="r1", workflow="math_boxed_workflow")
    scored = dataclasses.replace(plain, task_id="r2", reward_fn="format_reward")
    engine = LocalEngine(hf)
    flow = PerTaskWorkflow("math_workflow")
    by_math, by_boxed, by_format = (asyncio.run(flow.run(t, engine, _ctx(tok, ts, repeat=1)))[0]
                                    for t in (plain, boxed, scored))
    # the prompt is the row's question (format.prompt_key), under each workflow's system prompt
    assert engine.calls[0][0][0] == render_chat([{"role": "system", "content": MATH_SYSTEM_PROMPT},
                                                 {"role": "user", "content": row["question"]}], tok)
    assert "boxed" in tok.decode(engine.calls[1][0][0])
    assert set(by_math.info["reward_parts"]) == {"accuracy", "format_score"}
    assert by_boxed.info["reward_parts"]["format_score"] == 0.0  # math_boxed_reward without with_think
    assert set(by_format.info["reward_parts"]) == {"format_score"}  # the row's reward_fn, not math_reward
    # single_turn scores with the row's reward_fn too
    (e,) = asyncio.run(load_workflow("single_turn").run(scored, engine, _ctx(tok, ts, repeat=1)))
    assert set(e.info["reward_parts"]) == {"format_score"}
