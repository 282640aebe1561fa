"""Ground truths in the forms users bring (trinity_like.algorithms.truths) and the built-in scorers reading them:
a table of truth form x response form -> score, worked by hand, for math, openai/gsm8k and countdown; truths a
scorer cannot read raise UnreadableTruth (never a silent 0) and truth_problem says so without scoring."""

from __future__ import annotations

import json

import pytest

from trinity_like.algorithms.rewards import compute_score, countdown_score, math_score, truth_problem
from trinity_like.algorithms.truths import (
    UnreadableTruth,
    countdown_reference,
    gsm8k_reference,
    math_reference,
)
from trinity_like.algorithms.verl_scores import gsm8k_score, math_reward_score

# gsm8k's ground truth as Trinity keeps it: the whole solution, the final answer after "#### "
GSM8K_SOLUTION = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                  "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")
TRUTHS_72 = {
    "bare": "72",
    "number": 72,
    "gsm8k solution": GSM8K_SOLUTION,
    "boxed": "so the answer is \\boxed{72}",
    "answer tag": "<answer>72</answer>",
    "#### 72.": "... #### 72.",  # a trailing period
}
RESPONSES_72 = {
    "boxed": "Half of 48 is 24, and 48 + 24 = \\boxed{72}",
    "answer tag": "<think>48 + 24</think><answer>72</answer>",
    "####": "48 + 24 = 72 clips\n#### 72",
    "plain final number": "She sold 24 in May, so 72",
}
RESPONSES_WRONG = {
    "boxed": "48 + 24 = \\boxed{70}",
    "answer tag": "<think>72 - 2</think><answer>70</answer>",  # 72 appears, but the answer given is 70
    "####": "I first thought 72\n#### 70",  # the number after #### wins over earlier ones
    "plain final number": "72 is wrong, it is 70",
}


@pytest.mark.parametrize("truth", TRUTHS_72.values(), ids=TRUTHS_72.keys())
@pytest.mark.parametrize("response", RESPONSES_72.values(), ids=RESPONSES_72.keys())
def test_math_reads_every_truth_form_and_scores_every_answer_form(truth, response):
    assert math_score(response, truth) == 1.0  # before: 0.0 for the gsm8k solution, the boxed and the tagged truth
    assert compute_score([response], [truth], data_sources=[""]) == [1.0]  # no data source: math


@pytest.mark.parametrize("truth", TRUTHS_72.values(), ids=TRUTHS_72.keys())
@pytest.mark.parametrize("response", RESPONSES_WRONG.values(), ids=RESPONSES_WRONG.keys())
def test_math_wrong_answers_score_0_in_every_form(truth, response):
    assert math_score(response, truth) == 0.0


@pytest.mark.parametrize(("truth", "response", "expected"), [
    ("1,234", "\\boxed{1234}", 1.0),  # thousands commas on either side
    ("Total: 1234 apples\n#### 1,234", "<answer>1,234</answer>", 1.0),
    ("\\boxed{\\frac{1}{2}}", "<answer>\\frac{1}{2}</answer>", 1.0),  # the tag's content whole, not its last number 2
    ("\\boxed{\\frac{1}{2}}", "<answer>0.5</answer>", 1.0),  # equal as numbers
    ("\\boxed{\\frac{1}{2}}", "<answer>2</answer>", 0.0),
    ("3", "<answer>x = 3</answer>", 1.0),  # not the content, but its last number
])
def test_math_more_forms_by_hand(truth, response, expected):
    assert math_score(response, truth) == expected


# openai/gsm8k keeps verl's response rule (strict: only "#### <number>"); its truth is read in every form
@pytest.mark.parametrize("truth", TRUTHS_72.values(), ids=TRUTHS_72.keys())
@pytest.mark.parametrize(("response", "expected"), [
    ("48 + 24 = 72\n#### 72", 1.0),
    ("#### 70", 0.0),  # an answer, wrong: format_score 0.0
    ("\\boxed{72}", 0.0),  # verl's strict rule reads only "#### ": no answer -> 0
    ("<answer>72</answer>", 0.0),
])
def test_gsm8k_reads_every_truth_form(truth, response, expected):
    assert gsm8k_score(response, truth) == expected  # before: 0.0 for every response against the solution
    assert compute_score([response], [truth], data_sources=["openai/gsm8k"]) == [expected]


def test_gsm8k_truth_with_commas_and_flexible_method():
    assert gsm8k_score("#### 1,234", "She has 1,234 now.\n#### 1,234") == 1.0  # strict drops the response's commas
    assert gsm8k_score("so 1234", "#### 1,234", method="flexible") == 1.0
    assert gsm8k_score("#### 5", "6", format_score=0.1) == 0.1  # verl's format score, unchanged


def test_math_sets_read_a_boxed_truth_as_trinity_does():
    assert math_reward_score("\\boxed{\\frac{1}{2}}", "The answer is $\\boxed{\\frac12}$.") == 1.0
    assert math_reward_score("\\boxed{0.5}", "\\frac{1}{2}") == 1.0  # a bare truth: verl's rule
    assert math_reward_score("\\boxed{3}", "\\boxed{4}") == 0.0


CD = {"target": 4, "numbers": [8, 4, 2]}


@pytest.mark.parametrize("truth", [CD, json.dumps(CD), {"target": "4", "numbers": ["8", "4", "2"]}],
                         ids=["dict", "JSON string", "numbers as text"])
@pytest.mark.parametrize(("response", "expected"), [
    ("<answer>8/4*2</answer>", 1.0),
    ("<think>8/2 = 4</think>\n<answer>8/(4/2)</answer>", 1.0),
    ("<answer>8-4-2</answer>", 0.1),  # every number once, equals 2: the format reward
    ("<answer>8/4</answer>", 0.1),  # 2 unused: the format reward
    ("no equation", 0.0),
])
def test_countdown_reads_dict_and_json_truths(truth, response, expected):
    assert countdown_score(response, truth) == expected
    assert compute_score([response], [truth], data_sources=["countdown"]) == [expected]


def test_references_by_hand():
    assert math_reference(GSM8K_SOLUTION) == "72"
    assert math_reference(" #### 1,234. ") == "1,234."  # as written; math_score normalises
    assert math_reference("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert math_reference("(-\\infty, 3) \\cup (5, \\infty)") == "(-\\infty, 3) \\cup (5, \\infty)"  # bare
    assert math_reference("\\text{Monday}") == "\\text{Monday}"
    assert gsm8k_reference(GSM8K_SOLUTION) == "72"
    assert gsm8k_reference("#### $1,234.") == "1234"
    assert gsm8k_reference(-5) == "-5"
    assert countdown_reference('{"target": 24, "numbers": [4, 6, 1]}') == {"target": 24, "numbers": [4, 6, 1]}


@pytest.mark.parametrize(("scorer", "truth", "says"), [
    (math_score, "She sold 48 clips in April\nand half as many in May, 72 in all", "no final answer marked"),
    (math_score, "She sold forty eight clips altogether", "no final answer marked"),  # prose on one line
    (math_score, "x" * 101, "no final answer marked"),
    (math_score, None, "type NoneType"),
    (math_score, {"target": 4}, "type dict"),
    (math_score, "  ", "empty"),
    (math_score, "solution ####", "empty answer"),
    (gsm8k_score, "#### seventy-two", "not a number"),
    (gsm8k_score, "Natalia sold 72 clips in April and May", "no final answer marked"),
    (countdown_score, "24", "no target and numbers"),
    (countdown_score, "{target: 4}", "not JSON"),
    (countdown_score, {"target": 4.5, "numbers": [1]}, "must be integers"),
    (countdown_score, {"target": 4, "numbers": "8 4"}, "must be integers"),
])
def test_unreadable_truths_raise_never_score_0(scorer, truth, says):
    with pytest.raises(UnreadableTruth, match=says):
        scorer("\\boxed{72} #### 72 <answer>8/4*2</answer>", truth)


def test_truth_problem_by_data_source():
    assert truth_problem("math", GSM8K_SOLUTION) is None
    assert truth_problem("", "She sold 48 clips in April\nand 24 in May").startswith("the ground truth is a text with no final")
    assert "'solution #### 72'" in truth_problem("openai/gsm8k", "seventy-two")
    assert truth_problem("countdown", json.dumps(CD)) is None
    assert "JSON" in truth_problem("countdown", "8 4 2 -> 4")
    assert truth_problem("arithmetic", "12") is None and "integer" in truth_problem("arithmetic", "1/2")
    assert truth_problem("math_dapo", "anything at all") is None  # takes any truth
    assert truth_problem("chess", "e4") is None  # no scorer: missing_scorer's business
