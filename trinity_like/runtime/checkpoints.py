"""Checkpoint pointers: ``checkpoints/latest`` names the newest complete full checkpoint, and
``checkpoints/state_dict/latest`` the newest published weights version. A pointer is a file holding one
integer, moved atomically after its target is complete; a missing pointer means "none yet", while one that
does not hold an integer, or names a folder that is not complete, is damage that must stop a resume rather
than silently start it again from step 0.

Each full checkpoint also holds ``checksums.json`` (size and CRC-32 of every other file, written just before
``trainer_state.json``). A resume (``resume_checkpoint``) checks them and skips a damaged checkpoint (a flipped
byte, a truncated file) for the newest intact one before it; checkpoints written before checksums existed load
unchecked. CRC-32 rather than a cryptographic hash: it catches any burst of bit flips and truncation, and runs
at ~2 GB/s on one core (sha256: ~1.3), so checking costs about one more read of the checkpoint."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from trinity_like.common.errors import RunError
from trinity_like.common.fs import atomic_write_text, file_crc32

logger = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.json"
"""Written last into a full checkpoint: its presence marks the checkpoint complete."""

CHECKSUMS = "checksums.json"
"""``{"algorithm": "crc32", "files": {relative path: {"bytes": n, "crc32": c}}}`` of every file of a checkpoint
but itself and ``trainer_state.json``; written just before ``trainer_state.json``."""

DAMAGED_DIR = "damaged"
"""``checkpoints/damaged/step_<k>``: where a resume that skipped a damaged checkpoint moves it (out of the
``step_*`` folders that pruning and the pointer see; kept for inspection, deleted by hand)."""


class CheckpointPointerError(RunError):
    """A ``latest`` pointer that is garbled or names a checkpoint that is not there."""


def read_pointer(path: Path) -> int | None:
    """The step a pointer file names; None when the file does not exist."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    try:
        return int(text.strip())
    except ValueError:
        raise CheckpointPointerError(
            f"checkpoint pointer '{path}' is garbled ({text.strip()[:40]!r} is not a step number); write the step "
            f"of a complete checkpoint into it (e.g. `echo 3 > {path}`), or delete it to start from step 0") from None


def write_pointer(path: Path, step: int, durable: bool = True) -> None:
    atomic_write_text(Path(path), f"{step}\n", durable=durable)


def latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The newest complete full checkpoint (``checkpoints/latest`` points at it), or None when there is none.
    Raises ``CheckpointPointerError`` when the pointer is garbled or its checkpoint is incomplete or gone."""
    pointer = Path(checkpoint_dir) / "latest"
    step = read_pointer(pointer)
    if step is None:
        return None
    path = Path(checkpoint_dir) / f"step_{step}"
    if not (path / TRAINER_STATE).is_file():
        raise CheckpointPointerError(
            f"checkpoint pointer '{pointer}' names step {step}, but '{path}' is not a complete checkpoint; point it "
            "at a complete step_<k> folder (one holding trainer_state.json), or delete it to start from step 0")
    return path


class DamagedCheckpointError(RunError):
    """Every checkpoint a resume could use is damaged (its files differ from its checksums)."""


def write_checksums(folder: Path) -> None:
    """Record the size and CRC-32 of every file under ``folder`` in ``folder/checksums.json`` (called inside the
    temporary folder of a checkpoint, before ``trainer_state.json``; the folder's publish makes it durable)."""
    folder = Path(folder)
    files = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = f.relative_to(folder).as_posix()
        if rel not in (CHECKSUMS, TRAINER_STATE):
            files[rel] = {"bytes": f.stat().st_size, "crc32": file_crc32(f)}
    (folder / CHECKSUMS).write_text(json.dumps({"algorithm": "crc32", "files": files}, indent=1) + "\n")


def checkpoint_damage(path: Path) -> str | None:
    """What is wrong with checkpoint ``path`` by its ``checksums.json`` (the first damaged file: missing, size or
    checksum), or None when every file matches, or when it has no checksums (written before they existed)."""
    path = Path(path)
    try:
        text = (path / CHECKSUMS).read_text()
    except FileNotFoundError:
        return None
    try:
        files = json.loads(text)["files"]
    except (ValueError, KeyError, TypeError):
        return f"{CHECKSUMS} is garbled"
    for rel, want in files.items():
        f = path / rel
        try:
            size = f.stat().st_size
        except FileNotFoundError:
            return f"{rel} is missing"
        if size != want["bytes"]:
            return f"{rel} has {size} bytes, {want['bytes']} were written"
        crc = file_crc32(f)
        if crc != want["crc32"]:
            return f"{rel} fails its checksum (crc32 {crc:08x}, {want['crc32']:08x} was written)"
    return None


def complete_steps(checkpoint_dir: Path) -> list[int]:
    """Steps of the complete ``step_<k>`` folders (holding ``trainer_state.json``), newest first."""
    steps = []
    for p in Path(checkpoint_dir).glob("step_*"):
        step = p.name.removeprefix("step_")
        if step.isdigit() and (p / TRAINER_STATE).is_file():
            steps.append(int(step))
    return sorted(steps, reverse=True)


def resume_checkpoint(checkpoint_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The checkpoint a resume loads, and the damaged ones it skipped (path, what is wrong), newest first.

    That is ``latest_checkpoint`` when its files match its checksums, else the newest intact complete checkpoint
    before it (each one skipped is logged as a WARNING). None when there is no checkpoint yet. Raises
    ``DamagedCheckpointError`` when every complete checkpoint up to the pointer is damaged, and
    ``CheckpointPointerError`` as ``latest_checkpoint`` does."""
    checkpoint_dir = Path(checkpoint_dir)
    latest = latest_checkpoint(checkpoint_dir)
    if latest is None:
        return None, []
    newest = int(latest.name.removeprefix("step_"))
    damaged: list[tuple[Path, str]] = []
    for step in [newest, *(s for s in complete_steps(checkpoint_dir) if s < newest)]:
        path = checkpoint_dir / f"step_{step}"
        problem = checkpoint_damage(path)
        if problem is None:
            return path, damaged
        logger.warning("checkpoint %s is damaged (%s); skipping it for an older one", path, problem)
        damaged.append((path, problem))
    names = "; ".join(f"{p.name}: {why}" for p, why in damaged)
    raise DamagedCheckpointError(
        f"no intact checkpoint to resume from in '{checkpoint_dir}' ({names}); restore the damaged files, or start "
        "the run over without --resume (under another name, or after deleting its run directory)")


def set_aside(path: Path) -> Path:
    """Move a damaged checkpoint to ``checkpoints/damaged/step_<k>`` (replacing one set aside before) and return
    where it went."""
    path = Path(path)
    dest = path.parent / DAMAGED_DIR / path.name
    dest.parent.mkdir(exist_ok=True)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(path, dest)
    return dest
