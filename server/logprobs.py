"""Logprobs in OpenAI's shapes, from the worker's Picks (sampling.py says which distribution they are of).

    chat:        {"token": str, "logprob": float, "bytes": [int], "top_logprobs": [{token, logprob, bytes}]}
    completions: {"tokens": [str], "token_logprobs": [float], "top_logprobs": [{token: logprob}],
                  "text_offset": [int]}   (the legacy API; each top dict also holds the picked token)

A token is a run of bytes that need not be whole UTF-8 (byte-level BPE splits "é" in two): `bytes`
is exact, and `token` is their text, or "bytes:\\xc3" (OpenAI's spelling) when they are not valid UTF-8.
"""

from __future__ import annotations

from functools import lru_cache

from .sampling import Pick
from .token_bytes import token_bytes


@lru_cache(maxsize=4)
def _table(tokenizer) -> tuple[bytes, ...] | None:
    try:
        return token_bytes(tokenizer).tokens
    except ValueError:  # not byte-level BPE: each token decoded alone (a partial character comes out as U+FFFD)
        return None


def token_bytes_of(tokenizer, token: int) -> bytes:
    table = _table(tokenizer)
    if table is not None and token < len(table):
        return table[token]
    return tokenizer.decode([token], skip_special_tokens=False).encode("utf-8")


def token_text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _one(tokenizer, token: int, logprob: float) -> dict:
    raw = token_bytes_of(tokenizer, token)
    return {"token": token_text(raw), "logprob": logprob, "bytes": list(raw)}


def chat_entry(tokenizer, pick: Pick) -> dict:
    """One generated token in chat's `logprobs.content`."""
    return {**_one(tokenizer, pick.token, pick.logprob),
            "top_logprobs": [_one(tokenizer, t, lp) for t, lp in pick.top]}


def legacy(tokenizer, picks: list[Pick], offsets: list[int]) -> dict:
    """The tokens of a completion (or of one streamed chunk) in the legacy completions shape."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": list(offsets)}
    for p in picks:
        name = token_text(token_bytes_of(tokenizer, p.token))
        top = {token_text(token_bytes_of(tokenizer, t)): lp for t, lp in p.top}
        top.setdefault(name, p.logprob)
        out["tokens"].append(name)
        out["token_logprobs"].append(p.logprob)
        out["top_logprobs"].append(top)
    return out
