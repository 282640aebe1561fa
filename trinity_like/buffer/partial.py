"""Partial rollouts: what a group's engine calls have generated so far, kept beside the buffer so that an explorer
(or a whole run) killed mid-group continues them on restart instead of generating them again.

``buffer/partial/step-<k:08d>/`` exists while explorer step k runs (its groups may be part-written: a restart takes
such a step up again, whatever the buffer holds of it); in it, ``g<pos:05d>-<seq:012d>.arrow`` is group ``pos``'s
journal after its ``seq``-th record (the newest is the state; an older one left by a crash between the write and the
clean-up is ignored). A journal holds one row per request of every engine call the group's workflow made: the call's
index, the request's seed, its prompt (a chat call's rendering), and the response so far with each token's log-prob
and version; ``finish_reason`` is that of its last piece. Files are written whole (temp file, rename) and not
fsynced: they are to survive the death of a process, and a power loss only costs their regeneration. The buffer
decides: a group whose rows are in a segment is done, whatever its journal says.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from trinity_like.common.fs import atomic_write_with

PARTIAL = "partial"
PARTIAL_VERSION = "1"
"""Layout of a journal file, in its schema metadata: a file of another version is ignored (regenerated)."""
PARTIAL_SCHEMA = pa.schema([
    ("call", pa.int32()),
    ("request", pa.int32()),
    ("seed", pa.int64()),
    ("prompt_ids", pa.list_(pa.int32())),
    ("response_ids", pa.list_(pa.int32())),
    ("logprobs", pa.list_(pa.float32())),
    ("token_versions", pa.list_(pa.int32())),
    ("finish_reason", pa.string()),
], metadata={"partial_version": PARTIAL_VERSION})
_STEP = re.compile(r"^step-(\d{8})$")
_GROUP = re.compile(r"^g(\d{5})-(\d{12})\.arrow$")


class PartialStore:
    """The ``partial/`` folder of one buffer."""

    def __init__(self, buffer_dir: str | os.PathLike) -> None:
        self.dir = Path(buffer_dir) / PARTIAL

    def _step_dir(self, step: int) -> Path:
        return self.dir / f"step-{step:08d}"

    def open_step(self, step: int) -> None:
        """Step ``step`` is running: until ``drop_step``, a restart takes it up again."""
        self._step_dir(step).mkdir(parents=True, exist_ok=True)

    def steps(self) -> list[int]:
        """Steps opened and not dropped (running, or cut off by a crash)."""
        if not self.dir.is_dir():
            return []
        return sorted(int(m.group(1)) for n in os.listdir(self.dir) if (m := _STEP.match(n)))

    def _journals(self, step: int, position: int) -> list[tuple[int, Path]]:
        d = self._step_dir(step)
        if not d.is_dir():
            return []
        found = [(int(m.group(2)), d / n) for n in os.listdir(d)
                 if (m := _GROUP.match(n)) and int(m.group(1)) == position]
        return sorted(found)

    def record(self, step: int, position: int, table: pa.Table) -> None:
        """Group ``position``'s journal is now ``table`` (PARTIAL_SCHEMA); earlier records go."""
        older = self._journals(step, position)
        seq = older[-1][0] + 1 if older else 0
        self._step_dir(step).mkdir(parents=True, exist_ok=True)
        table = table.cast(PARTIAL_SCHEMA)

        def write(tmp: Path) -> None:
            with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, PARTIAL_SCHEMA) as writer:
                writer.write_table(table)

        atomic_write_with(self._step_dir(step) / f"g{position:05d}-{seq:012d}.arrow", write, durable=False)
        for _, path in older:
            path.unlink(missing_ok=True)

    def load(self, step: int, position: int) -> pa.Table | None:
        """Group ``position``'s newest journal; None when it has none (or only one of another layout)."""
        for _, path in reversed(self._journals(step, position)):
            try:
                table = ipc.open_file(pa.memory_map(str(path))).read_all()
            except (OSError, pa.ArrowInvalid):
                continue  # a file cut short cannot be: records are renamed into place whole
            if (table.schema.metadata or {}).get(b"partial_version") == PARTIAL_VERSION.encode():
                return table
        return None

    def drop_group(self, step: int, position: int) -> None:
        for _, path in self._journals(step, position):
            path.unlink(missing_ok=True)

    def drop_step(self, step: int) -> None:
        shutil.rmtree(self._step_dir(step), ignore_errors=True)

    def drop_step_if_empty(self, step: int) -> None:
        """A step opened whose groups never started (claimed just before the run stopped) holds no journal: its
        folder goes, so that no step looks cut off by a crash; one holding journals stays for a resume."""
        try:
            self._step_dir(step).rmdir()
        except OSError:  # not empty (journals to take up), or not there
            pass
