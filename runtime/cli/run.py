"""ostinato-run: load a plan and run its model as planned: replay a session, or answer a prompt."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from ostinato.checkpoint import CheckpointError
from ostinato.cli.common import refuse
from ostinato.plan import PlanError
from ostinato.workload import WorkloadError


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="ostinato-run",
        description="Run a plan from ostinato-compile: weights placed as planned (hot experts on their device, cold "
                    "experts behind the CPU kernel), split-route or upload-once prefill, the decode step.")
    p.add_argument("plan", type=Path, help="plan.yaml")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--session", type=Path, help="replay an agent session from a workload CSV and time every turn")
    what.add_argument("--prompt", help="generate a reply to this text (greedy)")
    what.add_argument("--serve", action="store_true", help="serve the OpenAI chat-completions API (runtime/server)")
    p.add_argument("--host", default="127.0.0.1", help="--serve: address to bind (127.0.0.1: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="--serve: port (8000)")
    p.add_argument("--api-key", help="--serve: require 'Authorization: Bearer KEY'")
    p.add_argument("--cache-sessions", type=int, default=4, help="--serve: cached sessions kept (LRU, 4)")
    p.add_argument("--max-queue", type=int, default=16,
                   help="--serve: requests that may wait for the engine; more are answered 503 + Retry-After (16)")
    p.add_argument("--session-dir", type=Path,
                   help="--serve: keep cached sessions' KV caches in this folder, so they survive a restart "
                        "(written when evicted, when idle and at stop; runtime/server/session_store.py)")
    p.add_argument("--session-dir-bytes", type=int, default=8 << 30,
                   help="--serve: bound of --session-dir; least recently used files are deleted (8 GiB)")
    p.add_argument("--session-idle", type=float, default=10.0,
                   help="--serve: seconds without a request after which changed sessions are written (10)")
    p.add_argument("--session-index", type=int, default=0, help="which session of the CSV (0)")
    p.add_argument("--limit-turns", type=int, help="replay at most this many turns")
    p.add_argument("--max-generated", type=int, help="decode at most this many tokens per turn")
    p.add_argument("--scale", type=float, default=1.0, help="multiply appended tokens by this factor (1.0)")
    p.add_argument("--max-new", type=int, default=32, help="tokens to generate for --prompt (32)")
    p.add_argument("--model", type=Path, help="checkpoint directory, when it moved since compile (default: the "
                                              "plan's model.path, relative to the plan file)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="cpu maps every planned GPU to the CPU; cuda requires "
                                                             "CUDA (default: cuda when available, else cpu)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"),
                   help="compute dtype (default: the plan's model.dense_format); another one only with --device cpu")
    p.add_argument("--hot-backend", choices=("cpu", "torch", "triton"),
                   help="hot-expert compute: triton (default on GPUs), cpu (the plan's CPU expert kernel; default on "
                        "the CPU) or torch (the dequantize-and-matmul reference)")
    p.add_argument("--decode", choices=("graph", "eager", "dynamic"), default="graph",
                   help="decode steps: graph = the fixed-shape step, one CUDA graph per GPU (eager on the CPU); "
                        "eager = that step without graphs; dynamic = the model's own forward (growing cache)")
    p.add_argument("--seed", type=int, default=0, help="seed of the replayed token ids (0)")
    a = p.parse_args(argv)
    if a.scale <= 0:
        p.error(f"--scale must be positive, got {a.scale}")
    for name in ("max_new", "cache_sessions", "limit_turns", "max_queue", "session_dir_bytes", "session_idle"):
        v = getattr(a, name)
        if v is not None and v <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {v}")
    if a.max_generated is not None and a.max_generated < 0:
        p.error(f"--max-generated must be >= 0, got {a.max_generated}")
    if a.session_dir is not None and not a.serve:
        p.error("--session-dir keeps a server's sessions: it goes with --serve")
    if not 0 <= a.port <= 65535:
        p.error(f"--port must be in 0..65535, got {a.port}")
    return a


def _decode_label(mode: str, engine) -> str:
    if mode == "graph" and not any(d.type == "cuda" for d in engine.devices):
        return "graph step, run eagerly (no GPU)"
    return {"graph": "CUDA graph per GPU", "eager": "fixed-shape step, eager", "dynamic": "dynamic forward"}[mode]


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.hot_backend == "triton" and (a.device == "cpu" or not torch.cuda.is_available()):
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is first imported
    from ostinato.workload import TokenSource, read_sessions, shrink_sessions

    from ..engine.loader import load_engine
    from ..engine.replay import HEADER, format_turn, replay, summary
    from ..engine.resident import resident, resident_line

    try:
        dtype = {None: None, "float32": torch.float32, "bfloat16": torch.bfloat16}[a.dtype]
        engine = load_engine(a.plan, a.model, a.device, dtype, a.hot_backend, static_decode=a.decode != "dynamic",
                             decode_graphs=a.decode == "graph", progress=None)  # a bar on a terminal's stderr
        model_dir = engine.model_dir
        print(f"plan {a.plan}: {engine.plan.model.layers} layers on {engine.plan.hardware.name} "
              f"(devices: {', '.join(sorted({str(d) for d in engine.devices}))}), "
              f"prefill threshold {engine.plan.policy.prefill_threshold}, decode: {_decode_label(a.decode, engine)}, "
              f"{engine.cpu_threads.describe()}")
        print(resident_line(resident(), engine.plan, engine.devices), flush=True)
        if a.serve:
            _serve(engine, model_dir, a)
        elif a.session:
            sessions = read_sessions(a.session)
            if not 0 <= a.session_index < len(sessions):
                raise WorkloadError(f"{a.session}: --session-index {a.session_index} out of range "
                                    f"(the file has {len(sessions)} sessions)")
            shape = shrink_sessions([sessions[a.session_index]], a.scale, a.limit_turns, a.max_generated)[0]
            print(f"session {shape.name}: {len(shape.turns)} turns\n{HEADER}")
            start = time.perf_counter()
            results = replay(engine, shape, TokenSource(model_dir, engine.model.config.vocab_size, a.seed),
                             on_turn=lambda r: print(format_turn(r), flush=True))
            print(summary(results, engine.plan, time.perf_counter() - start))
        else:
            _prompt(engine, model_dir, a.prompt or "Hello", a.max_new)
    except (PlanError, CheckpointError, WorkloadError) as e:
        return refuse("ostinato-run", e)
    return 0


def _serve(engine, model_dir: Path, a) -> None:
    import uvicorn
    from tokenizers import Tokenizer

    from ..server.app import create_app

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    store = None
    if a.session_dir is not None:
        from ..server.session_store import SessionStore, engine_identity

        store = SessionStore(a.session_dir, engine_identity(engine), a.session_dir_bytes, a.session_idle)
        print(f"session store {a.session_dir}: {len(store)} sessions, {store.bytes} bytes "
              f"(bound {a.session_dir_bytes})", flush=True)
    app = create_app(engine, tok, model_dir.name, api_key=a.api_key, cache_sessions=a.cache_sessions,
                     max_queue=a.max_queue, session_store=store)
    print(f"serving model {model_dir.name!r} on http://{a.host}:{a.port}/v1", flush=True)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning")


def _prompt(engine, model_dir: Path, text: str, max_new: int) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = [engine.model.config.bos_token_id] + tok.encode(text).ids
    session = engine.new_session()
    nxt = int(session.prefill(ids, last_only=True)[-1].argmax())
    out = [nxt]
    for _ in range(max_new - 1):
        if nxt == engine.model.config.eos_token_id:
            break
        nxt = int(session.decode(nxt).argmax())
        out.append(nxt)
    print(tok.decode(out))


if __name__ == "__main__":
    sys.exit(main())
