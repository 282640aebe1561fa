"""Reward functions of Trinity-RFT's shape: a ``RewardFn`` class built with keyword arguments
(``reward_fn_args``) whose instances are called with keywords (``response=``, ``truth=``, ``prompt=``, ...) and
return a dict of named parts, e.g. ``{"accuracy": 1.0, "format_score": 0.1}``. The reward is the sum of the parts;
each part is logged on its own (``info["reward_parts"]``, ``rollout/reward/<part>``).

``REWARD_FUNCTIONS`` holds them by Trinity's names; ``@REWARD_FUNCTIONS.register_module("name")`` registers a
user's class (a plugin file, ``trinity_like.common.plugins``), and ``REWARD_FUNCTIONS.get`` also takes
``module:Class``, ``path/to/file.py:Class`` or Trinity's dotted ``package.module.Class``.

Built in, with Trinity's formulas (upstream ``trinity/common/rewards``):

- ``math_reward`` (``MathRewardFn``): ``accuracy`` 1.0 / 0.0 plus ``format_score`` +0.1 when the response
  matches ``.*?<think>.*?</think>\\s*<answer>.*?</answer>\\s*$`` (dot-all, multi-line), else -0.1;
- ``math_boxed_reward`` (``MathBoxedRewardFn``): ``accuracy`` 1.0 when the last ``\\boxed{}`` of the response
  is equivalent to the truth (the truth's own last ``\\boxed{}`` when it has one; MATH's string normalisation),
  and ``format_score`` -``format_score_coef`` when called with ``with_think`` and the response lacks exactly
  one ``<think>`` before exactly one ``</think>``, else 0;
- ``accuracy_reward`` (``AccuracyReward``): ``accuracy`` 1.0 / 0.0;
- ``format_reward`` (``FormatReward``): ``format_score`` +0.1 when the response matches the pattern (default
  ``^<think>\\n.*?\\n</think>\\n<answer>\\n.*?\\n</answer>$``, dot-all, multi-line), else -0.1;
- ``countdown_reward`` (``CountDownRewardFn``): ``score`` 0 without an ``<answer>`` on the last line, 0.1 when
  the equation does not use each given number once or does not evaluate to the target, 1.0 when it does;
- ``math_dapo_reward`` (``MathDAPORewardFn``): ``accuracy`` 1.0 / 0.0 plus ``format_score``, DAPO's overlong
  penalty with ``enable_overlong_penalty``.

Departure: Trinity's ``math_reward``, ``accuracy_reward`` (and ``math_dapo_reward``, with verl's PRIME grader) compare answers with the ``math_verify`` package
(symbolic equivalence), not installed here; they use the project's math comparison instead
(``rewards.math_score``: the answer in ``<answer>``, the last ``\\boxed{}``, after ``####`` or the last number,
equal after normalisation or numerically within 1e-6), which agrees on numbers and plain expressions and
differs on answers only a symbolic check finds equal (``\\frac{1}{2}`` and ``0.5`` agree; ``x^2-1`` and
``(x-1)(x+1)`` do not). ``rm_gallery_reward`` needs the rm-gallery package and is refused when the config loads.
"""

from __future__ import annotations

import ast
import inspect
import json
import operator
import re
from collections.abc import Callable
from typing import Any

from trinity_like.algorithms.rewards import math_score
from trinity_like.algorithms.truths import UnreadableTruth
from trinity_like.algorithms.verl_scores import math_reward_score
from trinity_like.common.registry import import_module_ref


class RewardFn:
    """Trinity-RFT's reward function base: ``__init__(**reward_fn_args)``, ``__call__(**kw) -> dict[str, float]``
    (the reward is the sum of the dict's values)."""

    def __init__(self, **kwargs: Any) -> None:
        pass

    def __call__(self, **kwargs: Any) -> dict[str, float]:
        raise NotImplementedError


class Refused:
    """A Trinity name whose implementation needs what this machine cannot have; looking it up raises
    ``LookupError`` with ``why`` (one line: the package and data it needs)."""

    def __init__(self, name: str, why: str) -> None:
        self.name, self.why = name, why


class TrinityRegistry:
    """Trinity-RFT's registry interface (``register_module``, ``get``, ``modules``) over a plain dict: a name
    registered twice is an error (unless ``force``), an unknown name raises KeyError listing the known ones, never
    a silent None (STYLE.md rule 2; Trinity's ``get`` returns None for a key of None and raises otherwise).
    ``on_register(name, obj)`` runs for every registration (the workflow registry mirrors Trinity classes into
    the explorer's own)."""

    def __init__(self, kind: str, on_register: Callable[[str, Any], None] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, Any] = {}
        self._loaded: dict[str, Any] = {}
        """Objects loaded by import path (``get("module:Class")``), once per process: one class per path."""
        self._on_register = on_register

    @property
    def name(self) -> str:
        return self.kind

    @property
    def modules(self) -> dict[str, Any]:
        return {k: v for k, v in self._entries.items() if not isinstance(v, Refused)}

    def register_module(self, module_name: str | None = None, module_cls: Any = None, force: bool = False,
                        lazy: bool = False):
        """``@REG.register_module("name")`` on a class, or ``REG.register_module("name", cls)``."""

        def deco(cls: Any) -> Any:
            key = module_name or cls.__name__
            if key in self._entries and not force and self._entries[key] is not cls:
                raise KeyError(f"{self.kind} {key!r} is already registered; register it under another name "
                               "(or with force=True to replace it)")
            self._entries[key] = cls
            if self._on_register is not None:
                self._on_register(key, cls)
            return cls

        return deco if module_cls is None else deco(module_cls)

    def refuse(self, name: str, why: str) -> None:
        """Register ``name`` as a Trinity name that cannot run here, for ``why``."""
        self._entries[name] = Refused(name, why)
        if self._on_register is not None:
            self._on_register(name, self._entries[name])

    def get(self, key: str) -> Any:
        """The entry named ``key`` or loaded from ``module:Class``, ``file.py:Class`` or ``package.module.Class``;
        KeyError listing the valid names when there is none, LookupError for a refused name."""
        entry = self._entries.get(key)
        if entry is None and isinstance(key, str) and (":" in key or "." in key):
            if key not in self._loaded:
                self._loaded[key] = load_object(key, self.kind)
            entry = self._loaded[key]
        if entry is None:
            raise KeyError(f"unknown {self.kind} {key!r}; valid names: {', '.join(self.names())} (or "
                           "module:Class, or path/to/file.py:Class)")
        if isinstance(entry, Refused):
            raise LookupError(f"{self.kind} {key!r} {entry.why}")
        return entry

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.modules))

    def __contains__(self, key: str) -> bool:
        return key in self._entries


def load_object(ref: str, kind: str) -> Any:
    """``module:Name``, ``path/to/file.py:Name`` or Trinity's ``package.module.Name``; KeyError in words when it
    cannot be imported or has no such name."""
    if ":" in ref:
        module_ref, _, attr = ref.rpartition(":")
    else:
        module_ref, _, attr = ref.rpartition(".")
    try:
        return getattr(import_module_ref(module_ref, "trinity_like_user", "file"), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise KeyError(f"cannot load {kind} {ref!r}: {type(e).__name__}: {e}") from None


REWARD_FUNCTIONS = TrinityRegistry("reward function")
"""Trinity-RFT's reward functions by name (and ``module:Class``)."""


def build_reward_fn(ref: str | type, args: dict[str, Any] | None = None) -> Callable[..., dict[str, float]]:
    """An instance of the reward function ``ref`` (a name, ``module:Class`` or a class) built with ``args``
    (``reward_fn_args``)."""
    cls = REWARD_FUNCTIONS.get(ref) if isinstance(ref, str) else ref
    return cls(**(args or {})) if isinstance(cls, type) else cls


def reward_parts(fn: Callable[..., Any], response: str, truth: Any, prompt: str | None = None,
                 **extra: Any) -> dict[str, float]:
    """``fn``'s parts for one response, called with Trinity's keywords (``response``, ``truth``, and ``prompt``
    or anything in ``extra`` where ``fn`` takes it); a bare number counts as ``{"reward": value}``. ValueError
    when a part is not a number."""
    offered = {"response": response, "truth": truth, "prompt": prompt, **extra}
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in offered.items() if k != "prompt" or "prompt" in params}
    else:
        kwargs = {k: v for k, v in offered.items() if k in params}
    out = fn(**kwargs)
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        return {"reward": float(out)}
    if not isinstance(out, dict):
        raise ValueError(f"reward function {type(fn).__name__} returned {type(out).__name__}; a Trinity reward "
                         "function returns a dict of named float parts, e.g. {'accuracy': 1.0}")
    parts = {}
    for k, v in out.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"reward function {type(fn).__name__} returned part {k!r} = {v!r}; every part "
                             "must be a number")
        parts[str(k)] = float(v)
    return parts


def check_reward_fn_class(ref: str, args: dict[str, Any] | None = None) -> str | None:
    """None when ``ref`` names a reward function that builds with ``args`` and takes Trinity's call keywords
    (``response``, ``truth``); else why not, in one clause."""
    try:
        fn = build_reward_fn(ref, args)
    except (KeyError, LookupError) as e:
        return str(e.args[0] if e.args else e)
    except TypeError as e:
        return f"reward function {ref!r} cannot be built with reward_fn_args {args or {}}: {e}"
    if not callable(fn):
        return f"reward function {ref!r} is not callable"
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    missing = [k for k in ("response",) if k not in params]
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in ("response", "truth", "prompt")]
    if missing or required:
        return (f"reward function {ref!r} is called as fn(response=..., truth=..., prompt=...) but its __call__ "
                f"takes ({', '.join(params)})")
    return None


# ---------------------------------------------------------------- Trinity's built-ins

MATH_FORMAT_PATTERN = r".*?<think>.*?</think>\s*<answer>.*?</answer>\s*$"
"""``MathRewardFn``'s format rule (Trinity's ``DEFAULT_FORMAT_PATTERN``)."""
THINK_ANSWER_LINES_PATTERN = r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$"
"""``FormatReward``'s default rule (open-r1's)."""


def _accuracy(response: str, truth: Any) -> float:
    """1.0 when the response's answer equals the truth's (``rewards.math_score``), 0.0 otherwise (an unreadable
    truth included, as Trinity's verify scores 0 when it fails)."""
    try:
        return math_score(response, truth)
    except UnreadableTruth:
        return 0.0


@REWARD_FUNCTIONS.register_module("accuracy_reward")
class AccuracyReward(RewardFn):
    """``{"accuracy": 1.0 or 0.0}``; ``answer_parser(text) -> answer`` when given (applied to both response and
    truth, compared for equality), else :func:`_accuracy`."""

    def __init__(self, answer_parser: Callable[[str], Any] | None = None, **kwargs: Any) -> None:
        self.answer_parser = answer_parser

    def __call__(self, response: str, prompt: str | None = None, truth: Any = None, **kwargs: Any) -> dict[str, float]:
        if self.answer_parser is not None:
            return {"accuracy": float(self.answer_parser(response) == self.answer_parser(truth))}
        return {"accuracy": _accuracy(response, truth)}


@REWARD_FUNCTIONS.register_module("format_reward")
class FormatReward(RewardFn):
    """``{"format_score": 0.1}`` when the response matches ``pattern`` (dot-all, multi-line), else -0.1."""

    def __init__(self, pattern: str | None = None, **kwargs: Any) -> None:
        self.pattern = pattern or THINK_ANSWER_LINES_PATTERN

    def __call__(self, response: str, **kwargs: Any) -> dict[str, float]:
        matched = re.match(self.pattern, response, re.DOTALL | re.MULTILINE)
        return {"format_score": 0.1 if matched else -0.1}


@REWARD_FUNCTIONS.register_module("math_reward")
class MathRewardFn(RewardFn):
    """``{"accuracy": ..., "format_score": ±0.1}``: :class:`AccuracyReward` plus :class:`FormatReward` with the
    ``<think>``/``<answer>`` rule :data:`MATH_FORMAT_PATTERN`."""

    def __init__(self, answer_parser: Callable[[str], Any] | None = None, pattern: str = MATH_FORMAT_PATTERN,
                 **kwargs: Any) -> None:
        self.accuracy_reward = AccuracyReward(answer_parser)
        self.format_reward = FormatReward(pattern)

    def __call__(self, response: str, prompt: str | None = None, truth: Any = None, **kwargs: Any) -> dict[str, float]:
        return {**self.accuracy_reward(response, prompt, truth), **self.format_reward(response)}


def think_pattern_ok(text: str) -> bool:
    """Exactly one ``<think>`` and one ``</think>``, in that order (Trinity's ``validate_think_pattern``)."""
    return text.count("<think>") == 1 and text.count("</think>") == 1 and text.find("<think>") < text.find("</think>")


@REWARD_FUNCTIONS.register_module("math_boxed_reward")
class MathBoxedRewardFn(RewardFn):
    """``{"accuracy": 1.0/0.0 (last \\boxed{}, MATH's normalisation), "format_score": 0 or -format_score_coef}``."""

    def __call__(self, response: str, truth: Any = None, with_think: bool = False,
                 format_score_coef: float | None = 0.1, **kwargs: Any) -> dict[str, float]:
        try:
            accuracy = math_reward_score(response, "" if truth is None else truth)
        except UnreadableTruth:
            accuracy = 0.0
        fmt = -(format_score_coef or 0.1) if with_think and not think_pattern_ok(response) else 0.0
        return {"accuracy": accuracy, "format_score": fmt}


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _arith(node: ast.AST) -> float:
    """+ - * / and parentheses over numbers, nothing else (what Trinity's restricted ``eval`` admits)."""
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _arith(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    raise ValueError("not arithmetic")


def countdown_equation(response: str) -> str | None:
    """The content of the last ``<answer>...</answer>`` on the response's last line (Trinity's
    ``extract_solution``), stripped; None without one."""
    found = re.findall(r"<answer>(.*?)</answer>", response.split("\n")[-1])
    return found[-1].strip() if found else None


@REWARD_FUNCTIONS.register_module("countdown_reward")
class CountDownRewardFn(RewardFn):
    """Countdown (TinyZero): ``truth`` = ``{"target": int, "numbers": [int, ...]}`` as JSON text (or a dict).
    ``{"score": 0}`` without an equation, 0.1 when it does not use each number exactly once or does not hit the
    target (within 1e-5), 1.0 when it does."""

    def __call__(self, response: str, prompt: str | None = None, truth: Any = None, **kwargs: Any) -> dict[str, float]:
        truth = json.loads(truth) if isinstance(truth, str) else truth
        equation = countdown_equation(response)
        if equation is None:
            return {"score": 0.0}
        if sorted(int(n) for n in re.findall(r"\d+", equation)) != sorted(int(n) for n in truth["numbers"]):
            return {"score": 0.1}
        if not re.match(r"^[\d+\-*/().\s]+$", equation):
            return {"score": 0.1}
        try:
            value = _arith(ast.parse(equation, mode="eval"))
        except (ValueError, SyntaxError, ZeroDivisionError, TypeError):
            return {"score": 0.1}
        return {"score": 1.0 if abs(value - float(truth["target"])) < 1e-5 else 0.1}


@REWARD_FUNCTIONS.register_module("math_dapo_reward")
class MathDAPORewardFn(RewardFn):
    """``{"accuracy": 1.0/0.0, "format_score": DAPO's overlong penalty}``. With ``enable_overlong_penalty``, a
    response of ``n`` tokens (``response_token``) and ``expected = max_response_length - cache_length``: 0 when
    ``n < expected``, ``-penalty_factor`` when ``n > max_response_length``, else ``(expected - n) / cache_length *
    penalty_factor``; 0 without it. Accuracy by :func:`_accuracy` (Trinity grades with verl's PRIME grader)."""

    def __init__(self, enable_overlong_penalty: bool | None = None, penalty_factor: float | None = None,
                 max_response_length: int | None = None, cache_length: int | None = None, **kwargs: Any) -> None:
        if enable_overlong_penalty:
            if None in (penalty_factor, max_response_length, cache_length):
                raise ValueError("math_dapo_reward with enable_overlong_penalty needs reward_fn_args "
                                 "max_response_length, cache_length and penalty_factor")
            if max_response_length <= cache_length:
                raise ValueError("math_dapo_reward: max_response_length must be greater than cache_length")
        self.enable_overlong_penalty = bool(enable_overlong_penalty)
        self.penalty_factor, self.max_response_length, self.cache_length = (penalty_factor, max_response_length,
                                                                           cache_length)

    def overlong_penalty(self, n: int) -> float:
        expected = self.max_response_length - self.cache_length
        if n < expected:
            return 0.0
        if n > self.max_response_length:
            return -float(self.penalty_factor)
        return (expected - n) / self.cache_length * self.penalty_factor

    def __call__(self, response: str, response_token: Any = None, truth: Any = None,
                 **kwargs: Any) -> dict[str, float]:
        fmt = self.overlong_penalty(len(response_token)) if self.enable_overlong_penalty else 0.0
        return {"accuracy": _accuracy(response, truth), "format_score": fmt}


REWARD_FUNCTIONS.refuse("rm_gallery_reward", "needs the rm-gallery package (RM-Gallery's reward models), which "
                        "this project does not install; score with reward.reward_model or a reward function of "
                        "your own")
