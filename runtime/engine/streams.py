"""Stream ordering for the CUDA paths, with a CPU twin that records what a GPU would be told.

The upload double buffer (executor.py), the decode graphs' capture (decode_graphs.py) and the cold
routes' side stream (kernels/cold_task.py) order their work across CUDA streams through these few
operations, so the same code runs on the CPU with `CpuStreams`: there the work runs at once, in
program order, and while `recording()` every ordering operation is logged as (stream, op, what).
No GPU has run these paths yet; tests check the log for the orderings a GPU needs
(tests/stream_order.py).

    s = streams_for(device)
    side = s.new(device)
    s.wait_stream(side, s.current(device))   # fork: side's work starts after what is queued so far
    with s.on(side): ...                      # work queued on side
    done = s.record(side)                     # an event after that work
    s.wait_event(s.current(device), done)     # join
    with s.capture(stream) as graph: ...      # a CUDA graph captured on `stream` (None on the CPU)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch


class CudaStreams:
    """torch.cuda, one call per operation."""

    def current(self, device) -> torch.cuda.Stream:
        return torch.cuda.current_stream(device)

    def new(self, device) -> torch.cuda.Stream:
        return torch.cuda.Stream(device)

    def on(self, stream: torch.cuda.Stream):
        return torch.cuda.stream(stream)

    def record(self, stream: torch.cuda.Stream) -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait_event(self, stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
        stream.wait_event(event)

    def wait_stream(self, stream: torch.cuda.Stream, other: torch.cuda.Stream) -> None:
        stream.wait_stream(other)

    @contextmanager
    def capture(self, stream: torch.cuda.Stream, pool=None) -> Iterator[torch.cuda.CUDAGraph]:
        """Capture the work queued inside on `stream` (made the current stream) into a new graph (its
        memory from `pool`, a torch.cuda.graph_pool_handle(), when given)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(stream.device), torch.cuda.graph(graph, pool=pool, stream=stream):
            yield graph


class TwinStream(NamedTuple):
    number: int  # 0: the default stream


class TwinEvent(NamedTuple):
    number: int


class Entry(NamedTuple):
    stream: TwinStream
    op: str       # new, wait_stream, record, wait_event, capture_begin, capture_end (tests add their own)
    what: object  # the other stream, the event, or None


class CpuStreams:
    """The CPU twin: every CPU device is one device (as its tensors say), work runs when it is issued,
    and ordering operations change nothing but the log (while recording) and which stream is current
    (one for all threads, unlike CUDA's: only the log depends on it)."""

    def __init__(self):
        self.log: list[Entry] | None = None
        self._current = [TwinStream(0)]  # a stack: on() pushes
        self._numbers = itertools.count(1)

    @contextmanager
    def recording(self) -> Iterator[list[Entry]]:
        self.log = []
        try:
            yield self.log
        finally:
            self.log = None

    def current(self, device=None) -> TwinStream:
        return self._current[-1]

    def new(self, device=None) -> TwinStream:
        stream = TwinStream(next(self._numbers))
        self._note(stream, "new", None)
        return stream

    @contextmanager
    def on(self, stream: TwinStream) -> Iterator[None]:
        self._current.append(stream)
        try:
            yield
        finally:
            self._current.pop()

    def record(self, stream: TwinStream) -> TwinEvent:
        event = TwinEvent(next(self._numbers))
        self._note(stream, "record", event)
        return event

    def wait_event(self, stream: TwinStream, event: TwinEvent) -> None:
        self._note(stream, "wait_event", event)

    def wait_stream(self, stream: TwinStream, other: TwinStream) -> None:
        self._note(stream, "wait_stream", other)

    @contextmanager
    def capture(self, stream: TwinStream, pool=None) -> Iterator[None]:
        """The work inside runs eagerly on `stream`; nothing is captured."""
        self._note(stream, "capture_begin", None)
        with self.on(stream):
            yield None
        self._note(stream, "capture_end", None)

    def _note(self, stream: TwinStream, op: str, what) -> None:
        if self.log is not None:
            self.log.append(Entry(stream, op, what))


CUDA_STREAMS = CudaStreams()
CPU_STREAMS = CpuStreams()  # one, as there is one CUDA runtime: objects made at load time share it with tests


def streams_for(device) -> CudaStreams | CpuStreams:
    return CUDA_STREAMS if torch.device(device).type == "cuda" else CPU_STREAMS
