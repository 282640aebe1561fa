"""The OpenAI-compatible recording endpoint: a FastAPI app over a rollout backend and the pending store.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``, ``GET /health``, and the
recording API ``POST /v1/feedback``, ``POST /v1/commit``, ``GET /v1/pending``; beside it Trinity-RFT's proxy API,
with Trinity's request and response shapes, so that a client written for Trinity's serve mode works unchanged:
``POST /feedback {msg_ids, reward, task_id?, run_id?}``, ``POST /commit`` and ``GET /metrics`` (errors there are
Trinity's ``{"error": "<message>"}``). docs/agents.md maps them onto the records.

Every completion is recorded (``records.py``) before its answer is sent; the answer carries ``experience_id``,
``session_id``, ``turn`` and ``model_version`` (also as headers ``X-Experience-Id``, ``X-Session-Id``,
``X-Model-Version``). A session id (header ``X-Session-Id`` or body field ``session_id``) links the turns of a
conversation into one experience; ``group_id`` (header ``X-Group-Id`` or body field) puts experiences in one
GRPO group.

Robustness: a request body over ``serve.max_body_bytes`` gets 413; malformed JSON, a wrong shape or a value
out of range gets 400 with an OpenAI-style ``{"error": {"message", "type", "param"}}``; a missing or wrong
bearer key gets 401 when a key is set. A client that disconnects before its completion is recorded leaves
no trace: the turn is dropped, not half-written. A record or a commit the disk has no room for gets 507 (503 for
a read-only file system) naming the path; nothing of that request is kept, on disk or in memory (the pending
store changes its index only after the write: ``PendingStore.update``), and the server goes on.

Departures from the OpenAI API: ``n`` must be 1; ``top_logprobs`` is not offered; ``stop`` strings cut the
response after the token that completes them (the tokens the policy produced up to there are what is
recorded); ``tool_choice`` and ``response_format`` other than text are not honoured (400 for the latter).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import random
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from trinity_like.common.chat import ChatFormatError, continuation_ids, normalize_messages, render_ids
from trinity_like.common.errors import DiskFullError, StorageError
from trinity_like.config import SamplingConfig, ServeConfig
from trinity_like.explorer.fleet import EngineCallFailed
from trinity_like.serve.records import PendingStore, Record

MIN_TEMPERATURE = 0.01
_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


class Backend(Protocol):
    """What the app needs from the policy: generation from token ids and the version it serves."""

    tokenizer: Any
    version: int
    load_error: str | None
    """Why the newest published version could not be loaded, or None: ``/health`` says "degraded" with it."""

    async def generate(self, input_ids: list[int], sampling: SamplingConfig, seed: int):
        """One ``Sample`` (response_ids, logprobs, finish_reason, model_version, engine_id)."""
        ...

    # optional: ``engines() -> list[(engine_id, model_version)]``, one per engine in order, for ``/metrics``


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


TRINITY_ROUTES = ("/feedback", "/commit", "/metrics")
"""Trinity-RFT's proxy routes: their errors take Trinity's shape, ``{"error": "<message>"}``."""
TRINITY_WRITE_ROUTES = ("/feedback", "/commit")
"""Trinity's routes that change what is trained on: behind the API key, as ``/v1`` is (``/metrics`` and
``/health`` stay open: they only read counts)."""


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
           path: str = "") -> JSONResponse:
    if path in TRINITY_ROUTES:
        return JSONResponse({"error": message}, status_code=status)
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                        status_code=status)


# ------------------------------------------------------------------ request bodies
class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    temperature: float | None = Field(None, ge=0.0, le=5.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    logprobs: bool | int | None = None
    session_id: str | None = Field(None, min_length=1, max_length=128)
    group_id: str | None = Field(None, min_length=1, max_length=128)


class ChatBody(_Body):
    messages: list[Any]
    tools: list[dict[str, Any]] | None = None
    top_logprobs: int | None = Field(None, ge=0)
    response_format: dict[str, Any] | None = None


class CompletionBody(_Body):
    prompt: str | list[int]


class FeedbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    completion_id: str | None = None
    experience_id: str | None = None
    session_id: str | None = None
    reward: float | None = None
    turn_rewards: list[float] | None = None
    group_id: str | None = Field(None, min_length=1, max_length=128)


class CommitBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session_id: str | None = None
    completion_ids: list[str] | None = None
    experience_ids: list[str] | None = None


# ------------------------------------------------------------------ limits and auth (plain ASGI middleware)
class Guard:
    """Plain ASGI middleware in front of the app (not Starlette's BaseHTTPMiddleware, which hides a client's
    disconnect from the route): the bearer-key check (401) when a key is set, and the body limit (413, by
    Content-Length or while a chunked body streams in), so the app never sees an unauthorised or oversized
    request."""

    def __init__(self, app, limit: int, api_key: str = "") -> None:
        self.app, self.limit, self.api_key = app, limit, api_key

    def _authorised(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, key = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode(), self.api_key.encode())

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        path = scope["path"]
        guarded = path.startswith("/v1") or path in TRINITY_WRITE_ROUTES
        if self.api_key and guarded and not self._authorised(headers):
            return await _error(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                                kind="authentication_error", path=path)(scope, receive, send)
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await _error(413, f"request body over {self.limit} bytes (serve.max_body_bytes)",
                                path=path)(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise ApiError(413, f"request body over {self.limit} bytes (serve.max_body_bytes)")
            return message

        await self.app(scope, limited, send)


class SessionLocks:
    """One ``asyncio.Lock`` per session with a request in flight: the turns of a session are recorded one at a
    time, in order, and a commit waits for the turn in progress of each session it takes. An entry lives only
    while a request holds or waits for its lock, so the table stays as small as the requests in flight however
    many sessions come and go (one lock per session ever seen, kept forever, grew without bound)."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        """session id -> (its lock, the requests holding or waiting for it)."""

    def __len__(self) -> int:
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, *sessions: str | None):
        """Hold the locks of ``sessions`` (None: a request without a session, which needs none), taken in sorted
        order so that two holders of several never wait for each other."""
        names = sorted({s for s in sessions if s is not None})
        for s in names:
            lock, users = self._locks.get(s, (None, 0))
            self._locks[s] = (lock or asyncio.Lock(), users + 1)
        taken: list[asyncio.Lock] = []
        try:
            for s in names:
                lock = self._locks[s][0]
                await lock.acquire()
                taken.append(lock)
            yield
        finally:
            for lock in taken:
                lock.release()
            for s in names:
                lock, users = self._locks[s]
                if users == 1:
                    del self._locks[s]
                else:
                    self._locks[s] = (lock, users - 1)


@dataclass
class Counters:
    """What ``GET /metrics`` reports, counted since this server started (Trinity's proxy counts in memory too),
    except ``commits``, which starts from the commits stored in the run's buffer. Changed only on the event loop."""

    completions: int = 0
    """Completions answered and recorded (Trinity's ``rollout/total_experience_count``: there each completion is
    one experience)."""
    rewarded_completions: int = 0
    """Completions whose experience got its reward (Trinity's ``rollout/ready_experience_count``)."""
    by_engine: dict[str, int] = field(default_factory=dict)
    """engine id -> completions it answered (Trinity's ``rollout/model_<i>/total_request_count``)."""
    committed: int = 0
    """Experiences this server committed into the buffer."""
    commits: int = 0
    """Commits that wrote a buffer segment, those of earlier servers of the run included (Trinity's
    ``explore_step_num``, which a commit advances)."""


@dataclass
class ServeState:
    cfg: ServeConfig
    backend: Backend
    store: PendingStore
    model_name: str
    default_sampling: SamplingConfig
    commit: Callable[[list[Record]], Awaitable[str]]
    """Writes records as one buffer segment (source agent) and returns its name."""
    api_key: str = ""
    counters: Counters = field(default_factory=Counters)


def build_app(state: ServeState) -> Guard:
    """The ASGI app: the routes behind ``Guard``."""
    app = FastAPI(title="trinity_like serve", docs_url=None, redoc_url=None)
    locks = SessionLocks()
    counters = state.counters
    store_lock = asyncio.Lock()
    """Serialises feedback and commit with each other (they touch several records)."""
    tok = state.backend.tokenizer
    vocab = len(tok)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return _error(e.status, e.message, e.param, e.kind, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            msg = "request body is not valid JSON"
        elif not loc and first.get("type") in ("model_attributes_type", "dict_type", "model_type"):
            msg = "request body must be a JSON object (Content-Type: application/json)"
        return _error(400, f"{loc + ': ' if loc else ''}{msg}", loc or None)

    @app.exception_handler(EngineCallFailed)
    async def engines_down(request: Request, e: EngineCallFailed):
        return _error(503, f"the policy's engines could not answer ({e}); retry later", kind="server_error",
                      path=request.url.path)

    @app.exception_handler(StorageError)
    async def storage_refused(request: Request, e: StorageError):
        # the store and the buffer write atomically and change nothing in memory before the disk: nothing of
        # this request was kept, and the server goes on
        full = isinstance(e, DiskFullError)
        return _error(507 if full else 503, f"{e.fault}; nothing of this request was recorded or committed (what was "
                      f"stored before is intact); retry once {'space is freed' if full else 'the disk is writable'}",
                      kind="server_error", path=request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        return _error(e.status_code, str(e.detail), kind="invalid_request_error" if e.status_code < 500 else "server_error",
                      path=request.url.path)

    # -------------------------------------------------------------- info
    @app.get("/health")
    async def health():
        problem = getattr(state.backend, "load_error", None)
        return {"status": "degraded" if problem else "ok", "model_version": state.backend.version,
                "pending": len(state.store.records), **({"reason": problem} if problem else {})}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": 0,
                                            "owned_by": "trinity_like", "model_version": state.backend.version}]}

    @app.get("/v1/pending")
    async def pending():
        return {"object": "list", "data": [
            {"experience_id": r.record_id, "session_id": r.session_id, "group_id": r.group_id,
             "turns": len(r.turn_ends), "model_versions": r.versions, "rewarded": r.rewarded, "closed": r.closed}
            for r in state.store.records.values()]}

    # -------------------------------------------------------------- generation
    def sampling_of(body: _Body) -> tuple[SamplingConfig, int]:
        if body.n not in (None, 1):
            raise ApiError(400, "n must be 1: every completion is recorded as its own experience", "n")
        limit = state.cfg.max_tokens
        max_tokens = body.max_completion_tokens or body.max_tokens or min(state.default_sampling.max_new_tokens, limit)
        if max_tokens > limit:
            raise ApiError(400, f"max_tokens {max_tokens} is over this server's limit {limit} (serve.max_tokens)",
                           "max_tokens")
        if body.temperature is not None and 0 < body.temperature < MIN_TEMPERATURE:
            raise ApiError(400, f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}: smaller values "
                                "overflow the scaled logits", "temperature")
        d = state.default_sampling
        sampling = SamplingConfig(temperature=d.temperature if body.temperature is None else body.temperature,
                                  top_p=d.top_p if body.top_p is None else body.top_p,
                                  top_k=d.top_k if body.top_k is None else body.top_k,
                                  max_new_tokens=max_tokens, stop_token_ids=list(d.stop_token_ids))
        seed = random.getrandbits(31) if body.seed is None else body.seed % (2**31)
        return sampling, seed

    def stops_of(body: _Body) -> list[str]:
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if len(stops) > 4 or any(not s or len(s) > 256 for s in stops):
            raise ApiError(400, "stop takes up to 4 non-empty strings of at most 256 characters", "stop")
        return stops

    def ids_of(request: Request, body: _Body) -> tuple[str | None, str | None]:
        session = request.headers.get("x-session-id") or body.session_id
        group = request.headers.get("x-group-id") or body.group_id
        for name, value in (("session_id", session), ("group_id", group)):
            if value is not None and not (0 < len(value) <= 128 and value.isprintable()):
                raise ApiError(400, f"{name} must be 1 to 128 printable characters", name)
        return session, group

    def cut_at_stop(ids: list[int], stops: list[str]) -> int | None:
        """Length of the shortest prefix of ``ids`` whose text contains a stop string, or None."""
        if not stops:
            return None
        for n in range(1, len(ids) + 1):
            text = tok.decode(ids[:n], skip_special_tokens=True)
            if any(s in text for s in stops):
                return n
        return None

    async def generate(input_ids: list[int], sampling: SamplingConfig, seed: int, stops: list[str]):
        if len(input_ids) > state.cfg.max_prompt_tokens:
            raise ApiError(400, f"the conversation is {len(input_ids)} tokens, over this server's limit "
                                f"{state.cfg.max_prompt_tokens} (serve.max_prompt_tokens); start a new session",
                           "messages")
        sample = await state.backend.generate(input_ids, sampling, seed)
        ids = [int(x) for x in sample.response_ids]
        logprobs = [float(x) for x in sample.logprobs]
        finish = sample.finish_reason
        cut = cut_at_stop(ids, stops)
        if cut is not None:
            ids, logprobs, finish = ids[:cut], logprobs[:cut], "stop"
        text = tok.decode(ids, skip_special_tokens=True)
        for s in stops:
            if s in text:
                text = text[:text.index(s)]
        return sample, ids, logprobs, finish, text

    async def record_turn(request: Request, record: Record, context_ids: list[int], ids: list[int],
                          logprobs: list[float], sample, finish: str, reply: dict[str, Any],
                          new_messages: list[dict[str, Any]]) -> str | None:
        """Append one turn to ``record`` and save it; None (nothing recorded) if the client left."""
        if await request.is_disconnected():
            return None
        cid = f"{record.record_id}-{len(record.turn_ends)}"

        def add_turn(r: Record) -> None:
            r.response_ids += context_ids + ids
            r.action_mask += [False] * len(context_ids) + [True] * len(ids)
            r.logprobs += [0.0] * len(context_ids) + logprobs
            r.turn_ends.append(max(len(r.response_ids) - 1, 0))  # an empty reply has no token of its own
            r.versions.append(int(sample.model_version))
            r.completion_ids.append(cid)
            r.engine_ids.append(sample.engine_id)
            r.truncated = r.truncated or finish == "length"
            r.messages = r.messages + new_messages + [reply]

        state.store.update(record, add_turn)  # a full disk: 507, and the record is as it was
        counters.completions += 1
        counters.by_engine[sample.engine_id] = counters.by_engine.get(sample.engine_id, 0) + 1
        return cid

    def session_record(session: str | None, group: str | None, messages, tools, render_new, extend):
        """(record, context ids to append, messages new to the record) for a turn of ``session``."""
        session = session or uuid.uuid4().hex
        record = state.store.open_record(session)
        if record is not None and (tools or None) == (record.tools or None):
            context = extend(record)
            if context is not None:
                return record, context[0], context[1]
        prompt = render_new()
        return state.store.new_record(session, group, prompt, [], tools), [], messages

    def _headers(record: Record, version: int) -> dict[str, str]:
        return {"X-Experience-Id": record.record_id, "X-Session-Id": record.session_id,
                "X-Model-Version": str(version)}

    def _extra(record: Record, version: int) -> dict[str, Any]:
        return {"experience_id": record.record_id, "session_id": record.session_id, "group_id": record.group_id,
                "turn": len(record.turn_ends) - 1, "model_version": version,
                "system_fingerprint": f"trinity_like-v{version}"}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, request: Request):
        _check_unicode(body.model_dump(), "request")
        if len(body.messages) > state.cfg.max_messages:
            raise ApiError(400, f"{len(body.messages)} messages, over this server's limit {state.cfg.max_messages} "
                                "(serve.max_messages)", "messages")
        if body.top_logprobs:
            raise ApiError(400, "top_logprobs is not offered; logprobs=true returns the sampled tokens' log-probs",
                           "top_logprobs")
        if body.response_format and body.response_format.get("type") not in (None, "text"):
            raise ApiError(400, "only response_format {\"type\": \"text\"} is supported", "response_format")
        if body.tools is not None and (len(body.tools) > 64 or len(json.dumps(body.tools)) > 65536):
            raise ApiError(400, "tools: at most 64 tools and 64 KiB of schemas", "tools")
        try:
            messages = normalize_messages(body.messages)
        except ChatFormatError as e:
            raise ApiError(400, str(e), "messages") from None
        sampling, seed = sampling_of(body)  # bad sampling is refused before any work
        stops = stops_of(body)
        session, group = ids_of(request, body)
        tools = body.tools or None

        def extend(record: Record):
            known = len(record.messages)
            if len(messages) <= known or _canonical(messages[:known]) != _canonical(record.messages):
                return None
            new = messages[known:]
            ids = continuation_ids(record.messages, new, tok, tools)
            return None if ids is None else (ids, new)

        async with locks.hold(session):
            try:
                record, context, new_messages = session_record(
                    session, group, messages, tools, lambda: render_ids(messages, tok, True, tools), extend)
            except ChatFormatError as e:
                raise ApiError(400, str(e), "messages") from None
            sample, ids, logprobs, finish, text = await generate(record.input_ids() + context, sampling, seed, stops)
            content, calls = _parse_tool_calls(text)
            reply: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                reply["tool_calls"] = calls
                finish = "tool_calls" if finish == "stop" else finish
            cid = await record_turn(request, record, context, ids, logprobs, sample, finish, reply, new_messages)
        if cid is None:
            return Response(status_code=499)
        version = int(sample.model_version)
        usage = {"prompt_tokens": len(record.input_ids()) - len(ids), "completion_tokens": len(ids),
                 "total_tokens": len(record.input_ids())}
        lp = _logprobs_block(tok, ids, logprobs) if body.logprobs else None
        created = int(time.time())
        if body.stream:
            return _stream_chat(cid, created, state.model_name, reply, finish, lp, usage, _extra(record, version),
                                _headers(record, version))
        return JSONResponse({"id": f"chatcmpl-{cid}", "object": "chat.completion", "created": created,
                             "model": state.model_name,
                             "choices": [{"index": 0, "message": reply, "finish_reason": finish, "logprobs": lp}],
                             "usage": usage, **_extra(record, version)}, headers=_headers(record, version))

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request):
        _check_unicode(body.model_dump(), "request")
        if isinstance(body.prompt, str):
            if not body.prompt:
                raise ApiError(400, "prompt is empty", "prompt")
            prompt_ids = list(tok.encode(body.prompt, add_special_tokens=False))
        else:
            if not body.prompt or any(not 0 <= t < vocab for t in body.prompt):
                raise ApiError(400, f"prompt token ids must be a non-empty list in 0..{vocab - 1}", "prompt")
            prompt_ids = list(body.prompt)
        if not prompt_ids:
            raise ApiError(400, "prompt tokenises to nothing", "prompt")
        sampling, seed = sampling_of(body)
        stops = stops_of(body)
        session, group = ids_of(request, body)

        def extend(record: Record):  # a session's next prompt must extend everything said so far, in tokens
            held = record.input_ids()
            if len(prompt_ids) <= len(held) or prompt_ids[:len(held)] != held:
                return None
            return prompt_ids[len(held):], []

        async with locks.hold(session):
            record, context, _ = session_record(session, group, [], None, lambda: prompt_ids, extend)
            sample, ids, logprobs, finish, text = await generate(record.input_ids() + context, sampling, seed, stops)
            cid = await record_turn(request, record, context, ids, logprobs, sample, finish,
                                    {"role": "assistant", "content": text}, [])
        if cid is None:
            return Response(status_code=499)
        version = int(sample.model_version)
        choice = {"index": 0, "text": text, "finish_reason": finish,
                  "logprobs": {"tokens": [tok.decode([t]) for t in ids], "token_logprobs": logprobs}
                  if body.logprobs else None}
        payload = {"id": f"cmpl-{cid}", "object": "text_completion", "created": int(time.time()),
                   "model": state.model_name, "choices": [choice],
                   "usage": {"prompt_tokens": len(record.input_ids()) - len(ids), "completion_tokens": len(ids),
                             "total_tokens": len(record.input_ids())}, **_extra(record, version)}
        if body.stream:
            async def events():
                yield f"data: {json.dumps(payload)}\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream", headers=_headers(record, version))
        return JSONResponse(payload, headers=_headers(record, version))

    # -------------------------------------------------------------- feedback and commit
    def targets(completion_id, experience_id, session_id) -> list[Record]:
        given = [x for x in (completion_id, experience_id, session_id) if x is not None]
        if len(given) != 1:
            raise ApiError(400, "name exactly one of completion_id, experience_id, session_id")
        if completion_id is not None:
            rec = state.store.of_completion(_strip_prefix(completion_id))
            found = [rec] if rec else []
        elif experience_id is not None:
            found = [state.store.records[experience_id]] if experience_id in state.store.records else []
        else:
            found = state.store.of_session(session_id)
        if not found:
            raise ApiError(404, f"no pending experience for {given[0]!r} (committed already, or never recorded)",
                           kind="not_found_error")
        return found

    @app.post("/v1/feedback")
    async def feedback(body: FeedbackBody):
        _check_unicode(body.model_dump(), "request")
        if body.reward is None and body.turn_rewards is None and body.group_id is None:
            raise ApiError(400, "feedback needs reward, turn_rewards or group_id")
        values = ([body.reward] if body.reward is not None else []) + list(body.turn_rewards or [])
        if any(not math.isfinite(v) for v in values):
            raise ApiError(400, "rewards must be finite numbers", "reward")
        async with store_lock:
            records = targets(body.completion_id, body.experience_id, body.session_id)
            if body.turn_rewards is not None:
                if len(records) != 1:
                    raise ApiError(400, f"turn_rewards needs one experience; session {body.session_id!r} holds "
                                        f"{len(records)}: send feedback per experience_id", "turn_rewards")
                turns = len(records[0].turn_ends)
                if len(body.turn_rewards) != turns:
                    raise ApiError(400, f"turn_rewards has {len(body.turn_rewards)} values for {turns} assistant "
                                        "turns", "turn_rewards")

            def give(r: Record) -> None:
                if body.reward is not None:
                    r.reward = float(body.reward)
                if body.turn_rewards is not None:
                    r.turn_rewards = [float(v) for v in body.turn_rewards]
                if body.group_id is not None:
                    r.group_id = body.group_id

            newly = sum(len(r.completion_ids) for r in records if not r.rewarded)
            for r in records:
                state.store.update(r, give)
            counters.rewarded_completions += newly if body.reward is not None or body.turn_rewards is not None else 0
        return {"object": "feedback", "experience_ids": [r.record_id for r in records],
                "rewarded": all(r.rewarded for r in records)}

    async def commit_records(chosen: list[Record]) -> str | None:
        """Write ``chosen`` into the buffer as one segment (source agent) and drop their pending files; the
        segment's name, or None when there was nothing to write. Called under ``store_lock``."""
        # no turn of these sessions is half-way while they are committed
        async with locks.hold(*{r.session_id for r in chosen}):
            segment = await state.commit(chosen) if chosen else None
            state.store.remove(chosen)
        if segment is not None:
            counters.committed += len(chosen)
            counters.commits += 1
        return segment

    @app.post("/v1/commit")
    async def commit(request: Request):
        raw = await request.body()
        try:
            body = CommitBody.model_validate_json(raw) if raw.strip() else CommitBody()
        except ValueError as e:
            raise ApiError(400, f"commit body: {str(e).splitlines()[0]}") from None
        _check_unicode(body.model_dump(), "request")
        async with store_lock:
            if body.session_id is None and body.completion_ids is None and body.experience_ids is None:
                chosen = [r for r in state.store.records.values() if r.rewarded]
            else:
                chosen = []
                for cid in body.completion_ids or []:
                    chosen += targets(cid, None, None)
                for eid in body.experience_ids or []:
                    chosen += targets(None, eid, None)
                if body.session_id is not None:
                    chosen += targets(None, None, body.session_id)
                chosen = list({r.record_id: r for r in chosen}.values())
                unrewarded = [r.record_id for r in chosen if not r.rewarded]
                if unrewarded:
                    raise ApiError(409, f"{len(unrewarded)} experience(s) have no reward yet ({unrewarded[0]}...); "
                                        "POST /v1/feedback first", kind="conflict_error")
            segment = await commit_records(chosen)
        return {"object": "commit", "committed": len(chosen), "experience_ids": [r.record_id for r in chosen],
                "segment": segment, "pending": len(state.store.records)}

    # -------------------------------------------------------------- Trinity-RFT's proxy API
    @app.post("/feedback")
    async def trinity_feedback(request: Request):
        """Trinity's ``POST /feedback {msg_ids, reward, task_id?, run_id?}``: ``reward`` to the experience of each
        completion named in ``msg_ids`` (the ``id`` of each answer). ``task_id`` becomes the experiences' group
        (Trinity's task: one GRPO group), ``run_id`` is kept in their ``info``. All or nothing: an unknown id or
        an experience rewarded already refuses the whole request, naming it."""
        body = await _json_object(request)
        _check_unicode(body, "request")
        msg_ids, reward = body.get("msg_ids"), body.get("reward")
        if msg_ids is None or reward is None:
            raise ApiError(400, "msg_ids and reward are required")  # Trinity's words
        if not isinstance(msg_ids, list) or isinstance(reward, bool) or not isinstance(reward, int | float):
            raise ApiError(400, "msg_ids must be a list and reward must be a number")  # Trinity's words
        unknown = sorted(set(body) - {"msg_ids", "reward", "task_id", "run_id"})
        if unknown:
            raise ApiError(400, f"unknown field {unknown[0]!r}: /feedback takes msg_ids, reward, task_id, run_id")
        if not msg_ids or not all(isinstance(m, str) and m for m in msg_ids):
            raise ApiError(400, "msg_ids must be a non-empty list of completion ids (the 'id' of each answer, e.g. "
                                "'chatcmpl-...')")
        if not math.isfinite(reward):
            raise ApiError(400, f"reward must be a finite number, got {reward}")
        task_id, run_id = body.get("task_id"), body.get("run_id")
        if task_id is not None and not (isinstance(task_id, str) and 0 < len(task_id) <= 128 and task_id.isprintable()):
            raise ApiError(400, "task_id must be 1 to 128 printable characters")
        if run_id is not None and (isinstance(run_id, bool) or not isinstance(run_id, int)):
            raise ApiError(400, "run_id must be an integer")
        async with store_lock:
            records: dict[str, Record] = {}
            for mid in msg_ids:
                rec = state.store.of_completion(_strip_prefix(mid))
                if rec is None:
                    raise ApiError(404, f"no pending completion has id {mid!r}: it was never answered here, or its "
                                        "experience was committed already; nothing was rewarded")
                if rec.rewarded and rec.record_id not in records:
                    given = rec.reward if rec.reward is not None else f"turn rewards {rec.turn_rewards}"
                    raise ApiError(409, f"completion {mid!r} has a reward already ({given}, experience "
                                        f"{rec.record_id}); a reward is given once; nothing was rewarded")
                records[rec.record_id] = rec

            def give(r: Record) -> None:
                r.reward = float(reward)
                if task_id is not None:
                    r.group_id = task_id
                if run_id is not None:
                    r.run_id = run_id

            for r in records.values():
                state.store.update(r, give)
                counters.rewarded_completions += len(r.completion_ids)
        return {"status": "success", "experience_ids": list(records)}

    @app.post("/commit")
    async def trinity_commit():
        """Trinity's ``POST /commit``: every rewarded experience goes into the buffer, where the trainer reads it
        (Trinity hands its rewarded experiences to the explorer's pipeline, which writes them to the trainer's
        buffer). The unrewarded ones stay pending."""
        async with store_lock:
            chosen = [r for r in state.store.records.values() if r.rewarded]
            segment = await commit_records(chosen)
        return {"status": "success", "committed": len(chosen), "experience_ids": [r.record_id for r in chosen],
                "segment": segment, "pending": len(state.store.records)}

    @app.get("/metrics")
    async def trinity_metrics():
        """Trinity's fields (``explore_step_num``, ``rollout/...``), then ours (``serve/...``)."""
        engines = state.backend.engines() if hasattr(state.backend, "engines") else []
        metrics: dict[str, Any] = {"explore_step_num": counters.commits}
        for i, (engine_id, version) in enumerate(engines):
            metrics[f"rollout/model_{i}/total_request_count"] = counters.by_engine.get(engine_id, 0)
            metrics[f"rollout/model_{i}/model_version"] = version
        rewarded = [r for r in state.store.records.values() if r.rewarded]
        metrics.update({
            "rollout/total_experience_count": counters.completions,
            "rollout/ready_experience_count": counters.rewarded_completions,
            "serve/model_version": state.backend.version,
            "serve/pending_experiences": len(state.store.records),
            "serve/rewarded_pending_experiences": len(rewarded),
            "serve/committed_experiences": counters.committed,
            "serve/commits": counters.commits,
            "serve/open_sessions": len(state.store.open_by_session),
        })
        return metrics

    return Guard(app, state.cfg.max_body_bytes, state.api_key)


async def _json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying what it is instead."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "request body is not valid JSON (send a JSON object, Content-Type: application/json)") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


def _check_unicode(value: Any, where: str = "body") -> None:
    """400 for a string holding a lone surrogate (valid JSON as a \\ud800 escape, but not text: it cannot be
    tokenised, stored or echoed back)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, f"{where} holds a lone surrogate (an unpaired \\uD800-\\uDFFF escape); send valid "
                                "Unicode text", where) from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_unicode(k, where)
            _check_unicode(v, f"{where}.{k}" if isinstance(k, str) and k.isascii() else where)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_unicode(v, f"{where}[{i}]")


def _strip_prefix(completion_id: str) -> str:
    for prefix in ("chatcmpl-", "cmpl-"):
        if completion_id.startswith(prefix):
            return completion_id[len(prefix):]
    return completion_id


def _canonical(messages: list[dict[str, Any]]) -> list[tuple]:
    """What must match for a request to continue a recorded conversation: roles, texts, tool calls (by name
    and arguments, parsed when JSON) and tool results; ids and extra keys may differ."""
    out = []
    for m in messages:
        calls = []
        for c in m.get("tool_calls") or ():
            args = c["function"]["arguments"]
            try:
                args = json.dumps(json.loads(args), sort_keys=True)
            except (TypeError, json.JSONDecodeError):
                pass
            calls.append((c["function"]["name"], args))
        out.append((m["role"], (m.get("content") or "").strip(), tuple(calls)))
    return out


def _parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Hermes-style ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks -> OpenAI tool calls; the
    text outside them is the content. A block that is not a JSON object with a name stays in the content."""
    calls, kept, last = [], [], 0
    for match in _TOOL_CALL.finditer(text):
        try:
            obj = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", {})
        calls.append({"id": f"call_{uuid.uuid4().hex[:12]}_{len(calls)}", "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args)}})
        kept.append(text[last:match.start()])
        last = match.end()
    if not calls:
        return text, []
    content = ("".join(kept) + text[last:]).strip()
    return content or None, calls


def _logprobs_block(tok, ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    return {"content": [{"token": tok.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                        for t, lp in zip(ids, logprobs, strict=True)]}


def _stream_chat(cid, created, model, reply, finish, lp, usage, extra, headers) -> StreamingResponse:
    """The recorded answer as server-sent events: a role chunk, the content (and tool calls), the finish."""
    base = {"id": f"chatcmpl-{cid}", "object": "chat.completion.chunk", "created": created, "model": model, **extra}

    def chunk(delta, finish_reason=None, **more):
        return "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                                                           "logprobs": None}], **more}) + "\n\n"

    async def events():
        yield chunk({"role": "assistant", "content": ""})
        delta: dict[str, Any] = {"content": reply.get("content") or ""}
        if reply.get("tool_calls"):
            delta["tool_calls"] = [{**c, "index": i} for i, c in enumerate(reply["tool_calls"])]
        yield chunk(delta)
        yield chunk({}, finish, usage=usage)
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
