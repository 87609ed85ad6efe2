"""ostinato-serve: load a plan and serve it to agents over HTTP (OpenAI-compatible API)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ostinato.checkpoint import CheckpointError
from ostinato.cli.common import refuse
from ostinato.plan import PlanError
from ostinato.runtime.cli.engine_args import add_engine_args, load_engine_from_args

from .background import DEFAULT_SHUTDOWN_S, server_for
from .listen import PortError, listen
from .request_body import DEFAULT_MAX_BODY_BYTES
from .session_lock import SessionDirBusy, SessionDirLock


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="ostinato-serve",
        description="Serve a plan from ostinato-compile to agents: the OpenAI chat-completions and completions "
                    "APIs, DSV4 tool calls, prefix-cached sessions.")
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (8000)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY'")
    p.add_argument("--cache-sessions", type=int, default=4, help="cached sessions kept (LRU, 4)")
    p.add_argument("--parallel", type=int, default=1,
                   help="requests generated at once: their decode tokens run in one batched step, each reply what "
                        "it is alone (at most the plan's policy.sessions: ostinato-compile --sessions N) (1)")
    p.add_argument("--max-queue", type=int, default=16,
                   help="requests that may wait for the engine; more are answered 503 + Retry-After (16)")
    p.add_argument("--session-dir", type=Path,
                   help="keep cached sessions' KV caches in this folder, so they survive a restart "
                        "(written when evicted, when idle and at stop); one server per folder (locked)")
    p.add_argument("--session-dir-bytes", type=int, default=8 << 30,
                   help="bound of --session-dir; least recently used files are deleted (8 GiB)")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="largest request body taken; larger ones are answered 413 before parsing "
                        f"({DEFAULT_MAX_BODY_BYTES >> 20} MiB)")
    p.add_argument("--session-idle", type=float, default=10.0,
                   help="seconds without a request after which changed sessions are written (10)")
    p.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_S,
                   help="on SIGTERM or Ctrl-C, seconds to wait for replies in flight before they are cancelled "
                        f"and the server stops, writing --session-dir ({DEFAULT_SHUTDOWN_S:g})")
    a = p.parse_args(argv)
    for name in ("parallel", "cache_sessions", "max_queue", "session_dir_bytes", "session_idle", "max_body_bytes",
                 "shutdown_timeout"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(a, name)}")
    if not 0 <= a.port <= 65535:
        p.error(f"--port must be in 0..65535, got {a.port}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    sock = lock = None
    try:
        # first: a busy port or session folder must not cost a model load
        sock = listen(a.host, a.port)
        lock = SessionDirLock.take(a.session_dir) if a.session_dir is not None else None
        engine = load_engine_from_args(a)
    except (PortError, SessionDirBusy, PlanError, CheckpointError) as e:
        if sock is not None:
            sock.close()
        if lock is not None:
            lock.release()
        return refuse("ostinato-serve", e)
    serve(engine, engine.model_dir, a, sock)  # the lock is held until the process ends
    return 0


def serve(engine, model_dir: Path, a, sock=None) -> None:
    """Serve on `sock` (listen.py's, already bound), or bind a.host:a.port now."""
    from tokenizers import Tokenizer

    from .app import create_app

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    store = None
    if a.session_dir is not None:
        from .session_store import SessionStore, engine_identity

        store = SessionStore(a.session_dir, engine_identity(engine), a.session_dir_bytes, a.session_idle)
        print(f"session store {a.session_dir}: {len(store)} sessions, {store.bytes} bytes "
              f"(bound {a.session_dir_bytes})", flush=True)
    app = create_app(engine, tok, model_dir.name, api_key=a.api_key, cache_sessions=a.cache_sessions,
                     max_queue=a.max_queue, session_store=store, max_body_bytes=a.max_body_bytes)
    print(f"serving model {model_dir.name!r} on http://{a.host}:{a.port}/v1", flush=True)
    server = server_for(app, a.host, a.port, a.shutdown_timeout)
    server.run(sockets=[sock if sock is not None else listen(a.host, a.port)])


if __name__ == "__main__":
    sys.exit(main())
