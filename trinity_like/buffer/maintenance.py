"""Buffer upkeep: statistics (from the catalog) and verification (with quarantine of bad segments)."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trinity_like.buffer.catalog as catalog
from trinity_like.buffer.ledger import Ledger, consumer_names
from trinity_like.buffer.segments import (
    QUARANTINE,
    SegmentError,
    list_segments,
    quarantine,
    read_segment,
    segment_dir,
)
from trinity_like.buffer.sql import group_consumption


def buffer_stats(buffer_dir: Path) -> dict[str, Any]:
    """Rows by source and model_version, consumption per consumer (with the rows it quarantined as untrainable),
    segments, bytes, quarantined segment files. From the catalog and the ledgers' file names: a segment is read
    only if it has no catalog entry yet (then its entry is healed)."""
    by_source: Counter = Counter()
    by_version: Counter = Counter()
    cat = catalog.load(buffer_dir)
    for _, entry in cat.listed():
        by_source.update(entry.sources)
        by_version.update(entry.versions)
    segments = cat.segments
    unreadable = len(cat.unreadable)
    rows = sum(s.num_rows for s in segments)
    consumers = {}
    for name in consumer_names(buffer_dir):
        ledger = Ledger(buffer_dir, name, create=False)
        commits, pending = ledger.files()
        committed = sum(r for _, r, _ in commits)
        in_flight = sum(r for _, r, _ in pending)
        quarantined = ledger.quarantined_rows()
        consumers[name] = {"committed": committed, "pending": in_flight, "quarantined_rows": quarantined,
                           "unconsumed": rows - committed - in_flight - quarantined,
                           "last_committed_step": max((s for s, _, _ in commits), default=None)}
    q = Path(buffer_dir) / QUARANTINE
    return {
        "rows": rows,
        "segments": len(segments),
        "bytes": sum(e.bytes for _, e in cat.listed()) + sum(_size(s.path) for s in cat.unreadable),
        "by_source": dict(sorted(by_source.items())),
        "by_model_version": {str(k): v for k, v in sorted(by_version.items())},
        "consumers": consumers,
        "unreadable_segments": unreadable,
        "quarantined": len(os.listdir(q)) if q.is_dir() else 0,
    }


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # quarantined meanwhile
        return 0


def verify_buffer(buffer_dir: Path, move: bool = True) -> dict[str, Any]:
    """Check every segment's checksum and schema (whatever the catalog says: this is the full check); record each
    check in the catalog; move bad ones to ``quarantine/`` (unless ``move`` is False) and drop their entries; list
    leftover temporary files of interrupted writes."""
    good, bad, checked = 0, [], []
    for info in list_segments(buffer_dir):
        try:
            table = read_segment(info, verify=True)
            checked.append(catalog.entry_of(table, info.name, info.path.stat().st_size, verified_at=time.time()))
            good += 1
        except SegmentError as e:
            entry = {"segment": info.name, "problem": str(e)}
            if move:
                entry["moved_to"] = str(quarantine(buffer_dir, info))
            bad.append(entry)
    catalog.save(buffer_dir, checked)
    if move and bad:
        catalog.roll_up(buffer_dir, block=True)  # the quarantined segments' entries go now
    d = segment_dir(buffer_dir)
    leftovers = sorted(n for n in os.listdir(d) if n.startswith(".")) if d.is_dir() else []
    groups = group_consumption(buffer_dir) if good else []
    return {"ok": good, "bad": bad, "temporary_files": leftovers, "groups_not_trained_once": groups}
