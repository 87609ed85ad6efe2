"""The compressor's decode step at a fixed shape (static twin of ../compressor.py).

One token at position p (a device tensor): its projections go to slot p mod m of the window
buffers; the entry of its window w = p // m is computed every step from the whole buffer and written
to row w unconditionally. Only rows below (p+1) // m are ever visible, so while the window is
incomplete its row holds a harmless provisional entry (computed from stale, finite slots), which the
step completing the window overwrites with the real one. For overlapped (CSA) compressors the
completing step also replaces prev_kv / prev_gate (torch.where on `complete`: no branch on data).

Legend: m ratio, C projection width, width entry width, D hidden, R rows capacity.
"""

from __future__ import annotations

import torch

from ..compressor import CompressorWeights, pool_entries
from ..rope import Rope
from .state import CompressorBuffers


def compressor_step(w: CompressorWeights, buf: CompressorBuffers, x: torch.Tensor, pos: torch.Tensor, rope: Rope,
                    eps: float) -> None:
    """x [1, D] at position pos [1] int64: update buf's window slots, its entry row and (CSA) prev state."""
    m, width = w.ratio, w.width
    xf = x.float()  # projections in float32, as the dynamic compressor
    slot = pos % m  # [1]
    new_kv, new_gate = (xf @ w.wkv_gate.T).chunk(2, dim=-1)  # [1, C] each: both projections in one matmul
    buf.kv.index_copy_(0, slot, new_kv)  # [m, C]
    buf.gate.index_copy_(0, slot, new_gate)  # [m, C]
    kv, gate = buf.kv.unsqueeze(0), (buf.gate + w.ape).unsqueeze(0)  # [1, m, C] the window in slot order
    if w.overlap:  # slots 0..m-1: the previous window's first half; m..2m-1: this window's second half
        slots_kv = torch.cat((buf.prev_kv.unsqueeze(0), kv[..., width:]), dim=1)  # [1, 2m, width]
        slots_gate = torch.cat((buf.prev_gate.unsqueeze(0), gate[..., width:]), dim=1)
    else:
        slots_kv, slots_gate = kv, gate  # [1, m, width]
    row = pos // m  # [1]
    entry = pool_entries(w, slots_kv, slots_gate, row * m, rope, eps)  # [1, width] float32
    buf.rows.index_copy_(0, row, entry.to(buf.rows.dtype))
    if w.overlap:
        complete = slot == m - 1  # [1] bool: this token closes its window
        buf.prev_kv.copy_(torch.where(complete, kv[0, :, :width], buf.prev_kv))  # [m, width]
        buf.prev_gate.copy_(torch.where(complete, gate[0, :, :width], buf.prev_gate))
