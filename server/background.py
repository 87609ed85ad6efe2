"""Serve an app on a free loopback port from a background thread (tools, tests, embedding the
server in another program); `ostinato-serve` runs uvicorn in the foreground instead."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


def serve_in_background(app, host: str = "127.0.0.1") -> tuple[uvicorn.Server, str]:
    """Start `app` on a free port of `host`; returns the server (set `should_exit` to stop it) and its
    OpenAI base URL, once it accepts connections."""
    s = socket.socket()
    s.bind((host, 0))
    port = s.getsockname()[1]
    s.close()
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://{host}:{port}/v1"
