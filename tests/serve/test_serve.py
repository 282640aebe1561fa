"""The recording endpoint on loopback, driven by the official ``openai`` client: a real Ray instance, the real
tiny model in engine actors, real files for the pending records and the buffer, a real trainer job."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx2 as httpx  # the HTTP client the openai package is built on
import numpy as np
import pytest
import torch

from trinity_like.config import load_config
from trinity_like.runtime.paths import RunPaths

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow


def _cfg(tmp_path, model_path, name="serve", *overrides):
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}", "project=t",
                              f"name={name}", "explorer.taskset.size=8", "explorer.num_engines=1",
                              "explorer.sampling.max_new_tokens=12", "synchronizer.method=checkpoint",
                              "serve.max_tokens=1024", "serve.max_body_bytes=65536", "serve.max_messages=16",
                              "trainer.batch_size=4", "trainer.total_steps=1", "trainer.micro_batch_size=2",
                              *overrides])


class ServerThread:
    """``serve_async`` on its own event loop in a thread, on a free loopback port."""

    def __init__(self, cfg, api_key: str = "") -> None:
        self.cfg, self.api_key = cfg, api_key
        self.url = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> ServerThread:
        from trinity_like.runtime.run_dir import prepare_run_dir
        from trinity_like.serve.server import bind_socket

        prepare_run_dir(self.cfg, role="serve")
        sock = bind_socket("127.0.0.1", 0)
        self.thread = threading.Thread(target=self._main, args=(sock,), daemon=True)
        self.thread.start()
        assert self._ready.wait(120), f"server did not start: {self._error!r}"
        return self

    def _main(self, sock) -> None:
        from trinity_like.serve.server import serve_async

        async def main():
            self.loop = asyncio.get_running_loop()
            self.stop_event = asyncio.Event()

            def ready(url):
                self.url = url
                self._ready.set()

            await serve_async(self.cfg, sock, self.api_key, ready, self.stop_event)

        try:
            asyncio.run(main())
        except BaseException as e:
            self._error = e
            self._ready.set()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(60)
        assert not self.thread.is_alive()

    def client(self, **kwargs):
        return openai.OpenAI(base_url=self.url, api_key=kwargs.pop("api_key", self.api_key or "none"),
                             max_retries=0, **kwargs)

    def post(self, path: str, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        headers.update(kwargs.pop("headers", {}))
        return httpx.post(self.url.removesuffix("/v1") + path, headers=headers, timeout=60, **kwargs)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url.removesuffix("/v1") + path, timeout=60)


@pytest.fixture(scope="module")
def server(ray_session, tmp_path_factory, tiny_model_path):
    srv = ServerThread(_cfg(tmp_path_factory.mktemp("serve"), tiny_model_path)).start()
    yield srv
    srv.stop()


def _plain(tok, role: str, text: str) -> list[int]:
    """The plain chat format worked out by hand: header, text, EOS."""
    return tok.encode(f"<|{role}|>\n", add_special_tokens=False) + tok.encode(text, add_special_tokens=False) + [
        tok.eos_token_id]


def test_four_turn_conversation_is_one_experience_with_the_assistants_tokens_masked_in(server, tiny_model_path):
    from trinity_like.common.tokenizer import hf_tokenizer

    tok = hf_tokenizer(tiny_model_path)
    client = server.client()
    users = ["what is 2 + 3?", "and 4 + 4?", "now 9 - 1?", "thanks, 7 + 0?"]
    messages, replies = [], []
    for turn, text in enumerate(users):
        messages.append({"role": "user", "content": text})
        resp = client.chat.completions.create(model="policy", messages=messages, max_tokens=6, logprobs=True,
                                              extra_headers={"X-Session-Id": "conv-1"})
        extra = resp.model_extra
        assert extra["session_id"] == "conv-1" and extra["turn"] == turn and extra["model_version"] == 0
        replies.append(resp)
        messages.append({"role": "assistant", "content": resp.choices[0].message.content})
    assert len({r.model_extra["experience_id"] for r in replies}) == 1
    eid = replies[0].model_extra["experience_id"]
    pending = server.get("/v1/pending").json()["data"]
    (rec,) = [p for p in pending if p["experience_id"] == eid]
    assert rec["turns"] == 4 and rec["model_versions"] == [0, 0, 0, 0] and not rec["rewarded"]

    record = json.loads((RunPaths.of(server.cfg).run_dir / "serve" / "pending" / f"{eid}.json").read_text())
    # prompt: the first user message and the assistant header; then per turn the reply (policy tokens), and for
    # turns 2-4 the next user message and header (context); the reply's tokens are the ones it reported
    assert record["prompt_ids"] == _plain(tok, "user", users[0]) + tok.encode("<|assistant|>\n",
                                                                                add_special_tokens=False)
    expected_ids, expected_mask, expected_lp = [], [], []
    for turn, resp in enumerate(replies):
        if turn:
            ctx = _plain(tok, "user", users[turn]) + tok.encode("<|assistant|>\n", add_special_tokens=False)
            expected_ids += ctx
            expected_mask += [False] * len(ctx)
            expected_lp += [0.0] * len(ctx)
        n = resp.usage.completion_tokens
        lps = [t.logprob for t in resp.choices[0].logprobs.content]
        assert len(lps) == n
        expected_ids += record["response_ids"][len(expected_ids):len(expected_ids) + n]
        expected_mask += [True] * n
        expected_lp += lps
        assert tok.decode(expected_ids[-n:], skip_special_tokens=True) == resp.choices[0].message.content
    assert record["response_ids"] == expected_ids
    assert record["action_mask"] == expected_mask
    np.testing.assert_allclose(record["logprobs"], expected_lp, rtol=0, atol=1e-6)

    # the behaviour log-probs are the model's own, recomputed here in one forward pass over the whole record
    from trinity_like.common.modeling import load_causal_lm, logprobs_from_logits

    model = load_causal_lm(tiny_model_path)
    ids = torch.tensor([record["prompt_ids"] + record["response_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(record["prompt_ids"]) - 1:-1]
    recomputed = logprobs_from_logits(logits, ids[0, len(record["prompt_ids"]):], 1.0).numpy()
    mask = np.array(expected_mask)
    np.testing.assert_allclose(recomputed[mask], np.array(expected_lp)[mask], atol=2e-4)


def test_an_edited_history_starts_a_new_experience_in_the_same_session(server):
    client = server.client()
    first = client.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                           extra_body={"session_id": "edit-1"})
    edited = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "something else entirely"},
              {"role": "user", "content": "go on"}]
    second = client.chat.completions.create(model="p", messages=edited, max_tokens=3,
                                            extra_body={"session_id": "edit-1"})
    assert second.model_extra["experience_id"] != first.model_extra["experience_id"]
    assert second.model_extra["turn"] == 0
    records = [p for p in server.get("/v1/pending").json()["data"] if p["session_id"] == "edit-1"]
    assert sorted(p["closed"] for p in records) == [False, True]
    # feedback on the session reaches both
    fb = server.post("/v1/feedback", json={"session_id": "edit-1", "reward": 0.5}).json()
    assert len(fb["experience_ids"]) == 2 and fb["rewarded"]


def test_feedback_commit_then_a_trainer_job_trains_on_it_and_the_served_version_rises(server):
    from trinity_like.buffer.ledger import Ledger
    from trinity_like.buffer.sql import query
    from trinity_like.launcher import run

    client = server.client()
    eids = []
    for k in range(4):
        resp = client.chat.completions.create(model="p", messages=[{"role": "user", "content": f"{k} + 1 = ?"}],
                                              max_tokens=4, extra_headers={"X-Group-Id": "g-commit"})
        eids.append(resp.model_extra["experience_id"])
        assert resp.model_extra["group_id"] == "g-commit"
    # an unrewarded experience cannot be committed by name
    r = server.post("/v1/commit", json={"experience_ids": [eids[0]]})
    assert r.status_code == 409 and "no reward" in r.json()["error"]["message"]
    for k, cid in enumerate(eids):
        r = server.post("/v1/feedback", json={"experience_id": cid, "reward": float(k % 2)})
        assert r.status_code == 200, r.text
    r = server.post("/v1/feedback", json={"experience_id": eids[0], "turn_rewards": [1.0, 2.0]})
    assert r.status_code == 400 and "1 assistant turns" in r.json()["error"]["message"]
    r = server.post("/v1/commit", json={"experience_ids": eids})
    assert r.status_code == 200, r.text
    assert r.json()["committed"] == 4 and sorted(r.json()["experience_ids"]) == sorted(eids)
    paths = RunPaths.of(server.cfg)
    rows = query(paths.buffer_dir, f"eid IN ({', '.join(repr(e) for e in eids)})").to_pylist()
    assert len(rows) == 4 and {r["source"] for r in rows} == {"agent"}
    assert sorted(r["reward"] for r in rows) == [0.0, 0.0, 1.0, 1.0]
    assert {r["model_version"] for r in rows} == {0} and {r["group_id"] for r in rows} == {"g-commit"}
    assert not any((paths.run_dir / "serve" / "pending" / f"{e}.json").exists() for e in eids)
    # committed twice: nothing pending under those ids any more
    assert server.post("/v1/commit", json={"experience_ids": [eids[0]]}).status_code == 404

    # a trainer job of the same run takes one step on exactly these rows (trainer.batch_size 4) and publishes
    # version 1, which the server loads
    summary = run(load_config(paths.config), role="trainer")
    assert summary["exit_reason"] == "completed", summary
    assert Ledger(paths.buffer_dir, "trainer", create=False).consumed_rows() == 4
    deadline = time.monotonic() + 60
    while server.get("/health").json()["model_version"] < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    resp = client.chat.completions.create(model="p", messages=[{"role": "user", "content": "again"}], max_tokens=2)
    assert resp.model_extra["model_version"] == 1 and resp.system_fingerprint == "trinity_like-v1"


def test_bad_requests_get_4xx_with_a_message(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError, match="max_tokens 5000 is over this server's limit 1024"):
        client.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}], max_tokens=5000)
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        client.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}], n=2)
    with pytest.raises(openai.BadRequestError, match="role must be one of"):
        client.chat.completions.create(model="p", messages=[{"role": "wizard", "content": "x"}])
    cases = [
        ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
        ("/v1/chat/completions", b"[1, 2]", 400, "JSON object"),
        ("/v1/chat/completions", json.dumps({"messages": "hello"}).encode(), 400, "messages"),
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}],
                                             "temperature": -1}).encode(), 400, "temperature"),
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}] * 17}).encode(), 400,
         "over this server's limit 16"),
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x" * 70000}]}).encode(), 413,
         "65536 bytes"),
        ("/v1/completions", json.dumps({"prompt": [10 ** 9]}).encode(), 400, "token ids"),
        ("/v1/feedback", json.dumps({"session_id": "nobody", "reward": 1}).encode(), 404, "no pending"),
        ("/v1/feedback", json.dumps({"reward": 1}).encode(), 400, "exactly one of"),
        ("/v1/feedback", b'{"session_id": "x", "reward": NaN}', 400, "finite"),
        ("/v1/commit", b'{"everything": true}', 400, "commit body"),
    ]
    for path, body, status, words in cases:
        r = server.post(path, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == status, (path, body[:60], r.status_code, r.text)
        assert words in r.json()["error"]["message"], (path, r.json())
    assert server.get("/v1/nowhere").status_code == 404
    assert server.get("/chat/completions").status_code == 404
    assert server.get("/v1/chat/completions").status_code == 405


def test_a_client_that_leaves_mid_request_leaves_no_record(server):
    """A long generation (seeded so it runs to 500-1000 tokens) whose client gives up a tenth of the way through:
    the turn is never recorded. (A fixed 0.3 s was shorter than the generation only on a busy machine: on an idle
    one the tiny model writes 500 tokens in less.)"""
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 1000, "session_id": "probe"}

    def probe(s: int) -> float | None:
        start = time.perf_counter()
        answer = server.post("/v1/chat/completions", json={**body, "seed": s, "session_id": f"probe-{s}"}).json()
        return time.perf_counter() - start if answer["usage"]["completion_tokens"] >= 500 else None

    seed, took_s = next((s, t) for s in range(40) if (t := probe(s)) is not None)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/chat/completions", json={**body, "seed": seed, "session_id": "leaver"},
                   timeout=took_s / 10)
    time.sleep(4)  # the generation finishes server-side, then finds its client gone
    assert not [p for p in server.get("/v1/pending").json()["data"] if p["session_id"] == "leaver"]
    # the server still answers
    assert server.get("/health").json()["status"] == "ok"


def test_streaming_answers_and_records_the_same_turn(server):
    client = server.client()
    stream = client.chat.completions.create(model="p", messages=[{"role": "user", "content": "stream me"}],
                                            max_tokens=5, stream=True, extra_body={"session_id": "stream-1"})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    (rec,) = [p for p in server.get("/v1/pending").json()["data"] if p["session_id"] == "stream-1"]
    record = json.loads((RunPaths.of(server.cfg).run_dir / "serve" / "pending" /
                         f"{rec['experience_id']}.json").read_text())
    assert record["messages"][-1]["content"] == text


def test_api_key_and_exposure(ray_session, tmp_path, tiny_model_path):
    from trinity_like.common.errors import UserError
    from trinity_like.serve.server import bind_socket, check_exposure

    with pytest.raises(UserError, match="refusing to serve on 0.0.0.0 without an API key"):
        check_exposure("0.0.0.0", "")
    check_exposure("0.0.0.0", "k")
    check_exposure("127.0.0.1", "")
    check_exposure("::1", "")
    taken = bind_socket("127.0.0.1", 0)
    with pytest.raises(UserError, match=f"port {taken.getsockname()[1]} on 127.0.0.1 is in use"):
        bind_socket("127.0.0.1", taken.getsockname()[1])
    taken.close()

    srv = ServerThread(_cfg(tmp_path, tiny_model_path, "keyed"), api_key="s3cret").start()
    try:
        messages = [{"role": "user", "content": "x"}]
        with pytest.raises(openai.AuthenticationError):
            srv.client(api_key="wrong").chat.completions.create(model="p", messages=messages, max_tokens=2)
        r = httpx.post(srv.url + "/chat/completions", json={"messages": messages})
        assert r.status_code == 401 and "Bearer" in r.json()["error"]["message"]
        assert httpx.get(srv.url + "/models").status_code == 401
        ok = srv.client().chat.completions.create(model="p", messages=messages, max_tokens=2)
        assert ok.model_extra["turn"] == 0
    finally:
        srv.stop()


def test_pending_records_survive_a_restart_and_the_session_goes_on(ray_session, tmp_path, tiny_model_path):
    cfg = _cfg(tmp_path, tiny_model_path, "restart")
    srv = ServerThread(cfg).start()
    messages = [{"role": "user", "content": "remember me"}]
    first = srv.client().chat.completions.create(model="p", messages=messages, max_tokens=4,
                                                 extra_body={"session_id": "s"})
    srv.stop()
    srv = ServerThread(cfg).start()
    try:
        (rec,) = srv.get("/v1/pending").json()["data"]
        assert rec["experience_id"] == first.model_extra["experience_id"] and rec["turns"] == 1
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "still there?"}]
        second = srv.client().chat.completions.create(model="p", messages=messages, max_tokens=4,
                                                      extra_body={"session_id": "s"})
        assert second.model_extra["experience_id"] == rec["experience_id"] and second.model_extra["turn"] == 1
    finally:
        srv.stop()


def test_a_commit_cut_off_before_the_pending_files_go_is_not_committed_twice(tmp_path):
    """The buffer segment is written before the pending files are deleted; a store opened after a crash in
    between drops the records whose ids the buffer already holds."""
    from trinity_like.buffer import BufferWriter
    from trinity_like.buffer.segments import stored_eids
    from trinity_like.serve.records import PendingStore

    store = PendingStore(tmp_path / "pending")
    rec = store.new_record("s", None, [1, 2, 3], [{"role": "user", "content": "x"}], None)
    rec.response_ids, rec.action_mask, rec.logprobs = [4, 5], [True, True], [-0.5, -0.25]
    rec.turn_ends, rec.versions, rec.completion_ids, rec.engine_ids = [1], [0], [f"{rec.record_id}-0"], ["hf-0"]
    rec.turn_rewards = [2.0]
    store.save(rec)
    other = store.new_record("t", None, [1], [{"role": "user", "content": "y"}], None)
    other.response_ids, other.action_mask, other.logprobs = [6], [True], [-1.0]
    other.turn_ends, other.versions, other.completion_ids, other.engine_ids = [0], [3], [f"{other.record_id}-0"], [""]
    store.save(other)
    BufferWriter(tmp_path / "buffer").write([rec.to_experience()])  # ... and the server died here
    reopened = PendingStore(tmp_path / "pending", stored_eids(tmp_path / "buffer"))
    assert list(reopened.records) == [other.record_id]
    assert not (tmp_path / "pending" / f"{rec.record_id}.json").exists()
    exp = rec.to_experience()
    assert exp.source == "agent" and exp.eid == rec.record_id and exp.reward is None
    assert exp.token_rewards.tolist() == [0.0, 2.0] and exp.model_version == 0


def test_a_server_killed_with_sigkill_restarts_with_every_answered_turn(tmp_path, tiny_model_path):
    """`trinity-like serve` as a real process (its own local Ray), its whole process group SIGKILLed after two
    answered turns; a new server on the same run has both turns pending and continues the session."""
    import os
    import re
    import signal
    import subprocess
    import sys
    from pathlib import Path

    cli = str(Path(sys.executable).parent / "trinity-like")
    args = [cli, "serve", "--port", "0", "project=t", "name=killed", f"checkpoint_root_dir={tmp_path}",
            f"model.path={tiny_model_path}", "explorer.taskset.size=8", "explorer.sampling.max_new_tokens=4"]
    config = tmp_path / "c.yaml"
    config.write_text("mode: async\n")

    def start():
        proc = subprocess.Popen([*args, str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        for line in proc.stdout:
            m = re.search(r"at (http://\S+/v1)", line)
            if m:
                return proc, m.group(1)
        raise AssertionError(f"serve exited with {proc.wait()}")

    proc, url = start()
    try:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "one"}]
        first = client.chat.completions.create(model="p", messages=messages, extra_body={"session_id": "k"})
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "two"}]
        second = client.chat.completions.create(model="p", messages=messages, extra_body={"session_id": "k"})
        assert second.model_extra["turn"] == 1
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    pending = tmp_path / "t" / "killed" / "serve" / "pending"
    assert [p.name for p in pending.iterdir()] == [f"{first.model_extra['experience_id']}.json"]  # no temp files

    proc, url = start()
    try:
        rows = httpx.get(url.removesuffix("/v1") + "/v1/pending", timeout=30).json()["data"]
        assert [(r["experience_id"], r["turns"]) for r in rows] == [(first.model_extra["experience_id"], 2)]
        messages += [{"role": "assistant", "content": second.choices[0].message.content},
                     {"role": "user", "content": "three"}]
        third = openai.OpenAI(base_url=url, api_key="none", max_retries=0).chat.completions.create(
            model="p", messages=messages, extra_body={"session_id": "k"})
        assert third.model_extra["turn"] == 2
        assert third.model_extra["experience_id"] == first.model_extra["experience_id"]
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0
