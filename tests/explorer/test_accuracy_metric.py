"""`rollout/accuracy` counts a reward of 1.0 as correct, or, for a reward function returning parts (Trinity's
math_reward: accuracy 1.0 + format 0.1 = 1.1 for a right, well-formed answer), its `accuracy` part."""

from __future__ import annotations

from trinity_like.common.experience import Experience
from trinity_like.explorer.rollout import correct


def _exp(reward, parts=None) -> Experience:
    info = {} if parts is None else {"reward_parts": parts}
    return Experience(prompt_ids=[1], response_ids=[2], reward=reward, info=info)


def test_accuracy_reads_the_accuracy_part_when_the_reward_has_parts():
    assert correct(_exp(1.0)) and not correct(_exp(0.5)) and not correct(_exp(None))
    assert correct(_exp(1.1, {"accuracy": 1.0, "format_score": 0.1}))  # a plain == 1.0 test said 0 here
    assert not correct(_exp(1.0, {"accuracy": 0.0, "format_score": 1.0}))  # a reward of 1.0 that is not accuracy
    assert correct(_exp(0.9, {"accuracy": 1.0, "format_score": -0.1}))
