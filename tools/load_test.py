"""Load test: N concurrent openai clients against the server on loopback, for a bounded time and count.

    python tools/load_test.py --url http://127.0.0.1:8000/v1 --model tiny   # an existing server
    python tools/load_test.py                                               # starts one on the tiny model

Each client asks its own question greedily; the first answer to it is the reference, and every later
answer must equal it: a lost or mixed-up response (another client's text) fails the run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time


def _start_tiny():
    from tokenizers import Tokenizer

    from ostinato.compiler.compile import CompileOptions, compile_plan
    from ostinato.runtime.engine.loader import load_engine
    from ostinato.runtime.server.app import create_app
    from ostinato.runtime.server.background import serve_in_background
    from ostinato.tiny import write_tiny_checkpoint
    work = tempfile.mkdtemp(prefix="ostinato-load-")
    ckpt = write_tiny_checkpoint(os.path.join(work, "tiny"), "tiny", seed=0, progress=False)
    compile_plan(CompileOptions(ckpt, os.path.join(work, "plan.yaml"), "cpu-only", context=1024,
                                kernel_dir=os.path.join(work, "kernels"))).plan.write(os.path.join(work, "plan.yaml"))
    engine = load_engine(os.path.join(work, "plan.yaml"), ckpt, device="cpu")
    app = create_app(engine, Tokenizer.from_file(os.path.join(ckpt, "tokenizer.json")), "tiny", cache_sessions=8)
    return serve_in_background(app)[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url")
    p.add_argument("--model", default="tiny")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--max-requests", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=8)
    a = p.parse_args(argv)
    import openai
    url = a.url or _start_tiny()
    lock, waits, errors, tokens, done = threading.Lock(), [], [], [0], [0]
    deadline = time.perf_counter() + a.seconds

    def client(i):
        c = openai.OpenAI(base_url=url, api_key="load", max_retries=0)
        msgs = [{"role": "user", "content": f"Client {i}: tell me about the number {i * 7}"}]
        ref = None
        while time.perf_counter() < deadline:
            with lock:
                if done[0] >= a.max_requests:
                    return
                done[0] += 1
            try:
                t0, text, n = time.perf_counter(), "", 0
                first = None
                for ch in c.chat.completions.create(model=a.model, messages=msgs, max_tokens=a.max_tokens,
                                                    stream=True, temperature=0):
                    if ch.choices and ch.choices[0].delta.content:
                        first = first or time.perf_counter()
                        text += ch.choices[0].delta.content
                        n += 1
                ref = text if ref is None else ref
                with lock:
                    waits.append((first or time.perf_counter()) - t0)
                    tokens[0] += n
                    if text != ref:
                        errors.append(f"client {i}: answer changed: {ref!r} -> {text!r}")
            except Exception as e:
                with lock:
                    errors.append(f"client {i}: {type(e).__name__}: {e}")
    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    w = sorted(waits)
    print(f"clients {a.clients}  requests {len(w)}  errors {len(errors)}  wall {wall:.1f}s")
    if w:
        print(f"throughput {len(w) / wall:.2f} req/s  {tokens[0] / wall:.1f} tok/s  "
              f"wait p50 {statistics.median(w) * 1000:.0f} ms  p99 {w[min(len(w) - 1, int(0.99 * len(w)))] * 1000:.0f} ms")
    for e in errors[:10]:
        print("ERROR", e)
    return 1 if errors or not w else 0


if __name__ == "__main__":
    sys.exit(main())
