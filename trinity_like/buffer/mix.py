"""Batches with a set share of each experience source (``buffer.mix``): quotas and the choice of groups.

Pure functions over groups already in read-policy order, so the rule is testable without a buffer; the
:class:`~trinity_like.buffer.reader.BufferConsumer` feeds them its eligible groups (``min_version``, ``where``,
ledger already applied) and hands out what they choose.

The rule, for a batch of ``n`` rows and shares ``p_s`` (normalised to sum to 1):

1. Quotas: ``q_s = floor(n p_s)``, and the rows left over go one each to the sources with the largest
   remainders ``n p_s - q_s`` (Hamilton's largest-remainder method; ties to the larger share, then to the
   order of ``SOURCES``). The quotas add up to ``n``.
2. Each source fills its quota with its own whole groups in policy order, and stops at the first group that
   would overflow the quota (the reader's group rule, per source: never a split group, never a skipped one).
3. What is left of ``n`` (quotas that whole groups could not meet exactly, and with ``fill`` the quotas of
   sources that have no more rows right now, except the sources in ``WAITED_FOR``) goes, group by group, to the source whose next group fits and
   whose rows fall furthest below its exact share ``n p_s`` (ties: the group first in policy order).
4. The batch is ready when it holds ``n`` rows, or when no source's next group fits in what is left (then it
   closes with fewer rows, as a plain read does). It is not ready when the rows run out first, or when a
   source runs out of rows before its quota is met and may not give it away (without ``fill``: any source;
   with it: those in ``WAITED_FOR``): the caller polls again.

A group's source is the source of its first row (a group is one write's rows with one ``group_id``, which come
from one producer).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TypeVar

from trinity_like.common.experience import SOURCES

G = TypeVar("G")

WAITED_FOR = ("explorer",)
"""Sources whose quota is never given away, even with ``fill``: the run's own explorers keep writing them, so a
shortfall means "not yet", and giving the quota away would spend the scarce rows (human demonstrations, agent
traces, imports: written out of band, maybe never again) on the batches an explorer simply had not caught up
with, e.g. every batch of a run's first steps."""


def normalise_mix(mix: dict[str, float]) -> dict[str, float]:
    """Shares that sum to 1, in the order of ``SOURCES``; ValueError for an unknown source or a share <= 0."""
    unknown = [s for s in mix if s not in SOURCES]
    if unknown:
        raise ValueError(f"unknown experience source {unknown[0]!r} in the mix; valid: {', '.join(SOURCES)}")
    bad = {s: p for s, p in mix.items() if not (p > 0 and math.isfinite(p))}
    if bad:
        raise ValueError(f"mix shares must be finite and > 0, got {bad}")
    total = sum(mix.values())
    return {s: mix[s] / total for s in SOURCES if s in mix}


def mix_quotas(n: int, shares: dict[str, float]) -> dict[str, int]:
    """Rows per source in a batch of ``n`` by largest remainder; ``shares`` normalised (``normalise_mix``).

    Worked example: n = 10, shares {explorer: 0.55, agent: 0.25, human: 0.2} -> exact 5.5, 2.5, 2.0 -> floors
    5, 2, 2 (one row left) -> the remainders tie at 0.5, the larger share wins -> {explorer: 6, agent: 2,
    human: 2}."""
    exact = {s: n * p for s, p in shares.items()}
    quotas = {s: math.floor(x) for s, x in exact.items()}
    left = n - sum(quotas.values())
    by_remainder = sorted(shares, key=lambda s: (-(exact[s] - quotas[s]), -shares[s], SOURCES.index(s)))
    for s in by_remainder[:max(left, 0)]:
        quotas[s] += 1
    return quotas


class _SourceQueues:
    """The groups of one policy-ordered stream, split per source and pulled only as far as a source's next
    group is asked for (a read stops early when the quotas are met). Groups of sources outside the mix are
    passed over."""

    def __init__(self, groups: Iterable[tuple[str, list[G]]], sources: Iterable[str]) -> None:
        self._stream: Iterator[tuple[int, tuple[str, list[G]]]] = enumerate(groups)
        self._queues: dict[str, deque[tuple[int, list[G]]]] = {s: deque() for s in sources}

    def peek(self, source: str) -> tuple[int, list[G]] | None:
        """The source's next group as (position in policy order, rows), or None when it has no more."""
        queue = self._queues[source]
        while not queue:
            nxt = next(self._stream, None)
            if nxt is None:
                return None
            position, (src, rows) = nxt
            if src in self._queues:
                self._queues[src].append((position, rows))
        return queue[0]

    def pop(self, source: str) -> tuple[int, list[G]]:
        return self._queues[source].popleft()


def choose_mix(groups: Iterable[tuple[str, list[G]]], n: int, shares: dict[str, float],
               fill: bool = True) -> list[G] | None:
    """The rows of a batch of ``n`` by the module's rule, in policy order; None when it is not ready.

    ``groups``: (source, rows) per group in policy order, lazily (pulled only as far as needed); ``shares``:
    normalised (``normalise_mix``)."""
    queues = _SourceQueues(groups, shares)
    quotas = mix_quotas(n, shares)
    taken = dict.fromkeys(shares, 0)
    chosen: list[tuple[int, list[G]]] = []
    for source, quota in quotas.items():
        while taken[source] < quota:
            head = queues.peek(source)
            if head is None:  # no more rows of this source right now
                if not fill or source in WAITED_FOR:
                    return None
                break
            if taken[source] + len(head[1]) > quota:  # the quota closes with whole groups
                break
            chosen.append(queues.pop(source))
            taken[source] += len(head[1])
    total = sum(taken.values())
    while total < n:
        heads = {s: h for s in shares if (h := queues.peek(s)) is not None}
        if not heads:
            return None  # the rows ran out before the batch was full
        fits = [s for s, (_, rows) in heads.items() if total + len(rows) <= n]
        if not fits:
            if not chosen:  # a single group larger than n is handed out whole rather than never
                chosen.append(queues.pop(min(heads, key=lambda s: heads[s][0])))
            break
        source = max(fits, key=lambda s: (n * shares[s] - taken[s], -heads[s][0]))
        position, rows = queues.pop(source)
        chosen.append((position, rows))
        taken[source] += len(rows)
        total += len(rows)
    chosen.sort(key=lambda group: group[0])
    return [row for _, rows in chosen for row in rows]
