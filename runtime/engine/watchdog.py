"""Waiting for a step's GPU work with a deadline: a CUDA graph's host node (the cold routes' CPU task)
that never returns would otherwise hold `torch.cuda.synchronize()` and the whole engine forever, with
nothing said. `wait_done()` polls an event recorded after the step instead and raises after
`timeout_s`, naming what it waited for. The device is then in an unknown state (the stream still
holds the step): the caller reports it and the engine must be restarted.
"""

from __future__ import annotations

import time

STEP_TIMEOUT_S = 60.0  # a decode step takes milliseconds, a bucket step tens of them: a minute is a hang
POLL_S = (1e-5, 2e-4)  # first and longest sleep between polls: a short wait stays short, a long one idles


def wait_done(event, timeout_s: float, what: str) -> None:
    """Return once `event` (anything with .query() -> bool) has completed; TimeoutError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    sleep = POLL_S[0]
    while not event.query():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} has not finished after {timeout_s:.0f} s: a cold routes' CPU task "
                               "(a host node of its CUDA graph) may be hung; the GPU still holds the step, so "
                               "restart the engine")
        time.sleep(sleep)
        sleep = min(2 * sleep, POLL_S[1])
