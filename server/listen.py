"""The listening socket, taken before the model loads: a busy port fails in a second, not after minutes
of loading weights, and nothing else can take the port while they load."""

from __future__ import annotations

import socket


class PortError(OSError):
    pass


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port (SO_REUSEADDR, as uvicorn binds); PortError naming host:port."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise PortError(f"cannot listen on {host}:{port}: {e.strerror or e} (is another server using it?)") from None
