"""verl's rule-based scorers (trinity_like.algorithms.verl_scores), their dispatch by data source
(rewards.scorer_for / compute_score), and a reward file in the shape of verl's own scorers called as verl calls it.

Each expected value is worked out by hand from verl's published rules (verl/utils/reward_score/*.py) in the
comment beside it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trinity_like.algorithms.rewards import (
    NaiveRewardManager,
    as_batched_reward_fn,
    compute_score,
    known_scorers,
    load_reward_function,
    math_score,
    missing_scorer,
    register_scorer,
    scorer_for,
)
from trinity_like.algorithms.verl_scores import (
    gsm8k_extract,
    gsm8k_score,
    is_equiv,
    math_dapo_score,
    math_reward_score,
    normalize_final_answer,
    qa_normalize,
    search_r1_em_score,
    strip_string,
)

# ---------------------------------------------------------------- gsm8k


@pytest.mark.parametrize(("solution", "truth", "method", "expected"), [
    ("She pays 1,234 dollars.\n#### 1,234", "1234", "strict", 1.0),  # "1,234" -> commas dropped -> "1234"
    ("#### 12\nno wait\n#### 13", "13", "strict", 1.0),  # the last "#### "
    ("#### 12", "13", "strict", 0.0),  # found, wrong -> format_score 0.0
    ("The answer is 1234", "1234", "strict", 0.0),  # no "#### ": none found -> 0
    ("####1234", "1234", "strict", 0.0),  # the space after #### is part of the format
    ("#### -7", "-7", "strict", 1.0),
    ("#### 5.50", "5.5", "strict", 0.0),  # compared as strings: "5.50" != "5.5"
    ("3 apples and 4 pears make 7", "7", "flexible", 1.0),  # the last number
    ("first 7, then 8", "7", "flexible", 0.0),  # last number 8 -> format_score 0.0
    ("It costs 1,234", "1234", "flexible", 0.0),  # flexible keeps the comma: "1,234" != "1234"
    ("The answer is 42.", "42", "flexible", 0.0),  # ... and the trailing period: "42." != "42" (verl's quirk)
    ("no digits at all", "42", "flexible", 0.0),
])
def test_gsm8k_by_hand(solution, truth, method, expected):
    assert gsm8k_score(solution, truth, method=method) == expected


def test_gsm8k_format_score_score_and_clip():
    assert gsm8k_score("#### 3", "4", format_score=0.1) == 0.1  # an answer, wrong
    assert gsm8k_score("no answer", "4", format_score=0.1) == 0.0  # none: 0, not format_score
    assert gsm8k_score("#### 4", "4", score=2.0) == 2.0
    # only the last 300 characters are read: a "#### 4" 301+ characters before the end is not seen
    assert gsm8k_score("#### 4" + "x" * 300, "4") == 0.0
    assert gsm8k_score("#### 4" + "x" * 294, "4") == 1.0  # 6 + 294 = 300 characters: seen
    assert gsm8k_score("#### 4", 4) == 1.0  # a numeric ground truth is compared as its string
    assert gsm8k_extract("x . 5 . ", "flexible") == "5"  # "." runs are skipped
    assert gsm8k_extract("a . b", "flexible") == "."  # only "." runs: verl's loop ends on the first
    with pytest.raises(ValueError, match="strict, flexible"):
        gsm8k_extract("1", "loose")


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=-10**9, max_value=10**9))
def test_gsm8k_strict_reads_any_integer_with_thousands_commas(n):
    assert gsm8k_score(f"so the total is\n#### {n:,}", str(n)) == 1.0


# ---------------------------------------------------------------- MATH (math_reward)


@pytest.mark.parametrize(("a", "b", "expected"), [
    ("\\frac12", "\\frac{1}{2}", True),  # fix_fracs: \frac12 -> \frac{1}{2}
    ("0.5", "\\frac{1}{2}", True),  # strip_string turns exactly "0.5" into \frac{1}{2}
    ("0.50", "\\frac{1}{2}", False),  # ... but not "0.50"
    ("1/2", "\\frac{1}{2}", True),  # fix_a_slash_b
    ("\\dfrac{1}{2}", "\\frac{1}{2}", True),  # dfrac -> frac
    ("\\left( 3, 4 \\right)", "(3,4)", True),  # \left \right and spaces go
    ("x = 5", "5", True),  # "x " (2 characters) before one "=" goes
    ("10^\\circ", "10", True),  # degrees go
    ("5\\text{ cm}", "5", True),  # a unit after "\text{ " goes
    (".5", "0.5", True),  # "0" added in front: "0.5" both, then both -> \frac{1}{2}
    ("\\sqrt3", "\\sqrt{3}", True),  # fix_sqrt
    ("2", "3", False),
    ("\\sqrt", "\\sqrt", True),  # "\sqrt" alone cannot be normalised: raw strings compared
])
def test_math_is_equiv_by_hand(a, b, expected):
    assert is_equiv(a, b) is expected


def test_math_strip_string_by_hand():
    assert strip_string("\\tfrac{3}{4}\\%") == "\\frac{3}{4}"
    assert strip_string("k = \\frac 1 2") == "\\frac{1}{2}"  # "k ", spaces, then \frac12 -> \frac{1}{2}
    assert strip_string("") == ""


@pytest.mark.parametrize(("solution", "truth", "expected"), [
    ("so x = \\boxed{\\frac12}", "\\frac{1}{2}", 1.0),
    ("first \\boxed{2}, finally \\boxed{0.5}", "\\frac{1}{2}", 1.0),  # the last box
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}", 1.0),  # nested braces
    ("the answer is \\boxed 7$ done", "7", 1.0),  # "\boxed " form: up to the "$"
    ("\\fbox{7}", "7", 0.0),  # found, but verl's remove_boxed accepts \boxed only
    ("The answer is 7", "7", 0.0),  # no box: 0 (our own `math` takes the last number)
    ("\\boxed{7", "7", 0.0),  # never closed
    ("\\boxed{8}", "7", 0.0),
])
def test_math_reward_by_hand(solution, truth, expected):
    assert math_reward_score(solution, truth) == expected


# ---------------------------------------------------------------- math_dapo (incl. aime*)


@pytest.mark.parametrize(("solution", "truth", "expected"), [
    ("Let me think.\nAnswer: 5", "5", 1.0),
    ("answer :   5\n", "5", 1.0),  # any case, spaces around ":"
    ("Answer: 6", "5", -1.0),  # wrong: -1, not 0
    ("The result is 5", "5", -1.0),  # no "Answer:" -> "[INVALID]" -> -1
    ("Answer: 4\nAnswer: 5", "5", 1.0),  # the last one
    ("Answer: 1,000", "1000", 1.0),  # thousands commas of an integer go
    ("Answer: $\\frac{3}{4}$", "\\frac34", 1.0),  # $..$ kept and unwrapped; \frac34 -> \frac{3}{4}
    ("Answer: x = 12 dollars", "12", 1.0),  # after the last "=", "dollars" and spaces removed
    ("Answer: \\boxed{12}", "12", 1.0),
])
def test_math_dapo_by_hand(solution, truth, expected):
    assert math_dapo_score(solution, truth) == expected


def test_math_dapo_clip_and_strict_box():
    assert math_dapo_score("Answer: 5" + "x" * 300, "5") == -1.0  # not in the last 300 characters
    assert math_dapo_score("Answer: 5\n" + "x" * 290, "5") == 1.0  # 10 + 290 = 300: read
    assert math_dapo_score("so \\boxed{5}", "5", strict_box_verify=True) == 1.0
    assert math_dapo_score("\\boxed{5}" + "y" * 100, "5", strict_box_verify=True) == -1.0  # last 100 chars only
    assert math_dapo_score("\\boxed{ 5}", "5", strict_box_verify=True) == -1.0  # exact string match
    # after the last "=": " a 5 units" -> "a " goes -> " 5 units" -> spaces go -> "5units" -> "units" goes
    assert normalize_final_answer("x = a 5 units") == "5"
    assert normalize_final_answer("The answer: 5") == "Theanswer:5"  # no "=": the whole line, spaces gone


# ---------------------------------------------------------------- Search-R1 QA exact match


def test_search_r1_exact_match_by_hand():
    truth = {"target": ["Paris", "City of Paris"]}
    assert search_r1_em_score("<answer> The Paris! </answer>", truth) == 1.0  # lower, no punctuation, no "the"
    assert search_r1_em_score("<answer>London</answer><answer>city of paris</answer>", truth) == 1.0  # the last
    assert search_r1_em_score("<answer>Lyon</answer>", truth, format_score=0.2) == 0.2
    assert search_r1_em_score("Paris", truth) == 0.0  # no answer tags
    spam = "<answer>x</answer>" * 10 + "<answer>Paris</answer>"  # 11 tags > 10: a right answer scores 1/4
    assert search_r1_em_score(spam, truth) == 0.25
    assert search_r1_em_score("<answer>paris</answer>", {"target": "Paris"}) == 1.0  # one golden answer
    assert qa_normalize("An  apple, the pear.") == "apple pear"


# ---------------------------------------------------------------- dispatch by data source


@pytest.mark.parametrize(("source", "scorer"), [
    ("openai/gsm8k", gsm8k_score),
    ("lighteval/MATH", math_reward_score),
    ("DigitalLearningGmbH/MATH-lighteval", math_reward_score),
    ("HuggingFaceH4/MATH-500", math_reward_score),
    ("math_dapo", math_dapo_score),
    ("math_dapo_reasoning", math_dapo_score),
    ("aime2024", math_dapo_score),
    ("aime", math_dapo_score),
    ("numina_olympiads", math_reward_score),  # verl: prime_math; here the MATH rule
    ("searchR1_nq", search_r1_em_score),
    ("math", math_score),  # ours, not verl's math_dapo
    ("", math_score),
])
def test_scorer_for_verl_data_sources(source, scorer):
    assert scorer_for(source) is scorer


@pytest.mark.parametrize("source", ["chess", "codecontests", "apps", "codeforces", "taco", "hiyouga/geometry3k",
                                    "gsm8k", "Aime2024"])
def test_scorer_for_unknown_and_code_sets_is_none(source):
    assert scorer_for(source) is None
    assert missing_scorer(source).startswith(f"no built-in scorer for data source {source!r}")


def test_missing_scorer_says_why_for_code_sets():
    assert "code data set" in missing_scorer("taco") and "sandbox" in missing_scorer("taco")
    assert "vision data set" in missing_scorer("hiyouga/geometry3k")
    assert missing_scorer("chess") == "no built-in scorer for data source 'chess'"
    assert missing_scorer("openai/gsm8k") is None


def test_compute_score_dispatches_verl_sources_and_refuses_code_sets():
    responses = ["#### 1,234", "\\boxed{0.5}", "Answer: 5", "Answer: 6", "<answer>Paris</answer>", "7"]
    truths = ["1234", "\\frac{1}{2}", "5", "5", {"target": ["paris"]}, "7"]
    sources = ["openai/gsm8k", "HuggingFaceH4/MATH-500", "aime2025", "math_dapo", "searchR1_hotpotqa", "math"]
    # gsm8k 1; MATH 0.5 == 1/2 -> 1; dapo right 1, wrong -1; EM 1; ours: math last number 7 -> 1
    assert compute_score(responses, truths, data_sources=sources) == [1.0, 1.0, 1.0, -1.0, 1.0, 1.0]
    with pytest.raises(KeyError, match=r"no built-in scorer for data source 'taco' \(a code data set.*built-in: "
                                       r"arithmetic, math, .*openai/gsm8k.*aime\*, numina_\*, searchR1_\*"):
        compute_score(["print(1)"], ["1"], data_sources=["taco"])


def test_known_scorers_and_no_second_registration():
    known = known_scorers()
    assert known[:4] == ["arithmetic", "math", "countdown", "format"]
    assert {"openai/gsm8k", "math_dapo", "aime*", "numina_*", "searchR1_*"} <= set(known)
    with pytest.raises(ValueError, match="'math' is registered already"):
        register_scorer("math", math_dapo_score)
    with pytest.raises(ValueError, match="'aime\\*' is registered already"):
        register_scorer("aime*", math_score)


def test_the_reward_manager_scores_verl_sources_without_failures():
    manager = NaiveRewardManager(None)
    scores, info = manager.score(["#### 8", "#### 9"], ["8", "8"], ["openai/gsm8k"] * 2)
    assert scores == [1.0, 0.0] and info["reward_failed"] == [False, False]
    scores, info = manager.score(["x"], ["8"], ["apps"])
    assert scores == [0.0] and info["reward_failed"] == [True]
    assert "code data set" in manager.last_error


# ---------------------------------------------------------------- a reward file with verl's scorer signature

GSM8K_SHAPED = '''\
import re


def compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
    # the signature of verl's gsm8k.py; the body is a small stand-in
    pattern = r"#### (-?[0-9.,]+)" if method == "strict" else r"(-?[0-9.,]+)"
    found = re.findall(pattern, solution_str)
    if not found:
        return 0
    return score if found[-1].replace(",", "") == ground_truth else format_score


def with_extra(solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth) + extra_info["bonus"]


def with_kwargs(solution_str, ground_truth, **kwargs):
    return {"score": float(kwargs["data_source"] == "src" and kwargs["extra_info"]["bonus"] == 1.0)}


def needs_more(predict_str, ground_truth):
    return 1.0
'''


def test_a_reward_file_with_verls_scorer_signature_is_called_with_what_it_takes(tmp_path):
    path = tmp_path / "gsm8k_like.py"
    path.write_text(GSM8K_SHAPED)
    fn = load_reward_function(path)  # gets solution_str and ground_truth only, never data_source
    assert fn(["#### 1,234", "#### 5", "none"], ["1234", "6", "6"], data_sources=["openai/gsm8k"] * 3,
              extra_infos=[{}] * 3) == [1.0, 0.0, 0]
    # reward.function_kwargs bound at load, as verl's reward_kwargs: the flexible method, a format score
    flexible = load_reward_function(path, kwargs={"method": "flexible", "format_score": 0.1})
    assert flexible(["it is 7", "it is 8"], ["7", "7"], data_sources=["x", "x"]) == [1.0, 0.1]
    manager = NaiveRewardManager(None, compute_score=fn)
    scores, info = manager.score(["#### 3"], ["3"], ["openai/gsm8k"], extra_infos=[{"index": 0}])
    assert scores == [1.0] and info["reward_failed"] == [False] and manager.last_error is None
    # extra_info when named; all four keywords when it takes **kwargs
    assert load_reward_function(path, "with_extra")(["a"], ["a"], data_sources=["s"],
                                                     extra_infos=[{"bonus": 0.5}]) == [1.5]
    assert load_reward_function(path, "with_kwargs")(["a"], ["a"], data_sources=["src"],
                                                      extra_infos=[{"bonus": 1.0}]) == [1.0]
    with pytest.raises(TypeError, match=r"needs argument\(s\) predict_str.*data_source, solution_str, "
                                        r"ground_truth, extra_info"):
        load_reward_function(path, "needs_more")


def test_per_sample_functions_defined_inline():
    def positional_like_verl(data_source, solution_str, ground_truth, extra_info=None):
        return float(data_source == "a" and solution_str == ground_truth and extra_info == {"k": 1})

    assert as_batched_reward_fn(positional_like_verl)(["1", "1"], ["1", "1"], data_sources=["a", "b"],
                                                      extra_infos=[{"k": 1}, {"k": 1}]) == [1.0, 0.0]
    assert as_batched_reward_fn(lambda solution_str, ground_truth: 2.0)(["x"], ["y"], data_sources=["s"]) == [2.0]


@pytest.mark.parametrize("source", ["openai/gsm8k", "HuggingFaceH4/MATH-500", "aime2024", "math_dapo",
                                    "numina_cn_k12", "searchR1_nq"])
@settings(max_examples=25, deadline=None)
@given(text=st.text(max_size=80))
def test_verl_scorers_always_return_a_finite_number(source, text):
    # gsm8k reads only a number as its truth ("x" raises UnreadableTruth: tests/algorithms/test_truths.py)
    truth = {"target": ["x"]} if source.startswith("searchR1_") else "7" if source == "openai/gsm8k" else "x"
    s = scorer_for(source)(text, truth)
    assert isinstance(s, float) and s in (-1.0, 0.0, 0.25, 1.0)
