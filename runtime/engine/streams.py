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
    s.synchronize(side)                       # this thread waits for side's work so far
    with s.capture(stream) as graph: ...      # a CUDA graph captured on `stream` (None on the CPU)

The engine's own streams are named, one per device and role (`s.named(device, "capture")`), made
once and kept: torch.cuda.Stream() hands out streams round-robin from a pool of 32 per device, so a
stream per layer or per captured step would, past 32, be handed a stream already in use (a layer's
cold side stream being the capture stream itself: its host task then runs in series with the GPU
work), and each capture on a new stream keeps its own allocator blocks and cuBLAS workspace. The CPU
twin hands out its streams from the same kind of pool, so the tests see what a GPU would.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch

POOL_SIZE = 32  # torch.cuda.Stream()'s round-robin pool per device and priority (c10 kStreamsPerPool)
# role -> what runs on it; the engine takes no other streams
ROLES = {"capture": "the warm-up and capture of every fixed-shape step's graphs (all steps: one allocator pool, "
                    "one cuBLAS workspace)",
         "cold": "the cold routes' copies and host task, forked and joined per layer (layers run one at a time)",
         "copy": "upload-once copies into the staging buffers",
         "adapt": "re-placement's copies of promoted experts into freed hot-pool slots, between turns "
                  "(engine/adapter.py; a background thread waits on it)"}


class NamedStreams:
    """One stream per (device, role), made on first use and kept, distinct from each other and from the
    device's default stream (a pool that wrapped round would hand out a stream already named)."""

    def __init__(self):
        self._named: dict[tuple[torch.device, str], object] = {}

    def named(self, device, role: str):
        if role not in ROLES:
            raise ValueError(f"stream role must be one of {sorted(ROLES)}, got {role!r}")
        device = self._device(device)
        named = self._named
        if (device, role) not in named:
            held = {self._key(s) for (d, _), s in named.items() if d == device} | {self._key(self.current(device))}
            for _ in range(POOL_SIZE + 1):
                stream = self.new(device)
                if self._key(stream) not in held:
                    break
            else:
                raise RuntimeError(f"no stream on {device} distinct from the {len(held)} already in use")
            named[(device, role)] = stream
        return named[(device, role)]

    def named_streams(self, device) -> dict:
        """role -> stream of those made so far on `device`."""
        device = self._device(device)
        return {role: s for (d, role), s in self._named.items() if d == device}



class CudaStreams(NamedStreams):
    """torch.cuda, one call per operation."""

    @staticmethod
    def _device(device) -> torch.device:
        device = torch.device(device)
        return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())

    @staticmethod
    def _key(stream) -> int:
        return stream.cuda_stream

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

    def synchronize(self, stream: torch.cuda.Stream) -> None:
        """The calling thread waits for the work queued on `stream` so far."""
        stream.synchronize()

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
    op: str       # new, wait_stream, record, wait_event, synchronize, capture_begin, capture_end (tests add
                  # their own)
    what: object  # the other stream, the event, or None


class CpuStreams(NamedStreams):
    """The CPU twin: every CPU device is one device (as its tensors say), work runs when it is issued,
    and ordering operations change nothing but the log (while recording) and which stream is current
    (per thread, as CUDA's: a background thread's copies, engine/adapter.py, are logged on its stream
    while the main thread's forwards are logged on theirs). new() hands out streams 1..32 round-robin,
    as torch's pool does."""

    def __init__(self):
        super().__init__()
        self.log: list[Entry] | None = None
        self._local = threading.local()      # .current: this thread's stack of streams (on() pushes)
        self._numbers = itertools.count(1)   # events
        self._pool = itertools.count(0)      # streams

    @staticmethod
    def _device(device) -> torch.device:
        return torch.device("cpu")

    @staticmethod
    def _key(stream) -> TwinStream:
        return stream

    @contextmanager
    def recording(self) -> Iterator[list[Entry]]:
        self.log = []
        try:
            yield self.log
        finally:
            self.log = None

    @property
    def _current(self) -> list[TwinStream]:
        if not hasattr(self._local, "current"):
            self._local.current = [TwinStream(0)]  # every thread starts on the default stream
        return self._local.current

    def current(self, device=None) -> TwinStream:
        return self._current[-1]

    def new(self, device=None) -> TwinStream:
        stream = TwinStream(1 + next(self._pool) % POOL_SIZE)
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

    def synchronize(self, stream: TwinStream) -> None:
        """Nothing to wait for (the work ran when it was issued)."""
        self._note(stream, "synchronize", None)

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
