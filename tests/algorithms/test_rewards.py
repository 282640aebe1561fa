"""Rewards (trinity_like.algorithms.rewards): scorers, custom functions, failure isolation, managers."""

import dataclasses
import math

import pytest
import torch

from trinity_like.algorithms.rewards import (
    DAPORewardManager,
    NaiveRewardManager,
    OverlongBufferConfig,
    arithmetic_reward,
    compute_score,
    countdown_score,
    format_score,
    last_boxed,
    load_reward_function,
    load_reward_manager,
    math_score,
    normalize_answer,
    score_batch,
)
from trinity_like.common.experience import Experience
from trinity_like.config import ConfigError, load_config

CUSTOM = '''
def compute_score(responses, ground_truths, **kwargs):
    return [float(r == g) for r, g in zip(responses, ground_truths)]

def qa_score(responses, ground_truths, data_sources=None, **kwargs):
    if any("boom" in r for r in responses):
        raise RuntimeError("boom")
    return [1.0 if r == g and s == "qa" else 0.0 for r, g, s in zip(responses, ground_truths, data_sources)]

NOT_A_FUNCTION = 3
'''


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(CUSTOM)
    return path


def exp(n_tokens, text, **info):
    return Experience(prompt_ids=[0], response_ids=list(range(1, n_tokens + 1)), response_text=text, info=info)


# ---------------------------------------------------------------- scorers


@pytest.mark.parametrize(("response", "answer", "kwargs", "expected"), [
    ("42", "42", {}, 1.0),
    ("  42 apples", " 42 ", {}, 1.0),  # leading space and trailing text ignored, answer stripped
    ("-7", "-7", {}, 1.0),
    ("41", "42", {}, 0.1),  # a number, the wrong one: format reward
    ("41", "42", {"format_reward": 0.3}, 0.3),
    ("forty-two", "42", {}, 0.0),  # no leading number
])
def test_arithmetic_reward(response, answer, kwargs, expected):
    assert arithmetic_reward(response, answer, **kwargs) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("a \\boxed{1} b \\boxed{\\frac{1}{2}} c", "\\frac{1}{2}"),  # the last one, nested braces kept
    ("\\fbox{x}", "x"),
    ("\\fbox{1} then \\boxed{2}", "2"),
    ("no box here", None),
    ("\\boxed{12", None),  # never closed
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(("answer", "expected"), [
    ("\\frac{1}{2}", "1/2"),  # -> (1)/(2) -> 1/2
    ("\\dfrac{-3}{4}", "-3/4"),
    (" $1,234$. ", "1234"),  # strip, drop $, trailing period, thousands separator
    ("5\\text{ cm}", "5cm"),
    ("+7", "7"),
    ("\\left( 1, 2 \\right)", "(1,2)"),  # a pair, not a thousands separator
    ("12,34", "12,34"),  # not groups of three: left alone
])
def test_normalize_answer(answer, expected):
    assert normalize_answer(answer) == expected


@pytest.mark.parametrize(("solution", "truth", "expected"), [
    ("so \\boxed{\\frac{1}{2}}", "0.5", 1.0),  # 1/2 vs 0.5: equal as numbers
    ("We get 1,234 apples", "1234", 1.0),  # last number, separator dropped
    ("x = 3.0", "3", 1.0),
    ("The answer is 12.", "12", 1.0),
    ("\\boxed{2} although 3 appears later", "2", 1.0),  # a box beats the last number
    ("\\boxed{x + 1}", "x+1", 1.0),  # symbolic: equal after removing spaces
    ("\\boxed{13}", "12", 0.0),
    ("\\boxed{1/0}", "5", 0.0),  # not a number, not equal
    ("no numbers here", "1", 0.0),
])
def test_math_score(solution, truth, expected):
    assert math_score(solution, truth) == expected


def test_math_score_number_followed_by_a_comma():
    assert math_score("The answer is 3, I think.", "3") == 1.0  # the last number is 3


def test_format_score():
    assert format_score("<think>a\nb</think>\n<answer>4</answer>") == 1.0  # multi-line think
    assert format_score("  <think></think><answer>4</answer>\n") == 1.0  # surrounding whitespace allowed
    assert format_score("<answer>4</answer>") == 0.0  # no think
    assert format_score("<think>a</think><answer>4</answer> extra") == 0.0  # text after the answer
    assert format_score("42", pattern=r"^\d+$") == 1.0
    assert format_score("4a", pattern=r"^\d+$") == 0.0


GT = {"target": 4, "numbers": [8, 4, 2]}


@pytest.mark.parametrize(("solution", "truth", "expected"), [
    ("<answer>8/4*2</answer>", GT, 1.0),  # 8/4 = 2, *2 = 4
    ("<answer>8/(4/2)</answer>", GT, 1.0),  # 8/2 = 4
    ("<answer>(8-4)*2</answer> no: <answer>8/4*2 = 4</answer>", GT, 1.0),  # last answer, text after = dropped
    ("no tag, last line:\n8 / 4 * 2", GT, 1.0),
    ("<answer>8-4-2</answer>", GT, 0.1),  # every number once but equals 2
    ("<answer>8/4</answer>", GT, 0.1),  # 2 is not used
    ("<answer>6/(3-3)</answer>", {"target": 1, "numbers": [6, 3, 3]}, 0.1),  # division by zero
    ("<answer>2**3</answer>", {"target": 8, "numbers": [2, 3]}, 0.1),  # power is not allowed
    ("<answer>eight</answer>", GT, 0.0),  # no equation
    ("", GT, 0.0),
])
def test_countdown_score(solution, truth, expected):
    assert countdown_score(solution, truth) == expected


def test_compute_score_dispatches_by_data_source():
    responses = ["6", "\\boxed{2}", "<answer>8/4*2</answer>", "<think>x</think><answer>y</answer>", "\\boxed{3}"]
    truths = ["5", "2", GT, None, "3"]
    sources = ["arithmetic", "math", "countdown", "format", ""]  # "" -> math
    # arithmetic: 6 != 5 -> .1; math 2 == 2; countdown right; format right; math 3 == 3
    assert compute_score(responses, truths, data_sources=sources) == [0.1, 1.0, 1.0, 1.0, 1.0]
    assert compute_score(["\\boxed{3}", "7"], ["3", "8"]) == [1.0, 0.0]  # no data sources: math for all
    with pytest.raises(KeyError, match="no built-in scorer for data source 'chess'; built-in: arithmetic, math"):
        compute_score(["1"], ["1"], data_sources=["chess"])


# ---------------------------------------------------------------- custom functions and failures


def test_load_reward_function(reward_file, tmp_path):
    fn = load_reward_function(reward_file)
    assert fn(["a", "b"], ["a", "c"]) == [1.0, 0.0]
    assert load_reward_function(str(reward_file), "qa_score")(["a"], ["a"], data_sources=["qa"]) == [1.0]
    with pytest.raises(FileNotFoundError, match="reward function file '.*nope.py' does not exist"):
        load_reward_function(tmp_path / "nope.py")
    with pytest.raises(AttributeError, match="has no function 'missing'"):
        load_reward_function(reward_file, "missing")
    with pytest.raises(AttributeError, match="has no function 'NOT_A_FUNCTION'"):
        load_reward_function(reward_file, "NOT_A_FUNCTION")


def test_score_batch_isolates_a_raising_sample():
    calls = []

    def fn(responses, truths, data_sources, tag):
        calls.append((list(responses), list(data_sources), tag))
        if any("boom" in r for r in responses):
            raise RuntimeError("boom")
        return [float(len(r)) for r in responses]

    scores, failures = score_batch(fn, ["ab", "xboomx", "abc"], [0, 0, 0], failure_value=-1.0,
                                   data_sources=["s0", "s1", "s2"], tag="t")
    assert scores == [2.0, -1.0, 3.0]  # len("ab"), failure_value, len("abc")
    assert failures == [1]
    # one batch call, then one call per sample with its own data source; the scalar kwarg passes unchanged
    assert calls[1:] == [(["ab"], ["s0"], "t"), (["xboomx"], ["s1"], "t"), (["abc"], ["s2"], "t")]


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1.0", None, True])
def test_score_batch_replaces_a_non_finite_or_non_number_score(bad):
    calls = []

    def fn(responses, truths):
        calls.append(responses)
        return [bad if r == "bad" else 1 for r in responses]  # ints are fine

    scores, failures = score_batch(fn, ["a", "bad", "c"], [0, 0, 0], failure_value=-2.0)
    assert scores == [1.0, -2.0, 1.0] and all(type(s) is float for s in scores)
    assert failures == [1]
    assert len(calls) == 1  # the batch did not raise: no re-scoring


def test_score_batch_wrong_number_of_scores():
    # always one score: wrong for the batch of 3, right for each sample alone -> every sample scored
    scores, failures = score_batch(lambda r, g: [1.0], ["a", "b", "c"], [0, 0, 0], failure_value=-1.0)
    assert (scores, failures) == ([1.0, 1.0, 1.0], [])
    # always one score too many: wrong in the batch and alone -> every sample gets failure_value
    scores, failures = score_batch(lambda r, g: [0.5] * (len(r) + 1), ["a", "b"], [0, 0], failure_value=-1.0)
    assert (scores, failures) == ([-1.0, -1.0], [0, 1])


# ---------------------------------------------------------------- managers


def test_naive_manager_puts_the_score_on_the_last_token():
    exps = [exp(3, "\\boxed{4}", ground_truth="4", data_source="math"),  # 1.0 at token 2
            exp(1, "7", answer="8", data_source="arithmetic"),  # ground truth from "answer": 7 != 8 -> .1 at 0
            exp(2, "\\boxed{2}", ground_truth="2")]  # no data source -> math: 1.0 at token 1
    out = NaiveRewardManager(None)(exps, return_dict=True)
    torch.testing.assert_close(out["reward_tensor"], torch.tensor([[0, 0, 1.0], [0.1, 0, 0], [0, 1.0, 0]]))
    assert out["reward_extra_info"] == {"reward_failed": [False, False, False]}
    # an empty response has no token to hold its score
    assert NaiveRewardManager(None)([exp(0, "1", ground_truth="1", data_source="arithmetic")]).tolist() == [[0.0]]


def test_naive_manager_failure_value_and_reward_fn_key(reward_file):
    fn = load_reward_function(reward_file, "qa_score")
    manager = NaiveRewardManager(None, compute_score=fn, reward_fn_key="task", failure_value=-1.0)
    exps = [exp(2, "yes", ground_truth="yes", task="qa"),  # right, source qa -> 1
            exp(1, "boom", ground_truth="boom", task="qa"),  # raises -> -1
            exp(2, "yes", ground_truth="yes", task="other")]  # source other -> 0
    out = manager(exps, return_dict=True)
    torch.testing.assert_close(out["reward_tensor"], torch.tensor([[0, 1.0], [-1.0, 0], [0, 0]]))
    assert out["reward_extra_info"]["reward_failed"] == [False, True, False]


def test_naive_manager_prints_num_examine_per_source(capsys):
    manager = NaiveRewardManager(None, num_examine=1)
    manager([exp(1, "1", ground_truth="1", data_source="math"), exp(1, "2", ground_truth="2", data_source="math"),
             exp(1, "3", ground_truth="3", data_source="arithmetic")])
    manager([exp(1, "4", ground_truth="4", data_source="math")])  # math already shown once
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("]")[0] for line in lines] == ["[math", "[arithmetic"]


def ones(responses, truths, **_):
    return [1.0] * len(responses)


def test_dapo_overlong_penalty_by_hand():
    # max_resp_len 10, buffer 4 -> expected length 6; penalty = min(-(n - 6)/4 * factor, 0)
    cfg = OverlongBufferConfig(enable=True, len=4, penalty_factor=1.0)
    manager = DAPORewardManager(None, compute_score=ones, max_resp_len=10, overlong_buffer_cfg=cfg)
    scores, extra = manager.score(["a"] * 4, [0] * 4, ["math"] * 4, response_lengths=[5, 6, 8, 10])
    # n=5: +.25 -> 0; n=6: 0; n=8: -(2)/4 = -.5; n=10: -(4)/4 = -1
    assert extra["overlong_reward"] == [0.0, 0.0, -0.5, -1.0]
    assert scores == [1.0, 1.0, 0.5, 0.0]
    # penalty_factor 2: n=8 -> -(2)/4*2 = -1
    doubled = DAPORewardManager(None, compute_score=ones, max_resp_len=10,
                                overlong_buffer_cfg=OverlongBufferConfig(enable=True, len=4, penalty_factor=2.0))
    assert doubled.score(["a"], [0], ["math"], response_lengths=[8])[0] == [0.0]
    # through __call__: lengths come from response_ids; 8 tokens -> 1 - .5 at token 7, 5 tokens -> 1 at token 4
    reward = manager([exp(8, "a"), exp(5, "b")])
    assert reward[0, 7].item() == 0.5 and reward[1, 4].item() == 1.0
    assert reward.sum().item() == 1.5  # nothing anywhere else


def test_dapo_without_overlong_buffer_is_naive():
    manager = DAPORewardManager(None, compute_score=ones)  # disabled by default, max_resp_len not needed
    scores, extra = manager.score(["a", "b"], [0, 0], ["math"] * 2, response_lengths=[100, 1])
    assert scores == [1.0, 1.0] and "overlong_reward" not in extra


def test_dapo_config_errors():
    with pytest.raises(ValueError, match="needs max_resp_len"):
        DAPORewardManager(None, overlong_buffer_cfg=OverlongBufferConfig(enable=True, len=4))
    for bad_len in (0, 11):
        with pytest.raises(ValueError, match=rf"must be in \(0, max_resp_len=10\], got {bad_len}"):
            DAPORewardManager(None, max_resp_len=10, overlong_buffer_cfg=OverlongBufferConfig(True, bad_len))
    manager = DAPORewardManager(None, max_resp_len=10, overlong_buffer_cfg=OverlongBufferConfig(True, 4))
    with pytest.raises(ValueError, match="the overlong penalty needs response_lengths"):
        manager.score(["a"], ["a"], ["math"])


DAPO_KEYS = ["reward.manager=dapo", "reward.max_resp_len=10", "reward.overlong_buffer.enable=true",
             "reward.overlong_buffer.len=4"]


def test_load_reward_manager_dapo_with_custom_function(reward_file):
    cfg = load_config(None, DAPO_KEYS + [f"reward.function_path={reward_file}", "reward.function_name=qa_score",
                                         "reward.failure_value=-1", "reward.reward_fn_key=task"])
    manager = load_reward_manager(cfg, None)
    assert isinstance(manager, DAPORewardManager)
    exps = [exp(8, "yes", ground_truth="yes", task="qa"),  # 1 + penalty -(8-6)/4 = .5, at token 7
            exp(5, "boom", ground_truth="boom", task="qa"),  # failure -1 + 0, at token 4
            exp(6, "no", ground_truth="yes", task="qa")]  # 0 + 0, at token 5
    out = manager(exps, return_dict=True)
    assert [out["reward_tensor"][0, 7].item(), out["reward_tensor"][1, 4].item()] == [0.5, -1.0]
    assert out["reward_tensor"].abs().sum().item() == 1.5
    assert out["reward_extra_info"]["reward_failed"] == [False, True, False]
    # the RewardConfig section works too, and keyword arguments override it
    manager = load_reward_manager(cfg.reward, None, failure_value=-3.0)
    assert manager([exp(5, "boom", ground_truth="x", task="qa")])[0, 4].item() == -3.0


def test_load_reward_manager_naive_and_errors(tmp_path):
    manager = load_reward_manager(load_config(None, []), None)
    assert type(manager) is NaiveRewardManager and manager.compute_score is compute_score
    cfg = load_config(None, [])
    with pytest.raises(KeyError, match="unknown reward manager 'bogus'; valid names: naive, dapo"):
        load_reward_manager(dataclasses.replace(cfg.reward, manager="bogus"), None)
    # load_config refuses a missing file already; the loader itself says so too
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(None, [f"reward.function_path={tmp_path / 'nope.py'}"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_reward_manager(dataclasses.replace(cfg.reward, function_path=str(tmp_path / "nope.py")), None)


def test_load_reward_manager_max_resp_len_defaults_to_max_new_tokens():
    cfg = load_config(None, DAPO_KEYS[:1] + DAPO_KEYS[2:] + ["explorer.sampling.max_new_tokens=10"])
    manager = load_reward_manager(cfg, None)
    # max_resp_len 10, buffer 4 -> expected 6: 8 tokens -> -(8-6)/4 = -.5
    assert manager.score(["a"], ["a"], ["math"], response_lengths=[8])[1]["overlong_reward"] == [-0.5]
