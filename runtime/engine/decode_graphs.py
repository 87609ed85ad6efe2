"""CUDA graphs of a fixed-shape step (decode or a prefill bucket): one graph per GPU segment, captured once.

`StaticStep.run_segment(i)` has fixed shapes, no host reads and touches only its segment's
buffers (tested on the CPU by the graph safety checker), so each GPU segment is captured once and
replayed every token: attention, routing, the hot experts' launch, the shared expert, and the cold
routes' memcpy / host-function / memcpy nodes (kernels/cold_task.py). Between segments the host
hands the residual on (`step.hand_off(i)`, a copy across GPUs that no graph could hold).

Each device gets its own capture stream (torch's default one is made once, on the first device),
which also runs the warm-up (allocator pools, Triton compilation, library handles). The warm-up and
capture runs move the state on, so they run from position 0 (`step.rewind()`: a session at
max_context - 1 would write past the buffers) and the caller loads the state afterwards (the
runner does). Ordering goes through engine/streams.py, so on the CPU `capture()` runs the same
warm-up and capture runs eagerly, captures nothing, and records the stream log tests check.
"""

from __future__ import annotations

import torch

from ostinato.buckets import CAPTURE_RUNS

from ..model.static_decode.step import StaticStep
from .streams import streams_for

WARMUP_RUNS = CAPTURE_RUNS - 1  # then the captured run


def graph_pool():
    """A memory pool for several steps' graphs. Sharing is safe because the steps never run at the same
    time and every tensor a capture allocates is dead at its end: outputs go to the steps' static
    buffers, and caches (route-token maps, Triton launchers) fill during the uncaptured warm-up runs."""
    return torch.cuda.graph_pool_handle()


class SegmentGraphs:
    def __init__(self, step: StaticStep, pool=None):
        """`pool`: graph_pool() to share with other steps' graphs (None: a private pool)."""
        self.step, self.pool = step, pool
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def capture(self) -> None:
        """Warm up and capture every segment (host side; leaves the state to be loaded again)."""
        step = self.step
        step.rewind()
        step.check_room(WARMUP_RUNS + 1)
        capture_streams = {}  # device -> its capture stream
        for i, seg in enumerate(step.segments):
            s = streams_for(seg.device)
            if seg.device not in capture_streams:
                capture_streams[seg.device] = s.new(seg.device)
            stream = capture_streams[seg.device]
            s.wait_stream(stream, s.current(seg.device))  # after the buffers' set-up and the previous hand-off
            with s.on(stream):
                for _ in range(WARMUP_RUNS):
                    step.run_segment(i)
            with s.capture(stream, self.pool) as graph:
                step.run_segment(i)
            s.wait_stream(s.current(seg.device), stream)
            step.hand_off(i)  # the next segment warms up on a real residual, as in a step
            if graph is not None:
                self.graphs[i] = graph
        for device in capture_streams:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

    def run(self) -> torch.Tensor:
        """One step (the step's T tokens): replay (or run) every segment in order, each followed by its hand-off ->
        the step's logits buffer [V]."""
        step = self.step
        step.check_room()
        for i, seg in enumerate(step.segments):
            if i in self.graphs:
                with torch.cuda.device(seg.device):  # replays on that device's current stream
                    self.graphs[i].replay()
            else:
                step.run_segment(i)
            step.hand_off(i)
        last = step.segments[-1].device
        if last.type == "cuda":
            torch.cuda.synchronize(last)
        step.note_step()
        return step.logits
