"""POST /v1/completions: the OpenAI completions API over raw prompts, text or token ids.

An agent harness or a benchmark that keeps its own token ids sends them as `prompt: [ids]` (the OpenAI
API accepts a token array) and asks for the generated ids back with `return_token_ids: true` (the same
extension vLLM has): `choices[0].token_ids`, `prompt_token_ids`, and in a stream each chunk's ids.
tools/llama_cpp_side_by_side.py replays agent sessions through it token for token.
Every field is either honoured or refused with a 400 naming it (OpenAI refuses unknown parameters).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from tokenizers.decoders import DecodeStream

from .errors import APIError
from .worker import Job

FIELDS = {"model", "prompt", "max_tokens", "temperature", "seed", "stream", "stream_options", "n",
          "return_token_ids", "user"}


def _prompt_ids(prompt, tok, vocab: int) -> list[int]:
    if isinstance(prompt, str):
        return tok.encode(prompt, add_special_tokens=False).ids
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        return _prompt_ids(prompt[0], tok, vocab)          # a batch of one prompt
    if isinstance(prompt, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
        bad = [i for i in prompt if not 0 <= i < vocab]
        if bad:
            raise APIError(400, f"prompt token ids must be in [0, {vocab}); got {bad[:5]}", "prompt")
        return list(prompt)
    raise APIError(400, "prompt must be a string, a list of token ids, or a list holding one of them "
                        "(batches of several prompts are not supported)", "prompt")


class Completions:
    """The /v1/completions handler over a Server (app.py): its auth, checks, worker and metrics."""

    def __init__(self, server):
        self.s = server

    def job(self, body: dict, emit) -> Job:
        s = self.s
        unknown = sorted(set(body) - FIELDS)
        if unknown:
            raise APIError(400, f"unsupported parameter(s): {', '.join(unknown)}", unknown[0], "unsupported_parameter")
        s.check_model(body)
        if body.get("prompt") in (None, "", []):
            raise APIError(400, "prompt is required and must not be empty", "prompt")
        ids = _prompt_ids(body["prompt"], s.tok, s.engine.model.config.vocab_size)
        n, temperature, seed = s.sampling(body)
        max_tokens = s.max_tokens(body, len(ids), "prompt")
        return Job(ids, max_tokens, emit, temperature, seed)

    async def handle(self, request: Request):
        s = self.s
        try:
            body = await s.body(request)
            loop, events = asyncio.get_running_loop(), asyncio.Queue()
            job = self.job(body, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
            if not isinstance(body.get("return_token_ids", False), bool):
                raise APIError(400, "return_token_ids must be a boolean", "return_token_ids")
            s.submit(job)
        except APIError as e:
            s.count_request(error=True)
            return e.response()
        s.count_request(error=False)
        meta = {"id": "cmpl-" + uuid.uuid4().hex[:24], "object": "text_completion", "created": int(time.time()),
                "model": s.model_name}
        ids_too = bool(body.get("return_token_ids"))
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(self._stream(job, events, meta, ids_too, usage), media_type="text/event-stream")
        return await self._whole(job, events, meta, ids_too)

    async def _whole(self, job: Job, events: asyncio.Queue, meta: dict, ids_too: bool):
        text, ids, stream = [], [], DecodeStream(skip_special_tokens=False)
        try:
            while (ev := await events.get())[0] == "token":
                ids.append(ev[1])
                text.append(stream.step(self.s.tok, ev[1]) or "")
        finally:
            job.cancel.set()  # a no-op when finished; stops the worker if this handler was cancelled
        if ev[0] == "error":
            return APIError(500, ev[1], None, "engine_error", "server_error").response()
        choice = {"index": 0, "text": "".join(text), "logprobs": None, "finish_reason": ev[1]}
        extra = {"prompt_token_ids": job.ids} if ids_too else {}
        if ids_too:
            choice["token_ids"] = ids
        return JSONResponse({**meta, **extra, "choices": [choice], "usage": self.s.usage(job, len(ids), ev[2])})

    async def _stream(self, job: Job, events: asyncio.Queue, meta: dict, ids_too: bool, include_usage: bool):
        def chunk(text: str, reason=None, ids=None) -> str:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            if ids_too and ids is not None:
                choice["token_ids"] = ids
            return "data: " + json.dumps({**meta, "choices": [choice]}) + "\n\n"
        stream, n = DecodeStream(skip_special_tokens=False), 0
        try:
            while (ev := await events.get())[0] == "token":
                n += 1
                yield chunk(stream.step(self.s.tok, ev[1]) or "", ids=[ev[1]])
            if ev[0] == "error":
                yield APIError(500, ev[1], None, "engine_error", "server_error").sse()  # ends with [DONE]
                return
            yield chunk("", ev[1], ids=[])
            if include_usage:
                yield "data: " + json.dumps({**meta, "choices": [], "usage": self.s.usage(job, n, ev[2])}) + "\n\n"
            yield "data: [DONE]\n\n"
        finally:
            job.cancel.set()  # client gone (or finished): the worker stops before its next forward
