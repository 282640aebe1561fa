"""Trinity-RFT's reward functions (``trinity_like.algorithms.trinity_rewards``) against values worked out by hand
from upstream's formulas (trinity/common/rewards at 9051d63)."""

import pytest

from trinity_like.algorithms.trinity_rewards import (
    REWARD_FUNCTIONS,
    TrinityRegistry,
    build_reward_fn,
    check_reward_fn_class,
    reward_parts,
)

GSM8K_TRUTH = "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n#### 72"


@pytest.mark.parametrize("response", [
    "<think>48 + 24</think>\n<answer>72</answer>",  # the form math_workflow's system prompt asks for
    "<think>48 + 24</think> <answer>\\boxed{72}</answer>",
    "so the total is \\boxed{72}",
    "48 + 24 = 72",
    "#### 72",
])
def test_math_reward_scores_a_right_answer_1_in_each_of_trinitys_forms(response):
    parts = build_reward_fn("math_reward")(response=response, truth=GSM8K_TRUTH)
    assert parts["accuracy"] == 1.0


def test_math_reward_parts_by_hand():
    fn = build_reward_fn("math_reward")
    # think + answer: format +0.1; right: accuracy 1 -> reward 1.1
    assert fn(response="<think>48+24</think><answer>72</answer>", truth="72") == {"accuracy": 1.0, "format_score": 0.1}
    # no tags: format -0.1; wrong: 0 -> reward -0.1
    assert fn(response="71", truth=GSM8K_TRUTH) == {"accuracy": 0.0, "format_score": -0.1}
    # Trinity's pattern is matched multi-line: `$` also matches before a newline, so trailing lines still pass
    assert fn(response="<think>a</think><answer>72</answer>\nmore text", truth="72")["format_score"] == 0.1
    # the answer tag's content is the answer: 71 inside <answer> is wrong even if 72 appears in the thinking
    assert fn(response="<think>72?</think><answer>71</answer>", truth="72")["accuracy"] == 0.0


def test_format_reward_default_pattern_needs_the_newlines():
    fn = build_reward_fn("format_reward")
    assert fn(response="<think>\nx\n</think>\n<answer>\ny\n</answer>") == {"format_score": 0.1}
    assert fn(response="<think>x</think><answer>y</answer>") == {"format_score": -0.1}
    assert build_reward_fn("format_reward", {"pattern": r"^\d+$"})(response="12") == {"format_score": 0.1}


def test_math_boxed_reward_by_hand():
    fn = build_reward_fn("math_boxed_reward")
    # MATH's normalisation: \frac12 == \frac{1}{2}; the truth's own \boxed{} is unwrapped
    assert fn(response="so \\boxed{\\frac{1}{2}}", truth="\\frac12") == {"accuracy": 1.0, "format_score": 0.0}
    assert fn(response="\\boxed{3}", truth="the answer is \\boxed{3}")["accuracy"] == 1.0
    assert fn(response="\\boxed{4}", truth="3")["accuracy"] == 0.0
    assert fn(response="3", truth="3")["accuracy"] == 0.0  # no box, no answer
    # with_think: -coef unless exactly one <think> before one </think>
    assert fn(response="\\boxed{3}", truth="3", with_think=True)["format_score"] == pytest.approx(-0.1)
    assert fn(response="\\boxed{3}", truth="3", with_think=True, format_score_coef=0.5)["format_score"] == -0.5
    assert fn(response="<think>a</think>\\boxed{3}", truth="3", with_think=True)["format_score"] == 0.0
    assert fn(response="</think><think>\\boxed{3}", truth="3", with_think=True)["format_score"] == pytest.approx(-0.1)


def test_countdown_reward_by_hand():
    fn = build_reward_fn("countdown_reward")
    truth = '{"target": 24, "numbers": [2, 3, 4]}'
    assert fn(response="think...\n<answer>2*3*4</answer>", truth=truth) == {"score": 1.0}  # 24
    assert fn(response="<answer>2*3+4</answer>", truth=truth) == {"score": 0.1}  # 10: wrong value
    assert fn(response="<answer>(2+4)*4</answer>", truth=truth) == {"score": 0.1}  # 4 twice, no 3
    assert fn(response="no equation", truth=truth) == {"score": 0.0}
    # only the last line is read (TinyZero's extract_solution)
    assert fn(response="<answer>2*3*4</answer>\ndone", truth=truth) == {"score": 0.0}
    assert fn(response="<answer>2*3*4</answer>", truth={"target": 24, "numbers": [4, 3, 2]}) == {"score": 1.0}


def test_math_dapo_overlong_penalty_by_hand():
    fn = build_reward_fn("math_dapo_reward", {"enable_overlong_penalty": True, "max_response_length": 100,
                                              "cache_length": 20, "penalty_factor": 1.0})
    # expected length 100 - 20 = 80: under it 0; (80 - 90) / 20 = -0.5; over 100: -1
    assert fn(response="\\boxed{1}", response_token=[0] * 79, truth="1") == {"accuracy": 1.0, "format_score": 0.0}
    assert fn(response="x", response_token=[0] * 90, truth="1")["format_score"] == -0.5
    assert fn(response="x", response_token=[0] * 101, truth="1")["format_score"] == -1.0
    with pytest.raises(ValueError, match="cache_length"):
        build_reward_fn("math_dapo_reward", {"enable_overlong_penalty": True})


def test_reward_parts_sum_and_shape():
    assert reward_parts(lambda response, truth: {"a": 1, "b": 0.5}, "r", "t") == {"a": 1.0, "b": 0.5}
    assert reward_parts(lambda response: 0.25, "r", "t") == {"reward": 0.25}
    with pytest.raises(ValueError, match="every part must be a number"):
        reward_parts(lambda response: {"a": "high"}, "r", None)
    # keywords a function does not take are not passed; **kwargs takes them all but prompt-less signatures
    seen = {}
    reward_parts(lambda response, **kw: seen.update(kw) or {"x": 0}, "r", "t", prompt="p", extra=1)
    assert seen == {"truth": "t", "extra": 1}


def test_registry_names_errors_and_refusals(tmp_path):
    with pytest.raises(KeyError, match="math_reward"):  # the valid names are listed
        REWARD_FUNCTIONS.get("no_such_reward")
    with pytest.raises(LookupError, match="rm-gallery"):
        REWARD_FUNCTIONS.get("rm_gallery_reward")
    reg = TrinityRegistry("thing")
    reg.register_module("a", int)
    with pytest.raises(KeyError, match="already registered"):
        reg.register_module("a", float)
    reg.register_module("a", float, force=True)
    assert reg.get("a") is float
    f = tmp_path / "my_reward.py"
    f.write_text("class R:\n    def __init__(self, bonus=0.0):\n        self.bonus = bonus\n"
                 "    def __call__(self, response, truth=None):\n        return {'hit': float(response == truth) + self.bonus}\n")
    assert build_reward_fn(f"{f}:R", {"bonus": 0.5})(response="a", truth="a") == {"hit": 1.5}
    assert check_reward_fn_class(f"{f}:R", {"bonus": 0.5}) is None
    assert "cannot be built" in check_reward_fn_class(f"{f}:R", {"nope": 1})
    g = tmp_path / "bad_reward.py"
    g.write_text("class B:\n    def __call__(self, text, reference):\n        return {}\n")
    assert "fn(response=" in check_reward_fn_class(f"{g}:B")
