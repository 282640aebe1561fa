"""Checkpoint pointers: ``checkpoints/latest`` names the newest complete full checkpoint, and
``checkpoints/state_dict/latest`` the newest published weights version. A pointer is a file holding one
integer, moved atomically after its target is complete; a missing pointer means "none yet", while one that
does not hold an integer, or names a folder that is not complete, is damage that must stop a resume rather
than silently start it again from step 0."""

from __future__ import annotations

from pathlib import Path

from trinity_like.common.errors import RunError
from trinity_like.common.fs import atomic_write_text

TRAINER_STATE = "trainer_state.json"
"""Written last into a full checkpoint: its presence marks the checkpoint complete."""


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
