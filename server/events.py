"""The engine's events for one request, and waiting for them in a handler that answers in one piece.

The worker (worker.py) puts them on the request's queue, in order:

    Started(reused)                    the prefix cache was searched (the Messages API's message_start)
    Generated(token, pick, reply) ...  one per token: the generation loop's token (runtime/engine/generation.py),
                                       its Pick (sampling.py: logprobs), and what the reply builder made of it
                                       on the engine thread (Job.watch: ReplyBuilder or TextReply's pieces)
    Done(reason, reused)               the reply ended: "stop", "length" or "cancelled"
or  Failed(message)                    the engine failed on it (the message is the client's, not the traceback)

A streamed response notices a client that left (Starlette cancels its generator, whose `finally`
cancels the job). A whole response would not: the handler just waits for the engine. So it waits in
short slices and asks the connection in between; a client that left cancels its job, which frees
its place in the queue or stops its generation before the next forward.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.requests import Request

from .sampling import Pick

POLL_S = 0.25   # how often a waiting handler checks its connection


@dataclass(frozen=True)
class Started:
    reused: int                 # prompt tokens the prefix cache held (not prefilled again)


@dataclass(frozen=True)
class Generated:
    token: int
    pick: Pick
    reply: object               # Job.watch's output for this token (None without a watch)


@dataclass(frozen=True)
class Done:
    reason: str                 # "stop", "length", "cancelled" (the generation loop's Finished.reason)
    reused: int


@dataclass(frozen=True)
class Failed:
    message: str


Event = Started | Generated | Done | Failed


class ClientGone(Exception):
    """The client disconnected while its reply was being made."""


async def next_event(events: asyncio.Queue, request: Request, job) -> Event:
    """The next engine event for `job`; ClientGone (with the job cancelled) if the client has left."""
    while True:
        try:
            return await asyncio.wait_for(events.get(), POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                job.cancel.set()
                raise ClientGone from None
