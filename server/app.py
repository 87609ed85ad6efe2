"""The ASGI app: OpenAI's /v1/chat/completions (SSE or whole) and /v1/completions (completions.py),
Anthropic's /v1/messages and /v1/messages/count_tokens (messages_api.py), /v1/models, /health, /metrics.

    app = create_app(engine, tokenizer, "tiny")      # then uvicorn.run(app, host="127.0.0.1")

Requests are checked and rendered here (any problem: a 4xx OpenAI error body, before the engine
sees anything), then queued to the single engine worker (worker.py); its events come back to the
event loop through an asyncio queue. A client that disconnects mid-stream sets the job's cancel
flag; the worker stops before its next forward.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import queue
import time
import uuid

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .chat_encoding import ChatOptions, ConversationError, encode, encode_chat, render_parts
from .completions import Completions
from .dsml import BLOCK_START, DSML, SEPARATOR
from .errors import APIError, engine_error, http_error, server_busy
from .events import ClientGone, Done, Failed, next_event
from .logprobs import chat_entry
from .messages_api import Messages
from .metrics import Metrics
from .openai_api import ChatCompletionRequest
from .prefix_cache import PrefixCache
from .reply import ReplyBuilder
from .request_body import (
    CONTEXT_HINT,
    DEFAULT_MAX_BODY_BYTES,
    LARGE_BODY_BYTES,
    give_back_memory,
    read_json,
    read_json_sized,
    refuse_past_context,
)
from .sampling import constraint_for
from .tokens import TokenEndpoints
from .tool_choice import tool_choice
from .worker import Job, Worker, log

RETRY_AFTER_S = 1   # told to clients turned away by a full queue


def structured_outputs(tokenizer, eos: int):
    """constrained.py's response_format factory for this tokenizer, or None (logged) where llguidance is
    missing or the tokenizer is not byte-level BPE: JSON modes are then refused with a 400, never ignored."""
    try:
        from .constrained import constraint_factory
        return constraint_factory(tokenizer, eos)
    except (ImportError, ValueError) as e:
        log.warning("structured output (response_format json) is off: %s", e)
        return None


class Server:
    def __init__(self, engine, tokenizer, model_name: str, api_key: str | None = None, cache_sessions: int = 4,
                 keep_branches: bool = False, logits_hook=None, max_queue: int = 16, session_store=None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
        self.engine, self.tok, self.model_name, self.api_key = engine, tokenizer, model_name, api_key
        self.max_body_bytes = max_body_bytes
        self.context = engine.plan.policy.context
        self.chat_encoding = engine.plan.policy.chat_encoding  # the release's reasoning-effort levels
        self.eos = engine.model.config.eos_token_id
        self.metrics = Metrics()
        self.cache = PrefixCache(engine.new_session, cache_sessions, keep_branches, session_store)
        self.worker = Worker(engine, self.cache, self.metrics, logits_hook, max_queue)
        self.constraints = structured_outputs(tokenizer, self.eos)  # None: response_format json is refused
        # what the request models check against (fields.py's context()): this server's model and vocabulary
        self.request_context = {"model": model_name, "vocab": engine.model.config.vocab_size}

    # -- request checking ---------------------------------------------------------------------------
    def _auth(self, request: Request) -> None:
        """The key as OpenAI clients send it (Authorization: Bearer KEY) or Anthropic's (x-api-key: KEY),
        on every endpoint but /health."""
        if not self.api_key:
            return
        bearer = request.headers.get("authorization", "").encode()
        key = request.headers.get("x-api-key", "").encode()
        # constant time, both always compared: the timing must not tell how much of a guessed key was right
        ok = hmac.compare_digest(bearer, f"Bearer {self.api_key}".encode())
        ok |= hmac.compare_digest(key, self.api_key.encode())
        if not ok:
            raise APIError(401, "invalid or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)", None,
                           "invalid_api_key", "authentication_error")

    async def body(self, request: Request) -> dict:
        """The request's JSON object, after the key check (APIError otherwise: 413 past max_body_bytes,
        400 for bad JSON or a lone surrogate; request_body.py)."""
        self._auth(request)
        return await read_json(request, self.max_body_bytes)

    def check_model(self, model) -> None:
        """A request's `model`: this server's one model, else a 404."""
        if model != self.model_name:
            raise APIError(404, f"model {model!r} does not exist; this server has "
                                f"{self.model_name!r}", "model", "model_not_found")

    def max_tokens(self, max_tokens: int | None, prompt_tokens: int, param: str) -> int:
        """The reply's token limit a request asks for (checked by its model; None: none asked), refused past the
        context."""
        room = self.context - prompt_tokens
        if room < 1 or (max_tokens is not None and max_tokens > room):
            raise APIError(400, f"this model's maximum context length is {self.context} tokens; the {param} "
                                f"take {prompt_tokens} and max_tokens asks for {max_tokens or 1} more "
                                f"({CONTEXT_HINT})", param, "context_length_exceeded")
        return max_tokens or room  # OpenAI's default: as many as the context has left

    def submit(self, job: Job, reserved: bool = False) -> None:
        """Queue a checked job for the engine (into the slot accept reserved); 503 with Retry-After when the
        queue is full."""
        try:
            self.worker.submit(job, reserved)
        except queue.Full:
            raise server_busy(self.worker.jobs.maxsize, RETRY_AFTER_S) from None

    def count_request(self, error: bool) -> None:
        with self.metrics.lock:
            self.metrics.requests += 1
            self.metrics.errors += error

    def _job(self, body: dict, emit) -> tuple[ChatCompletionRequest, Job, ReplyBuilder]:
        req = ChatCompletionRequest.check(body, context=self.request_context)  # every field checked here, once
        try:
            options = ChatOptions(req.thinking_mode, req.effort, self.chat_encoding)
            ids = encode_chat(self.tok, render_parts(req.messages, req.tools, options))
        except ConversationError as e:
            raise APIError(400, str(e), e.param) from None
        banned, force, parse_tools = tool_choice(req.tool_choice, req.tools, self.tok)
        reply = ReplyBuilder(self.tok, self.eos, options.thinking, parse_tools, req.stops, req.parallel_tool_calls)
        max_tokens = self.max_tokens(req.asked_tokens(), len(ids), "messages")
        # last: may be costly
        constraint = constraint_for(req.response_format, self.constraints, self.tok, options.thinking)
        forced: tuple[int, ...] = ()
        if force is not None and constraint is not None:
            raise APIError(400, "response_format json_object/json_schema cannot be combined with a tool_choice "
                                "that forces a tool call", "response_format")
        if force is not None:
            constraint, forced = self._forced_call(force, req.tools, options.thinking)
        return req, Job(ids, max_tokens, emit, req.sampling(banned), forced, constraint, reply.feed), reply

    def _forced_call(self, force: str, tools: list, thinking: bool) -> tuple[object | None, tuple[int, ...]]:
        """(constraint, forced tokens) making the reply a valid DSML call of the named tool (of any tool for
        REQUIRED), parameters typed by its schema. Without structured output (llguidance missing) only
        the call's opening can be forced: the rest is the model's."""
        if self.constraints is None:
            opening = SEPARATOR + BLOCK_START + f'\n<{DSML}invoke name="' + (f'{force}">\n' if force else "")
            return None, tuple(encode(self.tok, opening))
        from .constrained import ResponseFormatError, dsml_call_constraint
        try:
            return dsml_call_constraint(force or None, tools, self.tok, self.eos, thinking), ()
        except ResponseFormatError as e:
            raise APIError(400, str(e), e.param) from None

    # -- endpoints ------------------------------------------------------------------------------------
    async def accept(self, request: Request, make_job, anthropic: bool = False) -> tuple | Response:
        """Check a request and queue its job: (its typed request, job, reply, events), or the error response to
        send. make_job(body, emit) -> (typed request, Job, reply) raises APIError for what it refuses (the
        body is parsed there, once, into its endpoint's model: openai_api/, anthropic_api/). It runs in a
        thread: rendering and tokenizing a long prompt take seconds, and /health and other clients must not
        wait for them (the tokenizer releases the GIL in encode_batch, chat_encoding.encode). anthropic: errors
        in the Messages API's shape.
        The work is bounded before it starts: the request takes a queue slot (503 when none is free), a
        prompt whose text cannot fit the context by its bytes alone is refused untokenized, large bodies are
        prepared one at a time, and the memory their tokenizing took is given back (request_body.py)."""
        reserved = large = False
        try:
            self._auth(request)  # as body(), with the body's size
            body, size = await read_json_sized(request, self.max_body_bytes)
            large = size >= LARGE_BODY_BYTES
            if not (reserved := self.worker.reserve()):
                raise server_busy(self.worker.jobs.maxsize, RETRY_AFTER_S)
            await asyncio.to_thread(refuse_past_context, body, self.tok, self.context)
            loop, events = asyncio.get_running_loop(), asyncio.Queue()
            async with self.worker.large_lane if large else contextlib.nullcontext():
                req, job, reply = await asyncio.to_thread(
                    make_job, body, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
            self.submit(job, reserved=True)
            reserved = False
        except APIError as e:
            self.count_request(error=True)
            return e.anthropic_response() if anthropic else e.response()
        finally:
            if reserved:
                self.worker.unreserve()
            if large:  # in a thread, not awaited: a trim takes ~0.1 s, and a cancelled task must not wait for it
                asyncio.get_running_loop().run_in_executor(None, give_back_memory)
        self.count_request(error=False)
        return req, job, reply, events

    async def chat(self, request: Request):
        got = await self.accept(request, self._job)
        if isinstance(got, Response):
            return got
        req, job, reply, events = got
        meta = {"id": "chatcmpl-" + uuid.uuid4().hex[:24], "created": int(time.time()), "model": self.model_name}
        if req.stream:
            return StreamingResponse(self._stream(job, reply, events, meta, req.include_usage),
                                     media_type="text/event-stream")
        return await self._whole(job, reply, events, meta, request)

    async def _whole(self, job, reply, events, meta, request):
        try:
            msg = {"role": "assistant", "content": "", "reasoning_content": ""}
            n, logprobs = 0, []
            while True:
                ev = await next_event(events, request, job)
                if isinstance(ev, Failed):
                    return engine_error(ev.message).response()
                if isinstance(ev, Done):
                    break
                n += 1
                self._apply(msg, ev.reply)  # the reply's events for this token (reply.feed ran on the engine thread)
                if job.sampling.logprobs and ev.token != self.eos:
                    logprobs.append(chat_entry(self.tok, ev.pick))
            reason, reused = reply.finish_reason(ev.reason), ev.reused
            self._apply(msg, reply.finish(ev.reason))
        except ClientGone:
            return Response(status_code=499)  # nobody reads it: the client left (nginx's "client closed")
        finally:
            job.cancel.set()  # a no-op when finished; stops the worker if this handler was cancelled
        if reply.tool_calls:
            msg["tool_calls"] = [c.to_openai() for c in reply.tool_calls]
        if not msg["reasoning_content"]:
            del msg["reasoning_content"]
        msg["content"] = msg["content"] or (None if reply.tool_calls else "")
        choice = {"index": 0, "message": msg, "logprobs": {"content": logprobs} if job.sampling.logprobs else None,
                  "finish_reason": reason}
        return JSONResponse({**meta, "object": "chat.completion", "choices": [choice],
                             "usage": self.usage(job, n, reused)})

    @staticmethod
    def _apply(msg, events):
        for kind, v in events:
            if kind == "content":
                msg["content"] += v
            elif kind == "reasoning":
                msg["reasoning_content"] += v

    @staticmethod
    def usage(job, n, reused):
        return {"prompt_tokens": len(job.ids), "completion_tokens": n, "total_tokens": len(job.ids) + n,
                "prompt_tokens_details": {"cached_tokens": reused}}

    async def _stream(self, job, reply, events, meta, include_usage):
        unsent = []  # logprob entries of tokens whose text is not out yet: they ride on the next chunk

        def chunk(delta, reason=None):
            lp = {"content": unsent[:]} if unsent else None
            unsent.clear()
            return "data: " + json.dumps({**meta, "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": reason}]}) + "\n\n"

        def deltas(evs):
            for kind, v in evs:
                if kind == "tool_call":
                    yield chunk({"tool_calls": [v]})
                else:
                    yield chunk({"content" if kind == "content" else "reasoning_content": v})
        try:
            yield chunk({"role": "assistant", "content": ""})
            n = 0
            while True:
                ev = await events.get()
                if isinstance(ev, Failed):
                    yield engine_error(ev.message).sse()
                    return
                if isinstance(ev, Done):
                    break
                n += 1
                if job.sampling.logprobs and ev.token != self.eos:
                    unsent.append(chat_entry(self.tok, ev.pick))
                for c in deltas(ev.reply):  # the reply's events for this token (reply.feed ran on the engine thread)
                    yield c
            for c in deltas(reply.finish(ev.reason)):
                yield c
            yield chunk({}, reply.finish_reason(ev.reason))
            if include_usage:
                yield "data: " + json.dumps({**meta, "object": "chat.completion.chunk", "choices": [],
                                             "usage": self.usage(job, n, ev.reused)}) + "\n\n"
            yield "data: [DONE]\n\n"
        finally:
            job.cancel.set()  # client gone (or finished): the worker stops before its next forward

    def _card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": 0, "owned_by": "ostinato"}

    async def models(self, request: Request):
        try:
            self._auth(request)
        except APIError as e:
            return e.response()
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def model(self, request: Request):
        """GET /v1/models/{id}: this server's one model, or 404 in the OpenAI shape."""
        try:
            self._auth(request)
            self.check_model(request.path_params["model_id"])
        except APIError as e:
            return e.response()
        return JSONResponse(self._card())

    async def health(self, request: Request):
        return JSONResponse({"status": "ok", "model": self.model_name, "queued": self.worker.jobs.qsize()})

    async def metrics_text(self, request: Request):
        try:
            self._auth(request)  # behind the key like the API; /health stays open for load balancers
        except APIError as e:
            return e.response()
        store = self.cache.store.stats if self.cache.store is not None else None
        return PlainTextResponse(self.metrics.render(self.cache.stats, len(self.cache), store),
                                 media_type="text/plain; version=0.0.4")


def _unexpected(request, exc) -> JSONResponse:
    """A bug in a handler: the client gets a generic 500 in its API's shape. Starlette raises the exception
    on after this answer, and the ASGI server logs its traceback: one line here, not a second traceback."""
    log.error("unhandled %s on %s %s (its traceback follows)", type(exc).__name__, request.method, request.url.path)
    error = engine_error("internal server error; the server log has the details")
    return error.anthropic_response() if request.url.path.startswith("/v1/messages") else error.response()


def create_app(engine, tokenizer, model_name: str, **kw) -> Starlette:
    server = Server(engine, tokenizer, model_name, **kw)
    tokens = TokenEndpoints(server)
    messages = Messages(server)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        server.worker.stop()  # it ends after writing what the session store (if any) lacks
        await asyncio.to_thread(server.worker.thread.join)

    app = Starlette(lifespan=lifespan, routes=[
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        Route("/v1/completions", Completions(server).handle, methods=["POST"]),
        Route("/v1/messages", messages.create, methods=["POST"]),
        Route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", server.model, methods=["GET"]),
        Route("/tokenize", tokens.tokenize, methods=["POST"]),
        Route("/detokenize", tokens.detokenize, methods=["POST"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.metrics_text, methods=["GET"]),
    ], exception_handlers={HTTPException: http_error, Exception: _unexpected})
    app.state.server = server
    return app
