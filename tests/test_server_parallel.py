"""ostinato-serve --parallel N on the tiny model behind a real server: conversations sent at once through both
official clients each get exactly the reply they get alone (greedy, and sampled under a seed), their decode
tokens batched; a long prompt prefills in pieces between the others' tokens."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import pytest
from server_helpers import tiny_server

from ostinato.runtime.engine.loader import load_engine
from ostinato.server.events import Done, Generated
from ostinato.server.metrics import Metrics
from ostinato.server.prefix_cache import PrefixCache
from ostinato.server.worker import Job, Worker

pytestmark = pytest.mark.slow  # a compiled plan's engine (C++ kernels) behind the server

MAX_TOKENS = 24
TOPICS = ["the tides", "a parser for TOML", "why the build fails on ARM", "three names for a cat",
          "the billing address on order 7731", "a haiku about caches"]


@pytest.fixture(scope="module")
def server(tiny_ckpt, tmp_path_factory, kernel_dir):
    srv, base, app, engine, _ = tiny_server(tiny_ckpt, tmp_path_factory.mktemp("parallel"), kernel_dir, None,
                                            {"parallel": 4})
    yield {"openai": openai.OpenAI(base_url=base, api_key="x", max_retries=0),
           "anthropic": anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key="x", max_retries=0),
           "engine": engine, "metrics": base.removesuffix("/v1") + "/metrics"}
    srv.should_exit = True


def _ask(server, i: int, seed: int | None) -> str:
    """Conversation i's reply: even ones through the OpenAI client (sampled under `seed` when given), odd ones
    through the Anthropic client (greedy: the latest SDK's create() takes no temperature)."""
    text = f"Tell me about {TOPICS[i % len(TOPICS)]} ({i})."
    if i % 2 == 0:
        kw = {"temperature": 1.0, "seed": seed} if seed is not None else {"temperature": 0}
        r = server["openai"].chat.completions.create(model="tiny", messages=[{"role": "user", "content": text}],
                                                     max_tokens=MAX_TOKENS, **kw)
        return r.choices[0].message.content or ""
    r = server["anthropic"].messages.create(model="tiny", max_tokens=MAX_TOKENS,  # greedy: this server's default
                                            messages=[{"role": "user", "content": text}])
    return "".join(b.text for b in r.content if b.type == "text")


def _batched_tokens(server) -> int:
    text = httpx.get(server["metrics"]).text
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("ostinato_batched_tokens_total")))


@pytest.mark.parametrize("seed", [None, 5])
def test_four_conversations_at_once_each_get_their_solo_reply(server, seed):
    batcher = server["engine"].batcher
    before, counted = sum(batcher.steps_run.values()), _batched_tokens(server)
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda i: _ask(server, i, seed), range(4)))
    assert sum(batcher.steps_run.values()) > before  # their tokens did share steps, and /metrics counts them
    assert _batched_tokens(server) - counted >= 2 * (sum(batcher.steps_run.values()) - before)
    alone = [_ask(server, i, seed) for i in range(4)]  # one after another (their prompts now cached)
    assert together == alone
    assert len(set(alone)) == 4  # distinct conversations, not one reply four times


def test_a_long_prompt_prefills_between_the_other_replys_tokens(compiled_parallel):
    """Job A generates; job B arrives with a prompt of many pieces: A's tokens keep coming between B's pieces
    (at most one piece's prefill apart), and both replies are their solo ones."""
    engine = compiled_parallel
    engine.model.prefill_chunk = 16  # the piece: B's 120-token prompt takes 8 of them
    worker = Worker(engine, PrefixCache(engine.new_session), Metrics())
    order: list[str] = []
    a_started = threading.Event()
    done = {"a": queue.Queue(), "b": queue.Queue()}

    def emit(name):
        def on(event):
            if isinstance(event, Generated):
                order.append(name)
                a_started.set() if name == "a" else None
            if isinstance(event, Done):
                done[name].put(event)
        return on

    prompt_a, prompt_b = list(range(3, 40)), [(7 * i) % 1000 + 2 for i in range(120)]
    try:
        worker.submit(Job(prompt_a, 40, emit("a")))
        assert a_started.wait(120)
        worker.submit(Job(prompt_b, 4, emit("b"), started=lambda reused: order.append("b admitted")))
        assert done["a"].get(timeout=300).reason == "length" and done["b"].get(timeout=300).reason == "length"
    finally:
        worker.stop()
        worker.thread.join(60)
    admitted, first_b = order.index("b admitted"), order.index("b")
    a_between = order[admitted:first_b].count("a")
    assert a_between >= 120 // 16 - 1, order  # a token of A after (nearly) every piece of B


@pytest.fixture(scope="module")
def compiled_parallel(compiled, tiny_ckpt):
    plan = compiled[0]
    plan = plan.replace(policy=plan.policy.replace(sessions=2, speculative="off"))
    engine = load_engine(plan, tiny_ckpt, device="cpu", parallel=2)
    yield engine
    engine.close()


def test_a_job_cancelled_mid_batch_leaves_the_other_reply_whole(compiled_parallel):
    """Two jobs generate together; one is cancelled (its client left): it ends 'cancelled' with its session
    cached at exactly the tokens it ran, and the other's reply is the one it gets alone."""
    engine = compiled_parallel
    worker = Worker(engine, PrefixCache(engine.new_session), Metrics())
    prompt_a, prompt_b = list(range(5, 60)), list(range(300, 340))
    got = {"a": [], "b": []}
    done = {"a": queue.Queue(), "b": queue.Queue()}
    job_a = None

    def emit(name):
        def on(event):
            if isinstance(event, Generated):
                got[name].append(event.token)
                if name == "a" and len(got["a"]) == 6:
                    job_a.cancel.set()  # the client leaves after 6 tokens
            if isinstance(event, Done):
                done[name].put(event)
        return on

    try:
        job_a = Job(prompt_a, 40, emit("a"))
        worker.submit(job_a)
        worker.submit(Job(prompt_b, 24, emit("b")))
        assert done["a"].get(timeout=300).reason == "cancelled"
        assert done["b"].get(timeout=300).reason == "length"
        assert worker.metrics.batched_tokens > 0 and worker.metrics.cancelled == 1
        alone_b = []
        s = engine.new_session()
        logits = s.prefill(prompt_b, last_only=True)[-1]
        for _ in range(24):
            alone_b.append(int(logits.argmax()))
            logits = s.decode(alone_b[-1])
        assert got["b"] == alone_b
        entry = next(e for e in worker.cache.entries.values() if e.tokens[:len(prompt_a)] == prompt_a)
        # every token it was sent had run (the cancel is seen before the next pick)
        assert len(entry.session) == len(entry.tokens) == len(prompt_a) + len(got["a"])
        assert entry.tokens[len(prompt_a):] == got["a"]
    finally:
        worker.stop()
        worker.thread.join(60)
