"""The persistent experience buffer: Arrow segment files, DuckDB queries, exactly-once consumers."""

from trinity_like.buffer.catalog import explore_group_rows, explore_step_rows
from trinity_like.buffer.reader import POLICIES, BufferConsumer
from trinity_like.buffer.replay import ReplayReader
from trinity_like.buffer.segments import SegmentError, SegmentInfo, list_segments
from trinity_like.buffer.sql import count_rows, query, read_only_sql
from trinity_like.buffer.writer import BufferWriter

__all__ = ["POLICIES", "BufferConsumer", "BufferWriter", "ReplayReader", "SegmentError", "SegmentInfo", "count_rows",
           "explore_group_rows", "explore_step_rows", "list_segments", "query", "read_only_sql"]
