"""The reward model: a sequence-classification head on the tiny model, in this process and in its own Ray actor,
and how its scores meet the reward function's in the reward managers."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import torch

from trinity_like.algorithms.rewards import (
    DAPORewardManager,
    NaiveRewardManager,
    compute_reward,
    load_reward_manager,
)
from trinity_like.common.chat import render_ids
from trinity_like.common.errors import ConfigError, UserError
from trinity_like.common.tasks import Task
from trinity_like.common.tiny_model import make_tiny_model
from trinity_like.common.tokenizer import hf_tokenizer
from trinity_like.config import load_config
from trinity_like.explorer.fleet import EngineFleet
from trinity_like.explorer.reward_model import RewardModel, reward_input, start_reward_model
from trinity_like.explorer.workflows import WorkflowContext, load_workflow


@pytest.fixture(scope="module")
def reward_model_path(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("rm") / "tiny-rm", seed=1, reward_head=True))


def _reference(path: str, ids: list[int]) -> float:
    """The head's output for one unpadded sequence, straight from transformers."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.inference_mode():
        return float(model(input_ids=torch.tensor([ids])).logits[0, 0])


PROMPTS = ["1+2=", "17+25=", "what is the sum of 3 and 4?", "9+9="]
RESPONSES = ["3", "42 is the answer", "7", "the answer is 18 and that is good"]


def test_scores_of_padded_micro_batches_equal_each_sequence_scored_alone(reward_model_path):
    rm = RewardModel(reward_model_path, micro_batch_size=3)  # 4 inputs: a padded batch of 3, then 1
    items = [{"prompt": p} for p in PROMPTS]
    scores = rm.score(items, RESPONSES)
    tok = hf_tokenizer(reward_model_path)
    expected = [_reference(reward_model_path, tok.encode(p + r)) for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    assert scores == pytest.approx(expected, abs=1e-5)
    assert len(set(round(s, 6) for s in scores)) == 4  # the head reads something that differs between inputs


def test_chat_tasks_are_read_as_the_conversation_with_the_response_as_assistant_turn(reward_model_path):
    rm = RewardModel(reward_model_path)
    messages = [{"role": "user", "content": "what is 2 plus 3?"}]
    task = Task("c", "", "5", messages=messages)
    [score] = rm.score([reward_input(task)], ["5"])
    tok = hf_tokenizer(reward_model_path)
    ids = list(render_ids(messages + [{"role": "assistant", "content": "5"}], tok, add_generation_prompt=False))
    assert score == pytest.approx(_reference(reward_model_path, ids), abs=1e-5)


def test_an_input_over_max_length_keeps_its_last_tokens(reward_model_path):
    rm = RewardModel(reward_model_path, max_length=8)
    tok = hf_tokenizer(reward_model_path)
    long_response = " the answer is 12345 and the sum of numbers"
    ids = tok.encode("1+2=" + long_response)
    assert len(ids) > 8
    [score] = rm.score([{"prompt": "1+2="}], [long_response])
    assert score == pytest.approx(_reference(reward_model_path, ids[-8:]), abs=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-4), ("bfloat16", 5e-2)])
def test_on_cuda_the_scores_match_the_cpu_reference(reward_model_path, dtype, tol):
    """Asked for CUDA (reward.model.num_gpus > 0), the model runs there in the dtype given; its scores of padded
    micro-batches match each sequence scored alone in float32 on the CPU (bf16: to its rounding)."""
    rm = RewardModel(reward_model_path, micro_batch_size=3, dtype=dtype, device="cuda")
    assert rm.health()["device"].startswith("cuda") and rm.model.dtype == getattr(torch, dtype)
    scores = rm.score([{"prompt": p} for p in PROMPTS], RESPONSES)
    tok = hf_tokenizer(reward_model_path)
    expected = [_reference(reward_model_path, tok.encode(p + r)) for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    assert scores == pytest.approx(expected, abs=tol)


def test_without_a_gpu_share_the_model_stays_on_the_cpu(reward_model_path):
    """CUDA visible or not, the default (and an actor with reward.model.num_gpus 0) scores on the CPU in float32:
    a reward model with no GPU share must not take GPU memory that nobody accounted for."""
    rm = RewardModel(reward_model_path)
    assert rm.health()["device"] == "cpu" and rm.model.dtype == torch.float32


def test_a_folder_that_is_not_a_one_label_model_is_refused_clearly(tmp_path, tiny_model_path):
    with pytest.raises(UserError, match="not a model folder"):
        RewardModel(tmp_path)
    with pytest.raises(UserError, match="has 2 labels; a reward model has one"):  # the causal LM's config
        RewardModel(tiny_model_path)


def test_the_actor_serves_the_same_scores_as_the_model_in_process(reward_model_path, ray_session):
    cfg = load_config(None, [f"reward.model.path={reward_model_path}", "reward.model.micro_batch_size=2"])
    client = start_reward_model(cfg)
    task = Task("t", "17+25=", "42")

    async def main():
        health = await client.ready()
        return health, await client.score(task, RESPONSES)

    try:
        health, scores = asyncio.run(main())
    finally:
        client.stop()
    assert health["device"] == "cpu" and health["path"] == reward_model_path
    local = RewardModel(reward_model_path).score([{"prompt": "17+25="}] * 4, RESPONSES)
    assert scores == pytest.approx(local, abs=1e-6)
    assert start_reward_model(load_config(None, [])) is None  # no path: no actor


def test_a_workflow_rewards_its_samples_with_the_reward_models_scores(tmp_path, tiny_model_path, reward_model_path,
                                                                     ray_session):
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}", "project=rm",
                             "explorer.sampling.max_new_tokens=5", f"reward.model.path={reward_model_path}"])
    tok = hf_tokenizer(tiny_model_path)
    task = Task("t", "12+30=", "42", data_source="no_such_scorer")  # replace: the function is never asked
    ctx = WorkflowContext(sampling=cfg.explorer.sampling, repeat_times=3, seeds=[1, 2, 3], tokenizer=tok,
                          reward_manager=load_reward_manager(cfg, tok))

    async def main():
        fleet = EngineFleet(cfg)
        ctx.reward_model = start_reward_model(cfg)
        try:
            await fleet.ready()
            return await load_workflow("single_turn").run(task, fleet, ctx)
        finally:
            fleet.kill()
            ctx.reward_model.stop()

    exps = asyncio.run(main())
    expected = RewardModel(reward_model_path).score([{"prompt": "12+30="}] * 3, [e.response_text for e in exps])
    assert [e.reward for e in exps] == pytest.approx(expected, abs=1e-5)


def test_a_killed_reward_model_actor_is_restarted_and_scores_again(reward_model_path, ray_session):
    import ray

    client = start_reward_model(load_config(None, [f"reward.model.path={reward_model_path}"]))
    task = Task("t", "1+2=", "3")

    async def main():
        before = await client.score(task, ["3", "4"])
        victim = await client.actor.pid.remote()
        os.kill(victim, signal.SIGKILL)
        for _ in range(200):  # calls may fail until Ray has restarted the process and loaded the model again
            try:
                return before, await client.score(task, ["3", "4"]), victim, await client.actor.pid.remote()
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                await asyncio.sleep(0.1)
        raise AssertionError("the reward model actor did not come back")

    try:
        before, after, victim, pid = asyncio.run(main())
    finally:
        client.stop()
    assert pid != victim  # a new process serves
    assert after == pytest.approx(before, abs=1e-6)


def _raising(responses, ground_truths, **_):
    raise AssertionError("the reward function must not be called when the model's score replaces it")


def test_replace_uses_the_model_score_and_never_calls_the_function():
    manager = NaiveRewardManager(None, compute_score=_raising, model_combine="replace")
    scores, extra = manager.score(["a", "b"], ["1", "2"], ["math", "math"], model_scores=[0.25, -1.5])
    assert scores == [0.25, -1.5]
    assert extra == {"reward_failed": [False, False], "model_score": [0.25, -1.5]}


def test_add_sums_model_and_function_scores_and_dapo_shapes_on_top():
    manager = NaiveRewardManager(None, model_combine="add")  # built-in math scorer: 1.0 when right
    scores, _ = manager.score(["7", "8"], ["7", "7"], ["math", "math"], model_scores=[0.5, 0.5])
    assert scores == [1.5, 0.5]
    # DAPO: max_resp_len 10, buffer 4, factor 1: a 9-token response gets -(9 - 6) / 4 = -0.75
    dapo = DAPORewardManager(None, model_combine="add", max_resp_len=10,
                             overlong_buffer_cfg=load_config(None, ["reward.overlong_buffer.enable=true",
                                                                    "reward.overlong_buffer.len=4",
                                                                    "reward.overlong_buffer.penalty_factor=1.0"]
                                                             ).reward.overlong_buffer)
    scores, extra = dapo.score(["7", "7"], ["7", "7"], ["math", "math"], response_lengths=[5, 9],
                               model_scores=[0.5, -0.5])
    assert scores == [1.5, 0.5 - 0.75]
    assert extra["overlong_reward"] == [0.0, -0.75]
    with pytest.raises(ValueError, match="1 reward-model scores for 2 responses"):
        manager.score(["7", "8"], ["7", "7"], ["math", "math"], model_scores=[0.5])
    with pytest.raises(ValueError, match="model_combine must be one of replace, add"):
        NaiveRewardManager(None, model_combine="mean")


def test_a_bad_combine_or_model_folder_is_refused_at_config_load(tmp_path, tiny_model_path):
    with pytest.raises(ConfigError, match="reward.model.combine"):
        load_config(None, ["reward.model.combine=mean"])
    with pytest.raises(ConfigError, match="is not a model folder"):
        load_config(None, [f"reward.model.path={tmp_path}"])
    with pytest.raises(ConfigError, match="has 2 labels; a reward model has one"):  # a causal LM
        load_config(None, [f"reward.model.path={tiny_model_path}"])


def test_compute_reward_returns_the_managers_tensor_and_extra_info(batch_exps, tiny_model_path):
    tok = hf_tokenizer(tiny_model_path)
    manager = NaiveRewardManager(tok, compute_score=lambda responses, truths, **_: [float(len(r)) for r in responses])
    exps = batch_exps[:3]
    reward, extra = compute_reward(exps, manager)
    assert reward.shape == (3, max(len(e.response_ids) for e in exps))
    for i, e in enumerate(exps):
        n = len(e.response_ids)
        text = tok.decode(e.response_ids.tolist(), skip_special_tokens=True)
        assert reward[i, n - 1] == float(len(text))  # the score on the last response token
        assert reward[i, :n - 1].abs().sum() == 0
    assert extra == {"reward_failed": [False, False, False]}
    # a plain callable of the data only: its tensor, no extra info
    tensor, extra = compute_reward(exps, lambda data: torch.ones(len(data), 1))
    assert tensor.shape == (3, 1) and extra == {}
