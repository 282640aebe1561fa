"""Atomic file writes: write to a temporary file beside the target, fsync, rename, fsync the folder.

A reader therefore sees either the old file or the whole new one, never a partial write, and a crash at any
point leaves at most a stray temporary file (named ``.<name>.tmp-*``, which no reader globs for).

``durable=False`` keeps the temp-and-rename (atomic for every reader while the machine runs) and skips both
fsyncs: for files that only carry something to other processes and are made again from a durable copy, such as
the weight versions sent to the engines (after a power loss they may be incomplete, and their checksums refuse
them). Whatever must survive a power loss (checkpoints, the ledger, the run's config) keeps the default.

A write the file system refuses for a reason the user can fix (no space left, over quota, read-only) raises
``StorageError`` (``DiskFullError`` for space) naming the path and what was being written, after the temporary
file is removed: what was stored before is intact. ``torch.save`` and other writers that report a failed write
in their own words (torch: "unexpected pos ...") are recognised by the space left on the file system when they
fail.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trinity_like.common.errors import DiskFullError, StorageError

_FULL = (errno.ENOSPC, errno.EDQUOT)
_FULL_WORDS = ("No space left on device", "os error 28")
"""How writers that wrap the OS error in their own type say it (safetensors: "... (os error 28)")."""
_LOW_SPACE = 1 << 20
"""A writer that fails in its own words while its file system has less than this free ran out of space."""

# What a file of the run is, by the names in its path (first match wins): for the one-line error of a failed write.
_KINDS = (("consumers", "the consumption ledger"), ("catalog", "the buffer catalog"),
          ("rejects", "the rejected rows"), ("partial", "a partial-rollout journal"), ("serve", "serve records"),
          ("state_dict", "a weights version"), ("latest", "a checkpoint pointer"), ("checkpoints", "a checkpoint"),
          ("segments", "a buffer segment"), ("buffer", "a buffer segment"), ("metrics.jsonl", "the metrics log"),
          ("config.yaml", "the run's config"))


def describe(path: str | os.PathLike) -> str:
    """What the file at ``path`` is to a run ("a buffer segment", "a checkpoint", ...), from its path."""
    parts = Path(path).parts
    for key, kind in _KINDS:
        if any(part == key or part.startswith(key + "_") for part in parts):
            return kind
    return "a file"


def _free_bytes(path: Path) -> int | None:
    for p in (path, *path.parents):
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return None


def storage_error(exc: BaseException, path: str | os.PathLike) -> StorageError | None:
    """The user-facing error for ``exc`` raised while writing ``path``, or None when it is not a storage fault.
    Call before removing what the failed write left (a writer's own error is judged by the space left)."""
    if isinstance(exc, StorageError):
        return None
    path = Path(path)
    if isinstance(exc, OSError) and exc.errno == errno.EROFS:
        return StorageError(f"cannot write {describe(path)} '{path}': the file system is read-only",
                            "remount it writable (or move the run directory), then resume the run with --resume")
    free = _free_bytes(path.parent)
    said_full = isinstance(exc, OSError) and exc.errno in _FULL or any(m in str(exc) for m in _FULL_WORDS)
    if not (said_full or isinstance(exc, (OSError, RuntimeError)) and free is not None and free < _LOW_SPACE):
        return None
    what = describe(path)
    left = f" ({free / 1e6:.1f} MB free)" if free is not None else ""
    return DiskFullError(f"no space left on the device writing {what} '{path}'{left}",
                         "nothing half-written was kept: free space (or move the run directory), then resume the run "
                         "with --resume")


def _refused(exc: BaseException, path: Path, cleanup: Callable[[], None]) -> None:
    """Clean up a failed write, then raise its storage error (if it is one) from ``exc``."""
    err = storage_error(exc, path)
    try:
        cleanup()
    except OSError:  # a read-only file system keeps nothing to clean up either
        if err is None:
            raise
    if err is not None:
        raise err from exc


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
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _refused(exc, folder / tmp_prefix, lambda: None)
        raise
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
    except BaseException as exc:
        _refused(exc, folder / tmp_prefix, lambda: tmp.unlink(missing_ok=True))
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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    except OSError as exc:
        _refused(exc, path, lambda: None)
        raise
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
    except BaseException as exc:
        _refused(exc, path, lambda: shutil.rmtree(tmp, ignore_errors=True))
        raise
    return path


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line with a single O_APPEND write, then fsync.

    Used for logs (metrics.jsonl) that several processes append to: each line is one write() call, so lines
    from different writers do not interleave; a reader skips a torn last line after a crash."""
    data = (line.rstrip("\n") + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, data)
            if written != len(data):  # a full disk takes what fits: cut the torn line off again
                os.ftruncate(fd, os.fstat(fd).st_size - written)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        _refused(exc, Path(path), lambda: None)
        raise


def file_crc32(path: str | os.PathLike, chunk_bytes: int = 16 << 20) -> int:
    """CRC-32 of a file, read in chunks (zlib releases the GIL on each)."""
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_bytes):
            crc = zlib.crc32(chunk, crc)
    return crc
