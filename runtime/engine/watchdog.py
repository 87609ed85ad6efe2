"""Waiting for a step's GPU work with a deadline: a CUDA graph's host node (the cold routes' CPU task)
that never returns would otherwise hold `torch.cuda.synchronize()` and the whole engine forever, with
nothing said. `wait_done()` polls an event recorded after the step instead and raises after
`timeout_s`, naming what it waited for. The device is then in an unknown state (the stream still
holds the step): the caller reports it and the engine must be restarted.

How it polls: a sleep between polls oversleeps (`time.sleep(1e-5)` returns after ~80 us on Linux: the
timer slack and the wake-up), which a decode token would pay whenever its step ends during one. So it
first spins, querying without sleeping, for SPIN_NS (about what one such sleep costs): a step that ends
within it is seen at once; a longer one then sleeps between polls, from POLL_S[0] doubling to POLL_S[1],
so a long wait idles its core rather than taking it from the CPU's expert threads.
"""

from __future__ import annotations

import time

STEP_TIMEOUT_S = 60.0  # a decode step takes milliseconds, a bucket step tens of them: a minute is a hang
SPIN_NS = 100_000  # busy-poll this long first: about one short sleep's real length, so at most what one would cost
POLL_S = (1e-5, 2e-4)  # then the first and longest sleep between polls: a short wait stays short, a long one idles


def wait_done(event, timeout_s: float, what: str) -> None:
    """Return once `event` (anything with .query() -> bool) has completed; TimeoutError after timeout_s."""
    start = time.perf_counter_ns()
    spin_until, deadline = start + SPIN_NS, start + int(timeout_s * 1e9)
    pause = POLL_S[0]
    while not event.query():
        now = time.perf_counter_ns()
        if now > deadline:
            raise TimeoutError(f"{what} has not finished after {timeout_s:.0f} s: a cold routes' CPU task "
                               "(a host node of its CUDA graph) may be hung; the GPU still holds the step, so "
                               "restart the engine")
        if now < spin_until:
            continue
        time.sleep(pause)
        pause = min(2 * pause, POLL_S[1])
