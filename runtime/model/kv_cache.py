"""Per-session KV state of DeepSeek-V4 (docs/model.md section 4), built for agent sessions.

Per layer:
- window: the last W-1 key(=value) rows (sliding branch; constant size; the current token is the W-th);
- rows / index_rows: compressed entries and CSA indexer keys, one per complete window (grow with
  context: hd / m and dI / m values per token);
- comp / index_comp: the compressors' partial-window state (constant size, compressor.py).

Constant-size state is immutable (every update builds new tensors), so a snapshot of it is a set of
references plus the row counts; the growing rows are append-only buffers owned by the cache, and
rows below a snapshot's count are never rewritten while that snapshot is kept. This is what makes
truncation cheap: see Session.truncate.

Legend: W sliding_window, hd head_dim, dI index_head_dim, n rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .compressor import CompressorState


def rows_capacity(max_context: int, ratio: int) -> int:
    """Rows a compressor needs for positions < max_context, the incomplete last window included."""
    return -(-max_context // ratio)


class GrowingRows:
    """An append-only [n, width] buffer with doubling capacity (decode appends one row per window).
    `limit`: the rows a planned context needs; doubling stops there, so a session filled to the plan's
    context holds what the plan counted, not up to twice that (it still grows past it on demand)."""

    def __init__(self, width: int, dtype: torch.dtype, device: torch.device | str, capacity: int = 64,
                 limit: int | None = None):
        self.limit = limit
        self._buf = torch.empty(capacity if limit is None else min(capacity, limit), width, dtype=dtype,
                                device=device)
        self.n = 0

    def view(self) -> torch.Tensor:
        return self._buf[:self.n]  # [n, width]

    def append(self, rows: torch.Tensor) -> None:
        need = self.n + rows.shape[0]
        if need > self._buf.shape[0]:
            double = 2 * self._buf.shape[0]
            if self.limit is not None and need <= self.limit:
                double = min(double, self.limit)
            grown = torch.empty(max(need, double), self._buf.shape[1], dtype=self._buf.dtype, device=self._buf.device)
            grown[:self.n] = self._buf[:self.n]
            self._buf = grown
        self._buf[self.n:need] = rows.to(self._buf.dtype)
        self.n = need

    def truncate(self, n: int) -> None:
        assert 0 <= n <= self.n, (n, self.n)
        self.n = n

    def clone(self) -> GrowingRows:
        other = GrowingRows.__new__(GrowingRows)
        other._buf, other.n, other.limit = self._buf.clone(), self.n, self.limit
        return other

    @property
    def nbytes(self) -> int:
        return self.n * self._buf.shape[1] * self._buf.element_size()


@dataclass(frozen=True)
class LayerSnapshot:
    window: torch.Tensor
    comp: CompressorState | None
    index_comp: CompressorState | None
    n_rows: int
    n_index_rows: int


class LayerCache:
    def __init__(self, window: torch.Tensor, comp: CompressorState | None, rows: GrowingRows | None,
                 index_comp: CompressorState | None, index_rows: GrowingRows | None):
        self.window = window          # [<= W-1, hd] compute dtype, roped
        self.comp = comp
        self.rows = rows              # compressed entries [n, hd]
        self.index_comp = index_comp
        self.index_rows = index_rows  # indexer keys [n, dI]

    def snapshot(self) -> LayerSnapshot:
        return LayerSnapshot(self.window, self.comp, self.index_comp, self.rows.n if self.rows else 0,
                             self.index_rows.n if self.index_rows else 0)

    def restore(self, s: LayerSnapshot) -> None:
        self.window, self.comp, self.index_comp = s.window, s.comp, s.index_comp
        if self.rows is not None:
            self.rows.truncate(s.n_rows)
        if self.index_rows is not None:
            self.index_rows.truncate(s.n_index_rows)

    def clone(self) -> LayerCache:
        return LayerCache(self.window, self.comp, self.rows.clone() if self.rows else None, self.index_comp,
                          self.index_rows.clone() if self.index_rows else None)

    @property
    def nbytes_growing(self) -> int:
        return sum(r.nbytes for r in (self.rows, self.index_rows) if r is not None)

    @property
    def nbytes_constant(self) -> int:
        return (self.window.numel() * self.window.element_size()
                + sum(c.nbytes for c in (self.comp, self.index_comp) if c is not None))


@dataclass(frozen=True)
class CacheSnapshot:
    """The whole cache state after `position` tokens (constant size plus row counts)."""

    position: int
    layers: tuple[LayerSnapshot, ...]


class KvCache:
    def __init__(self, layers: list[LayerCache]):
        self.layers = layers
        self.position = 0  # tokens processed so far

    def snapshot(self) -> CacheSnapshot:
        return CacheSnapshot(self.position, tuple(layer.snapshot() for layer in self.layers))

    def restore(self, s: CacheSnapshot) -> None:
        for layer, ls in zip(self.layers, s.layers):
            layer.restore(ls)
        self.position = s.position

    def clone(self) -> KvCache:
        other = KvCache([layer.clone() for layer in self.layers])
        other.position = self.position
        return other

    @property
    def nbytes(self) -> dict[str, int]:
        return {"constant": sum(layer.nbytes_constant for layer in self.layers),
                "growing": sum(layer.nbytes_growing for layer in self.layers)}
