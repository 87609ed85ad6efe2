"""POST /v1/completions: the OpenAI completions API over raw prompts, text or token ids.

An agent harness or a benchmark that keeps its own token ids sends them as `prompt: [ids]` (the OpenAI
API accepts a token array) and asks for the generated ids back with `return_token_ids: true` (the same
extension vLLM has): `choices[0].token_ids`, `prompt_token_ids`, and in a stream each chunk's ids.
bench/llama_cpp_side_by_side.py replays agent sessions through it token for token.
Every field is either honoured or refused with a 400 naming it (OpenAI refuses unknown parameters).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from tokenizers.decoders import DecodeStream

from .chat_encoding import encode
from .errors import engine_error
from .events import ClientGone, Failed, Generated, next_event
from .logprobs import legacy
from .openai_api import CompletionRequest
from .stop import StopMatcher
from .worker import Job


@dataclass(frozen=True)
class TextPiece:
    """What one token adds to a completion's text."""
    text: str       # released now (text held back for a possible stop sequence comes later)
    offset: int     # the token's text_offset: characters decoded before it


class TextReply:
    """Generated ids -> completion text, on the engine thread (worker.Job.watch): decoded incrementally
    (special tokens kept) and cut at the first stop sequence, which ends generation on that token."""

    def __init__(self, tokenizer, stops: tuple[str, ...]):
        self.tok, self.decoder, self.stop = tokenizer, DecodeStream(skip_special_tokens=False), StopMatcher(stops)
        self.decoded = 0  # characters decoded so far, stop sequences or not: the next token's text_offset

    def feed(self, token: int) -> tuple[TextPiece, bool]:
        """(the token's piece, stop generating?)"""
        offset, piece = self.decoded, self.decoder.step(self.tok, token) or ""
        self.decoded += len(piece)
        text, hit = self.stop.feed(piece)
        return TextPiece(text, offset), hit

    def finish(self) -> str:
        return self.stop.flush()


class Completions:
    """The /v1/completions handler over a Server (app.py): its auth, checks, worker and metrics."""

    def __init__(self, server):
        self.s = server

    def job(self, body: dict, emit) -> tuple[CompletionRequest, Job, TextReply]:
        s = self.s
        req = CompletionRequest.check(body, context=s.request_context)  # every field checked here, once
        # raw text: special tokens written in it are the client's (see tokens.py)
        ids = encode(s.tok, req.prompt) if isinstance(req.prompt, str) else req.prompt
        reply = TextReply(s.tok, req.stops)
        return req, Job(ids, s.max_tokens(req.asked_tokens(), len(ids), "prompt"), emit, req.sampling(),
                        watch=reply.feed), reply

    async def handle(self, request: Request):
        s = self.s
        got = await s.accept(request, self.job)
        if isinstance(got, Response):
            return got
        req, job, reply, events = got
        meta = {"id": "cmpl-" + uuid.uuid4().hex[:24], "object": "text_completion", "created": int(time.time()),
                "model": s.model_name}
        ids_too = bool(req.return_token_ids)
        if req.stream:
            return StreamingResponse(self._stream(job, reply, events, meta, ids_too, req.include_usage),
                                     media_type="text/event-stream")
        return await self._whole(job, reply, events, meta, ids_too, request)

    async def _whole(self, job: Job, reply: TextReply, events: asyncio.Queue, meta: dict, ids_too: bool,
                     request: Request):
        text, ids, picks, offsets = [], [], [], []
        try:
            while isinstance(ev := await next_event(events, request, job), Generated):
                ids.append(ev.token)
                picks.append(ev.pick)
                text.append(ev.reply.text)
                offsets.append(ev.reply.offset)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it: the client left
        finally:
            job.cancel.set()  # a no-op when finished; stops the worker if this handler was cancelled
        if isinstance(ev, Failed):
            return engine_error(ev.message).response()
        text.append(reply.finish())
        lp = legacy(self.s.tok, picks, offsets) if job.sampling.logprobs else None
        choice = {"index": 0, "text": "".join(text), "logprobs": lp, "finish_reason": ev.reason}
        extra = {"prompt_token_ids": job.ids} if ids_too else {}
        if ids_too:
            choice["token_ids"] = ids
        return JSONResponse({**meta, **extra, "choices": [choice], "usage": self.s.usage(job, len(ids), ev.reused)})

    async def _stream(self, job: Job, reply: TextReply, events: asyncio.Queue, meta: dict, ids_too: bool,
                      include_usage: bool):
        def chunk(text: str, reason=None, ids=None, lp=None) -> str:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": reason}
            if ids_too and ids is not None:
                choice["token_ids"] = ids
            return "data: " + json.dumps({**meta, "choices": [choice]}) + "\n\n"
        n = 0
        try:
            while isinstance(ev := await events.get(), Generated):
                n += 1
                lp = legacy(self.s.tok, [ev.pick], [ev.reply.offset]) if job.sampling.logprobs else None
                yield chunk(ev.reply.text, ids=[ev.token], lp=lp)
            if isinstance(ev, Failed):
                yield engine_error(ev.message).sse()  # ends with [DONE]
                return
            yield chunk(reply.finish(), ev.reason, ids=[])
            if include_usage:
                yield "data: " + json.dumps({**meta, "choices": [], "usage": self.s.usage(job, n, ev.reused)}) + "\n\n"
            yield "data: [DONE]\n\n"
        finally:
            job.cancel.set()  # client gone (or finished): the worker stops before its next forward
