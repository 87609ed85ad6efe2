"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, for agents built on it.

The request is translated to the chat format (messages_request.py) and rendered by the same code as
the OpenAI path, so the prompt's tokens, the prefix cache, tool calls (DSV4's DSML, parsed by reply.py)
and the worker are shared: an agent's next turn reuses the session either API left. The reply comes
back as content blocks (messages_blocks.py), whole or as Anthropic's event stream:

    message_start (usage: input_tokens prefilled, cache_read_input_tokens reused) , ping,
    per block: content_block_start, content_block_delta (text_delta | thinking_delta | input_json_delta)...,
               content_block_stop,
    message_delta (stop_reason, stop_sequence, usage), message_stop;
    a failure: an `error` event. Before message_start (the request still queued) the stream sends SSE
    comments, after it `ping` events, every KEEPALIVE_S of silence, so proxies keep the connection.

Errors have Anthropic's shape ({"type": "error", "error": {"type", "message"}}; errors.py). The key
comes as x-api-key (Anthropic's clients) or Authorization: Bearer (app.py's _auth).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from .anthropic_api import CountTokensRequest, MessagesRequest
from .chat_encoding import END_THINK, encode_chat
from .errors import APIError, engine_error
from .events import ClientGone, Done, Failed, Generated, Started, next_event
from .messages_blocks import ContentBlocks, stop_reason
from .messages_request import ChatRequest, chat_request
from .reply import ReplyBuilder
from .sampling import Sampling
from .tool_choice import tool_choice
from .worker import Job

KEEPALIVE_S = 10.0


def _event(payload: dict) -> str:
    return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n"


class Messages:
    """The Messages API handlers over a Server (app.py): its auth, model, worker, metrics and forced calls."""

    def __init__(self, server):
        self.s = server

    # -- request ----------------------------------------------------------------------------------------
    def _ids(self, req: ChatRequest) -> list[int]:
        return encode_chat(self.s.tok, req.prompt_parts())

    def _sampling(self, request: MessagesRequest, req: ChatRequest, banned) -> Sampling:
        sampling = request.sampling(banned)
        if req.think_budget is None:
            return sampling
        return dataclasses.replace(sampling, think_budget=req.think_budget, end_think=self.s.tok.token_to_id(END_THINK))

    def job(self, body: dict, emit) -> tuple[MessagesRequest, Job, ReplyBuilder]:
        s = self.s
        request = MessagesRequest.check(body, context=s.request_context)  # every field checked here, once
        req = chat_request(request, s.chat_encoding)
        ids = self._ids(req)
        banned, force, parse_tools = tool_choice(req.tool_choice, req.tools, s.tok)
        sampling = self._sampling(request, req, banned)
        reply = ReplyBuilder(s.tok, s.eos, req.options.thinking, parse_tools, req.stops, req.parallel_tool_calls)
        max_tokens = s.max_tokens(request.max_tokens, len(ids), "messages")
        constraint, forced = (None, ()) if force is None else s._forced_call(force, req.tools, req.options.thinking)
        return request, Job(ids, max_tokens, emit, sampling, forced, constraint, reply.feed,
                            started=lambda reused: emit(Started(reused))), reply

    # -- endpoints ----------------------------------------------------------------------------------------
    async def create(self, request: Request):
        got = await self.s.accept(request, self.job, anthropic=True)
        if isinstance(got, Response):
            return got
        parsed, job, reply, events = got
        meta = {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant",
                "model": self.s.model_name}
        if parsed.stream:
            return StreamingResponse(self._stream(job, reply, events, meta), media_type="text/event-stream")
        return await self._whole(job, reply, events, meta, request)

    async def count_tokens(self, request: Request):
        """{"input_tokens": N}: the prompt the same request would prefill, tools and system included."""
        def count(body: dict) -> int:
            parsed = CountTokensRequest.check(body, context=self.s.request_context)  # every field, once
            req = chat_request(parsed, self.s.chat_encoding)
            tool_choice(req.tool_choice, req.tools, self.s.tok)  # a named tool must exist, as for /v1/messages
            return len(self._ids(req))
        try:
            body = await self.s.body(request)
            n = await asyncio.to_thread(count, body)  # rendering a long conversation: off the event loop
        except APIError as e:
            return e.anthropic_response()
        return JSONResponse({"input_tokens": n})

    @staticmethod
    def usage(job: Job, n: int, reused: int) -> dict:
        """Anthropic's usage: input_tokens are the prompt tokens computed, cache reads the ones reused
        (their sum is the prompt); nothing is ever billed as a cache write here."""
        return {"input_tokens": len(job.ids) - reused, "output_tokens": n, "cache_read_input_tokens": reused,
                "cache_creation_input_tokens": 0}

    async def _whole(self, job: Job, reply: ReplyBuilder, events: asyncio.Queue, meta: dict, request: Request):
        blocks, n = ContentBlocks(), 0
        try:
            while isinstance(ev := await next_event(events, request, job), (Started, Generated)):
                if isinstance(ev, Generated):
                    n += 1
                    blocks.feed(ev.reply)  # the reply's events for this token (reply.feed ran on the engine thread)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it: the client left
        finally:
            job.cancel.set()  # a no-op when finished; stops the worker if this handler was cancelled
        if isinstance(ev, Failed):
            return engine_error(ev.message).anthropic_response()
        blocks.feed(reply.finish(ev.reason))
        blocks.close()
        reason, sequence = stop_reason(reply, ev.reason)
        return JSONResponse({**meta, "content": blocks.content, "stop_reason": reason, "stop_sequence": sequence,
                             "usage": self.usage(job, n, ev.reused)})

    async def _stream(self, job: Job, reply: ReplyBuilder, events: asyncio.Queue, meta: dict):
        blocks, n, reused, started = ContentBlocks(), 0, 0, False
        try:
            while True:
                try:
                    ev = await asyncio.wait_for(events.get(), KEEPALIVE_S)
                except asyncio.TimeoutError:
                    yield _event({"type": "ping"}) if started else ": waiting for the engine\n\n"
                    continue
                if isinstance(ev, Failed):
                    yield engine_error(ev.message).anthropic_sse()
                    return
                if isinstance(ev, Done) and not started:  # cancelled while queued: nobody is reading
                    return
                if isinstance(ev, Started):
                    reused, started = ev.reused, True
                    message = {**meta, "content": [], "stop_reason": None, "stop_sequence": None,
                               "usage": self.usage(job, 0, reused)}
                    yield _event({"type": "message_start", "message": message})
                    yield _event({"type": "ping"})
                    continue
                if isinstance(ev, Done):
                    break
                n += 1
                for e in blocks.feed(ev.reply):
                    yield _event(e)
            for e in blocks.feed(reply.finish(ev.reason)) + blocks.close():
                yield _event(e)
            reason, sequence = stop_reason(reply, ev.reason)
            yield _event({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                          "usage": self.usage(job, n, ev.reused)})
            yield _event({"type": "message_stop"})
        finally:
            job.cancel.set()  # client gone (or finished): the worker stops before its next forward
