"""CUDA graphs of the fixed-shape decode step: one graph per GPU segment of the pipeline, captured once.

`StaticDecodeStep.run_segment(i)` has fixed shapes and no host reads (tested on the CPU by the graph
safety checker), so each GPU segment is captured once and replayed every token: attention, routing,
the hot experts' launch, the shared expert, and the cold routes' memcpy / host-function / memcpy
nodes (kernels/cold_task.py). Segments on the CPU run eagerly. Segments follow each other in layer
order; across GPUs the next device's stream waits for the previous one.

Capturing needs warm-up runs of each segment (allocator pools, Triton compilation, library handles),
and those runs move the step's state on; `capture()` therefore expects the caller to load the state
again afterwards (the runner does). Everything here needs CUDA; without it `capture()` captures nothing.
"""

from __future__ import annotations

import torch

from ..model.static_decode.step import StaticDecodeStep

WARMUP_RUNS = 2


class SegmentGraphs:
    def __init__(self, step: StaticDecodeStep):
        self.step = step
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def capture(self) -> None:
        """Warm up and capture every CUDA segment (host side; leaves the step's state advanced)."""
        for i, seg in enumerate(self.step.segments):
            if seg.device.type != "cuda":
                continue
            with torch.cuda.device(seg.device):
                side = torch.cuda.Stream(seg.device)
                side.wait_stream(torch.cuda.current_stream(seg.device))
                with torch.cuda.stream(side):
                    for _ in range(WARMUP_RUNS):
                        self.step.run_segment(i)
                torch.cuda.current_stream(seg.device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self.step.run_segment(i)
                self.graphs[i] = graph
        for seg in self.step.segments:
            if seg.device.type == "cuda":
                torch.cuda.synchronize(seg.device)

    def run(self) -> torch.Tensor:
        """One decode token: replay (or run) every segment in order -> the step's logits buffer [V]."""
        step = self.step
        step.check_room()
        previous = None
        for i, seg in enumerate(step.segments):
            if previous is not None and previous != seg.device and previous.type == "cuda":
                if seg.device.type == "cuda":  # the next GPU's stream waits for the previous GPU's work
                    torch.cuda.current_stream(seg.device).wait_stream(torch.cuda.current_stream(previous))
                else:
                    torch.cuda.synchronize(previous)
            if i in self.graphs:
                self.graphs[i].replay()
            else:
                step.run_segment(i)
            previous = seg.device
        if previous.type == "cuda":
            torch.cuda.synchronize(previous)
        step.note_step()
        return step.logits
