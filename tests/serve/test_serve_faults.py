"""The recording endpoint under many sessions and on a full disk (issue 38 items 1 and 5).

Most tests drive the app in-process (``build_app`` through httpx's ASGI transport) with a stand-in backend that
answers every prompt with the same three tokens, over a real ``PendingStore`` and a real ``BufferWriter``; the
last one runs the real server (Ray, the tiny model's engine). The disk-full tests put the run's files on a real
8 MiB tmpfs (``mount`` needs root; they are skipped with the reason otherwise) and fill it.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import os
from pathlib import Path

import httpx
import numpy as np
import pytest

from trinity_like.buffer import BufferWriter
from trinity_like.buffer.sql import query
from trinity_like.config import SamplingConfig, ServeConfig
from trinity_like.explorer.engines.base import Sample
from trinity_like.serve.app import ServeState, build_app
from trinity_like.serve.records import PendingStore

REPLY = [5, 6, 7]


class ThreeTokens:
    """A backend that answers every prompt with ``REPLY``."""

    version = 0
    load_error = None

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    async def generate(self, input_ids, sampling, seed):
        return Sample(response_ids=np.array(REPLY, np.int32), logprobs=np.full(len(REPLY), -0.5, np.float32),
                      finish_reason="length", engine_id="three")


def _app(folder: Path, tokenizer):
    writer = BufferWriter(folder / "buffer", writer_id="serve")

    async def commit(records) -> str:
        return (await asyncio.to_thread(writer.write, [r.to_experience() for r in records])).name

    return build_app(ServeState(cfg=ServeConfig(), backend=ThreeTokens(tokenizer),
                                store=PendingStore(folder / "serve" / "pending"), model_name="p",
                                default_sampling=SamplingConfig(max_new_tokens=3), commit=commit))


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from trinity_like.common.tokenizer import hf_tokenizer

    return hf_tokenizer(tiny_model_path)


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serve", timeout=30)


def _chat(session: str, text: str) -> dict:
    """A first turn: one user message (a session whose open record holds another history starts a new one)."""
    return {"messages": [{"role": "user", "content": text}], "session_id": session, "max_tokens": 3}


def _locks_alive() -> int:
    gc.collect()
    return sum(type(o) is asyncio.Lock for o in gc.get_objects())


def test_the_session_locks_go_with_their_sessions(tmp_path, tokenizer):
    """200 sessions, each one turn, a reward and a commit, 20 at a time: no lock outlives its requests (one
    asyncio.Lock per session ever seen was kept, so the server's memory grew with every session)."""
    app = _app(tmp_path, tokenizer)

    async def one(k: int, http) -> None:
        r = await http.post("/v1/chat/completions", json=_chat(f"s{k}", "hi"))
        assert r.status_code == 200, r.text
        assert (await http.post("/v1/feedback", json={"session_id": f"s{k}", "reward": 1.0})).status_code == 200
        assert (await http.post("/v1/commit", json={"session_id": f"s{k}"})).json()["committed"] == 1

    async def main() -> int:
        async with _client(app) as http:
            await asyncio.gather(*(one(k, http) for k in range(20)))  # warm: whatever the app keeps for good
            before = _locks_alive()
            for start in range(20, 220, 20):
                await asyncio.gather(*(one(k, http) for k in range(start, start + 20)))
            return _locks_alive() - before

    assert asyncio.run(main()) <= 2
    assert len(query(tmp_path / "buffer", "source = 'agent'")) == 220


def test_a_turn_racing_its_sessions_commit_is_either_committed_or_pending_once(tmp_path, tokenizer):
    """Second turns and commits of the same sessions sent together: whichever runs first, every answered turn
    ends up in exactly one place (committed with its record, or pending in the record a later turn opened)."""
    app = _app(tmp_path, tokenizer)

    async def main():
        async with _client(app) as http:
            follow_ups = []
            for k in range(10):
                first = (await http.post("/v1/chat/completions", json=_chat(f"s{k}", "a"))).json()
                await http.post("/v1/feedback", json={"session_id": f"s{k}", "reward": 1.0})
                follow_ups.append({"messages": [{"role": "user", "content": "a"}, first["choices"][0]["message"],
                                                {"role": "user", "content": "b"}], "session_id": f"s{k}"})
            answers = await asyncio.gather(
                *(http.post("/v1/chat/completions", json=body) for body in follow_ups),
                *(http.post("/v1/commit", json={"session_id": f"s{k}"}) for k in range(10)))
            pending = (await http.get("/v1/pending")).json()["data"]
            return answers, pending

    answers, pending = asyncio.run(main())
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
    stored = query(tmp_path / "buffer", "source = 'agent'").column("eid").to_pylist()
    held = [p["experience_id"] for p in pending]
    assert len(stored) == len(set(stored)) and not set(stored) & set(held)
    assert {a.json()["experience_id"] for a in answers[:10]} <= set(stored) | set(held)


# ---------------------------------------------------------------------------------------------- a full disk
@pytest.fixture
def small_disk(small_disk_of):
    """A real 8 MiB tmpfs (tests/conftest.py ``SmallDisk``; skipped where mounting is refused): its folder."""
    return small_disk_of("8m").path


def _fill(disk: Path) -> Path:
    """Take every free byte of ``disk``; returns the file to delete to free them."""
    ballast = disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT)
    try:
        st = os.statvfs(disk)
        os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize)
        while True:  # whatever fallocate left, a page at a time
            try:
                os.write(fd, b"\0" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC
                break
    finally:
        os.close(fd)
    return ballast


def _temp_files(root: Path) -> list[str]:
    return [p.name for p in root.rglob("*") if ".tmp" in p.name]


def _assert_disk_full(r: httpx.Response, where: Path) -> None:
    assert r.status_code == 507, r.text
    message = r.json()["error"]["message"]
    assert "no space left on the device" in message and str(where) in message, message
    assert "nothing of this request was recorded or committed" in message


def test_a_full_disk_answers_507_and_keeps_nothing_of_the_refused_request(small_disk, tokenizer):
    """On a full disk a turn, a reward and a commit each get 507 naming the path; the pending record is as it was
    (in memory too: before, the refused turn stayed in memory and was committed later, and the refused reward
    too), the committed rows are intact, no temporary file is left; with room again the commit goes through."""
    app = _app(small_disk, tokenizer)
    pending_dir = small_disk / "serve" / "pending"

    async def main():
        async with _client(app) as http:
            first = (await http.post("/v1/chat/completions", json=_chat("kept", "a"))).json()["experience_id"]
            await http.post("/v1/feedback", json={"session_id": "kept", "reward": 1.0})
            assert (await http.post("/v1/commit", json={"session_id": "kept"})).status_code == 200
            turn = await http.post("/v1/chat/completions", json=_chat("t", "a"))
            eid = turn.json()["experience_id"]
            await http.post("/v1/feedback", json={"session_id": "t", "reward": 0.5})
            again = {"messages": [{"role": "user", "content": "a"},
                                  {"role": "assistant", "content": turn.json()["choices"][0]["message"]["content"]},
                                  {"role": "user", "content": "b"}], "session_id": "t", "max_tokens": 3}

            ballast = _fill(small_disk)
            _assert_disk_full(await http.post("/v1/chat/completions", json=again), pending_dir)
            _assert_disk_full(await http.post("/v1/feedback", json={"session_id": "t", "reward": 0.9}), pending_dir)
            _assert_disk_full(await http.post("/v1/commit", json={"session_id": "t"}), small_disk / "buffer")
            assert (await http.get("/health")).json()["status"] == "ok"
            (rec,) = (await http.get("/v1/pending")).json()["data"]
            assert rec["experience_id"] == eid and rec["turns"] == 1 and rec["rewarded"]
            assert _temp_files(small_disk) == []
            assert query(small_disk / "buffer", "source = 'agent'").column("eid").to_pylist() == [first]

            ballast.unlink()
            done = await http.post("/v1/commit", json={"session_id": "t"})
            assert done.status_code == 200 and done.json()["experience_ids"] == [eid], done.text
            return first, eid

    first, eid = asyncio.run(main())
    rows = query(small_disk / "buffer", "source = 'agent'").to_pylist()
    assert [r["eid"] for r in rows] == [first, eid]
    assert rows[1]["reward"] == 0.5 and len(rows[1]["response_ids"]) == len(REPLY)  # the refused turn is not in it
    assert not list(pending_dir.iterdir())


@pytest.mark.slow
def test_the_real_server_on_a_full_disk_answers_507_and_stays_up(ray_session, small_disk, tiny_model_path):
    """``serve`` itself (the engine, the run directory, the buffer on the small disk): a commit on the full disk
    gets 507 naming the buffer, the committed rows stay as they were, the server keeps answering, and once
    space is freed the same commit succeeds."""
    from test_serve import ServerThread, _cfg  # tests/serve/ is on sys.path (rootdir conftest, no package)

    from trinity_like.runtime.paths import RunPaths

    srv = ServerThread(_cfg(small_disk, tiny_model_path, "full")).start()
    try:
        buffer_dir = RunPaths.of(srv.cfg).buffer_dir
        body = {"messages": [{"role": "user", "content": "1 + 1 ="}], "max_tokens": 4}
        first = srv.post("/v1/chat/completions", json={**body, "session_id": "kept"}).json()["experience_id"]
        srv.post("/v1/feedback", json={"session_id": "kept", "reward": 1.0})
        assert srv.post("/v1/commit", json={"session_id": "kept"}).status_code == 200
        eid = srv.post("/v1/chat/completions", json={**body, "session_id": "t"}).json()["experience_id"]
        srv.post("/v1/feedback", json={"session_id": "t", "reward": 0.0})

        ballast = _fill(small_disk)
        _assert_disk_full(srv.post("/v1/commit", json={"session_id": "t"}), buffer_dir)
        assert srv.get("/health").json()["status"] == "ok"
        assert [p["experience_id"] for p in srv.get("/v1/pending").json()["data"]] == [eid]
        assert query(buffer_dir, "source = 'agent'").column("eid").to_pylist() == [first]
        assert _temp_files(small_disk) == []

        ballast.unlink()
        done = srv.post("/v1/commit", json={"session_id": "t"})
        assert done.status_code == 200 and done.json()["experience_ids"] == [eid], done.text
        assert query(buffer_dir, "source = 'agent'").column("eid").to_pylist() == [first, eid]
    finally:
        srv.stop()
