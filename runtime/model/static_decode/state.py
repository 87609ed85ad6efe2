"""Static decode state: every buffer allocated once, at its final shape, on its layer's device.

A CUDA graph replays fixed shapes at fixed addresses, so nothing here grows or is replaced while
decoding; the step writes into these buffers in place and reads the position from a device tensor.
Per layer (the dynamic KvCache's contents, kv_cache.py, laid out for that):
- window ring [W, hd] and the position each slot holds [W] int64 (-1: none): position p lives in
  slot p mod W, so the W keys of a query are gathered back in position order;
- per compressor (CSA/HCA entries, CSA index keys), `CompressorBuffers`: the current window's
  projections [m, C] (kv, gate without ape) in slot pos mod m; for overlapped (CSA) compressors the
  last complete window's first-half channels prev_kv / prev_gate [m, width] (gate -inf: no previous
  window yet, its slots weigh 0); the entries rows [R, width], R = ceil(max_context / m), so the
  entry of the token's (possibly incomplete) window always has a row to be written to;
- a position tensor [1] int64 per pipeline segment, shared by the segment's layers.

Buffers start at zero: rows that are not visible still go through matmuls with weight 0 (or are
gathered and masked), and 0 * NaN would poison them; stale rows are finite for the same reason.

`DecodeState.load(cache)` / `store(cache)` convert from / to a dynamic KvCache on the host (plain
eager code, not meant to be captured). rollback.py undoes a step exactly (a rejected speculative draft).

Legend: W sliding_window, hd head_dim, m ratio, C compressor projection width (2 * width when
overlapped), width entry width (hd, or dI for index keys), R rows capacity.
"""

from __future__ import annotations

import copy

import torch

from ..compressor import CompressorState, CompressorWeights
from ..kv_cache import GrowingRows, KvCache, LayerCache, rows_capacity
from ..loading import LayerWeights
from .segments import Segment

F32 = torch.float32


def check_context(position: int, max_context: int, what: str) -> None:
    if position > max_context:
        raise ValueError(f"static decode: {what} needs a context of {position} tokens, beyond max_context="
                         f"{max_context} (the static buffers' size); build the step with a larger max_context")


class CompressorBuffers:
    """One compressor's state and entries (see the module docstring)."""

    def __init__(self, w: CompressorWeights, max_context: int, dtype: torch.dtype, device: torch.device):
        m, C, width = w.ratio, w.wkv.shape[0], w.width
        self.ratio = m
        self.kv = torch.zeros(m, C, dtype=F32, device=device)    # [m, C] slot = position mod m
        self.gate = torch.zeros(m, C, dtype=F32, device=device)  # [m, C] without ape
        self.prev_kv = torch.zeros(m, width, dtype=F32, device=device) if w.overlap else None  # [m, width]
        self.prev_gate = torch.full((m, width), float("-inf"), device=device) if w.overlap else None
        self.rows = torch.zeros(rows_capacity(max_context, m), width, dtype=dtype, device=device)  # [R, width]
        self.row_ids = torch.arange(self.rows.shape[0], device=device)  # [R]: visibility masks compare these

    def within(self, context: int) -> CompressorBuffers:
        """The same buffers, with rows and row_ids cut to the first `context` tokens' rows (views: writes
        land in these buffers)."""
        view, r = copy.copy(self), rows_capacity(context, self.ratio)
        view.rows, view.row_ids = self.rows[:r], self.row_ids[:r]  # [r, width], [r]
        return view

    def load(self, state: CompressorState, rows: GrowingRows, position: int) -> None:
        m, b = self.ratio, state.buf_kv.shape[0]
        if b != position % m or rows.n != position // m:
            raise ValueError(f"inconsistent cache: {b} buffered tokens and {rows.n} rows at position {position} "
                             f"(ratio {m})")
        self.kv[:b] = state.buf_kv
        self.gate[:b] = state.buf_gate
        if self.prev_kv is not None:
            if state.prev_kv is None:  # no complete window yet
                self.prev_kv.zero_()
                self.prev_gate.fill_(float("-inf"))
            else:
                self.prev_kv.copy_(state.prev_kv)
                self.prev_gate.copy_(state.prev_gate)
        self.rows[:rows.n] = rows.view()

    def store(self, rows: GrowingRows, position: int) -> CompressorState:
        """Append the rows completed since `rows.n` and return the partial-window state at `position`
        (fresh tensors: snapshots keep references to CompressorState tensors)."""
        m = self.ratio
        b = position % m
        rows.append(self.rows[rows.n:position // m])
        has_prev = self.prev_kv is not None and position >= m
        return CompressorState(self.kv[:b].clone(), self.gate[:b].clone(),
                               self.prev_kv.clone() if has_prev else None,
                               self.prev_gate.clone() if has_prev else None)

    @property
    def nbytes(self) -> int:
        ts = (self.kv, self.gate, self.prev_kv, self.prev_gate, self.rows, self.row_ids)
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


class LayerState:
    """One layer's static buffers; `position` is its segment's position tensor [1] int64."""

    def __init__(self, lw: LayerWeights, max_context: int, dtype: torch.dtype, device: torch.device,
                 position: torch.Tensor):
        a = lw.attn
        W = a.window
        self.position = position
        self.window = torch.zeros(W, a.head_dim, dtype=dtype, device=device)  # [W, hd] ring
        self.window_pos = torch.full((W,), -1, dtype=torch.long, device=device)  # [W] position held per slot
        self.window_offsets = torch.arange(1 - W, 1, device=device)  # [W]: query p sees p-W+1 .. p
        self.comp = CompressorBuffers(a.compressor, max_context, dtype, device) if a.compressor else None
        self.index = CompressorBuffers(a.indexer.compressor, max_context, dtype, device) if a.indexer else None

    def within(self, context: int) -> LayerState:
        """The same buffers, with the compressors' rows cut to the first `context` tokens' (a step that
        reads no more of them: static_decode/step.py `within`)."""
        view = copy.copy(self)
        view.comp = self.comp.within(context) if self.comp is not None else None
        view.index = self.index.within(context) if self.index is not None else None
        return view

    def load(self, lc: LayerCache, position: int) -> None:
        W = self.window.shape[0]
        n = lc.window.shape[0]
        if n != min(position, W - 1):
            raise ValueError(f"inconsistent cache: {n} window rows at position {position} (window {W})")
        held = torch.arange(position - n, position, device=self.window.device)  # [n] positions of the rows
        self.window.zero_()
        self.window_pos.fill_(-1)
        self.window[held % W] = lc.window
        self.window_pos[held % W] = held
        if self.comp is not None:
            self.comp.load(lc.comp, lc.rows, position)
        if self.index is not None:
            self.index.load(lc.index_comp, lc.index_rows, position)

    def store(self, lc: LayerCache, position: int) -> None:
        W = self.window.shape[0]
        held = torch.arange(position - min(position, W - 1), position, device=self.window.device)  # [<= W-1]
        assert torch.equal(self.window_pos[held % W], held), "window ring out of step with the position"
        lc.window = self.window[held % W]  # [<= W-1, hd] in position order (a gather: a fresh tensor)
        if self.comp is not None:
            lc.comp = self.comp.store(lc.rows, position)
        if self.index is not None:
            lc.index_comp = self.index.store(lc.index_rows, position)

    @property
    def nbytes(self) -> int:
        own = sum(t.numel() * t.element_size() for t in (self.window, self.window_pos, self.window_offsets))
        return own + sum(c.nbytes for c in (self.comp, self.index) if c is not None)


class DecodeState:
    """All layers' static buffers, the segments' position tensors and the host's copy of the position.

    `position` (host int) is what the position tensors hold; `loaded_at` the position of the last
    load; `synced` is the position at which the dynamic cache last agreed with these buffers (load or
    store): store() requires the cache to be still there, so it only has to append what the steps
    added."""

    def __init__(self, layers: tuple[LayerWeights, ...], segments: list[Segment], max_context: int,
                 dtype: torch.dtype):
        if max_context < 1:
            raise ValueError(f"max_context must be at least 1, not {max_context}")
        self.max_context = max_context
        self.positions = [torch.zeros(1, dtype=torch.long, device=s.device) for s in segments]  # [1] each
        self.layers = [LayerState(layers[i], max_context, dtype, s.device, pos)
                       for s, pos in zip(segments, self.positions) for i in range(s.first_layer, s.end_layer)]
        self.position = self.synced = self.loaded_at = 0

    def load(self, cache: KvCache) -> None:
        check_context(cache.position, self.max_context, "load(cache)")
        for ls, lc in zip(self.layers, cache.layers):
            ls.load(lc, cache.position)
        for pos in self.positions:
            pos.fill_(cache.position)
        self.position = self.synced = self.loaded_at = cache.position

    def store(self, cache: KvCache) -> None:
        if cache.position != self.synced:
            raise ValueError(f"store(cache): the cache is at position {cache.position}, but these buffers were "
                             f"last loaded from / stored to position {self.synced}; load it again first")
        held = [int(p) for p in self.positions]  # host reads are fine here: store() is never captured
        if held != [self.position] * len(held):
            raise RuntimeError(f"store(cache): the segments' position tensors hold {held}, the host counted "
                               f"{self.position}: was every segment run once per note_step()?")
        for ls, lc in zip(self.layers, cache.layers):
            ls.store(lc, self.position)
        cache.position = self.synced = self.position

    @property
    def nbytes(self) -> int:
        return sum(ls.nbytes for ls in self.layers)
