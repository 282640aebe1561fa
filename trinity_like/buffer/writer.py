"""Writing the buffer: one atomic segment per write, with an optional capacity and back-pressure."""

from __future__ import annotations

import itertools
import time
import uuid
from pathlib import Path

import pyarrow as pa

from trinity_like.buffer.ledger import Ledger
from trinity_like.buffer.segments import SegmentInfo, list_segments, write_segment
from trinity_like.common.experience import Experience, experiences_to_table

POLL_INTERVAL_S = 0.05


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
        return self.write_table(experiences_to_table(exps))

    def write_table(self, table: pa.Table) -> SegmentInfo:
        """Write an Arrow table of Experience rows (EXPERIENCE_SCHEMA) as one new segment."""
        return write_segment(self.buffer_dir, table, self.writer_id, next(self._seq))

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
