"""The server's edges, through real HTTP and the openai client: JSON errors for every status (unknown
routes, wrong methods, a failing engine, a full queue), the model card, /tokenize and /detokenize, and the
default max_tokens (what the context has left)."""

import contextlib
import logging
import threading

import httpx
import openai
import pytest
from conftest import compile_tiny_plan
from tokenizers import Tokenizer

from ostinato.runtime.engine.loader import load_engine
from ostinato.server.app import create_app
from ostinato.server.background import serve_in_background

pytestmark = pytest.mark.slow  # a compiled plan's engine (C++ kernels) behind the server

CONTEXT = 256


class Gate:
    """A logits hook that, when closed, holds the engine thread at its first pick (a busy engine)."""
    def __init__(self):
        self.open, self.entered = threading.Event(), threading.Event()
        self.open.set()

    def __call__(self, gen, logits):
        self.entered.set()
        self.open.wait(30)
        return logits


@pytest.fixture(scope="module")
def server(tiny_ckpt, tmp_path_factory, kernel_dir):
    work = tmp_path_factory.mktemp("server_errors")
    compile_tiny_plan(tiny_ckpt, work, kernel_dir, context=CONTEXT)
    engine = load_engine(work / "plan.yaml", tiny_ckpt, device="cpu")
    tok = Tokenizer.from_file(str(tiny_ckpt / "tokenizer.json"))
    gate = Gate()
    app = create_app(engine, tok, "tiny", cache_sessions=2, logits_hook=gate, max_queue=1)
    srv, base = serve_in_background(app)
    yield {"url": base.removesuffix("/v1"), "client": openai.OpenAI(base_url=base, api_key="x", max_retries=0),
           "app": app, "tok": tok, "gate": gate, "engine": engine}
    srv.should_exit = True


def test_unknown_route_and_wrong_method_answer_openai_errors(server):
    r = httpx.get(server["url"] + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(server["url"] + "/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert "POST" in r.headers.get("allow", "")


def test_model_card(server):
    assert server["client"].models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError) as e:
        server["client"].models.retrieve("other")
    assert e.value.body["code"] == "model_not_found"


def test_tokenize_detokenize_round_trip(server):
    text = "Hello <｜User｜> wörld"
    r = httpx.post(server["url"] + "/tokenize", json={"content": text}).json()
    assert r["tokens"] == server["tok"].encode(text, add_special_tokens=False).ids and r["count"] == len(r["tokens"])
    back = httpx.post(server["url"] + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert back["content"] == text
    bad = httpx.post(server["url"] + "/detokenize", json={"tokens": [10 ** 7]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_max_tokens_defaults_to_what_the_context_has_left(server):
    ids = server["tok"].encode(" ".join(["word"] * 400), add_special_tokens=False).ids[:CONTEXT - 6]
    assert len(ids) == CONTEXT - 6
    r = server["client"].completions.create(model="tiny", prompt=ids)          # no max_tokens
    assert r.usage.completion_tokens == 6 or (r.usage.completion_tokens < 6 and r.choices[0].finish_reason == "stop")


def test_engine_failure_is_logged_and_answered_generically(server, caplog, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("secret internal detail")
    monkeypatch.setattr(server["app"].state.server.cache, "new_session", lambda: _Failing(boom))
    with caplog.at_level(logging.ERROR, logger="ostinato.server"):
        r = httpx.post(server["url"] + "/v1/completions", json={"model": "tiny", "prompt": [9, 8, 7, 6, 5],
                                                                 "max_tokens": 2})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert "secret" not in r.text
        with httpx.stream("POST", server["url"] + "/v1/completions", json={
                "model": "tiny", "prompt": [9, 8, 7, 6, 4], "max_tokens": 2, "stream": True}) as s:
            lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
    assert "error" in lines[-2] and lines[-1] == "data: [DONE]" and "secret" not in "".join(lines)
    assert any("secret internal detail" in (rec.exc_text or "") for rec in caplog.records)


class _Failing:
    def __init__(self, fail):
        self.prefill = fail

    def __len__(self):
        return 0


def test_a_full_queue_answers_503_with_retry_after(server):
    gate, url = server["gate"], server["url"] + "/v1/completions"
    gate.open.clear()
    gate.entered.clear()
    results = []

    def ask(i):
        results.append(httpx.post(url, json={"model": "tiny", "prompt": [20 + i, 3, 4], "max_tokens": 1},
                                  timeout=60).status_code)
    running = threading.Thread(target=ask, args=(0,))
    running.start()
    assert gate.entered.wait(30)                         # the engine is busy with request 0
    queued = threading.Thread(target=ask, args=(1,))
    queued.start()
    for _ in range(100):                                  # request 1 waits in the one queue slot
        if server["app"].state.server.worker.jobs.qsize() == 1:
            break
        threading.Event().wait(0.05)
    r = httpx.post(url, json={"model": "tiny", "prompt": [5, 6], "max_tokens": 1})
    gate.open.set()
    running.join(60)
    queued.join(60)
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "server_busy"
    assert sorted(results) == [200, 200]


def test_a_client_that_leaves_a_whole_reply_stops_its_generation(server):
    """Not streamed: the handler notices the closed connection while it waits, and the job is cancelled
    before its next forward (without that, this request would decode its 200 tokens for nobody)."""
    gate, s = server["gate"], server["app"].state.server
    before = (s.metrics.cancelled, s.metrics.generated_tokens)
    gate.open.clear()
    gate.entered.clear()
    def leave():
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server["url"] + "/v1/completions", json={"model": "tiny", "prompt": [40, 41, 42],
                                                                "max_tokens": 200},
                       timeout=httpx.Timeout(5.0, read=0.5))
    gone = threading.Thread(target=leave)
    gone.start()
    assert gate.entered.wait(30)      # the engine holds its first pick
    gone.join(10)                     # the client gave up and closed its connection
    threading.Event().wait(4 * 0.25)  # the handler's next look at the connection
    gate.open.set()
    for _ in range(100):
        if s.metrics.cancelled > before[0]:
            break
        threading.Event().wait(0.05)
    assert s.metrics.cancelled == before[0] + 1
    assert s.metrics.generated_tokens - before[1] <= 2


def test_a_stop_waits_its_bound_for_a_reply_then_cancels_it(server, caplog):
    """A stop with a reply in flight: logged, waited for at most the bound (1 s here), then the reply's
    job is cancelled before its next forward and the worker ends (without the bound: the 200-token
    reply at 0.2 s a token, about 40 s)."""
    caplog.set_level(logging.WARNING, logger="ostinato.server")

    def slowly(gen, logits):
        threading.Event().wait(0.2)
        return logits
    app = create_app(server["engine"], server["tok"], "tiny", logits_hook=slowly)
    srv, base = serve_in_background(app, shutdown_s=1)
    s, started = app.state.server, threading.Event()

    def ask():
        started.set()
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(base + "/completions", json={"model": "tiny", "prompt": [40, 41, 42], "max_tokens": 200,
                                                    "temperature": 1.0, "seed": 3}, timeout=120)
    threading.Thread(target=ask, daemon=True).start()
    assert started.wait(10)
    for _ in range(200):  # the engine is generating
        if s.worker.running is not None:
            break
        threading.Event().wait(0.05)
    assert s.worker.running is not None
    srv.should_exit = True
    s.worker.thread.join(60)
    assert not s.worker.thread.is_alive() and s.metrics.cancelled == 1
    assert s.metrics.generated_tokens < 100
    assert any("waiting for 1 reply in flight, at most 1 s" in r.getMessage() for r in caplog.records)
