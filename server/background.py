"""Serve an app on a free loopback port from a background thread (tools, tests, embedding the
server in another program); `ostinato-serve` runs uvicorn in the foreground instead. Both stop through
GracefulServer: a stop (SIGTERM, Ctrl-C, should_exit) says what it waits for, and waits a stated time."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time

import uvicorn

log = logging.getLogger("ostinato.server")

DEFAULT_SHUTDOWN_S = 60.0


class GracefulServer(uvicorn.Server):
    """uvicorn's server, whose stop logs the replies still in flight and the bound it waits for them
    (config.timeout_graceful_shutdown): past it, their handlers are cancelled, which cancels their jobs
    before the engine's next forward, and the server ends (writing the session store, app.py's lifespan).
    Without a word a stop looked like a hang; without a bound, one long reply held it for minutes."""

    async def shutdown(self, sockets=None) -> None:
        n, bound = len(self.server_state.tasks), self.config.timeout_graceful_shutdown
        if n:
            log.warning("stopping: waiting for %d %s in flight, at most %s s (then %s cancelled)", n,
                        "reply" if n == 1 else "replies", "no limit" if bound is None else f"{bound:g}",
                        "it is" if n == 1 else "they are")
        quiet = _CancelledByTheBound()
        logging.getLogger("uvicorn.error").addFilter(quiet)
        try:
            await super().shutdown(sockets)  # past the bound it logs "Cancel N running task(s)" and cancels them
        finally:
            logging.getLogger("uvicorn.error").removeFilter(quiet)


class _CancelledByTheBound(logging.Filter):
    """Drops uvicorn's traceback for each reply the shutdown bound cancelled: that is the bound working (its
    own line says how many), not a fault to look into."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))


def server_for(app, host: str, port: int, shutdown_s: float | None = DEFAULT_SHUTDOWN_S) -> GracefulServer:
    """The uvicorn server for `app` on host:port; a stop waits at most `shutdown_s` for replies in flight."""
    return GracefulServer(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                         timeout_graceful_shutdown=shutdown_s))


def serve_in_background(app, host: str = "127.0.0.1",
                        shutdown_s: float | None = DEFAULT_SHUTDOWN_S) -> tuple[uvicorn.Server, str]:
    """Start `app` on a free port of `host`; returns the server (set `should_exit` to stop it) and its
    OpenAI base URL, once it accepts connections."""
    s = socket.socket()
    s.bind((host, 0))
    port = s.getsockname()[1]
    s.close()
    server = server_for(app, host, port, shutdown_s)
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://{host}:{port}/v1"
