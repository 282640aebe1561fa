"""The persistent experience buffer: segment files, DuckDB queries, exactly-once consumers."""

from trinity_like.buffer.store import BufferConsumer, BufferWriter, count_rows, query, segment_files

__all__ = ["BufferConsumer", "BufferWriter", "count_rows", "query", "segment_files"]
