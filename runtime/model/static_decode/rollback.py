"""Undoing a fixed-shape step exactly (a rejected speculative draft's verify step), in graphs.

A step of up to T tokens at position p overwrites, per layer (state.py):
- the window ring's slots of positions p .. p+T-1 (one of them, (p+1) mod W for T = 2, still held a
  visible key) and their position entries;
- per compressor, the window buffer's slots of those positions (kv, gate) and, for overlapped (CSA)
  ones, the previous window's first halves (replaced when the step completes a window);
- entry rows from p // m on, which are not visible at p (only rows below p // m are) and are written
  again by the step that completes their window before anything reads them: not saved.
`save_segment(i)` copies the first two into static buffers, with the segment's position;
`restore_segment(i)` copies them back and puts the position back. Both compute the slots on the
device from the position tensor, with fixed shapes and no host reads, so each segment of each is
captured as a CUDA graph (engine/step_runner.py: `Saver` / `Restorer` look like a step to
decode_graphs.py) and a verify plus a rejection costs two extra replays per GPU, not hundreds of
dispatched copies.

Legend: T tokens undone at most, W sliding_window, hd head_dim, m ratio, C compressor projection width,
width entry width.
"""

from __future__ import annotations

import torch

from .segments import Segment
from .state import CompressorBuffers, DecodeState, LayerState


class _CompressorSave:
    def __init__(self, buf: CompressorBuffers, tokens: int):
        n = min(tokens, buf.ratio)
        dev = buf.kv.device
        self.offsets = torch.arange(n, device=dev)                                 # [n]
        self.kv = torch.zeros(n, buf.kv.shape[1], device=dev)                     # [n, C] float32
        self.gate = torch.zeros_like(self.kv)
        self.prev_kv = torch.zeros_like(buf.prev_kv) if buf.prev_kv is not None else None  # [m, width]
        self.prev_gate = torch.zeros_like(buf.prev_gate) if buf.prev_gate is not None else None

    def save(self, buf: CompressorBuffers, position: torch.Tensor) -> None:
        slots = (position + self.offsets) % buf.ratio  # [n]
        self.kv.copy_(buf.kv.index_select(0, slots))
        self.gate.copy_(buf.gate.index_select(0, slots))
        if self.prev_kv is not None:
            self.prev_kv.copy_(buf.prev_kv)
            self.prev_gate.copy_(buf.prev_gate)

    def restore(self, buf: CompressorBuffers, position: torch.Tensor) -> None:
        slots = (position + self.offsets) % buf.ratio
        buf.kv.index_copy_(0, slots, self.kv)
        buf.gate.index_copy_(0, slots, self.gate)
        if self.prev_kv is not None:
            buf.prev_kv.copy_(self.prev_kv)
            buf.prev_gate.copy_(self.prev_gate)


class _LayerSave:
    def __init__(self, ls: LayerState, tokens: int):
        W, dev = ls.window.shape[0], ls.window.device
        n = min(tokens, W)
        self.offsets = torch.arange(n, device=dev)                                 # [n]
        self.window = torch.zeros(n, ls.window.shape[1], dtype=ls.window.dtype, device=dev)  # [n, hd]
        self.window_pos = torch.zeros(n, dtype=torch.long, device=dev)            # [n]
        self.comp = _CompressorSave(ls.comp, tokens) if ls.comp is not None else None
        self.index = _CompressorSave(ls.index, tokens) if ls.index is not None else None

    def save(self, ls: LayerState, position: torch.Tensor) -> None:
        slots = (position + self.offsets) % ls.window.shape[0]  # [n]
        self.window.copy_(ls.window.index_select(0, slots))
        self.window_pos.copy_(ls.window_pos.index_select(0, slots))
        for saved, buf in ((self.comp, ls.comp), (self.index, ls.index)):
            if saved is not None:
                saved.save(buf, position)

    def restore(self, ls: LayerState, position: torch.Tensor) -> None:
        slots = (position + self.offsets) % ls.window.shape[0]
        ls.window.index_copy_(0, slots, self.window)
        ls.window_pos.index_copy_(0, slots, self.window_pos)
        for saved, buf in ((self.comp, ls.comp), (self.index, ls.index)):
            if saved is not None:
                saved.restore(buf, position)


class StepRollback:
    """Save and restore of a DecodeState around steps of up to `tokens` tokens (host side: mark / back_to;
    device side: save_segment / restore_segment, capturable)."""

    def __init__(self, state: DecodeState, segments: list[Segment], tokens: int):
        self.state, self.segments, self.tokens = state, segments, tokens
        self.layers = [_LayerSave(ls, tokens) for ls in state.layers]
        self.positions = [torch.zeros_like(p) for p in state.positions]  # [1] each: the mark's, per segment
        self.marked: int | None = None

    # Host side.
    def mark(self, run=None) -> None:
        """Save the state now (run: replays the save graphs; default: the segments eagerly)."""
        run = run or (lambda: [self.save_segment(i) for i in range(len(self.segments))])
        run()
        self.marked = self.state.position

    def back_to(self, run=None) -> None:
        """The state of the last mark() exactly (run: replays the restore graphs; default: eagerly)."""
        s = self.state
        if self.marked is None or s.synced is None or not s.synced <= self.marked <= s.position \
                or s.position - self.marked > self.tokens:
            raise ValueError(f"back_to: the mark is at position {self.marked}, the buffers went from {s.synced} "
                             f"(their cache's position) to {s.position} since (at most {self.tokens} tokens undo)")
        run = run or (lambda: [self.restore_segment(i) for i in range(len(self.segments))])
        run()
        s.position, self.marked = self.marked, None

    # Device side: capturable, segment i's buffers only.
    @torch.no_grad()
    def save_segment(self, i: int) -> None:
        seg, pos = self.segments[i], self.state.positions[i]
        for layer in range(seg.first_layer, seg.end_layer):
            self.layers[layer].save(self.state.layers[layer], pos)
        self.positions[i].copy_(pos)

    @torch.no_grad()
    def restore_segment(self, i: int) -> None:
        seg, pos = self.segments[i], self.positions[i]
        for layer in range(seg.first_layer, seg.end_layer):
            self.layers[layer].restore(self.state.layers[layer], pos)
        self.state.positions[i].copy_(pos)


class RollbackPass:
    """One direction of a StepRollback shaped like a step for decode_graphs.SegmentGraphs (segments,
    run_segment, and no-op host bookkeeping): what the engine captures and replays."""

    def __init__(self, rollback: StepRollback, restore: bool):
        self.rollback, self.segments, self.tokens = rollback, rollback.segments, rollback.tokens
        self.run_segment = rollback.restore_segment if restore else rollback.save_segment
        self.logits = None  # the host reads nothing back: SegmentGraphs.run() does not wait for the pass

    def rewind(self) -> None:
        """Warm-up and capture runs copy stale buffers around: the state is loaded again afterwards."""

    def check_room(self, steps: int = 1) -> None:
        """Nothing moves past the context."""

    def hand_off(self, i: int) -> None:
        """Segments share nothing."""

    def note_step(self) -> None:
        """The host's position is StepRollback's to set."""
