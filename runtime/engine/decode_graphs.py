"""CUDA graphs of a fixed-shape step (decode or a prefill bucket): one graph per GPU segment, captured once.

`StaticStep.run_segment(i)` has fixed shapes, no host reads and touches only its segment's
buffers (tested on the CPU by the graph safety checker), so each GPU segment is captured once and
replayed every token: attention, routing, the hot experts' launch, the shared expert, and the cold
routes' memcpy / host-function / memcpy nodes (kernels/cold_task.py). Between segments the host
hands the residual on (`step.hand_off(i)`, a copy across GPUs that no graph could hold).

Every step of an engine captures on its device's one named capture stream (engine/streams.py), which
also runs the warm-up (Triton compilation, allocator blocks, the stream's cuBLAS workspace): the
caching allocator reuses blocks only within a stream, so one stream for all steps is what makes the
shared graph pool as large as the largest step rather than the sum of them.
Capture is all or nothing: if any segment fails, no graph is kept and the error propagates; after a
capture every GPU segment replays its graph, and one without a graph is an error, never a silent
eager run. The warm-up and
capture runs move the state on, so they run from position 0 (`step.rewind()`: a session at
max_context - 1 would write past the buffers) and the caller loads the state afterwards (the
runner does). Ordering goes through engine/streams.py, so on the CPU `capture()` runs the same
warm-up and capture runs eagerly, captures nothing, and records the stream log tests check.
A CPU segment may instead be compiled into one call (`compile_cpu()`, engine/cpu_step.py), which run()
then calls in its place.
"""

from __future__ import annotations

import torch

from ostinato.buckets import CAPTURE_RUNS

from ..model.static_decode.step import StaticStep
from . import watchdog
from .cpu_step import compile_segment
from .streams import streams_for

WARMUP_RUNS = CAPTURE_RUNS - 1  # then the captured run


def graph_pool():
    """A memory pool for several steps' graphs. Sharing is safe because the steps never run at the same
    time and every tensor a capture allocates is dead at its end: outputs go to the steps' static
    buffers, and caches (route-token maps, Triton launchers) fill during the uncaptured warm-up runs."""
    return torch.cuda.graph_pool_handle() if torch.cuda.is_available() else None  # the CPU twin captures nothing


class SegmentGraphs:
    def __init__(self, step: StaticStep, pool=None):
        """`pool`: graph_pool() to share with other steps' graphs (None: a private pool)."""
        self.step, self.pool = step, pool
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.compiled: dict = {}  # CPU segment -> its compiled call (compile_cpu)
        self.done = False  # capture() ran to its end: every GPU segment has its graph

    @property
    def captured(self) -> bool:
        return self.done

    def capture(self) -> None:
        """Warm up and capture every segment (host side; leaves the state to be loaded again). All or nothing:
        on an error no graph is kept."""
        step = self.step
        step.rewind()
        step.check_room(WARMUP_RUNS + 1)
        self.graphs, self.done = {}, False
        graphs = {}
        try:
            for i, seg in enumerate(step.segments):
                s = streams_for(seg.device)
                stream = s.named(seg.device, "capture")
                s.wait_stream(stream, s.current(seg.device))  # after the buffers' set-up and the previous hand-off
                with s.on(stream):
                    for _ in range(WARMUP_RUNS):
                        step.run_segment(i)
                with s.capture(stream, self.pool) as graph:
                    step.run_segment(i)
                s.wait_stream(s.current(seg.device), stream)
                step.hand_off(i)  # the next segment warms up on a real residual, as in a step
                if graph is not None:
                    graphs[i] = graph
            for device in {seg.device for seg in step.segments if seg.device.type == "cuda"}:
                torch.cuda.synchronize(device)
        except Exception as e:
            raise RuntimeError(f"capturing the {step.tokens}-token step's CUDA graphs failed at segment {i} "
                               f"({seg.device}): {e}; --decode eager runs the step without graphs") from e
        self.graphs, self.done = graphs, True

    def compile_cpu(self) -> None:
        """Compile every CPU segment into one call (all or nothing: raises cpu_step.CompileFailed, keeping
        none). Like capture(), leaves the state to be loaded again."""
        self.compiled = {}
        self.compiled = {i: compile_segment(self.step, i) for i, seg in enumerate(self.step.segments)
                         if seg.device.type == "cpu"}

    def run(self) -> torch.Tensor:
        """One step (the step's T tokens): replay (or run) every segment in order, each followed by its hand-off ->
        the step's logits buffer [V]."""
        step = self.step
        step.check_room()
        for i, seg in enumerate(step.segments):
            if i in self.graphs:
                with torch.cuda.device(seg.device):  # replays on that device's current stream
                    self.graphs[i].replay()
            elif i in self.compiled:
                self.compiled[i]()
            elif self.done and seg.device.type == "cuda":
                raise RuntimeError(f"the {step.tokens}-token step's segment {i} on {seg.device} has no CUDA graph")
            else:  # not captured (graphs off), or an uncompiled CPU segment: eagerly
                step.run_segment(i)
            step.hand_off(i)
        last = step.segments[-1].device
        # The host reads the step's logits: wait for them, with the watchdog's deadline (the last segment's stream
        # ends after every earlier one: the hand-offs order them). A pass that hands the host nothing (rollback's
        # save and restore, logits None) does not wait: the next step, on the same streams, runs after it anyway.
        if last.type == "cuda" and step.logits is not None:
            s = streams_for(last)
            watchdog.wait_done(s.record(s.current(last)), watchdog.STEP_TIMEOUT_S, f"the {step.tokens}-token step")
        step.note_step()
        return step.logits
