"""Reading the reference answer out of a ground truth, in the forms users bring it.

A task set's ground truth is not always the bare answer. Trinity-RFT keeps gsm8k's whole solution
(``... #### 72``), MATH-style sets keep ``\\boxed{72}``, and countdown keeps ``{"target": .., "numbers": [..]}``,
as a dict or as a JSON string. A scorer that compared such a truth as it is would score every sample 0 and say
nothing; so each built-in scorer reads its truth through one of the readers here, and the same readers run once
over the whole task set when a run starts (``runtime.run_dir.check_reward_sources``), so that a truth a scorer
cannot read stops the run before its first step instead of scoring 0 for a hundred.

A reader takes the ground truth and returns the reference answer, or raises :class:`UnreadableTruth` whose
message says which forms it reads. Readers never look at a response.

Where this departs from Trinity: Trinity's math reward parses both sides with ``math_verify`` (sympy), which reads
any text and extracts something from it; here a truth must be in one of the forms below, and prose without a
marker (``####``, ``\\boxed{}``, ``<answer>``) is refused rather than guessed at.
"""

from __future__ import annotations

import json
import re
from typing import Any


class UnreadableTruth(ValueError):
    """A ground truth that a scorer cannot read; the message says which forms it reads."""


MATH_TRUTH_FORMS = "a bare answer ('72'), gsm8k's 'solution #### 72', '\\boxed{72}' or '<answer>72</answer>'"
"""The truth forms :func:`math_reference` reads, in words (for messages)."""
BARE_ANSWER_MAX_CHARS = 100
"""A truth with none of the markers is taken as the bare answer only when it is one line of at most this many
characters and not prose (:data:`_PROSE`): a longer text is a solution whose answer we cannot locate."""
_PROSE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}(?:[ \t]+[A-Za-z]{2,}[,.;:]?){3,}")
"""Four plain words in a row (not LaTeX commands): a sentence, not an answer."""
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def closing_brace(text: str, start: int) -> int | None:
    """Where the braces counted from ``start`` first balance again: the index of the ``}`` that brings the depth
    back to 0 (a ``}`` before any ``{`` takes it below 0, as in verl's loops); None when that never happens."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), with nested braces; None if there is none."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    end = closing_brace(text, i)
    return None if end is None else text[i + 1:end]


def last_answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>``; None if there is none."""
    found = _ANSWER_TAG.findall(text)
    return found[-1] if found else None


def _scalar_text(truth: Any, forms: str) -> str:
    """``truth`` as stripped text: a string or a number (not a bool); anything else, or an empty text, refused."""
    if isinstance(truth, bool) or not isinstance(truth, (str, int, float)):
        raise UnreadableTruth(f"a ground truth of type {type(truth).__name__} is none of the forms it reads: {forms}")
    text = str(truth).strip()
    if not text:
        raise UnreadableTruth(f"the ground truth is empty; it reads {forms}")
    return text


def math_reference(truth: Any) -> str:
    """The reference answer of a math ground truth (``rewards.math_score``), looked for in this order: the content
    of the last ``<answer>...</answer>``; what follows the last ``####`` (gsm8k's solutions); the content of the last
    ``\\boxed{}``; else the truth itself when it is a bare answer (one line, at most
    :data:`BARE_ANSWER_MAX_CHARS` characters, not prose). Numbers are taken as their text. The answer is returned
    as written (``math_score`` normalises both sides: thousands commas, a trailing period, ``$``)."""
    text = _scalar_text(truth, MATH_TRUTH_FORMS)
    tagged = last_answer_tag(text)
    if tagged is not None:
        text = tagged.strip()
    if "####" in text:
        ref = text.rsplit("####", 1)[1].strip()
    else:
        boxed = last_boxed(text)
        if boxed is not None:
            ref = boxed.strip()
        elif "\n" in text or len(text) > BARE_ANSWER_MAX_CHARS or _PROSE.search(text):
            raise UnreadableTruth(f"the ground truth is a text with no final answer marked in it; it reads "
                                  f"{MATH_TRUTH_FORMS}")
        else:
            ref = text
    if not ref:
        raise UnreadableTruth(f"the ground truth marks an empty answer; it reads {MATH_TRUTH_FORMS}")
    return ref


GSM8K_TRUTH_FORMS = "a number ('72', '1,234'), gsm8k's 'solution #### 72' or '\\boxed{72}'"
_GSM8K_REFERENCE = re.compile(r"-?\d+(?:\.\d+)?")


def gsm8k_reference(truth: Any) -> str:
    """The reference answer of a gsm8k ground truth (``verl_scores.gsm8k_score``): as :func:`math_reference`
    finds it, with ``$``, thousands commas and a trailing period dropped; it must then be a number (verl's strict
    rule reads only numbers after ``#### ``, so any other truth would score 0 for every response)."""
    try:
        ref = math_reference(truth)
    except UnreadableTruth as e:
        raise UnreadableTruth(str(e).replace(MATH_TRUTH_FORMS, GSM8K_TRUTH_FORMS)) from None
    ref = ref.replace("$", "").replace(",", "").strip().rstrip(".")
    if not _GSM8K_REFERENCE.fullmatch(ref):
        raise UnreadableTruth(f"the answer {ref!r} is not a number; it reads {GSM8K_TRUTH_FORMS}")
    return ref


BOXED_TRUTH_FORMS = "a bare answer ('\\frac{1}{2}') or '\\boxed{\\frac{1}{2}}'"


def boxed_reference(truth: Any) -> str:
    """The reference answer of a MATH ground truth (``verl_scores.math_reward_score``): the content of its last
    ``\\boxed{}`` when it has one (as Trinity's ``compute_score`` reads it), else the truth as it is (verl's)."""
    text = _scalar_text(truth, BOXED_TRUTH_FORMS)
    boxed = last_boxed(text)
    return text if boxed is None else boxed.strip()


COUNTDOWN_TRUTH_FORMS = '{"target": 24, "numbers": [4, 6, 1]}, as a dict or a JSON string'


def countdown_reference(truth: Any) -> dict[str, Any]:
    """The target and numbers of a countdown ground truth (``rewards.countdown_score``): a dict, or a JSON string
    of one, with an integer ``target`` and a list of integer ``numbers``; returned as ``{"target": int, "numbers":
    [int, ...]}``."""
    if isinstance(truth, str):
        try:
            truth = json.loads(truth)
        except json.JSONDecodeError:
            raise UnreadableTruth(f"the ground truth is a string but not JSON; it reads {COUNTDOWN_TRUTH_FORMS}") from None
    if not isinstance(truth, dict) or "target" not in truth or "numbers" not in truth:
        raise UnreadableTruth(f"the ground truth has no target and numbers; it reads {COUNTDOWN_TRUTH_FORMS}")
    numbers = truth["numbers"]
    numbers = numbers.tolist() if hasattr(numbers, "tolist") else numbers  # a numpy array from Parquet
    try:
        if isinstance(numbers, (str, bytes)) or any(float(n) != int(n) for n in [truth["target"], *numbers]):
            raise ValueError
        return {"target": int(truth["target"]), "numbers": [int(n) for n in numbers]}
    except (TypeError, ValueError):
        raise UnreadableTruth(f"the target and numbers must be integers; it reads {COUNTDOWN_TRUTH_FORMS}") from None


ARITHMETIC_TRUTH_FORMS = "an integer ('7')"


def arithmetic_reference(truth: Any) -> str:
    """The reference answer of an arithmetic ground truth (``rewards.arithmetic_reward``): an integer."""
    text = _scalar_text(truth, ARITHMETIC_TRUTH_FORMS)
    if not re.fullmatch(r"-?\d+", text):
        raise UnreadableTruth(f"the ground truth is not an integer; it reads {ARITHMETIC_TRUTH_FORMS}")
    return text
