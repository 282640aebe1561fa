"""Defaults of the parameters that both the algorithms (their own defaults, for direct calls) and the config
schema (``algorithm.off_policy``, ``reward.overlong_buffer``) state: stated here once, read by both."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OffPolicyParams:
    """Parameters the off-policy corrections read (by attribute or dict key) from their ``config`` argument."""

    cap: float = 2.0
    """C: truncation bound (tis, seq_tis), sequence-ratio bound (seq_mis), token drop bound (decoupled)."""
    low: float = 0.5
    """Lower bound of the kept ratio range (icepop, geo_mask)."""
    high: float = 2.0
    """Upper bound of the kept ratio range (icepop, geo_mask)."""
    negative_cap: float = 0.0
    """With a correction: a token with a negative advantage keeps at least min(rho_t, negative_cap) as its
    weight, whatever the correction cut (see ``off_policy.pessimistic_weights``); 0 = off."""


@dataclass
class OverlongBufferParams:
    """DAPO's overlong penalty."""

    enable: bool = False
    len: int = 0
    """Tokens before ``max_resp_len`` where the linear penalty starts."""
    penalty_factor: float = 1.0
    """Penalty at ``max_resp_len``."""
