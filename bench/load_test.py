"""Load test: N concurrent clients, OpenAI's and Anthropic's (the official SDKs, alternating), against the
server on loopback, for a bounded time.

    python -m ostinato.bench.load_test                                               # starts one on the tiny model
    python -m ostinato.bench.load_test --url http://127.0.0.1:8000/v1 --model tiny   # an existing server

Each client holds its own conversation (its own question) and speaks one API: even clients the chat
completions API, odd ones the Messages API (`--apis` to choose). Before the load, every question's greedy
answer is fetched alone through the OpenAI API, one at a time: that is its reference, for both APIs
(they render the same prompt, so they must give the same tokens). Under load every answer must equal
its client's reference, so a lost response, a truncated one, another client's text or an API whose
answer differs fails the run. A server with a bounded queue (`--max-queue`, 4 on the server this tool
starts) turns away what does not fit with 503 + Retry-After; clients wait that long and ask again, and
the run counts them. Printed: requests (per API), 503s, errors, throughput, wait (time to the first
content token) p50 / p99. Exit status 1 on any wrong answer or unexpected error, or when an API got
no request through.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time


def _start_tiny(max_queue: int):
    from tokenizers import Tokenizer

    from ostinato.compiler.compile import CompileOptions, compile_plan
    from ostinato.runtime.engine.loader import load_engine
    from ostinato.server.app import create_app
    from ostinato.server.background import serve_in_background
    from ostinato.tiny import write_tiny_checkpoint
    work = tempfile.mkdtemp(prefix="ostinato-load-")
    ckpt = write_tiny_checkpoint(os.path.join(work, "tiny"), "tiny", seed=0, progress=False)
    compile_plan(CompileOptions(ckpt, os.path.join(work, "plan.yaml"), "cpu-only", context=1024,
                                kernel_dir=os.path.join(work, "kernels"))).plan.write(os.path.join(work, "plan.yaml"))
    engine = load_engine(os.path.join(work, "plan.yaml"), ckpt, device="cpu")
    app = create_app(engine, Tokenizer.from_file(os.path.join(ckpt, "tokenizer.json")), "tiny", cache_sessions=8,
                     max_queue=max_queue)
    return serve_in_background(app)[1]


def _ask(client, model: str, msgs: list, max_tokens: int) -> tuple[str, float]:
    """(the streamed answer's text, seconds to its first content token) of one greedy request, through the
    client's API: an openai.OpenAI (chat completions) or an anthropic.Anthropic (Messages; greedy is this
    server's default there)."""
    t0, text, first = time.perf_counter(), "", None
    if hasattr(client, "messages"):
        with client.messages.stream(model=model, messages=msgs, max_tokens=max_tokens) as stream:
            for piece in stream.text_stream:
                first = first or time.perf_counter()
                text += piece
        return text, (first or time.perf_counter()) - t0
    for ch in client.chat.completions.create(model=model, messages=msgs, max_tokens=max_tokens, stream=True,
                                             temperature=0):
        if ch.choices and ch.choices[0].delta.content:
            first = first or time.perf_counter()
            text += ch.choices[0].delta.content
    return text, (first or time.perf_counter()) - t0


def _client(api: str, url: str, key: str, retries: int):
    """An SDK client of `api` for the server's /v1 URL (Anthropic's SDK adds /v1 itself)."""
    if api == "anthropic":
        import anthropic
        return anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key=key, max_retries=retries)
    import openai
    return openai.OpenAI(base_url=url, api_key=key, max_retries=retries)


def _status(e: Exception) -> tuple[int, dict] | None:
    """(HTTP status, headers) of an SDK's status error, None for any other failure."""
    response = getattr(e, "response", None)
    status = getattr(e, "status_code", None)
    return (status, response.headers) if status is not None and response is not None else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="an existing server's /v1 URL (default: start one on the tiny model)")
    p.add_argument("--model", default="tiny")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--max-queue", type=int, default=4, help="queue bound of the server this tool starts (4)")
    p.add_argument("--apis", default="openai,anthropic",
                   help="the APIs the clients speak, assigned in turn by client number (openai,anthropic)")
    p.add_argument("--api-key", default="load", help="the server's key, if it has one")
    a = p.parse_args(argv)
    apis = a.apis.split(",")
    if not set(apis) <= {"openai", "anthropic"} or not apis:
        p.error(f"--apis takes openai and/or anthropic, comma-separated; got {a.apis!r}")
    url = a.url or _start_tiny(a.max_queue)
    questions = [[{"role": "user", "content": f"Client {i}: tell me about the number {i * 7}"}]
                 for i in range(a.clients)]
    solo = _client("openai", url, a.api_key, 3)
    refs = [_ask(solo, a.model, q, a.max_tokens)[0] for q in questions]   # each alone: the reference
    lock, waits, errors, busy = threading.Lock(), [], [], [0]
    answered = {api: 0 for api in apis}
    deadline = time.perf_counter() + a.seconds

    def client(i: int) -> None:
        api = apis[i % len(apis)]
        c = _client(api, url, a.api_key, 0)
        while time.perf_counter() < deadline:
            try:
                text, wait = _ask(c, a.model, questions[i], a.max_tokens)
            except Exception as e:  # noqa: BLE001  (a load test reports every failure)
                status = _status(e)
                if status is not None and status[0] == 503:
                    with lock:
                        busy[0] += 1
                    time.sleep(float(status[1].get("retry-after", "1")))
                    continue
                with lock:
                    errors.append(f"client {i} ({api}): " + (f"HTTP {status[0]}: {e}" if status else
                                                             f"{type(e).__name__}: {e}"))
                continue
            with lock:
                waits.append(wait)
                answered[api] += 1
                if text != refs[i]:
                    errors.append(f"client {i} ({api}): answer is not its own: {refs[i]!r} -> {text!r}")

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    w = sorted(waits)
    per_api = "  ".join(f"{api} {n}" for api, n in answered.items())
    print(f"clients {a.clients}  answered {len(w)} ({per_api})  turned away (503) {busy[0]}  errors {len(errors)}  "
          f"wall {wall:.1f}s")
    if w:
        p99 = w[min(len(w) - 1, int(0.99 * len(w)))]
        print(f"throughput {len(w) / wall:.2f} answers/s  wait p50 {statistics.median(w) * 1000:.0f} ms  "
              f"p99 {p99 * 1000:.0f} ms")
    for e in errors[:10]:
        print("ERROR", e)
    return 1 if errors or not w or not all(answered.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
