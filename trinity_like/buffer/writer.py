"""Writing the buffer: one atomic segment per write, with an optional capacity and back-pressure."""

from __future__ import annotations

import itertools
import time
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa

from trinity_like.buffer.catalog import entry_of, maybe_roll_up, record, step_value
from trinity_like.buffer.ledger import Ledger
from trinity_like.buffer.segments import SegmentInfo, list_segments, write_segment
from trinity_like.common.experience import Experience, experiences_to_table

POLL_INTERVAL_S = 0.05
ROLLUP_CHECK_EVERY = 16
"""A writer looks whether a catalog roll-up is due after every 16th segment it writes (a listing of the catalog
folder; readers look after every load)."""


class BufferWriter:
    """Appends experiences as segments. Any number of writer processes may share a buffer folder.

    With ``capacity`` > 0, ``unconsumed()`` (rows written minus rows the consumer ``consumer`` has taken,
    committed or pending) is the back-pressure signal; ``wait_for_room`` blocks while it is at capacity."""

    def __init__(self, buffer_dir: str | Path, writer_id: str = "w", capacity: int = 0,
                 consumer: str = "trainer") -> None:
        self.buffer_dir = Path(buffer_dir)
        self.writer_id = f"{writer_id}-{uuid.uuid4().hex[:8]}"
        self._seq = itertools.count()
        self.capacity = capacity
        self.consumer = consumer

    def write(self, exps: list[Experience]) -> SegmentInfo:
        """Write ``exps`` as one new segment. The rows of one call that share a group_id form one group."""
        if not exps:
            raise ValueError("BufferWriter.write needs at least one experience")
        table = experiences_to_table(exps)
        steps = Counter(step_value(e.info.get("explore_step")) for e in exps if "explore_step" in e.info)
        steps.pop(None, None)
        return self.write_table(table, explore_steps=dict(steps))

    def write_table(self, table: pa.Table, explore_steps: dict[int, int] | None = None) -> SegmentInfo:
        """Write an Arrow table of Experience rows (EXPERIENCE_SCHEMA) as one new segment, its catalog entry
        published just before it (a crash between the two leaves an entry that is ignored, never a segment that
        the catalog describes wrongly). ``explore_steps``: the rows' info.explore_step -> rows if the caller
        knows them (else they are read from the ``info`` column)."""
        def publish_entry(name: str, nbytes: int, written: pa.Table) -> None:
            record(self.buffer_dir, [entry_of(written, name, nbytes, explore_steps=explore_steps)])

        seq = next(self._seq)
        info = write_segment(self.buffer_dir, table, self.writer_id, seq, before_publish=publish_entry)
        if seq % ROLLUP_CHECK_EVERY == ROLLUP_CHECK_EVERY - 1:
            maybe_roll_up(self.buffer_dir)
        return info

    def unconsumed(self) -> int:
        written = sum(s.num_rows for s in list_segments(self.buffer_dir))
        return written - Ledger(self.buffer_dir, self.consumer, create=False).consumed_rows()

    def pressure(self) -> float:
        """unconsumed / capacity (0 without a capacity): >= 1 means writers should wait."""
        return self.unconsumed() / self.capacity if self.capacity else 0.0

    def wait_for_room(self, timeout_s: float = 600.0) -> float:
        """Block while the buffer is at capacity; return the seconds waited; TimeoutError after timeout_s."""
        start = time.monotonic()
        while self.capacity and self.unconsumed() >= self.capacity:
            if time.monotonic() - start > timeout_s:
                raise TimeoutError(f"buffer '{self.buffer_dir}' stayed at capacity ({self.capacity} unconsumed "
                                   f"rows) for {timeout_s:.0f}s: is the consumer '{self.consumer}' running?")
            time.sleep(POLL_INTERVAL_S)
        return time.monotonic() - start
