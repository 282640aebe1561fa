"""A schema-based fuzzer against the live recording endpoint: request bodies shaped like the OpenAI schema with
every field drawn mostly from valid values, sometimes from wrong types, out-of-range numbers, NaN, huge integers, lone surrogates
and arbitrary JSON; raw bytes; odd headers. The server must answer every one with a status below 500.

``TRINITY_FUZZ_EXAMPLES`` sets the examples per endpoint (default 100 in the test suite); the counts of each
status are printed at the end of each test (``pytest -s``).
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_serve import ServerThread, _cfg  # tests/ is on sys.path (rootdir conftest, no package)

httpx = pytest.importorskip("httpx2")

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("TRINITY_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("TRINITY_FUZZ_RANDOM") is None,
                suppress_health_check=list(HealthCheck))
STATUS: dict[str, Counter] = {}
REASONS: dict[str, Counter] = defaultdict(Counter)

# strings with any code point, lone surrogates included (they arrive as \ud800 escapes in JSON)
text = st.text(st.characters(exclude_categories=()), max_size=30) | st.sampled_from(
    ["", " ", "\ud800", "a\udfffb", "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", "x" * 300,
     "<|assistant|>\n", "\x00", "💥"])
leaf = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
        | text)
any_json = st.recursive(leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(text, c, max_size=4),
                        max_leaves=12)


def _or_junk(valid):
    """Mostly ``valid``, sometimes any leaf or any JSON value."""
    return st.one_of(valid, valid, valid, valid, leaf, any_json)


role = _or_junk(st.sampled_from(["system", "developer", "user", "assistant", "tool", "wizard", ""]))
content = _or_junk(text | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]),
                                                          "text": _or_junk(text)}), max_size=3))
tool_call = _or_junk(st.fixed_dictionaries({"id": _or_junk(text), "type": st.just("function"),
                                            "function": _or_junk(st.fixed_dictionaries(
                                                {"name": _or_junk(text), "arguments": _or_junk(text)}))}))
message = _or_junk(st.fixed_dictionaries({"role": role}, optional={
    "content": content, "tool_calls": _or_junk(st.lists(tool_call, max_size=2)), "tool_call_id": _or_junk(text),
    "name": _or_junk(text)}))
small_int = _or_junk(st.integers(-3, 40) | st.integers(-(2**70), 2**70))
unit = _or_junk(st.floats(-1, 6) | st.sampled_from([0.0, 1.0, 1e-300, float("nan"), float("inf")]))
common_fields = {
    "model": _or_junk(text), "max_tokens": small_int, "max_completion_tokens": small_int, "n": small_int,
    "temperature": unit, "top_p": unit, "top_k": small_int, "seed": small_int,
    "stop": _or_junk(text | st.lists(text, max_size=5)), "stream": _or_junk(st.booleans()),
    "logprobs": _or_junk(st.booleans()), "session_id": _or_junk(text), "group_id": _or_junk(text),
}
chat_body = st.fixed_dictionaries({"messages": _or_junk(st.lists(message, min_size=1, max_size=5))},
                                           optional={**common_fields, "tools": _or_junk(st.lists(any_json, max_size=2)),
                                                     "top_logprobs": small_int,
                                                     "response_format": _or_junk(st.fixed_dictionaries(
                                                         {"type": _or_junk(st.sampled_from(["text", "json_object"]))}))})
completion_body = st.fixed_dictionaries(
    {"prompt": _or_junk(text | st.lists(st.integers(-5, 70000), min_size=0, max_size=8))}, optional=common_fields)
feedback_body = st.fixed_dictionaries({}, optional={
    "completion_id": _or_junk(text), "experience_id": _or_junk(text), "session_id": _or_junk(text),
    "reward": unit, "turn_rewards": _or_junk(st.lists(unit, max_size=4)), "group_id": _or_junk(text)})
commit_body = st.fixed_dictionaries({}, optional={
    "session_id": _or_junk(text), "completion_ids": _or_junk(st.lists(text, max_size=3)),
    "experience_ids": _or_junk(st.lists(text, max_size=3))})
header_value = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40).map(str.strip) | st.sampled_from(
    ["", "a" * 200, "\u00e9t\u00e9"])
headers = st.fixed_dictionaries({}, optional={"X-Session-Id": header_value, "X-Group-Id": header_value,
                                              "Content-Type": st.sampled_from(["application/json"] * 6 + ["text/plain",
                                                                               "application/x-www-form-urlencoded",
                                                                               "multipart/form-data", ""])})
# well-formed conversations with sampling settings in and out of range: most of these generate and record
plain_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool"]),
                                       "content": text})
valid_chat_body = st.fixed_dictionaries(
    {"messages": st.lists(plain_message, min_size=1, max_size=4)},
    optional={"max_tokens": st.integers(1, 10), "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1),
              "top_k": st.integers(0, 50), "seed": st.integers(0, 2**40), "stop": st.lists(text, max_size=2),
              "stream": st.booleans(), "logprobs": st.booleans(), "session_id": st.sampled_from(["a", "b", "c"]),
              "group_id": st.sampled_from(["g1", "g2"])})
raw = st.binary(max_size=200) | any_json.map(lambda v: json.dumps(v, allow_nan=True).encode())


@pytest.fixture(scope="module")
def fuzz_server(ray_session, tmp_path_factory, tiny_model_path):
    srv = ServerThread(_cfg(tmp_path_factory.mktemp("fuzz"), tiny_model_path, "fuzz", "serve.max_tokens=8",
                            "explorer.sampling.max_new_tokens=4", "serve.max_body_bytes=4096")).start()
    yield srv
    srv.stop()
    print("\nfuzz status counts:", {k: dict(v) for k, v in STATUS.items()})
    print("most common refusals:", {k: v.most_common(6) for k, v in REASONS.items()})


def _send(srv, name: str, path: str, body: bytes, hdrs: dict[str, str]) -> None:
    hdrs = {"Content-Type": "application/json", **hdrs}
    r = srv.post(path, content=body, headers={k: v.encode("latin-1") for k, v in hdrs.items()})
    STATUS.setdefault(name, Counter())[r.status_code] += 1
    assert r.status_code < 500, (path, body[:300], r.status_code, r.text[:300])
    if r.status_code >= 400:
        message = r.json()["error"]["message"]
        assert message, r.text  # every refusal says why
        REASONS[name][message.split(":")[0][:50]] += 1


def _encode(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


@FUZZ
@given(body=chat_body, hdrs=headers)
def test_fuzz_chat_completions(fuzz_server, body, hdrs):
    _send(fuzz_server, "chat", "/v1/chat/completions", _encode(body), hdrs)


@FUZZ
@given(body=valid_chat_body)
def test_fuzz_well_formed_chat(fuzz_server, body):
    _send(fuzz_server, "chat_well_formed", "/v1/chat/completions", _encode(body), {})


@FUZZ
@given(body=completion_body, hdrs=headers)
def test_fuzz_completions(fuzz_server, body, hdrs):
    _send(fuzz_server, "completions", "/v1/completions", _encode(body), hdrs)


@FUZZ
@given(body=feedback_body, commit=commit_body)
def test_fuzz_feedback_and_commit(fuzz_server, body, commit):
    _send(fuzz_server, "feedback", "/v1/feedback", _encode(body), {})
    _send(fuzz_server, "commit", "/v1/commit", _encode(commit), {})


@FUZZ
@given(body=raw, path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/feedback", "/v1/commit"]),
       hdrs=headers)
def test_fuzz_raw_bytes(fuzz_server, body, path, hdrs):
    _send(fuzz_server, "raw", path, body, hdrs)
