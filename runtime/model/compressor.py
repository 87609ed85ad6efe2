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
from .stored_bf16 import stored_product


@dataclass(frozen=True)
class CompressorWeights:
    wkv_gate: torch.Tensor  # [2C, D] bf16 as stored (or float32): wkv rows, then wgate rows (one product for both)
    ape: torch.Tensor       # [m, C] float32, gate bias by position in window
    norm: torch.Tensor      # [hd] float32
    ratio: int
    overlap: bool           # CSA: windows overlap by one (c = 2)

    @property
    def width(self) -> int:
        return self.norm.numel()

    @property
    def wkv(self) -> torch.Tensor:  # [C, D] view
        return self.wkv_gate[: self.wkv_gate.shape[0] // 2]

    @property
    def wgate(self) -> torch.Tensor:  # [C, D] view
        return self.wkv_gate[self.wkv_gate.shape[0] // 2:]


@dataclass(frozen=True)
class CompressorState:
    buf_kv: torch.Tensor             # [b, C] float32, b < m: projections of the incomplete window
    buf_gate: torch.Tensor           # [b, C] float32 (without ape)
    prev_kv: torch.Tensor | None     # [m, hd] CSA: first-half values of the last complete window
    prev_gate: torch.Tensor | None   # [m, hd] its gates (ape included)

    @classmethod
    def empty(cls, w: CompressorWeights, device: torch.device | str) -> CompressorState:
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
    # compressor projections run in float32 (as the reference does), from the rows as stored
    new_kv, new_gate = stored_product(x, w.wkv_gate).chunk(2, dim=-1)  # [T, C] each
    kv = torch.cat((state.buf_kv, new_kv))  # [b+T, C]
    gate = torch.cat((state.buf_gate, new_gate))  # [b+T, C]
    usable = kv.shape[0] // m * m
    n = usable // m
    rest = (kv[usable:].clone(), gate[usable:].clone())  # clone: do not pin the whole chunk in the state
    if n == 0:
        return kv.new_zeros(0, hd), CompressorState(*rest, state.prev_kv, state.prev_gate)
    ck = kv[:usable].view(n, m, -1)  # [n, m, C]
    cg = gate[:usable].view(n, m, -1) + w.ape  # [n, m, C]
    if w.overlap:  # slots 0..m-1: the previous window's first half channels; m..2m-1: this one's second half
        first_kv, first_gate = ck[..., :hd], cg[..., :hd]  # [n, m, hd] each window's first half
        if state.prev_kv is None:  # no previous window: values 0, gates -inf (weight 0)
            prev_kv, prev_gate = ck.new_zeros(1, m, hd), cg.new_full((1, m, hd), float("-inf"))
        else:
            prev_kv, prev_gate = state.prev_kv[None], state.prev_gate[None]  # [1, m, hd]
        slots_kv = torch.cat((torch.cat((prev_kv, first_kv[:-1])), ck[..., hd:]), dim=1)  # [n, 2m, hd]
        slots_gate = torch.cat((torch.cat((prev_gate, first_gate[:-1])), cg[..., hd:]), dim=1)
        new_state = CompressorState(*rest, first_kv[-1].clone(), first_gate[-1].clone())
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
