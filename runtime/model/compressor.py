"""The KV compressor of CSA and HCA layers (and of the CSA indexer), incremental (docs/model.md section 3.4).

Every complete window of m tokens (window w = positions [w*m, (w+1)*m)) becomes one entry: a softmax
over the window's tokens (per channel) of gates z = x Wg + ape[pos mod m] weights the values
a = x Wkv. CSA (m = 4) overlaps windows: entry w pools window w's second half-channels together with
window w-1's first half-channels (8 slots). The entry is rms-normed and rotated at position w*m.

Incremental state (constant size, `CompressorState`): the projections of the incomplete window
(< m tokens) and, for CSA, the first-half channels and gates of the last complete window. Feeding a
sequence in any chunking produces the same entries as feeding it whole. State tensors are replaced,
never written in place, so a snapshot may hold references to them.

Legend: T new tokens, m ratio, C = c * hd projection width (c = 2 overlapped, 1 not), hd entry width,
n complete windows in this call, D hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .norms import rms_norm
from .rope import Rope, apply_rope


@dataclass(frozen=True)
class CompressorWeights:
    wkv: torch.Tensor    # [C, D] float32
    wgate: torch.Tensor  # [C, D] float32
    ape: torch.Tensor    # [m, C] float32, gate bias by position in window
    norm: torch.Tensor   # [hd] float32
    ratio: int
    overlap: bool        # CSA: windows overlap by one (c = 2)

    @property
    def width(self) -> int:
        return self.norm.numel()


@dataclass(frozen=True)
class CompressorState:
    buf_kv: torch.Tensor             # [b, C] float32, b < m: projections of the incomplete window
    buf_gate: torch.Tensor           # [b, C] float32 (without ape)
    prev_kv: torch.Tensor | None     # [m, hd] CSA: first-half values of the last complete window
    prev_gate: torch.Tensor | None   # [m, hd] its gates (ape included)

    @classmethod
    def empty(cls, w: CompressorWeights, device: torch.device | str) -> "CompressorState":
        z = torch.zeros(0, w.wkv.shape[0], dtype=torch.float32, device=device)
        return cls(z, z, None, None)

    @property
    def nbytes(self) -> int:
        ts = [self.buf_kv, self.buf_gate, self.prev_kv, self.prev_gate]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


def compress(w: CompressorWeights, x: torch.Tensor, state: CompressorState, n_done: int, rope: Rope,
             eps: float) -> tuple[torch.Tensor, CompressorState]:
    """x [T, D] (new tokens) on top of `state` with `n_done` entries already emitted
    -> (new entries [n, hd] float32, new state)."""
    m, hd = w.ratio, w.width
    xf = x.float()  # compressor projections run in float32 (as the reference does)
    kv = torch.cat((state.buf_kv, xf @ w.wkv.T))  # [b+T, C]
    gate = torch.cat((state.buf_gate, xf @ w.wgate.T))  # [b+T, C]
    usable = kv.shape[0] // m * m
    n = usable // m
    rest = (kv[usable:].clone(), gate[usable:].clone())  # clone: do not pin the whole chunk in the state
    if n == 0:
        return kv.new_zeros(0, hd), CompressorState(*rest, state.prev_kv, state.prev_gate)
    ck = kv[:usable].view(n, m, -1)  # [n, m, C]
    cg = gate[:usable].view(n, m, -1) + w.ape  # [n, m, C]
    if w.overlap:
        slots_kv = ck.new_zeros(n, 2 * m, hd)  # [n, 2m, hd]: slots 0..m-1 = previous window's first half
        slots_gate = cg.new_full((n, 2 * m, hd), float("-inf"))  # absent previous window: weight 0
        slots_kv[:, m:] = ck[..., hd:]
        slots_gate[:, m:] = cg[..., hd:]
        slots_kv[1:, :m] = ck[:-1, :, :hd]
        slots_gate[1:, :m] = cg[:-1, :, :hd]
        if state.prev_kv is not None:
            slots_kv[0, :m] = state.prev_kv
            slots_gate[0, :m] = state.prev_gate
        new_state = CompressorState(*rest, ck[-1, :, :hd].clone(), cg[-1, :, :hd].clone())
    else:
        slots_kv, slots_gate = ck, cg  # [n, m, hd]
        new_state = CompressorState(*rest, None, None)
    positions = (torch.arange(n, device=x.device) + n_done) * m  # [n] each entry sits at its window start
    return pool_entries(w, slots_kv, slots_gate, positions, rope, eps), new_state


def pool_entries(w: CompressorWeights, slots_kv: torch.Tensor, slots_gate: torch.Tensor, positions: torch.Tensor,
                 rope: Rope, eps: float) -> torch.Tensor:
    """Slots [n, s, hd] (values, gates with ape) -> entries [n, hd] float32: gate-softmax pooling over the
    s slots per channel, rms norm, rope at the windows' start `positions` [n]."""
    pooled = (slots_kv * slots_gate.softmax(dim=1)).sum(dim=1)  # [n, hd]
    pooled = rms_norm(pooled, w.norm, eps)
    cos, sin = rope.cos_sin(positions)
    return apply_rope(pooled, cos, sin)
