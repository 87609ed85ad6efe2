"""A request's JSON body, read within a size bound and checked for text the tokenizer cannot take.

    body = await read_json(request, max_bytes)     # APIError 413 / 400 otherwise, before any other work
    body, size = await read_json_sized(request, max_bytes)   # the same, and its size in bytes

The bound is checked twice: against Content-Length before reading anything, and while the body streams
in (a chunked request has no length), so an oversized request costs at most `max_bytes` of memory.
JSON may escape a lone UTF-16 surrogate ("\\ud800"): Python then holds a str that cannot be encoded as
UTF-8, which the tokenizer (and any error message echoing it) fails on deep inside a handler. Every
string of the body, keys included, is checked here so the client learns which field is at fault.

Nesting is bounded before parsing: json.loads recurses once per level and raises RecursionError near
1,000 levels, and every walk over the parsed body (the surrogate check here, rendering, schema checks)
recurses as deep. A cheap scan of the bytes (strings removed, brackets counted) refuses a body nested
deeper than MAX_NESTING with a 400 before json.loads sees it.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import re

import numpy as np
from starlette.requests import Request

from .errors import APIError

DEFAULT_MAX_BODY_BYTES = 4 << 20  # ~1M tokens of text: more than a context holds, far below a memory hazard
LARGE_BODY_BYTES = 256 << 10  # ~64k tokens of text: tokenized one at a time (app.py), memory given back after
_SURROGATE = re.compile("[\ud800-\udfff]")
# far above any real request (tool schemas nest ~10 levels), far below where recursion fails (~1,000)
MAX_NESTING = 128
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)   # a string literal, escapes included
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


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


def nesting_depth(raw: bytes) -> int:
    """How deep arrays and objects nest in the JSON text `raw` (brackets inside strings do not count);
    linear, in C (regex, translate, cumsum): ~0.05 s for 4 MB."""
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKET)  # b"[{}[]]..."
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, np.uint8)                                 # [B]
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int32)
    return int(np.cumsum(steps).max())


def too_deep(depth: int | None = None) -> APIError:
    found = f" {depth} levels deep" if depth is not None else " too deeply"
    return APIError(400, f"the request body nests arrays and objects{found}; this server takes at most "
                         f"{MAX_NESTING} levels", None, "invalid_json")


def parse(raw: bytes) -> dict:
    if (depth := nesting_depth(raw)) > MAX_NESTING:
        raise too_deep(depth)
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", None, "invalid_json") from None
    except RecursionError:  # the scan above makes this unreachable; a 400 all the same, never a 500
        raise too_deep() from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", None, "invalid_json")
    bad = surrogate_path(body)
    if bad:
        raise APIError(400, f"{bad} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), "
                            f"which is not text; send valid Unicode", bad, "invalid_unicode")
    return body


async def read_json_sized(request: Request, limit: int) -> tuple[dict, int]:
    """(the body as a JSON object, its size in bytes); parsed off the event loop (a few MB of JSON takes
    tens of ms)."""
    raw = await read_bounded(request, limit)
    return (await asyncio.to_thread(parse, raw) if len(raw) > 65536 else parse(raw)), len(raw)


async def read_json(request: Request, limit: int) -> dict:
    return (await read_json_sized(request, limit))[0]


# -- the prompt's size bound before tokenizing ------------------------------------------------------------
# Tokenizing 4 MB of text takes seconds and ~400 MB; a prompt that cannot fit the context is refused
# without it. No token of a byte-level BPE vocabulary spans more bytes than its longest one (L: 128 for
# DSV4's, a run of spaces), and no normalizer changes the text, so a text of N bytes is at least N / L
# tokens, whatever it is and however encode_parts cuts it (data_text.py cuts, never merges).
_LONGEST: dict[int, tuple[object, int | None]] = {}  # id(tokenizer) -> (tokenizer kept alive, L or None)


def max_token_bytes(tokenizer) -> int | None:
    """L: the most bytes of text one token of `tokenizer` covers (added tokens included), from its
    vocabulary; None where no such bound holds (not byte-level BPE, or a normalizer that may shrink text)."""
    got = _LONGEST.get(id(tokenizer))
    if got is None or got[0] is not tokenizer:
        got = _LONGEST[id(tokenizer)] = (tokenizer, _longest_token(tokenizer))
    return got[1]


def _longest_token(tokenizer) -> int | None:
    from .token_bytes import token_bytes
    normalizer = getattr(tokenizer, "normalizer", None)
    if normalizer is not None and json.loads(normalizer.__getstate__()) != {"type": "Sequence", "normalizers": []}:
        return None  # e.g. NFC composes 3 bytes into 2: the text's bytes no longer bound the tokens
    try:
        return max(len(b) for b in token_bytes(tokenizer).tokens)
    except ValueError:
        return None


def _text_bytes(content) -> int:
    """UTF-8 bytes of the text a message's content puts into the prompt as it is: a string, text blocks
    (both APIs) and tool_result blocks' content (Anthropic); other blocks count nothing."""
    if isinstance(content, str):
        return len(content.encode("utf-8", "surrogatepass"))
    if not isinstance(content, list):
        return 0
    n = 0
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            n += _text_bytes(block.get("text"))
        elif isinstance(block, dict) and block.get("type") == "tool_result":
            n += _text_bytes(block.get("content"))
    return n


def prompt_text_bytes(body: dict) -> tuple[int, int]:
    """(bytes of text the request's prompt holds verbatim, token ids it gives as ids) for the three
    generating endpoints: messages' content and the system prompt (chat, Messages API), or the prompt
    (completions: text, or ids counted as they are). Text the prompt may drop or re-spell (reasoning,
    tool calls, tool definitions) does not count: this is a lower bound."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str):
        return _text_bytes(prompt), 0
    if isinstance(prompt, list):
        return 0, len(prompt)
    messages = body.get("messages")
    n = _text_bytes(body.get("system"))
    for m in messages if isinstance(messages, list) else ():
        if isinstance(m, dict):
            n += _text_bytes(m.get("content"))
    return n, 0


def _asked_tokens(body: dict) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
            return v
    return 1


# what a server whose plan is too short for an agent's sessions needs: the plan's policy.context, longer
CONTEXT_HINT = "the plan's policy.context: serve a plan compiled with a longer one, ostinato-compile --context N"


def refuse_past_context(body: dict, tokenizer, context: int) -> None:
    """APIError 400 context_length_exceeded (the context check's, app.py's max_tokens) when the prompt's
    text cannot fit `context` with the tokens asked for, by its bytes alone: before any tokenizing."""
    text, ids = prompt_text_bytes(body)
    longest = max_token_bytes(tokenizer) if text else None
    floor = ids + (-(-text // longest) if longest else 0)  # ceil(text / L)
    asked = _asked_tokens(body)
    if floor + asked <= context:
        return
    param = "prompt" if "prompt" in body else "messages"
    spelled = f"at least {floor} tokens ({text} bytes of text, at most {longest} bytes a token)" if text else \
        f"{floor} tokens"
    raise APIError(400, f"this model's maximum context length is {context} tokens; the {param} take {spelled} "
                        f"and max_tokens asks for {asked} more ({CONTEXT_HINT})", param, "context_length_exceeded")


def give_back_memory() -> None:
    """Return freed heap to the OS (glibc's malloc_trim). Tokenizing a few MB allocates hundreds of MB in
    many small blocks; freed, glibc keeps them (measured: 1.2 GB kept after three 4 MB prompts, 0.15 GB
    after a trim), so the server's footprint would stay at its worst request's."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass
