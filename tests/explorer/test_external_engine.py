"""``explorer.engine: external`` (engines/external.py): bench of a model behind an OpenAI-compatible server.

The server is a real one started here: our own ``trinity-like serve`` in front of the tiny model (``serve_async`` on
a loopback port, its engine a real Ray actor), which answers ``/v1/completions`` and ``/v1/chat/completions`` as an
OpenAI-compatible server does. It is a recording proxy too: what it records stays pending in its own run
directory, which these tests do not read."""

from __future__ import annotations

import asyncio

import pytest

from tests.serve.test_serve import ServerThread, _cfg
from trinity_like.common.errors import ConfigError, RunError
from trinity_like.config import SamplingConfig, load_config

pytest.importorskip("openai")  # ServerThread's module needs it

KEY = "sk-test-key"


@pytest.fixture(scope="module")
def openai_server(ray_session, tmp_path_factory, tiny_model_path):
    """``trinity-like serve`` over the tiny model, behind the API key ``KEY``, as the external server."""
    srv = ServerThread(_cfg(tmp_path_factory.mktemp("external-server"), tiny_model_path, "external-server",
                            "serve.model_name=tiny-served"), api_key=KEY).start()
    yield srv
    srv.stop()


TEXT_REWARD = ("def compute_score(responses, ground_truths, **kwargs):\n"
               "    # a reward that tells any two answers apart (the tiny model never answers right)\n"
               "    return [len(r) + sum(map(ord, r)) % 7 / 10 for r in responses]\n")


def _bench_cfg(tmp_path, model_path, *overrides):
    tmp_path.mkdir(parents=True, exist_ok=True)
    reward = tmp_path / "text_reward.py"
    reward.write_text(TEXT_REWARD)
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}", "project=t",
                              "name=bench", "explorer.sampling.max_new_tokens=6", f"reward.function_path={reward}",
                              "explorer.eval_tasksets=[{name: arith, size: 8, max_operand: 9}]", *overrides])


@pytest.mark.slow
def test_bench_through_the_server_gives_the_rows_of_bench_on_the_model_itself(openai_server, tmp_path,
                                                                             tiny_model_path, monkeypatch):
    """Greedy: the server's engine answers each prompt as our own hf engine does, so every row is the same; the
    key and the model name are sent (a wrong key is refused by the server, in one line naming it)."""
    from trinity_like.explorer.evaluation import bench

    monkeypatch.setenv("MY_BASE", openai_server.url)
    monkeypatch.setenv("MY_KEY", KEY)
    external = ["explorer.engine=external", "explorer.external_model.base_url_env=MY_BASE",
                "explorer.external_model.api_key_env=MY_KEY"]
    before = openai_server.get("/metrics").json()
    rows = bench(_bench_cfg(tmp_path / "ext", tiny_model_path, *external))
    direct = bench(_bench_cfg(tmp_path / "hf", tiny_model_path))
    assert rows == direct
    assert rows[0]["taskset"] == "arith" and rows[0]["tasks"] == 8 and rows[0]["reward_mean"] > 1
    after = openai_server.get("/metrics").json()
    # one completion per task went through the server
    assert after["rollout/total_experience_count"] - before["rollout/total_experience_count"] == 8

    monkeypatch.setenv("MY_KEY", "wrong")
    with pytest.raises(RunError, match=r"/v1/models did not answer \(HTTP 401: missing or wrong API key"):
        bench(_bench_cfg(tmp_path / "ext", tiny_model_path, *external))
    monkeypatch.setenv("MY_KEY", KEY)
    with pytest.raises(RunError, match="HTTP 400"):  # the served model refuses what it cannot do, said as it says
        bench(_bench_cfg(tmp_path / "ext", tiny_model_path, *external, "explorer.sampling.max_new_tokens=5000"))


@pytest.mark.slow
def test_chat_and_the_first_listed_model(openai_server, tiny_model_path, monkeypatch):
    """``chat`` goes to /chat/completions; with no model_name the first model of /models is used; the prompt ids
    are the local rendering of the messages, the response ids the answer's text in our tokenizer."""
    from trinity_like.common.tokenizer import hf_tokenizer
    from trinity_like.explorer.engines.base import render_chat
    from trinity_like.explorer.engines.external import ExternalEngine

    tok = hf_tokenizer(tiny_model_path)
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.url + "/")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    cfg = load_config(None, [f"model.path={tiny_model_path}", "explorer.engine=external"])
    messages = [{"role": "user", "content": "what is 2 + 2?"}]

    async def main():
        engine = ExternalEngine.from_config(cfg, tok)
        try:
            await engine.ready()
            sample = await engine.chat(messages, SamplingConfig(temperature=0.0, max_new_tokens=5), seed=3)
            (greedy,) = await engine.generate([render_chat(messages, tok)],
                                              SamplingConfig(temperature=0.0, max_new_tokens=5), [4])
            return engine.model_name, sample, greedy
        finally:
            await engine.aclose()

    name, sample, greedy = asyncio.run(main())
    assert name == "tiny-served"
    assert sample.prompt_ids.tolist() == render_chat(messages, tok)
    assert sample.model_version == -1 and sample.engine_id == "external-0"
    assert len(sample.logprobs) == len(sample.response_ids) and not sample.logprobs.any()
    # the same conversation, greedy, through /completions from its rendered ids: the same answer
    assert tok.decode(greedy.response_ids) == tok.decode(sample.response_ids)
    assert sample.finish_reason in ("stop", "length")


def test_a_missing_variable_is_refused_in_one_line_naming_it(tmp_path, tiny_model_path, monkeypatch):
    from trinity_like.explorer.evaluation import bench

    monkeypatch.delenv("NO_SUCH_BASE", raising=False)
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    cfg = _bench_cfg(tmp_path, tiny_model_path, "explorer.engine=external",
                     "explorer.external_model.base_url_env=NO_SUCH_BASE")
    with pytest.raises(ConfigError, match="environment variable NO_SUCH_BASE, which is not set") as e:
        bench(cfg)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "t" / "bench").exists()  # refused before anything was written
    monkeypatch.setenv("NO_SUCH_BASE", "localhost:8000/v1")
    with pytest.raises(ConfigError, match="NO_SUCH_BASE='localhost:8000/v1' is not an http"):
        bench(cfg)
    monkeypatch.setenv("NO_SUCH_BASE", "http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError, match="API key from the environment variable NO_SUCH_KEY, which is not set"):
        bench(_bench_cfg(tmp_path, tiny_model_path, "explorer.engine=external",
                         "explorer.external_model.base_url_env=NO_SUCH_BASE",
                         "explorer.external_model.api_key_env=NO_SUCH_KEY"))


def test_run_and_serve_refuse_engine_external_before_anything_starts(tmp_path, tiny_model_path):
    from trinity_like.launcher import run
    from trinity_like.serve.server import serve

    cfg = _bench_cfg(tmp_path, tiny_model_path, "explorer.engine=external")
    for start, command in ((run, "run"), (serve, "serve")):
        with pytest.raises(ConfigError, match=f"explorer.engine external is for `bench` only: {command} needs") as e:
            start(cfg)
        assert "\n" not in str(e.value)
    assert not (tmp_path / "t").exists()


def test_an_external_model_takes_no_checkpoint(tmp_path, tiny_model_path):
    from trinity_like.common.errors import UserError
    from trinity_like.explorer.evaluation import bench, bench_checkpoints

    cfg = _bench_cfg(tmp_path, tiny_model_path, "explorer.engine=external")
    for call in (lambda: bench(cfg, str(tmp_path)), lambda: bench_checkpoints(cfg, follow=True),
                 lambda: bench(_bench_cfg(tmp_path, tiny_model_path, "explorer.engine=external",
                                          "explorer.bench_on_latest_checkpoint=true"))):
        with pytest.raises(UserError, match="explorer.engine external evaluates the server's model: it takes no "
                                            "checkpoint"):
            call()
