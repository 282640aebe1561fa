"""Rewards: rule-based scorers, custom reward functions loaded from a file, and reward managers.

A reward function has the seeds' batched signature::

    compute_score(responses: list[str], ground_truths: list, **kwargs) -> list[float]

``kwargs`` carries ``data_sources`` (one per response) and anything else the caller has. The built-in
:func:`compute_score` dispatches each sample by its data source (:func:`scorer_for`) to a scorer: ours below
(``arithmetic``, ``math``, ``countdown``, ``format``) and verl's (``openai/gsm8k``, the MATH sets, ``math_dapo``,
``aime*``, ``numina_*``, ``searchR1_*``: :mod:`trinity_like.algorithms.verl_scores`, which lists where they
depart from verl). One data source differs from verl's dispatch: ``math`` is ours (1.0 right, 0.0 wrong: the
answer in ``<answer>``, the last ``\\boxed{}``, the number after ``####`` or the last number, compared after
normalisation), where verl scores ``math`` with ``math_dapo`` (+1 / -1, the answer after "Answer:"). A data source
with no scorer raises KeyError here, which the reward manager records as a failed sample; a run refuses such task
sets before it starts (``runtime.run_dir``).

Each scorer reads the reference answer out of its ground truth in the forms users bring (``72``, gsm8k's
``... #### 72``, ``\\boxed{72}``, countdown's JSON): :data:`TRUTH_READERS`, module ``truths``. A truth its scorer
cannot read raises ``UnreadableTruth`` (a failed sample, never a silent 0), and a run refuses a task set with such a
row before it starts (:func:`truth_problem`, ``runtime.run_dir.check_reward_sources``).

A reward function that raises, returns the wrong number of scores, or returns NaN/inf or a non-number for a
sample scores that sample with ``failure_value`` and logs it; the rest of the batch is scored normally (the
batch is re-scored one sample at a time to find which sample failed).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import logging
import math
import operator
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trinity_like.algorithms.verl_scores as verl_scores
from trinity_like.algorithms.truths import (
    UnreadableTruth,
    arithmetic_reference,
    boxed_reference,
    countdown_reference,
    gsm8k_reference,
    last_answer_tag,
    last_boxed,
    math_reference,
)
from trinity_like.common.algorithm_params import OverlongBufferParams

logger = logging.getLogger(__name__)

RewardFn = Callable[..., list[float]]

# ---------------------------------------------------------------- scorers

_LEADING_INT = re.compile(r"\s*(-?\d+)")
# thousands separators only in groups of three, so "3, then" is 3 and "5,000" is 5000
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def arithmetic_reward(response: str, answer: str, format_reward: float = 0.1) -> float:
    """1.0 when the response starts with the answer's number; ``format_reward`` when it starts with some
    other number (right format, wrong value); 0.0 otherwise. Leading whitespace and anything after the
    number are ignored."""
    m = _LEADING_INT.match(response)
    if m is None:
        return 0.0
    return 1.0 if m.group(1) == str(answer).strip() else format_reward


def normalize_answer(answer: str) -> str:
    """Canonical form of a math answer: no spaces, ``$``, ``\\left``/``\\right``, ``\\text{}`` wrappers,
    trailing period or thousands separators; ``\\frac{a}{b}`` / ``\\dfrac`` -> ``a/b``; ``+`` sign dropped."""
    s = str(answer).strip()
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", s)
    s = re.sub(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", s)
    for token in ("\\left", "\\right", "$", "\\!", "\\,", "\\;", " "):
        s = s.replace(token, "")
    s = s.rstrip(".")
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    s = re.sub(r"^\((-?\d+)\)/\((\d+)\)$", r"\1/\2", s)
    return s.lstrip("+")


def _as_number(s: str) -> float | None:
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            return float(num) / float(den)
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def math_answers(solution: str) -> list[str]:
    """The answers a solution gives, as Trinity's math rewards accept them, best first. Read inside the last
    ``<answer>...</answer>`` when there is one (its whole content is the first answer), else the whole solution;
    there: its last ``\\boxed{}``; else the last number after its last ``####``; else its last number."""
    tagged = last_answer_tag(solution)
    region = solution if tagged is None else tagged
    out = [] if tagged is None else [tagged.strip()]
    boxed = last_boxed(region)
    if boxed is not None:
        return [*out, boxed]
    numbers = _NUMBER.findall(region.rsplit("####", 1)[1] if "####" in region else region)
    return [*out, numbers[-1]] if numbers else out


def extract_math_answer(solution: str) -> str | None:
    """The answer a solution gives (:func:`math_answers`' first); None when it gives none."""
    found = math_answers(solution)
    return found[0] if found else None


def _same_answer(found: str, reference: str) -> bool:
    """Equal after normalisation, or numerically within 1e-6 relative when both are numbers."""
    a, b = normalize_answer(found), normalize_answer(reference)
    if a == b:
        return True
    x, y = _as_number(a), _as_number(b)
    return x is not None and y is not None and math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9)


def math_score(solution: str, ground_truth: Any) -> float:
    """1.0 if one of the solution's answers (:func:`math_answers`: ``<answer>72</answer>``, ``\\boxed{72}``,
    ``#### 72`` or a final number) equals the reference answer after normalisation (numerically within 1e-6
    relative when both are numbers), else 0.0. The reference is read from the ground truth by
    ``truths.math_reference`` (``72``, ``solution #### 72``, ``\\boxed{72}``, ``<answer>72</answer>``); a truth it
    cannot read raises ``UnreadableTruth`` (the sample fails, it does not score 0)."""
    reference = math_reference(ground_truth)
    return 1.0 if any(_same_answer(found, reference) for found in math_answers(solution)) else 0.0


THINK_ANSWER_FORMAT = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


def format_score(solution: str, pattern: re.Pattern | str = THINK_ANSWER_FORMAT) -> float:
    """1.0 if the whole solution matches ``pattern`` (by default ``<think>...</think><answer>...</answer>``)."""
    return 1.0 if re.match(pattern, solution) else 0.0


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _safe_eval(expr: str) -> float:
    """Evaluate + - * / and parentheses over integers, nothing else."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError("only + - * / and parentheses over integers are allowed")

    return ev(ast.parse(expr, mode="eval"))


def countdown_score(solution: str, ground_truth: Any, format_reward: float = 0.1) -> float:
    """Countdown (TinyZero): ``ground_truth = {"target": int, "numbers": [int, ...]}``, a dict or its JSON string
    (``truths.countdown_reference``; anything else raises ``UnreadableTruth``). The equation is the content of the
    last ``<answer>...</answer>`` (else the last line). 1.0 if it uses every number exactly once and equals the
    target; ``format_reward`` if an equation was given but is wrong; 0.0 if none."""
    ground_truth = countdown_reference(ground_truth)
    found = re.findall(r"<answer>(.*?)</answer>", solution, re.DOTALL)
    equation = (found[-1] if found else (solution.strip().splitlines() or [""])[-1]).split("=")[0].strip()
    if not equation or not re.fullmatch(r"[\d+\-*/() ]+", equation):
        return 0.0
    used = sorted(int(n) for n in re.findall(r"\d+", equation))
    if used != sorted(int(n) for n in ground_truth["numbers"]):
        return format_reward
    try:
        value = _safe_eval(equation)
    except (ValueError, ZeroDivisionError, SyntaxError):
        return format_reward
    return 1.0 if abs(value - float(ground_truth["target"])) < 1e-5 else format_reward


SCORERS: dict[str, Callable[[str, Any], float]] = {}
"""Built-in scorers by exact data source: ``scorer(solution, ground_truth) -> float`` (ours, then verl's)."""
PREFIX_SCORERS: dict[str, Callable[[str, Any], float]] = {}
"""Built-in scorers by data-source prefix (verl's ``aime*``, ``numina_*``, ``searchR1_*``)."""


def register_scorer(data_source: str, scorer: Callable[[str, Any], float]) -> None:
    """Score ``data_source`` with ``scorer``; a name ending in ``*`` is a prefix rule. A name registered twice
    is an error (so verl's rules never replace ours: ``math`` stays ours, module ``verl_scores``)."""
    table, key = (PREFIX_SCORERS, data_source[:-1]) if data_source.endswith("*") else (SCORERS, data_source)
    if key in table:
        raise ValueError(f"a scorer for data source {data_source!r} is registered already")
    table[key] = scorer


for _name, _scorer in {"arithmetic": arithmetic_reward, "math": math_score, "countdown": countdown_score,
                       "format": lambda solution, _ground_truth: format_score(solution),
                       **verl_scores.VERL_SCORERS,
                       **{f"{prefix}*": fn for prefix, fn in verl_scores.VERL_PREFIX_SCORERS.items()}}.items():
    register_scorer(_name, _scorer)
del _name, _scorer


def scorer_for(data_source: str) -> Callable[[str, Any], float] | None:
    """The built-in scorer of ``data_source`` (empty: ``math``): by exact name, else by the longest prefix rule;
    None when there is none (then :func:`missing_scorer` says why, in words)."""
    source = data_source or "math"
    if source in SCORERS:
        return SCORERS[source]
    prefixes = sorted((p for p in PREFIX_SCORERS if source.startswith(p)), key=len, reverse=True)
    return PREFIX_SCORERS[prefixes[0]] if prefixes else None


TRUTH_READERS: dict[Callable[[str, Any], float], Callable[[Any], Any]] = {
    arithmetic_reward: arithmetic_reference,
    math_score: math_reference,
    countdown_score: countdown_reference,
    verl_scores.gsm8k_score: gsm8k_reference,
    verl_scores.math_reward_score: boxed_reference,
}
"""How each built-in scorer reads its ground truth (``trinity_like.algorithms.truths``): ``reader(truth)`` returns
the reference answer or raises ``UnreadableTruth`` saying which forms it reads. Scorers not listed (``format``,
``math_dapo``, ``searchR1_*``) take any truth."""


def truth_problem(data_source: str, truth: Any) -> str | None:
    """None when the built-in scorer of ``data_source`` can read ``truth`` (or there is no such scorer, which
    :func:`missing_scorer` reports, or it takes any truth); else why not, in one clause that names the forms it
    reads. Cheap: only the truth is read, nothing is scored."""
    reader = TRUTH_READERS.get(scorer_for(data_source))
    if reader is None:
        return None
    try:
        reader(truth)
    except UnreadableTruth as e:
        return str(e)
    return None


def known_scorers() -> list[str]:
    """The data sources the built-in reward scores: exact names, then prefix rules as ``prefix*``."""
    return [*SCORERS, *(f"{p}*" for p in PREFIX_SCORERS)]


def missing_scorer(data_source: str) -> str | None:
    """None when the built-in reward scores ``data_source``; else one clause saying so, and why for the verl data
    sets that need a reward function of their own (code sets, geometry3k), e.g. ``no built-in scorer for data
    source 'taco' (a code data set, ...)``."""
    if scorer_for(data_source) is not None:
        return None
    why = verl_scores.NOT_BUILT_IN.get(data_source)
    return f"no built-in scorer for data source {data_source!r}" + (f" ({why})" if why else "")


def compute_score(responses: Sequence[str], ground_truths: Sequence[Any], data_sources: Sequence[str] | None = None,
                  **_: Any) -> list[float]:
    """The default reward function: each sample scored by the scorer of its data source (:func:`scorer_for`;
    ``math`` when the data source is missing). KeyError for a data source with no scorer."""
    sources = data_sources if data_sources is not None else ["math"] * len(responses)
    out = []
    for response, truth, source in zip(responses, ground_truths, sources, strict=True):
        scorer = scorer_for(source)
        if scorer is None:
            raise KeyError(f"{missing_scorer(source)}; built-in: {', '.join(known_scorers())}")
        out.append(scorer(response, truth))
    return out


DEFAULT_REWARD_FN: RewardFn = compute_score


# ---------------------------------------------------------------- custom functions


def load_reward_function(path: str | Path, name: str = "compute_score",
                         kwargs: dict[str, Any] | None = None) -> RewardFn:
    """Import ``name`` from the Python file at ``path`` (a clear error if either is missing), with ``kwargs``
    bound to it (verl's ``reward_kwargs``; a name the function does not take is refused here)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"reward function file '{path}' does not exist")
    spec = importlib.util.spec_from_file_location(f"trinity_like_reward_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import reward function file '{path}'")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AttributeError(f"reward function file '{path}' has no function {name!r}")
    if kwargs:
        params = inspect.signature(fn).parameters
        unknown = sorted(k for k in kwargs if k not in params)
        if unknown and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            raise TypeError(f"reward function {name!r} in '{path}' takes no argument(s) {', '.join(unknown)} "
                            f"(reward.function_kwargs); it takes {', '.join(params)}")
        fn = functools.partial(fn, **kwargs)
    return as_batched_reward_fn(fn)


PER_SAMPLE_PARAMS = ("data_source", "solution_str", "ground_truth", "extra_info")
"""What verl's reward loop gives a per-sample reward function, by keyword:
``compute_score(data_source, solution_str, ground_truth, extra_info=None)``."""


def as_batched_reward_fn(fn: Callable[..., Any]) -> RewardFn:
    """A reward function in the batched form ``fn(responses, ground_truths, **kwargs) -> list[float]``.

    Two signatures are accepted: the batched one (the seeds'), which gets of the keyword arguments
    ``data_sources`` and ``extra_infos`` those it names (all of them when it takes ``**kwargs``); and verl's
    per-sample one (it names ``solution_str`` or ``ground_truth``, or starts with ``data_source``), called once per
    sample with those of :data:`PER_SAMPLE_PARAMS` it names (all four when it takes ``**kwargs``), so that both
    ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` and the shape of verl's own
    scorers, ``compute_score(solution_str, ground_truth, method="strict", ...)`` (``gsm8k.py``), are called right.
    (verl's reward loop passes all four, so a file of the second shape works there only through
    ``default_compute_score``.) Its result may be a number or a dict with a ``score`` (verl's convention for extra
    outputs). A per-sample function that needs an argument other than those four is refused here (TypeError)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C function: take it as batched
        return fn
    names = list(params)
    if "solution_str" in names or "ground_truth" in names or names[:1] == ["data_source"]:
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        passed = PER_SAMPLE_PARAMS if takes_any else tuple(k for k in PER_SAMPLE_PARAMS if k in params)
        required = [k for k, p in params.items() if p.default is p.empty and k not in PER_SAMPLE_PARAMS
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if required:
            raise TypeError(f"reward function {getattr(fn, '__name__', fn)!r} needs argument(s) {', '.join(required)}, "
                            f"which a per-sample reward function is not given; it is called with "
                            f"{', '.join(PER_SAMPLE_PARAMS)} (those it names), so name its parameters so or give "
                            "them defaults (reward.function_kwargs binds values)")

        def per_sample(responses, ground_truths, data_sources=None, extra_infos=None, **_: Any) -> list[Any]:
            n = len(responses)
            sources = data_sources if data_sources is not None else [""] * n
            extras = extra_infos if extra_infos is not None else [{}] * n
            out = []
            for response, truth, source, extra in zip(responses, ground_truths, sources, extras, strict=True):
                given = {"data_source": source, "solution_str": response, "ground_truth": truth, "extra_info": extra}
                score = fn(**{k: given[k] for k in passed})
                out.append(score.get("score") if isinstance(score, dict) else score)
            return out

        return per_sample
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn
    accepted = {k for k in ("data_sources", "extra_infos") if k in params}

    def batched(responses, ground_truths, **kwargs: Any) -> list[Any]:
        return fn(responses, ground_truths, **{k: v for k, v in kwargs.items() if k in accepted})

    return batched


def _valid_score(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def score_batch(fn: RewardFn, responses: Sequence[str], ground_truths: Sequence[Any], failure_value: float = 0.0,
                errors: list[str] | None = None, **kwargs: Any) -> tuple[list[float], list[int]]:
    """Scores of a batch and the indices of samples that failed (scored ``failure_value``); ``errors``, when
    given, receives each failure's reason in one line.

    Per-sample ``kwargs`` (sequences as long as ``responses``) are sliced when samples are re-scored alone."""
    errors = [] if errors is None else errors
    n = len(responses)
    try:
        scores = list(fn(list(responses), list(ground_truths), **kwargs))
        if len(scores) != n:
            raise ValueError(f"reward function returned {len(scores)} scores for {n} responses")
    except Exception as e:  # any failure of user code: isolate the sample(s) below
        logger.warning("reward function failed on a batch of %d (%s); scoring samples one by one", n, e)
        scores = []
        for i in range(n):
            one = {k: ([v[i]] if isinstance(v, (list, tuple)) and len(v) == n else v) for k, v in kwargs.items()}
            try:
                result = list(fn([responses[i]], [ground_truths[i]], **one))
                scores.append(result[0] if len(result) == 1 else None)
            except Exception as sample_error:
                logger.warning("reward function failed on sample %d: %s", i, sample_error)
                first = str(sample_error).splitlines()[0] if str(sample_error) else ""
                errors.append(f"{type(sample_error).__name__}: {first}")
                scores.append(None)
    failures = [i for i, s in enumerate(scores) if not _valid_score(s)]
    for i in failures:
        if scores[i] is not None:
            logger.warning("reward function returned %r for sample %d; using %s", scores[i], i, failure_value)
            errors.append(f"it returned {scores[i]!r}, not a finite number")
        scores[i] = failure_value
    return [float(s) for s in scores], failures


# ---------------------------------------------------------------- managers


OverlongBufferConfig = OverlongBufferParams
"""DAPO's overlong penalty (defaults in ``trinity_like.common.algorithm_params``)."""


MODEL_COMBINE = ("replace", "add")
"""How a reward model's scores meet the reward function's (``reward.model.combine``)."""


class NaiveRewardManager:
    """Scores decoded responses with a reward function; the score sits on the last response token.

    With a reward model's scores (``score(..., model_scores=...)``, computed by the explorer's reward-model actor),
    ``model_combine`` says what they do: ``replace`` (the reward is the model's score, the function is not called:
    verl's behaviour) or ``add`` (model score + function score)."""

    def __init__(self, tokenizer, num_examine: int = 0, compute_score: RewardFn | None = None,
                 reward_fn_key: str = "data_source", failure_value: float = 0.0,
                 model_combine: str = "replace") -> None:
        if model_combine not in MODEL_COMBINE:
            raise ValueError(f"model_combine must be one of {', '.join(MODEL_COMBINE)}, got {model_combine!r}")
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or DEFAULT_REWARD_FN
        self.reward_fn_key = reward_fn_key
        self.failure_value = failure_value
        self.model_combine = model_combine
        self._examined: dict[str, int] = {}
        self.last_error: str | None = None
        """Why the reward function last failed on a sample, in one line (None: it never did)."""

    def score(self, responses: Sequence[str], ground_truths: Sequence[Any], data_sources: Sequence[str],
              response_lengths: Sequence[int] | None = None, extra_infos: Sequence[dict] | None = None,
              model_scores: Sequence[float] | None = None) -> tuple[list[float], dict[str, list]]:
        """Scores per response and extra per-sample info (``reward_failed``; with ``model_scores`` also
        ``model_score``). ``extra_infos``: per-sample extras for the reward function (verl's ``extra_info``)."""
        n = len(responses)
        if model_scores is not None and len(model_scores) != n:
            raise ValueError(f"{len(model_scores)} reward-model scores for {n} responses")
        if model_scores is not None and self.model_combine == "replace":
            scores, failures = [float(s) for s in model_scores], []
        else:
            kwargs: dict[str, Any] = {"data_sources": list(data_sources)}
            if extra_infos is not None:
                kwargs["extra_infos"] = list(extra_infos)
            errors: list[str] = []
            scores, failures = score_batch(self.compute_score, responses, ground_truths, self.failure_value,
                                           errors=errors, **kwargs)
            if errors:
                self.last_error = errors[-1]
            if model_scores is not None:
                scores = [s + float(m) for s, m in zip(scores, model_scores, strict=True)]
        self._print_examples(responses, ground_truths, data_sources, scores)
        failed = set(failures)
        extra: dict[str, list] = {"reward_failed": [i in failed for i in range(n)]}
        if model_scores is not None:
            extra["model_score"] = [float(m) for m in model_scores]
        return scores, extra

    def _print_examples(self, responses, ground_truths, data_sources, scores) -> None:
        for response, truth, source, s in zip(responses, ground_truths, data_sources, scores, strict=True):
            if self._examined.get(source, 0) < self.num_examine:
                self._examined[source] = self._examined.get(source, 0) + 1
                print(f"[{source}] response: {response!r}  ground truth: {truth!r}  score: {s}")

    def __call__(self, exps, return_dict: bool = False):
        """Token-level rewards (B, R) for a list of Experiences (R = longest response), the score on each
        response's last token. Ground truth from ``info["ground_truth"]`` (or ``info["answer"]``), data source
        from ``info[reward_fn_key]``."""
        import torch

        responses = [e.response_text if e.response_text is not None
                     else self.tokenizer.decode(e.response_ids.tolist(), skip_special_tokens=True) for e in exps]
        truths = [e.info.get("ground_truth", e.info.get("answer")) for e in exps]
        sources = [e.info.get(self.reward_fn_key, "math") for e in exps]
        lengths = [len(e.response_ids) for e in exps]
        scores, extra = self.score(responses, truths, sources, lengths)
        reward = torch.zeros(len(exps), max(max(lengths, default=1), 1))
        for i, (s, n) in enumerate(zip(scores, lengths, strict=True)):
            if n:
                reward[i, n - 1] = s
        return {"reward_tensor": reward, "reward_extra_info": extra} if return_dict else reward


class DAPORewardManager(NaiveRewardManager):
    """NaiveRewardManager plus DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476): with
    expected = max_resp_len - buffer_len, a response of n tokens gets min(-(n - expected) / buffer_len *
    penalty_factor, 0) added to its score."""

    def __init__(self, tokenizer, num_examine: int = 0, compute_score: RewardFn | None = None,
                 reward_fn_key: str = "data_source", max_resp_len: int | None = None,
                 overlong_buffer_cfg: OverlongBufferConfig | Any = None, failure_value: float = 0.0,
                 model_combine: str = "replace") -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, failure_value, model_combine)
        self.overlong = overlong_buffer_cfg or OverlongBufferConfig()
        self.max_resp_len = max_resp_len
        if self.overlong.enable:
            if max_resp_len is None:
                raise ValueError("DAPORewardManager with an overlong buffer needs max_resp_len")
            if not 0 < self.overlong.len <= max_resp_len:
                raise ValueError(f"overlong buffer len must be in (0, max_resp_len={max_resp_len}], "
                                 f"got {self.overlong.len}")

    def score(self, responses, ground_truths, data_sources, response_lengths=None, extra_infos=None,
              model_scores=None):
        """The naive scores (a reward model's included) plus the overlong penalty."""
        scores, extra = super().score(responses, ground_truths, data_sources, response_lengths, extra_infos,
                                      model_scores)
        if self.overlong.enable:
            if response_lengths is None:
                raise ValueError("the overlong penalty needs response_lengths")
            expected = self.max_resp_len - self.overlong.len
            penalties = [min(-(n - expected) / self.overlong.len * self.overlong.penalty_factor, 0.0)
                         for n in response_lengths]
            scores = [s + p for s, p in zip(scores, penalties, strict=True)]
            extra["overlong_reward"] = penalties
        return scores, extra


REWARD_MANAGERS = {"naive": NaiveRewardManager, "dapo": DAPORewardManager}


def load_reward_manager(config, tokenizer, num_examine: int = 0, **kwargs: Any):
    """Build the reward manager that ``config.reward`` (or ``config`` itself, a RewardConfig) describes:
    ``manager`` (naive | dapo), ``function_path`` / ``function_name`` (a custom reward function; empty = the
    built-in ``compute_score``), ``reward_fn_key``, ``failure_value``, ``model.combine``, and for dapo
    ``max_resp_len`` and ``overlong_buffer``. ``kwargs`` go to the manager's constructor."""
    rc = getattr(config, "reward", config)
    if rc.manager not in REWARD_MANAGERS:
        raise KeyError(f"unknown reward manager {rc.manager!r}; valid names: {', '.join(REWARD_MANAGERS)}")
    fn = load_reward_function(rc.function_path, rc.function_name, dict(rc.function_kwargs)) if rc.function_path else None
    common = dict(compute_score=fn, reward_fn_key=rc.reward_fn_key, failure_value=rc.failure_value,
                  model_combine=rc.model.combine)
    if rc.manager == "dapo":
        max_resp_len = rc.max_resp_len
        if max_resp_len is None and hasattr(config, "explorer"):
            max_resp_len = config.explorer.sampling.max_new_tokens
        common.update(max_resp_len=max_resp_len, overlong_buffer_cfg=rc.overlong_buffer)
    return REWARD_MANAGERS[rc.manager](tokenizer, num_examine, **{**common, **kwargs})


def compute_reward(data, reward_fn) -> tuple[Any, dict[str, list]]:
    """verl's ``compute_reward(data, reward_fn)``: the token-level reward tensor (B, R) of ``data`` (a list of
    Experiences) and the reward manager's extra per-sample info. ``reward_fn`` is a reward manager (anything
    called as ``reward_fn(data, return_dict=True)`` returning ``{"reward_tensor", "reward_extra_info"}``), or a
    callable that takes only ``data`` and returns the tensor (then the extra info is empty)."""
    try:
        result = reward_fn(data, return_dict=True)
    except TypeError as e:  # a callable without return_dict
        if "return_dict" not in str(e):
            raise
        return reward_fn(data), {}
    return result["reward_tensor"], dict(result.get("reward_extra_info", {}))
