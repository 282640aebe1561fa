"""SingleTurnWorkflow's greedy baseline (ReMax) with the real tiny model in an in-process HFEngine (no Ray)."""

import asyncio

import pytest

from trinity_like.common.tasks import Task
from trinity_like.common.tokenizer import hf_tokenizer
from trinity_like.config import SamplingConfig
from trinity_like.explorer.engines.hf_engine import HFEngine
from trinity_like.explorer.workflows import SingleTurnWorkflow, WorkflowContext

SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=6)
TASKS = [Task("t0", "1+2=", "3"), Task("t1", "4+4=", "8")]


class LocalEngine:
    """The fleet's ``generate`` and ``generate_spread`` over one in-process engine; records each call's
    (prompts, temperature)."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine
        self.calls: list[tuple[int, float]] = []

    async def generate(self, prompts, sampling, seeds):
        self.calls.append((len(prompts), sampling.temperature))
        return self.engine.generate(prompts, sampling, seeds)

    generate_spread = generate


def _checksum(text: str) -> float:
    return float(sum(map(ord, text)) % 997)


class ChecksumReward:
    """A reward manager that scores a response by a checksum of its characters (different responses, different
    rewards: the tiny model's greedy answers to the two prompts differ)."""

    def score(self, responses, ground_truths, data_sources, response_lengths=None, *rest):
        return [_checksum(r) for r in responses], {"reward_failed": [False] * len(responses)}


@pytest.fixture(scope="module")
def engine_and_tokenizer(tiny_model_path):
    return HFEngine(tiny_model_path, device="cpu"), hf_tokenizer(tiny_model_path)


def _ctxs(tokenizer, greedy_baseline: bool) -> list[WorkflowContext]:
    return [WorkflowContext(sampling=SAMPLING, repeat_times=3, seeds=[10 * i + j for j in range(3)], tokenizer=tokenizer,
                            reward_manager=ChecksumReward(), greedy_baseline=greedy_baseline) for i in range(len(TASKS))]


def _greedy_reward(engine, tokenizer, task) -> float:
    """The reward of the greedy response to the task's prompt, computed apart from the workflow."""
    sample = engine.generate([tokenizer.encode(task.prompt)], SamplingConfig(temperature=0.0, max_new_tokens=6), [0])[0]
    return _checksum(tokenizer.decode(sample.response_ids.tolist(), skip_special_tokens=True))


def test_the_baseline_is_the_reward_of_the_greedy_response_for_every_sample_of_a_task(engine_and_tokenizer):
    engine, tokenizer = engine_and_tokenizer
    expected = [_greedy_reward(engine, tokenizer, task) for task in TASKS]
    assert expected[0] != expected[1]  # so a baseline given to the wrong task would show
    workflow = SingleTurnWorkflow()

    one_by_one, local = [], LocalEngine(engine)
    for task, ctx in zip(TASKS, _ctxs(tokenizer, True), strict=True):
        one_by_one.append(asyncio.run(workflow.run(task, local, ctx)))
    assert sorted(local.calls) == sorted([(3, 1.0), (1, 0.0)] * 2)  # per task: the samples, one greedy prompt
    batched_engine = LocalEngine(engine)
    batched = asyncio.run(workflow.run_batch(TASKS, batched_engine, _ctxs(tokenizer, True)))
    assert sorted(batched_engine.calls) == [(2, 0.0), (6, 1.0)]  # the step's samples, the step's greedy prompts

    for groups in (one_by_one, batched):
        for group, baseline in zip(groups, expected, strict=True):
            assert len(group) == 3  # the greedy response is not an experience
            assert [e.info["reward_baseline"] for e in group] == [baseline] * 3
    # the greedy call leaves the samples as they are without it
    plain = asyncio.run(workflow.run_batch(TASKS, LocalEngine(engine), _ctxs(tokenizer, False)))
    for with_baseline, without in zip(batched, plain, strict=True):
        assert [e.response_ids.tolist() for e in with_baseline] == [e.response_ids.tolist() for e in without]
        assert all("reward_baseline" not in e.info for e in without)


def test_guess_number_baseline_is_the_reward_of_a_greedy_episode(engine_and_tokenizer):
    from trinity_like.explorer.workflows import GuessNumberWorkflow

    engine, tokenizer = engine_and_tokenizer
    task = Task("g", "", "7")
    ctx = WorkflowContext(sampling=SAMPLING, repeat_times=2, seeds=[3, 4], tokenizer=tokenizer,
                          reward_manager=ChecksumReward(), max_turns=2)
    workflow, local = GuessNumberWorkflow(), LocalEngine(engine)
    plain = asyncio.run(workflow.run(task, local, ctx))
    greedy_alone = asyncio.run(workflow._episode(task, 7, local, WorkflowContext(
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=6), repeat_times=1, seeds=[3], tokenizer=tokenizer,
        reward_manager=ChecksumReward(), max_turns=2), 3))
    local.calls.clear()
    ctx.greedy_baseline = True
    with_baseline = asyncio.run(workflow.run(task, local, ctx))
    assert len(with_baseline) == 2  # the greedy episode is not an experience
    assert [e.info["reward_baseline"] for e in with_baseline] == [greedy_alone.reward] * 2
    assert any(t == 0.0 for _, t in local.calls)  # its turns were sampled greedily
    assert [e.response_ids.tolist() for e in with_baseline] == [e.response_ids.tolist() for e in plain]
    assert all("reward_baseline" not in e.info for e in plain)


class NewVersionEachCall(LocalEngine):
    """``LocalEngine`` whose weights change after every call: call k's samples come from version k."""

    def __init__(self, engine: HFEngine) -> None:
        super().__init__(engine)
        self.responses: list[list[int]] = []

    async def generate(self, prompts, sampling, seeds):
        samples = await super().generate(prompts, sampling, seeds)
        for s in samples:
            s.model_version = len(self.calls) - 1
        self.responses.append(samples[0].response_ids.tolist())
        return samples


def test_guess_number_gives_each_token_its_turns_version(engine_and_tokenizer):
    from trinity_like.explorer.workflows import GuessNumberWorkflow

    engine, tokenizer = engine_and_tokenizer
    ctx = WorkflowContext(sampling=SAMPLING, repeat_times=1, seeds=[3], tokenizer=tokenizer,
                          reward_manager=ChecksumReward(), max_turns=2)
    local = NewVersionEachCall(engine)
    task = Task("g", "", "-5")  # a secret the tiny model does not guess: both turns run
    (exp,) = asyncio.run(GuessNumberWorkflow().run(task, local, ctx))
    assert exp.info["turn_versions"] == [0, 1] and exp.model_version == 0
    versions = exp.token_versions.tolist()
    first = versions.count(0)  # turn 0's tokens and the environment's reply to it
    assert versions == [0] * first + [1] * (len(versions) - first)
    turn0, turn1 = local.responses
    response = exp.response_ids.tolist()
    assert response[:len(turn0)] == turn0 and response[first:first + len(turn1)] == turn1
    assert first > len(turn0)  # the reply to turn 0 took turn 0's version

    # one version throughout: stored as null, as before per-token versions existed
    (same,) = asyncio.run(GuessNumberWorkflow().run(task, LocalEngine(engine), ctx))
    assert same.token_versions is None and same.response_ids.tolist() == response
