"""Writes ``segment-v1.arrow``: a buffer segment of schema version 1, made by the v1 writer (commit 2952f65).

Kept so that the fixture's origin is on record; it runs only with that code (``SCHEMA_VERSION == 1``): the file
must hold the bytes the old writer produced, so later builds never regenerate it. Run from the repository root:
``python tests/buffer/data/make_segment_v1.py``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from trinity_like.buffer.segments import write_segment
from trinity_like.common.experience import SCHEMA_VERSION, Experience, experiences_to_table

OUT = Path(__file__).parent / "segment-v1.arrow"


def rows() -> list[Experience]:
    """Two groups of two: versions 0 and 1, with and without log-probs, masks, messages and an explore step."""
    at = datetime(2026, 11, 26, tzinfo=UTC)
    return [
        Experience(prompt_ids=[1, 2], response_ids=[3, 4, 5], eid="v1-a0", group_id="a", task_id="t0",
                   logprobs=[-0.5, -1.0, -0.25], reward=1.0, model_version=0, engine_id="e0",
                   info={"explore_step": 0}, created_at=at),
        Experience(prompt_ids=[1, 2], response_ids=[6, 7], eid="v1-a1", group_id="a", task_id="t0",
                   logprobs=[-0.75, -2.0], reward=0.0, model_version=0, engine_id="e0",
                   info={"explore_step": 0}, created_at=at),
        Experience(prompt_ids=[8], response_ids=[9, 10, 11, 12], eid="v1-b0", group_id="b", task_id="t1",
                   action_mask=[True, False, True, True], logprobs=[-0.1, -0.2, -0.3, -0.4], reward=0.5,
                   model_version=1, truncated=True, prompt_text="p", response_text="r",
                   messages=[{"role": "user", "content": "p"}], info={"explore_step": 1}, created_at=at),
        Experience(prompt_ids=[8], response_ids=[13], eid="v1-b1", group_id="b", task_id="t1", reward=0.25,
                   token_rewards=[0.25], model_version=1, info={"explore_step": 1}, created_at=at),
    ]


def main() -> None:
    if SCHEMA_VERSION != 1:
        sys.exit(f"this build writes schema version {SCHEMA_VERSION}; the fixture must come from the v1 writer")
    with tempfile.TemporaryDirectory() as tmp:
        info = write_segment(tmp, experiences_to_table(rows()), "v1fixture", 0)
        shutil.copyfile(info.path, OUT)
    print(f"wrote {OUT} ({info.num_rows} rows, crc32 {info.crc32:08x})")


if __name__ == "__main__":
    main()
