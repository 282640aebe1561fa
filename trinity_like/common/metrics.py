"""metrics.jsonl: one JSON object per step and role, with flat ``area/metric`` keys."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trinity_like.common.fs import append_line


class MetricsWriter:
    def __init__(self, path: str | Path, role: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.role = role

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"role": self.role, "step": step, "time": time.time(), **metrics}
        append_line(self.path, json.dumps(record, sort_keys=False))


def read_metrics(path: str | Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Records from byte ``offset`` on, and the offset after the last complete line (a torn last line from
    a crashed writer is left for the next call)."""
    path = Path(path)
    if not path.is_file():
        return [], offset
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read()
    end = data.rfind(b"\n") + 1
    records = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return records, offset + end
