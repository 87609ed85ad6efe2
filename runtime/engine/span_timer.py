"""The executor's time counters for work that runs asynchronously on a GPU.

A launch returns long before its kernel has run, so a wall clock around it measures the launch (tens
of microseconds), not the work. On a GPU a span is timed by two CUDA events recorded on the current
stream at its start and end; the pairs are settled (waited for and added to the counters) only when
the counters are read, so timing never makes the host wait in the middle of a forward. On the CPU the
work is done when the call returns, and the wall clock is the time.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from .counters import Counters

MAX_PENDING = 4096  # event pairs held before they are settled unasked (a caller that never reads the counters)


def cuda_event(device: torch.device):
    """A timing event recorded now on `device`'s current stream."""
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return event


class SpanTimer:
    def __init__(self, counters: Counters, event=cuda_event):
        """`event(device)`: a recorded event with .synchronize() and .elapsed_time(end) in ms (tests pass fakes)."""
        self.counters, self.event = counters, event
        self.pending: list[tuple[str, object, object]] = []  # (counter field, start event, end event)

    @contextmanager
    def span(self, field: str, device: torch.device):
        """Add the time of the work issued inside (on `device`'s current stream) to counters.<field>."""
        if device.type != "cuda":
            start = time.perf_counter()
            yield
            setattr(self.counters, field, getattr(self.counters, field) + time.perf_counter() - start)
            return
        if len(self.pending) >= MAX_PENDING:  # nobody has read the counters for long: settle (those ended long ago)
            self.settle()
        start = self.event(device)
        yield
        self.pending.append((field, start, self.event(device)))

    def settle(self) -> Counters:
        """Wait for the pending spans' end events and add their times -> the counters, current."""
        for field, start, end in self.pending:
            end.synchronize()
            setattr(self.counters, field, getattr(self.counters, field) + start.elapsed_time(end) / 1e3)
        self.pending.clear()
        return self.counters
