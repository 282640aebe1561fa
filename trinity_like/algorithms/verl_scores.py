"""verl's rule-based scorers, written here from the rules verl publishes (``verl/utils/reward_score/``), and the
data sources verl's ``default_compute_score`` sends to each.

Every scorer has the one signature of the built-in scorers, ``scorer(solution, ground_truth) -> float`` (extra
parameters keep verl's defaults), and :mod:`trinity_like.algorithms.rewards` registers them by data source:

- ``openai/gsm8k``: :func:`gsm8k_score` (verl ``gsm8k.py``);
- ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500``: :func:`math_reward_score`
  (``math_reward.py``);
- ``math_dapo``, ``math_dapo_reasoning`` and every ``aime*``: :func:`math_dapo_score` (``math_dapo.py``);
- every ``numina_*``: :func:`math_reward_score` (verl: ``prime_math``, see below);
- every ``searchR1_*``: :func:`search_r1_em_score` (``search_r1_like_qa_em.py``);
- ``codecontests``, ``apps``, ``codeforces``, ``taco``, ``hiyouga/geometry3k``: no scorer, :data:`NOT_BUILT_IN`
  says why (a run on them needs a reward function).

Where this departs from verl:

- ``math``: verl sends it to ``math_dapo`` (+1 / -1, "Answer:" extraction); here ``math`` stays our own 0/1
  scorer (``rewards.math_score``), which earlier runs, tests and the demo use. A verl data set labelled ``math``
  that wants verl's rule can be relabelled ``math_dapo``.
- ``numina_*``: verl's ``prime_math`` grades with sympy and pylatexenc (an unboxed "the answer is 5" counts, and
  answers sympy proves equal). Here they get the MATH rule (last ``\\boxed{}``, ``strip_string``, ``is_equiv``):
  a boxed answer written as the data set writes it scores as in verl; an unboxed one, or one equal only under
  sympy, scores 0. Both score 0 / 1. verl lists six ``numina_`` sets by name; here any ``numina_`` prefix.
- ``searchR1_*``: verl lists seven sets by name; here any ``searchR1_`` prefix. verl prints one sample in 64;
  it needs ``{"target": ...}`` as the ground truth, where a bare answer (or list of answers) is taken too.
- ``hiyouga/geometry3k``: a vision set whose verl scorer needs ``mathruler``'s sympy grader; not built in.
- Code sets run the code against the tests in a sandbox; not built in (give a reward function).
- ``math_dapo`` returns a dict in verl (``score``, ``acc``, ``pred``); here only the score (verl's reward).
- Ground truths that are not strings (a Parquet column of numbers) are compared as ``str(ground_truth)``; verl
  compares them as they are, so a number never matches there.
- Ground truths are read as Trinity's users keep them (``trinity_like.algorithms.truths``): gsm8k's truth may be
  the whole solution (``... #### 72``), ``1,234`` or ``72.`` (compared as ``1234`` and ``72``); a MATH truth may be
  ``\\boxed{...}``. verl compares the truth as it is, so these score 0 there. A gsm8k truth that is not a number
  raises ``UnreadableTruth`` (and a run refuses it at start-up) instead of scoring 0.

Every verl quirk of the rules is kept, so that a run scores as verl would: gsm8k's ``flexible`` method keeps
commas and a trailing period (``"42."`` is not ``"42"``) and both methods read only the last 300 characters;
MATH reads ``\\boxed`` only (``\\fbox{}`` scores 0) and ``0.5`` equals ``\\frac{1}{2}`` but ``0.50`` does not.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from typing import Any

from trinity_like.algorithms.truths import boxed_reference, closing_brace, gsm8k_reference

__all__ = ["closing_brace"]  # re-exported: rewards and the MATH rule share it

Scorer = Callable[[str, Any], float]

# ---------------------------------------------------------------- gsm8k (verl gsm8k.py)

GSM8K_CLIP_CHARS = 300
"""Only the last 300 characters of a solution are searched (verl: the answer is at the end)."""
_GSM8K_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_GSM8K_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")
GSM8K_METHODS = ("strict", "flexible")


def gsm8k_extract(solution: str, method: str = "strict") -> str | None:
    """The answer of a GSM8K solution, from its last 300 characters.

    ``strict``: the last ``#### <number>`` (the dataset's format), commas and ``$`` removed.
    ``flexible``: the last run of digits, ``.``, ``,`` (and a leading ``-``) that is not ``""`` or ``"."``, kept as
    written (commas and a trailing period stay); when every run is ``"."``, the first (verl's loop falls through)."""
    if method not in GSM8K_METHODS:
        raise ValueError(f"gsm8k method must be one of {', '.join(GSM8K_METHODS)}, got {method!r}")
    text = solution[-GSM8K_CLIP_CHARS:]
    if method == "strict":
        found = _GSM8K_STRICT.findall(text)
        return found[-1].replace(",", "").replace("$", "") if found else None
    found = _GSM8K_NUMBER.findall(text)
    if not found:
        return None
    valid = [n for n in found if n not in ("", ".")]
    return valid[-1] if valid else found[0]


def gsm8k_score(solution: str, ground_truth: Any, method: str = "strict", format_score: float = 0.0,
                score: float = 1.0) -> float:
    """GSM8K (ReFT, Trung et al. 2024): ``score`` when the extracted answer (:func:`gsm8k_extract`) equals the
    reference answer exactly, ``format_score`` when an answer was found but differs, 0 when none was. The reference
    is read from the ground truth by ``truths.gsm8k_reference`` (``72``, ``1,234``, ``solution #### 72``,
    ``\\boxed{72}``); a truth it cannot read raises ``UnreadableTruth`` (the sample fails, it does not score 0)."""
    reference = gsm8k_reference(ground_truth)
    answer = gsm8k_extract(solution, method)
    if answer is None:
        return 0.0
    return float(score) if answer == reference else float(format_score)


# ---------------------------------------------------------------- MATH (verl math_reward.py, from lm-eval-harness)


class _NotNormalisable(ValueError):
    """``strip_string`` met a shape its rules cannot rewrite (verl: an assert or an index error); ``is_equiv``
    then compares the raw strings."""


def math_last_boxed(text: str) -> str | None:
    """The last ``\\boxed ...`` / ``\\boxed{...}`` (or ``\\fbox{...}``) of ``text``, command included.

    ``\\boxed `` followed by a space (anywhere) wins: everything after the last one up to a ``$``. Otherwise the
    last ``\\boxed`` (else ``\\fbox``) up to its matching ``}``; None when there is none or the braces never
    close."""
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    idx = text.rfind("\\boxed")
    if idx < 0:
        idx = text.rfind("\\fbox")
        if idx < 0:
            return None
    end = closing_brace(text, idx)
    return None if end is None else text[idx:end + 1]


def math_remove_boxed(boxed: str) -> str | None:
    """The content of ``\\boxed <x>`` or ``\\boxed{<x>}``; None for anything else (``\\fbox{}`` included: verl's
    assert fails there and the sample scores 0)."""
    if "\\boxed " in boxed:
        return boxed[len("\\boxed "):] if boxed.startswith("\\boxed ") else None
    if boxed.startswith("\\boxed{") and boxed.endswith("}"):
        return boxed[len("\\boxed{"):-1]
    return None


def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``; braced fractions stay."""
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if not part:
            raise _NotNormalisable(s)
        if part[0] == "{":
            out += part
            continue
        if len(part) < 2:
            return s
        a, b, rest = part[0], part[1], part[2:]
        out += "{" + a + "}{" + b + "}" + rest if b != "{" else "{" + a + "}" + b + rest
    return out


def _fix_a_slash_b(s: str) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` when both sides are integers written plainly."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _remove_right_units(s: str) -> str:
    """Drop ``\\text{ <unit>}`` at the end (a ``\\text{ `` with a space is only ever a unit in MATH)."""
    if "\\text{ " not in s:
        return s
    parts = s.split("\\text{ ")
    if len(parts) != 2:
        raise _NotNormalisable(s)
    return parts[0]


def _fix_sqrt(s: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}``."""
    if "\\sqrt" not in s:
        return s
    parts = s.split("\\sqrt")
    out = parts[0]
    for part in parts[1:]:
        if not part:
            raise _NotNormalisable(s)
        out += "\\sqrt" + part if part[0] == "{" else "\\sqrt{" + part[0] + "}" + part[1:]
    return out


def strip_string(s: str) -> str:
    """MATH's answer normalisation (Hendrycks et al. 2021, as lm-eval-harness and verl apply it): no line breaks,
    ``\\!``, ``\\left``/``\\right``, degrees, ``\\$``, units, ``\\%`` or spaces; ``tfrac``/``dfrac`` -> ``frac``;
    a leading ``.`` gets a ``0``; ``k = `` (two characters or less before one ``=``) dropped; ``\\sqrt3`` and
    ``\\frac12`` braced; exactly ``0.5`` -> ``\\frac{1}{2}``; ``a/b`` of integers -> ``\\frac{a}{b}``.
    Raises ``_NotNormalisable`` where verl's version raises."""
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    s = _remove_right_units(s)
    s = s.replace("\\\\%", "").replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def is_equiv(a: str | None, b: str | None) -> bool:
    """Equal after :func:`strip_string` (the raw strings compared when either cannot be normalised)."""
    if a is None or b is None:
        return a is None and b is None
    try:
        return strip_string(a) == strip_string(b)
    except _NotNormalisable:
        return a == b


def math_reward_score(solution: str, ground_truth: Any) -> float:
    """MATH (verl ``math_reward``): 1.0 when the content of the solution's last ``\\boxed`` is :func:`is_equiv`
    to the reference answer, else 0.0 (no box, an ``\\fbox``, or unclosed braces: 0.0). The reference is the
    ground truth, or the content of its last ``\\boxed{}`` when it has one (``truths.boxed_reference``, as
    Trinity's ``compute_score`` reads it)."""
    reference = boxed_reference(ground_truth)
    boxed = math_last_boxed(solution)
    answer = math_remove_boxed(boxed) if boxed is not None else None
    return 1.0 if answer is not None and is_equiv(answer, reference) else 0.0


# ---------------------------------------------------------------- math_dapo (verl math_dapo.py, Minerva's rule)

_DAPO_SUBSTITUTIONS = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
_DAPO_REMOVED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points",
    "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
    "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
    "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots",
)
DAPO_ANSWER_PATTERN = r"(?i)Answer\s*:\s*([^\n]+)"
"""Where a math_dapo solution states its answer: the rest of the line after the last ``Answer:``."""
DAPO_CLIP_CHARS = 300
"""Only the last 300 characters of a solution are read (verl: MATH-500's longest answer has 159)."""


def normalize_final_answer(answer: str) -> str:
    """Minerva's normalisation (Lewkowycz et al. 2022, as verl's math_dapo applies it): the text after the last
    ``=``; fixed substitutions (articles, ``\\$``, spaces) and unit words removed; the math of the first ``$...$``
    kept; ``\\text{}``, ``\\textbf{}``, ``\\overline{}``, ``\\boxed{}`` unwrapped; ``\\fracab`` -> ``\\frac{a}{b}``,
    ``\\sqrta`` -> ``\\sqrt{a}``; ``$`` dropped; thousands commas dropped from a plain integer."""
    answer = answer.split("=")[-1]
    for before, after in _DAPO_SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expr in _DAPO_REMOVED:
        answer = answer.replace(expr, "")
    answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", answer)
    answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", answer)
    answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def _dapo_last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces matched); None when there is none or it never closes."""
    idx = text.rfind("\\boxed{")
    if idx < 0:
        return None
    end = closing_brace(text, idx)
    return None if end is None else text[idx + len("\\boxed{"):end]


def math_dapo_score(solution: str, ground_truth: Any, strict_box_verify: bool = False) -> float:
    """DAPO's math reward (Yu et al. 2025, arXiv:2503.14476; verl ``math_dapo``): +1.0 when right, -1.0 otherwise
    (no answer included), on the solution's last 300 characters.

    Default (Minerva): the answer is the rest of the line after the last ``Answer:`` (any case), and right when
    it equals the ground truth after :func:`normalize_final_answer` on both. ``strict_box_verify``: the content
    of the last ``\\boxed{}`` in the last 100 of those characters must equal the ground truth exactly."""
    text = solution[-DAPO_CLIP_CHARS:]
    truth = str(ground_truth)
    if strict_box_verify:
        return 1.0 if _dapo_last_boxed(text[-100:]) == truth else -1.0
    found = re.findall(DAPO_ANSWER_PATTERN, text)
    pred = normalize_final_answer(found[-1] if found else "[INVALID]")
    return 1.0 if pred == normalize_final_answer(truth) else -1.0


# ---------------------------------------------------------------- Search-R1 QA exact match (verl search_r1_like_qa_em.py)

_PUNCTUATION = frozenset(string.punctuation)
SEARCH_R1_MAX_TAGS = 10
"""More ``<answer>`` (or ``</answer>``) tags than this quarter the score of a right answer (tag spamming)."""


def qa_normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles (a, an, the), single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def search_r1_em_score(solution: str, ground_truth: Any, format_score: float = 0.0, score: float = 1.0) -> float:
    """Search-R1 exact match (Jin et al. 2025, arXiv:2503.09516): the answer is the content of the last
    ``<answer>...</answer>``; ``score`` when it equals one of the golden answers after :func:`qa_normalize`
    (``score / 4`` when the solution has more than 10 opening or closing answer tags), ``format_score`` when it
    differs, 0 when there is no answer. ``ground_truth``: ``{"target": answer or [answers]}`` as in verl's data
    files (a bare answer or list of answers is taken too)."""
    found = re.findall(r"<answer>(.*?)</answer>", solution, re.DOTALL)
    if not found:
        return 0.0
    golden = ground_truth.get("target") if isinstance(ground_truth, dict) else ground_truth
    golden = [golden] if isinstance(golden, str) else list(golden)
    predicted = qa_normalize(found[-1].strip())
    if not any(qa_normalize(str(g)) == predicted for g in golden):
        return float(format_score)
    spam = max(solution.count("<answer>"), solution.count("</answer>")) > SEARCH_R1_MAX_TAGS
    return float(score) / 4 if spam else float(score)


# ---------------------------------------------------------------- verl's data sources

MATH_SETS = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")

VERL_SCORERS: dict[str, Scorer] = {
    "openai/gsm8k": gsm8k_score,
    **{name: math_reward_score for name in MATH_SETS},
    "math_dapo": math_dapo_score,
    "math_dapo_reasoning": math_dapo_score,
    # "math" -> math_dapo in verl; ours keeps its own 0/1 scorer (module docstring)
}
"""verl's data sources with a scorer here, by exact name."""

VERL_PREFIX_SCORERS: dict[str, Scorer] = {
    "aime": math_dapo_score,
    "numina_": math_reward_score,
    "searchR1_": search_r1_em_score,
}
"""verl's data sources with a scorer here, by name prefix (``aime2024``, ``numina_olympiads``, ``searchR1_nq``)."""

_CODE_WHY = ("a code data set, which verl scores by running the code against its tests in a sandbox, "
             "sandbox_fusion or prime_code: no such scorer is built in")
NOT_BUILT_IN: dict[str, str] = {
    **{name: _CODE_WHY for name in ("codecontests", "apps", "codeforces", "taco")},
    "hiyouga/geometry3k": ("a vision data set, which verl scores with mathruler's sympy grader, geo3k: no such "
                           "scorer is built in"),
}
"""verl's data sources that have no scorer here, with why: a run on them needs a reward function of its own."""
