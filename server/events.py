"""Waiting for the engine's events in a handler that answers in one piece (not streamed).

A streamed response notices a client that left (Starlette cancels its generator, whose `finally`
cancels the job). A whole response would not: the handler just waits for the engine. So it waits in
short slices and asks the connection in between; a client that left cancels its job, which frees
its place in the queue or stops its generation before the next forward.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request

POLL_S = 0.25   # how often a waiting handler checks its connection


class ClientGone(Exception):
    """The client disconnected while its reply was being made."""


async def next_event(events: asyncio.Queue, request: Request, job) -> tuple:
    """The next engine event for `job`; ClientGone (with the job cancelled) if the client has left."""
    while True:
        try:
            return await asyncio.wait_for(events.get(), POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                job.cancel.set()
                raise ClientGone from None
