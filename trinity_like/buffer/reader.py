"""Reading the buffer: named consumers with exactly-once delivery, read policies and group-atomic batches.

A :class:`BufferConsumer` keeps, per segment, how often each row was handed out and at which step
(``uses``/``last_step``), rebuilt on start from the committed ledger (see ``ledger.py``). It never hands a row
out more often than the policy allows while it runs; ``commit(step)`` makes the hand-outs durable.

Policies:
- ``fifo``: oldest rows first (write order);
- ``newest``: newest rows first;
- ``priority``: highest value of a SQL expression first, over the view ``rows`` with every Experience column
  (e.g. ``created_at``, or ``var_samp(reward) OVER (PARTITION BY _seg, group_id)`` for group reward variance);
- ``replay``: like fifo, but a row may be handed out up to ``max_uses`` times, each reuse at least
  ``cooldown_steps`` after the previous one; unused rows go first.

Filters: ``min_version`` (staleness; rows below it are skipped and counted in ``buffer/skipped_stale``, never
dropped silently) and any SQL ``where`` over the Experience columns. Rows with ``model_version -1`` (not generated
by this run's policy: human demonstrations, imports) have no staleness and pass every ``min_version``.

Groups: the rows of one write that share a ``group_id`` form a group, and a batch holds whole groups only.
A read returns exactly ``n`` rows when whole groups add up to ``n``; when the next group in policy order would
overflow, it returns the whole groups it has (never a split group).

Mix (``mix``, config ``buffer.mix``): a set share of each experience source per batch, each source's quota
filled with its own whole groups in policy order; see ``mix.py`` for the rule.

Corrupt or truncated segments are skipped with a logged error (``buffer verify`` quarantines them). A segment's
CRC-32 is checked the first time any reader opens it and the check is recorded in the buffer catalog
(``catalog.py``); a consumer that starts later does not repeat it. A ``where`` filter skips, without reading them,
the segments whose catalog entry shows no row that can match it.

Untrainable rows (``table_row_problems``: a token id outside the vocabulary ``vocab_size``, a NaN, per-token
fields of the wrong length...) are found when their segment is opened, and quarantined: recorded in the
ledger folder, named once in the log, counted in ``buffer/quarantined``, never handed out. A batch is built
from the remaining rows, so one poison row never stops the trainer; the rest of its group is still trained.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

import trinity_like.buffer.catalog as catalog
from trinity_like.buffer.ledger import Ledger
from trinity_like.buffer.mix import choose_mix, normalise_mix
from trinity_like.buffer.segments import SUFFIX, SegmentError, SegmentInfo, read_segment, segment_dir
from trinity_like.common.errors import UserError
from trinity_like.common.experience import Experience, table_row_problems, table_to_experiences

logger = logging.getLogger(__name__)

POLICIES = ("fifo", "newest", "priority", "replay")
POLL_INTERVAL_S = 0.02
NEVER = np.iinfo(np.int64).min // 2
CATALOG_SNAPSHOT_AT = 16
"""A refresh that finds more new segments than this (a start) reads the catalog snapshot and records its CRC
checks at once; a running consumer, seeing one or two at a time, reads only the new loose catalog files."""
CATALOG_SAVE_AT = 64
"""CRC checks recorded in the catalog per batch (and at each commit)."""
EXPLORER_GROUP = re.compile(r"^s\d+-.*-\d+$")
"""A group id as the explorer stamps it: ``s<step>-<task id>-<position>``."""
NEVER_STALE = np.iinfo(np.int64).max
"""A segment's newest version when it holds a row with ``model_version -1``: no ``min_version`` skips it."""


@dataclass
class _Segment:
    """A consumer's view of one segment: metadata arrays and per-row use counts."""

    info: SegmentInfo
    version: np.ndarray  # (rows,) model_version
    group: np.ndarray  # (rows,) group index within the segment, in order of first appearance
    eids: list[str]
    source: np.ndarray  # (rows,) Experience.source
    uses: np.ndarray = field(init=False)  # (rows,) times handed out (committed or this run)
    last_step: np.ndarray = field(init=False)  # (rows,) step of the last hand-out
    stale_counted: np.ndarray = field(init=False)  # (rows,) already counted as skipped for staleness

    def __post_init__(self) -> None:
        n = len(self.eids)
        self.uses = np.zeros(n, np.int32)
        self.last_step = np.full(n, NEVER, np.int64)
        self.stale_counted = np.zeros(n, bool)
        # The segment-level staleness skip compares this with min_version, so a segment holding any row that is
        # not this run's policy (-1, never stale) must never look stale as a whole.
        self.max_version = int(NEVER_STALE if (self.version < 0).any() else self.version.max()) if n else -1
        mine = self.version[self.version >= 0]
        self.min_version = int(mine.min()) if mine.size else -1


def _group_index(group_ids: list[str]) -> np.ndarray:
    first: dict[str, int] = {}
    return np.fromiter((first.setdefault(g, len(first)) for g in group_ids), np.int32, len(group_ids))


def _choose(groups: Iterator[list[tuple[int, int]]], n: int) -> list[tuple[int, int]] | None:
    """Whole groups in policy order up to ``n`` rows (no quotas); None when the rows run out first."""
    chosen: list[tuple[int, int]] = []
    for group in groups:
        if len(chosen) + len(group) > n:
            if not chosen:  # a single group larger than n is handed out whole rather than never
                chosen.extend(group)
            return chosen
        chosen.extend(group)
        if len(chosen) == n:
            return chosen
    return None


class BufferConsumer:
    """A named reader of one buffer folder. One process per consumer name."""

    def __init__(self, buffer_dir: str | Path, name: str = "trainer", policy: str = "fifo",
                 priority: str | None = None, where: str | None = None, max_uses: int = 1,
                 cooldown_steps: int = 0, resume_step: int | None = None, mix: dict[str, float] | None = None,
                 mix_fill: bool = True, vocab_size: int | None = None) -> None:
        """``mix``: share of each source per batch (normalised here; empty or None = no quotas); ``mix_fill``:
        a source short of rows gives its quota to the others rather than hold the batch back. ``vocab_size``:
        the trained model's, so that rows with token ids past it are quarantined (None: only negative ids)."""
        if policy not in POLICIES:
            raise ValueError(f"unknown read policy {policy!r}; valid: {', '.join(POLICIES)}")
        if policy == "priority" and not priority:
            raise ValueError("the priority policy needs a SQL expression (buffer.priority)")
        if max_uses < 1 or (policy != "replay" and max_uses != 1):
            raise ValueError("max_uses must be 1, or >= 1 with the replay policy")
        self.buffer_dir = Path(buffer_dir)
        self.name = name
        self.policy, self.priority, self.where = policy, priority, where
        self.max_uses, self.cooldown_steps = max_uses, cooldown_steps
        self.mix = normalise_mix(mix) if mix else None
        self.mix_fill = mix_fill
        self.vocab_size = vocab_size
        self._last_mix: dict[str, float] = {}
        """Per mix source: its share of the rows of the last batch handed out (the ``buffer/mix_*`` metrics)."""
        self.ledger = Ledger(self.buffer_dir, name)
        self.ledger.resume(resume_step)
        self._segments: list[_Segment] = []
        """Opened segments in write order; a segment is appended once, the first time it is listed."""
        self._known: set[str] = set()
        self._catalog = catalog.EntryCache(self.buffer_dir)
        self._entries: list[catalog.Entry] = []
        """Per opened segment: its catalog entry (what a ``where`` filter can rule out without reading it)."""
        self._unsaved: list[catalog.Entry] = []
        """Entries of segments CRC-checked by this consumer and not recorded yet (saved in batches, and at commit)."""
        self._bad: set[str] = set()
        self._seen_groups: dict[str, str] = {}
        """Explorer group id -> the segment it was first met in (``_repeated_groups``)."""
        self._max_version = np.zeros(0, np.int64)
        """Per opened segment: its largest model_version, NEVER_STALE if it holds a -1 row (segments wholly below
        min_version are skipped)."""
        self._min_version = np.zeros(0, np.int64)
        """Per opened segment: its smallest model_version >= 0; -1 if every row is not this run's policy."""
        self._exhausted = np.zeros(0, np.bool_)
        """Per opened segment: every row used ``max_uses`` times; reads skip it."""
        self._stale_counted = np.zeros(0, np.bool_)
        """Per opened segment: its stale rows were counted while the whole segment was below min_version."""
        self._skipped_stale = 0
        self._delivered = 0
        self._con = None
        self._prior = self._committed_uses()
        quarantined = self.ledger.quarantined()
        self._quarantined = set(zip(quarantined.column("segment").to_pylist(), quarantined.column("row").to_pylist(),
                                    strict=True))
        """(segment, row) of every quarantined row: recorded in the ledger folder, never handed out."""

    # ------------------------------------------------------------ state
    def _committed_uses(self) -> dict[str, list[tuple[int, int]]]:
        prior: dict[str, list[tuple[int, int]]] = {}
        table = self.ledger.committed()
        for seg, row, step in zip(table.column("segment").to_pylist(), table.column("row").to_pylist(),
                                  table.column("step").to_pylist(), strict=True):
            prior.setdefault(seg, []).append((row, step))
        return prior

    def _refresh(self) -> None:
        """Open the segments published since the last call (names compared before anything is parsed)."""
        d = segment_dir(self.buffer_dir)
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            return
        new = sorted(n for n in names if n not in self._known and n.endswith(SUFFIX) and not n.startswith("."))
        if new:
            self._catalog.refresh(snapshot=len(new) > CATALOG_SNAPSHOT_AT)
        for name in new:
            self._known.add(name)
            info = SegmentInfo.parse(d / name)
            if info is None:
                logger.error("skipping buffer segment %s: malformed name", d / name)
                continue
            try:
                # CRC-checked on first sight only: a check on record in the catalog is not repeated.
                table, updated = catalog.read_verified_once(info, self._catalog.get(name))
            except SegmentError as e:
                self._bad.add(info.name)
                logger.error("skipping a buffer segment: %s", e)
                continue
            if updated is not None:
                self._unsaved.append(updated)
                self._catalog.entries[name] = updated
            self._entries.append(self._catalog.get(name))
            seg = _Segment(info, table.column("model_version").to_numpy(),
                           _group_index(table.column("group_id").to_pylist()), table.column("eid").to_pylist(),
                           np.asarray(table.column("source").to_pylist(), dtype=object))
            for row, step in self._prior.pop(info.name, ()):
                seg.uses[row] += 1
                seg.last_step[row] = max(seg.last_step[row], step)
            self._quarantine(seg, table)
            self._segments.append(seg)
            self._max_version = np.append(self._max_version, seg.max_version)
            self._min_version = np.append(self._min_version, seg.min_version)
            self._exhausted = np.append(self._exhausted, bool((seg.uses >= self.max_uses).all()))
            self._stale_counted = np.append(self._stale_counted, False)
        if len(self._unsaved) >= CATALOG_SAVE_AT or len(new) > CATALOG_SNAPSHOT_AT:
            self._save_checks()

    def _save_checks(self) -> None:
        """Record the CRC checks done since the last call in the catalog, in one file (losing them in a crash only
        means they are done again)."""
        catalog.save(self.buffer_dir, self._unsaved)
        self._unsaved = []

    def _quarantine(self, seg: _Segment, table: pa.Table) -> None:
        """Take the segment's untrainable rows out of circulation; record and log the ones not seen before."""
        new = []
        problems = {**table_row_problems(table, self.vocab_size), **self._repeated_groups(seg, table)}
        for row, problem in sorted(problems.items()):
            seg.uses[row] = self.max_uses
            if (seg.info.name, row) not in self._quarantined:
                self._quarantined.add((seg.info.name, row))
                new.append((seg.eids[row], seg.info.name, row, problem))
                logger.error("quarantined buffer row %s (segment %s, row %d): %s; it is kept but never trained",
                             seg.eids[row], seg.info.name, row, problem)
        self.ledger.add_quarantined(new)

    def _repeated_groups(self, seg: _Segment, table: pa.Table) -> dict[int, str]:
        """Rows of explorer groups already met in an earlier segment: a group written twice (its step handed to
        another explorer while the first, taken for dead, was still writing it) is trained once, from its
        first copy. Only the group ids the explorer stamps (``s<step>-<task>-<position>``, unique in a run) on
        explorer rows: elsewhere one id in two writes is two groups."""
        problems: dict[int, str] = {}
        here: dict[str, str] = {}
        for row, group in enumerate(table.column("group_id").to_pylist()):
            if seg.source[row] != "explorer" or not EXPLORER_GROUP.match(group):
                continue
            first = self._seen_groups.get(group)
            if first is not None:
                problems[row] = f"group {group} was written twice; its first copy (segment {first}) is trained"
            else:
                here[group] = seg.info.name
        self._seen_groups.update(here)
        return problems

    def _eligible(self, seg: _Segment, min_version: int | None, step: int) -> np.ndarray:
        ok = seg.uses < self.max_uses
        if self.cooldown_steps:
            ok &= (seg.uses == 0) | (step - seg.last_step >= self.cooldown_steps)
        if min_version is not None:
            stale = ok & (seg.version < min_version) & (seg.version >= 0)  # -1: not this run's policy, never stale
            new_stale = stale & ~seg.stale_counted & (seg.uses == 0)
            self._skipped_stale += int(new_stale.sum())
            seg.stale_counted |= new_stale
            ok &= ~stale
        return ok

    def _live(self, min_version: int | None, step: int) -> np.ndarray:
        """Indices of segments that may hold eligible rows, in write order. Segments whose rows are all used
        up, or all older than ``min_version``, drop out without a per-row look (their stale rows are counted
        once, the first time)."""
        idx = np.flatnonzero(~self._exhausted)
        if min_version is not None:
            stale = idx[self._max_version[idx] < min_version]
            for i in stale[~self._stale_counted[stale]]:
                self._eligible(self._segments[i], min_version, step)
                self._stale_counted[i] = True
            idx = idx[self._max_version[idx] >= min_version]
        return idx

    # ------------------------------------------------------------ candidate groups, in policy order
    def _groups_in_order(self, min_version, where, step) -> Iterator[list[tuple[int, int]]]:
        if self.policy == "priority" or where:
            yield from self._groups_by_sql(min_version, where, step)
            return
        live = self._live(min_version, step)
        if self.policy == "newest":
            live = live[::-1]
        elif min_version is not None:
            # Under a staleness bound, first in = oldest policy first, then write order: explorers' segments
            # land in any order, and a newer step read first would let an older one go stale unused.
            # Segments of no policy of this run (-1: never stale) keep their place after the one written before.
            keys = self._min_version[live]
            carried = np.maximum.accumulate(np.where(keys >= 0, np.arange(keys.size), 0))
            live = live[np.argsort(keys[carried], kind="stable")]
        passes = (lambda s: s.uses == 0, lambda s: s.uses > 0) if self.policy == "replay" else (None,)
        for want in passes:
            for i in live.tolist():
                seg = self._segments[i]
                ok = self._eligible(seg, min_version, step)
                if want is not None:
                    ok &= want(seg)
                rows = np.flatnonzero(ok)
                if rows.size == 0:
                    continue
                groups = seg.group[rows]
                order = np.unique(groups, return_index=True)[1]
                firsts = sorted(order, reverse=self.policy == "newest")
                for first in firsts:
                    g = groups[first]
                    yield [(i, int(r)) for r in rows[groups == g]]

    def _groups_by_sql(self, min_version, where, step) -> Iterator[list[tuple[int, int]]]:
        import duckdb

        live = self._live(min_version, step)
        prune = catalog.Prune.of(where)
        parts = []
        for i in live.tolist():
            seg = self._segments[i]
            ok = self._eligible(seg, min_version, step)  # before the prune: it counts the stale rows
            if not ok.any() or (prune and not prune.may_match(self._entries[i])):
                continue
            table = read_segment(seg.info, verify=False)
            parts.append(table.append_column("_seg", pa.array(np.full(len(seg.eids), i, np.int32)))
                         .append_column("_row", pa.array(np.arange(len(seg.eids), dtype=np.int32)))
                         .append_column("_ok", pa.array(ok)))
        if not parts:
            return
        if self._con is None:
            self._con = duckdb.connect(":memory:")
            self._con.execute("SET threads TO 1")
        self._con.register("rows", pa.concat_tables(parts))
        filt = f"({where})" if where else "TRUE"
        score = f"({self.priority})" if self.policy == "priority" else "0"
        order = "_priority DESC, _seg, _row" if self.policy != "newest" else "_priority DESC, _seg DESC, _row DESC"
        try:
            result = self._con.sql(
                f"SELECT _seg, _row, group_id FROM (SELECT *, {score} AS _priority FROM rows) "
                f"WHERE _ok AND {filt} ORDER BY {order}").fetchall()
        except duckdb.Error as e:
            raise UserError(f"buffer filter/priority SQL failed: {str(e).splitlines()[0]}") from None
        finally:
            self._con.unregister("rows")
        groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for seg_i, row, _ in result:
            key = (seg_i, int(self._segments[seg_i].group[row]))
            groups.setdefault(key, []).append((seg_i, row))
        yield from groups.values()

    # ------------------------------------------------------------ reading
    def try_read(self, n: int, min_version: int | None = None, where: str | None = None,
                 step: int = 0) -> list[Experience] | None:
        """Up to ``n`` rows in whole groups by the policy, or None when not even one batch is ready.

        A batch is ready when whole groups add up to exactly ``n``, or when the next group would overflow
        ``n`` (then fewer rows come back). ``step`` is the train step the rows are for (ledger, cooldown)."""
        if n < 1:
            raise ValueError(f"read needs n >= 1, got {n}")
        self._refresh()
        groups = self._groups_in_order(min_version, where or self.where, step)
        if self.mix is None:
            chosen = _choose(groups, n)
        else:
            chosen = choose_mix(((self._source_of(g), g) for g in groups), n, self.mix, self.mix_fill)
        if chosen is None:
            return None
        return self._hand_out(chosen, step)

    def ready(self, n: int, min_version: int | None = None, where: str | None = None, step: int = 0) -> bool:
        """Whether ``try_read`` would return a batch now, without handing anything out (lock-step driving
        explores until this holds)."""
        self._refresh()
        groups = self._groups_in_order(min_version, where or self.where, step)
        if self.mix is None:
            return _choose(groups, n) is not None
        return choose_mix(((self._source_of(g), g) for g in groups), n, self.mix, self.mix_fill) is not None

    def _source_of(self, group: list[tuple[int, int]]) -> str:
        seg_i, row = group[0]
        return self._segments[seg_i].source[row]

    def _hand_out(self, chosen: list[tuple[int, int]], step: int) -> list[Experience]:
        by_segment: dict[int, list[int]] = {}
        for seg_i, row in chosen:
            by_segment.setdefault(seg_i, []).append(row)
        records, tables = [], []
        for seg_i, rows in by_segment.items():
            seg = self._segments[seg_i]
            idx = np.asarray(rows)
            seg.uses[idx] += 1
            seg.last_step[idx] = step
            self._exhausted[seg_i] = bool((seg.uses >= self.max_uses).all())
            tables.append(read_segment(seg.info, verify=False).take(pa.array(idx)))
            records.extend((seg.eids[r], step, seg.info.name, r) for r in rows)
        self.ledger.add_pending(step, records)
        self._delivered += len(records)
        if self.mix is not None:
            sources = [self._source_of([c]) for c in chosen]
            self._last_mix = {s: sources.count(s) / len(sources) for s in self.mix}
        exps = table_to_experiences(pa.concat_tables(tables))
        position = {(s, r): k for k, (s, r) in enumerate((s, r) for s, rows in by_segment.items() for r in rows)}
        return [exps[position[c]] for c in chosen]

    def read(self, n: int, min_version: int | None = None, timeout_s: float = 600.0, where: str | None = None,
             step: int = 0, should_stop: Callable[[], bool] | None = None) -> list[Experience]:
        """Block until ``try_read`` succeeds; TimeoutError after ``timeout_s``; InterruptedError when
        ``should_stop()`` says no producer is left."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.try_read(n, min_version, where, step)
            if got is not None:
                return got
            if should_stop is not None and should_stop():
                # the last producer may have written the missing rows between the read above and its end
                got = self.try_read(n, min_version, where, step)
                if got is not None:
                    return got
                raise InterruptedError("buffer read stopped: no producer left")
            if time.monotonic() > deadline:
                quotas = "" if self.mix is None else (
                    f" (buffer.mix {self.mix}{'' if self.mix_fill else ', every quota filled: buffer.mix_fill false'})")
                raise TimeoutError(f"buffer '{self.buffer_dir}' had fewer than {n} unconsumed experiences with "
                                   f"model_version >= {min_version}{quotas} after {timeout_s:.0f}s")
            time.sleep(POLL_INTERVAL_S)

    def commit(self, step: int) -> int:
        """Make every hand-out for steps <= ``step`` durable; call it right before checkpointing ``step``."""
        self._save_checks()
        return self.ledger.commit(step)

    def committed_steps(self) -> list[int]:
        return sorted({s for s, _, _ in self.ledger.files()[0]})

    def stats(self) -> dict[str, float]:
        self._refresh()
        total = sum(len(s.eids) for s in self._segments)
        unused = sum(int((s.uses == 0).sum()) for s in self._segments)
        return {"buffer/rows": float(total), "buffer/unconsumed": float(unused),
                "buffer/delivered": float(self._delivered), "buffer/skipped_stale": float(self._skipped_stale),
                "buffer/bad_segments": float(len(self._bad)), "buffer/quarantined": float(len(self._quarantined)),
                "buffer/segments": float(len(self._segments)),
                **{f"buffer/mix_{source}": share for source, share in self._last_mix.items()}}
