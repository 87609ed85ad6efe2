"""A request's JSON body, read within a size bound and checked for text the tokenizer cannot take.

    body = await read_json(request, max_bytes)     # APIError 413 / 400 otherwise, before any other work

The bound is checked twice: against Content-Length before reading anything, and while the body streams
in (a chunked request has no length), so an oversized request costs at most `max_bytes` of memory.
JSON may escape a lone UTF-16 surrogate ("\\ud800"): Python then holds a str that cannot be encoded as
UTF-8, which the tokenizer (and any error message echoing it) fails on deep inside a handler. Every
string of the body, keys included, is checked here so the client learns which field is at fault.
"""

from __future__ import annotations

import asyncio
import json
import re

from starlette.requests import Request

from .errors import APIError

DEFAULT_MAX_BODY_BYTES = 4 << 20  # ~1M tokens of text: more than a context holds, far below a memory hazard
_SURROGATE = re.compile("[\ud800-\udfff]")


def too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than this server's limit of {limit} bytes "
                         f"(ostinato-serve --max-body-bytes)", None, "request_too_large")


async def read_bounded(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def surrogate_path(value, path: str = "") -> str | None:
    """The path (messages[1].content) of the first string in `value` holding a lone surrogate, or None."""
    if isinstance(value, str):
        return path or "body" if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for k, v in value.items():
            if _SURROGATE.search(k):
                return f"{path}.{k!r}" if path else repr(k)
            found = surrogate_path(v, f"{path}.{k}" if path else k)
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = surrogate_path(v, f"{path}[{i}]")
            if found:
                return found
    return None


def parse(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", None, "invalid_json")
    bad = surrogate_path(body)
    if bad:
        raise APIError(400, f"{bad} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), "
                            f"which is not text; send valid Unicode", bad, "invalid_unicode")
    return body


async def read_json(request: Request, limit: int) -> dict:
    """The body as a JSON object; parsed off the event loop (a few MB of JSON takes tens of ms)."""
    raw = await read_bounded(request, limit)
    return await asyncio.to_thread(parse, raw) if len(raw) > 65536 else parse(raw)
