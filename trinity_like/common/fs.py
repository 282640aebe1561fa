"""Atomic file writes: write to a temporary file beside the target, fsync, rename, fsync the folder.

A reader therefore sees either the old file or the whole new one, never a partial write, and a crash at any
point leaves at most a stray temporary file (named ``.<name>.tmp-*``, which no reader globs for).

``durable=False`` keeps the temp-and-rename (atomic for every reader while the machine runs) and skips both
fsyncs: for files that only carry something to other processes and are made again from a durable copy, such as
the weight versions sent to the engines (after a power loss they may be incomplete, and their checksums refuse
them). Whatever must survive a power loss (checkpoints, the ledger, the run's config) keeps the default.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder's fsync makes the renames inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_with(path: str | os.PathLike, write: Callable[[Path], None], durable: bool = True) -> Path:
    """Call ``write(tmp_path)`` to fill a temporary file, then publish it at ``path`` atomically."""
    path = Path(path)
    return atomic_write_named(path.parent, write, lambda _tmp: path.name, tmp_prefix=path.name, durable=durable)


def atomic_write_named(folder: str | os.PathLike, write: Callable[[Path], None], name_of: Callable[[Path], str],
                       tmp_prefix: str = "write", durable: bool = True) -> Path:
    """Like ``atomic_write_with``, for a file whose name depends on its content (a checksum in the name):
    ``name_of(tmp_path)`` is asked for the final name after the data is written and synced."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # A fresh name that ``write`` creates: a file made first (mkstemp) and then opened for writing is truncated,
    # and ext4 (auto_da_alloc) then starts writing the file back to disk when it is closed: 0.1-0.5 s more for a
    # 0.4 GB weights version on the development VM, 3x the write itself (bench/sync.py method checkpoint).
    tmp = folder / f".{tmp_prefix}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        write(tmp)
        if durable:
            fsync_path(tmp)
        path = folder / name_of(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_path(folder)
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes, durable: bool = True) -> Path:
    return atomic_write_with(path, lambda tmp: tmp.write_bytes(data), durable=durable)


def atomic_write_text(path: str | os.PathLike, text: str, durable: bool = True) -> Path:
    return atomic_write_bytes(path, text.encode(), durable=durable)


def atomic_write_json(path: str | os.PathLike, obj: Any, durable: bool = True) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", durable=durable)


def atomic_publish_dir(path: str | os.PathLike, fill: Callable[[Path], None]) -> Path:
    """Fill a temporary folder with ``fill(tmp_dir)``, fsync its files, then rename it to ``path``.

    An existing folder at ``path`` is replaced (moved aside, then deleted after the rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        fill(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                fsync_path(f)
        fsync_path(tmp)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
        os.replace(tmp, path)
        fsync_path(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line with a single O_APPEND write, then fsync.

    Used for logs (metrics.jsonl) that several processes append to: each line is one write() call, so lines
    from different writers do not interleave; a reader skips a torn last line after a crash."""
    data = (line.rstrip("\n") + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
