"""Rule-based rewards: pure functions of a response string and a reference answer."""

from __future__ import annotations

import re

_LEADING_INT = re.compile(r"\s*(-?\d+)")


def arithmetic_reward(response: str, answer: str, format_reward: float = 0.1) -> float:
    """1.0 when the response starts with the answer's number; ``format_reward`` when it starts with some
    other number (right format, wrong value); 0.0 otherwise.

    Leading whitespace is ignored; anything after the number (for example an end token) is ignored too."""
    m = _LEADING_INT.match(response)
    if m is None:
        return 0.0
    return 1.0 if m.group(1) == answer.strip() else format_reward
