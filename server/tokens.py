"""POST /tokenize and /detokenize: the server's tokenizer, for clients that count or build prompts in ids.

    POST /tokenize   {"content": "text", "add_special_tokens": false}  -> {"tokens": [ids], "count": n}
    POST /detokenize {"tokens": [ids]}                                  -> {"content": "text"}

The text is tokenized exactly as prompts are (special tokens written in the text are recognised; no BOS
is added unless asked), so a prompt built from /tokenize ids equals the one the server would render.
Both run off the event loop (a few MB of text takes seconds; encode_batch/decode_batch release the GIL).
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse

from .errors import APIError


class TokenEndpoints:
    def __init__(self, server):
        self.s = server

    async def tokenize(self, request: Request):
        try:
            body = await self.s.body(request)
            if body.get("model") is not None:
                self.s.check_model(body["model"])
            text = body.get("content", body.get("prompt"))
            if not isinstance(text, str):
                raise APIError(400, "content must be a string", "content")
            special = body.get("add_special_tokens", False)
            if not isinstance(special, bool):
                raise APIError(400, "add_special_tokens must be a boolean", "add_special_tokens")
        except APIError as e:
            return e.response()
        ids = (await asyncio.to_thread(self.s.tok.encode_batch, [text], add_special_tokens=special))[0].ids
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": self.s.context})

    async def detokenize(self, request: Request):
        try:
            body = await self.s.body(request)
            if body.get("model") is not None:
                self.s.check_model(body["model"])
            ids = body.get("tokens")
            vocab = self.s.tok.get_vocab_size()
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise APIError(400, "tokens must be a list of token ids", "tokens")
            bad = [i for i in ids if not 0 <= i < vocab]
            if bad:
                raise APIError(400, f"token ids must be in [0, {vocab}); got {bad[:5]}", "tokens")
        except APIError as e:
            return e.response()
        text = (await asyncio.to_thread(self.s.tok.decode_batch, [ids], skip_special_tokens=False))[0]
        return JSONResponse({"content": text})
