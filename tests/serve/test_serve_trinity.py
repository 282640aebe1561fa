"""Trinity-RFT's proxy API on ``trinity-like serve``: ``POST /feedback``, ``POST /commit``, ``GET /metrics``.

The real server (Ray, the tiny model's engine, real files) on loopback, driven over real HTTP by Trinity-RFT's
own client and agent code (tests/serve/trinity_client/, copied unchanged from upstream); the key check runs the
app in-process with a stand-in backend (no engine is needed to refuse a request)."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
import requests

from tests.serve.test_serve import ServerThread, _cfg
from trinity_like.buffer.sql import query
from trinity_like.runtime.paths import RunPaths

pytest.importorskip("openai")

pytestmark = pytest.mark.slow

TRINITY_METRICS = ("explore_step_num", "rollout/total_experience_count", "rollout/ready_experience_count",
                   "rollout/model_0/total_request_count", "rollout/model_0/model_version")


@pytest.fixture(scope="module")
def server(ray_session, tmp_path_factory, tiny_model_path):
    srv = ServerThread(_cfg(tmp_path_factory.mktemp("serve-trinity"), tiny_model_path, "trinity")).start()
    yield srv
    srv.stop()


def _base(server) -> str:
    return server.url.removesuffix("/v1")


def _pending(server) -> dict[str, dict]:
    return {p["experience_id"]: p for p in server.get("/v1/pending").json()["data"]}


def test_trinitys_own_agent_and_client_record_reward_and_commit_unchanged(server):
    """Trinity's ServeTest flow: agents (streamed and not) each answer one chat and send their reward with
    ``msg_ids=[response.id]``; ``/metrics`` counts them in Trinity's fields; ``/commit`` puts them in the buffer
    with that reward and advances ``explore_step_num``."""
    from tests.serve.trinity_client.agent import run_agent
    from tests.serve.trinity_client.client import TrinityClient

    proxy = TrinityClient(proxy_url=_base(server))
    assert proxy.alive()
    before = proxy.get_metrics()
    assert set(TRINITY_METRICS) <= set(before)
    assert before["rollout/model_0/model_version"] == 0
    pending_before = set(_pending(server))

    n = 4
    answers: list[str | None] = [None] * n
    errors: list[BaseException] = []

    def agent(i: int) -> None:
        try:
            answers[i] = run_agent(_base(server), "any-model-name", i % 2 == 0)
        except BaseException as e:  # a failed agent fails the test below
            errors.append(e)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert all(isinstance(a, str) for a in answers)

    metrics = asyncio.run(proxy.get_metrics_async())
    assert metrics["rollout/total_experience_count"] - before["rollout/total_experience_count"] == n
    assert metrics["rollout/ready_experience_count"] - before["rollout/ready_experience_count"] == n
    assert (metrics["rollout/model_0/total_request_count"] - before["rollout/model_0/total_request_count"]) == n
    assert metrics["rollout/model_0/total_request_count"] == metrics["rollout/total_experience_count"]  # 1 engine
    assert metrics["serve/rewarded_pending_experiences"] == n
    new = {eid: p for eid, p in _pending(server).items() if eid not in pending_before}
    assert len(new) == n and all(p["rewarded"] for p in new.values())
    # each agent's client has its own task_id (Trinity's task): it became the experience's group
    assert len({p["group_id"] for p in new.values()}) == n and all(len(p["group_id"]) == 6 for p in new.values())

    assert asyncio.run(proxy.commit_async())["status"] == "success"
    after = proxy.get_metrics()
    assert after["explore_step_num"] == before["explore_step_num"] + 1
    assert after["serve/pending_experiences"] == len(pending_before)
    rows = query(RunPaths.of(server.cfg).buffer_dir,
                 f"eid IN ({', '.join(repr(e) for e in new)})").to_pylist()
    assert len(rows) == n
    for row in rows:  # what Trinity's test checks of the buffer, in our record's terms
        assert row["reward"] == 2.0 and row["source"] == "agent"
        assert len(row["prompt_ids"]) > 0 and len(row["response_ids"]) == len(row["logprobs"])
        assert row["group_id"] == new[row["eid"]]["group_id"]
    # a commit with nothing rewarded writes nothing and is no step
    assert proxy.commit()["committed"] == 0
    assert proxy.get_metrics()["explore_step_num"] == after["explore_step_num"]


def test_feedback_refuses_a_second_reward_an_unknown_id_and_a_bad_body_in_trinitys_shape(server):
    from tests.serve.trinity_client.client import TrinityClient

    proxy = TrinityClient(proxy_url=_base(server))
    openai_client = proxy.get_openai_client()
    ids = [openai_client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"{k} + 2 = ?"}],
                                                 max_tokens=3).id for k in range(2)]
    eids = [server.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                    max_tokens=2).model_extra["experience_id"]]
    url = f"{_base(server)}/feedback"

    # all or nothing: a known id beside an unknown one rewards neither
    r = requests.post(url, json={"msg_ids": [ids[0], "chatcmpl-nope"], "reward": 1.0}, timeout=30)
    assert r.status_code == 404 and r.json() == {"error": r.json()["error"]}
    assert "'chatcmpl-nope'" in r.json()["error"] and "never answered here" in r.json()["error"]
    assert not any(p["rewarded"] for p in _pending(server).values() if p["experience_id"] not in eids)

    assert proxy.feedback(reward=0.5, msg_ids=[ids[0]]) == {"status": "success",
                                                           "experience_ids": [ids[0].removeprefix("chatcmpl-")
                                                                              .rsplit("-", 1)[0]]}
    second = proxy.feedback(reward=1.0, msg_ids=[ids[0], ids[1]])
    assert list(second) == ["error"] and f"completion '{ids[0]}' has a reward already (0.5" in second["error"]
    # ids[1] was not rewarded by the refused request
    assert asyncio.run(proxy.feedback_async(1.0, [ids[1]]))["status"] == "success"

    bad = [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object, got list"),
        (b'{"msg_ids": ["a"]}', "msg_ids and reward are required"),
        (b'{"reward": 1}', "msg_ids and reward are required"),
        (b'{"msg_ids": "a", "reward": 1}', "msg_ids must be a list and reward must be a number"),
        (b'{"msg_ids": ["a"], "reward": "1"}', "msg_ids must be a list and reward must be a number"),
        (b'{"msg_ids": ["a"], "reward": true}', "msg_ids must be a list and reward must be a number"),
        (b'{"msg_ids": [], "reward": 1}', "non-empty list of completion ids"),
        (b'{"msg_ids": [3], "reward": 1}', "non-empty list of completion ids"),
        (b'{"msg_ids": ["a"], "reward": 1e999}', "finite number"),
        (b'{"msg_ids": ["a"], "reward": 1, "rewards": 2}', "unknown field 'rewards'"),
        (b'{"msg_ids": ["a"], "reward": 1, "run_id": "x"}', "run_id must be an integer"),
    ]
    for body, message in bad:
        r = httpx.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 400 and list(r.json()) == ["error"], (body, r.text)
        assert message in r.json()["error"], (body, r.json())


async def test_the_key_guards_feedback_and_commit_but_not_metrics(tmp_path, tiny_model_path):
    """With ``--api-key``, Trinity's writing routes need it too (they decide what is trained on), in Trinity's
    error shape; ``/metrics`` stays open like ``/health``."""
    from tests.serve.test_serve_faults import ThreeTokens
    from trinity_like.common.tokenizer import hf_tokenizer
    from trinity_like.config import SamplingConfig, ServeConfig
    from trinity_like.serve.app import ServeState, build_app
    from trinity_like.serve.records import PendingStore

    async def commit(records) -> str:
        return "segment"

    app = build_app(ServeState(cfg=ServeConfig(), backend=ThreeTokens(hf_tokenizer(tiny_model_path)),
                               store=PendingStore(tmp_path / "pending"), model_name="p",
                               default_sampling=SamplingConfig(max_new_tokens=3), commit=commit, api_key="k"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serve") as c:
        for path in ("/feedback", "/commit"):
            r = await c.post(path, json={"msg_ids": ["a"], "reward": 1})
            assert r.status_code == 401 and list(r.json()) == ["error"] and "API key" in r.json()["error"]
        r = await c.post("/feedback", json={"msg_ids": ["a"], "reward": 1}, headers={"Authorization": "Bearer k"})
        assert r.status_code == 404 and list(r.json()) == ["error"]
        r = await c.get("/metrics")
        assert r.status_code == 200 and r.json()["rollout/total_experience_count"] == 0
        assert r.json()["explore_step_num"] == 0
