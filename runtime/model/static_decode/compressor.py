"""The compressor's step at a fixed shape (static twin of ../compressor.py), for T new tokens.

T tokens at positions p .. p+T-1 (p a device tensor) touch the windows w0 = p // m onwards, at most
nW = (m + T - 2) // m + 1 of them (a static count: T consecutive positions span either ceil(T/m)
windows or one more). The step lays those windows out as nW * m slots, each filled from the window
buffer (the b = p mod m tokens of window w0 buffered before the step), from the new tokens, or, past
the last one, from a zero row; computes every window's entry and writes it to its row
unconditionally. Only rows below (p+T) // m are ever visible, so an incomplete window's row holds a
harmless provisional entry (computed from finite stale or zero slots) until the step completing the
window overwrites it with the real one. The last of the nW windows may lie wholly after the new
tokens; its row may then be one past the buffer (at the end of the context), so it is written
first, clamped to the last row, and the real windows are written after it.

The window buffer keeps the last min(T, m) new tokens' projections (slot = position mod m): what
the next step needs of the incomplete window. For overlapped (CSA) compressors prev_kv / prev_gate
become the first halves of the last complete window when the step completed one (torch.where on a
device flag: no branch on data). T = 1 is the decode step, which has its own shorter path: it runs
on every generated token.

Legend: m ratio, C projection width, width entry width, D hidden, R rows capacity, T new tokens,
nW windows touched.
"""

from __future__ import annotations

import torch

from ..compressor import CompressorWeights, pool_entries
from ..rope import Rope
from ..stored_bf16 import stored_product
from .state import CompressorBuffers


def windows_touched(tokens: int, ratio: int) -> int:
    """The most windows of `ratio` positions that `tokens` consecutive positions can touch."""
    return (ratio + tokens - 2) // ratio + 1


def compressor_step(w: CompressorWeights, buf: CompressorBuffers, x: torch.Tensor, positions: torch.Tensor,
                    rope: Rope, eps: float) -> None:
    """x [T, D] at consecutive positions [T] int64: update buf's window slots, entry rows, (CSA) prev state."""
    m, width, t = w.ratio, w.width, x.shape[0]
    if t == 1:
        return _decode_step(w, buf, x, positions, rope, eps)
    n_win = windows_touched(t, m)
    first = positions[:1]  # [1]
    buffered, w0 = first % m, first // m  # [1] each
    new_kv, new_gate = stored_product(x, w.wkv_gate).chunk(2, dim=-1)  # [T, C] each: both projections in one matmul
    # Slot j of the touched windows (position w0*m + j): buffered if j < b, else new token j - b, or the
    # zero row past the new tokens. Sources: [buffer (m) ; new (T) ; zero (1)].
    j = torch.arange(n_win * m, device=x.device)  # [nW*m]
    src = torch.where(j < buffered, j, (j - buffered + m).clamp(max=m + t))  # [nW*m]
    zero = new_kv.new_zeros(1, new_kv.shape[1])  # [1, C]
    kv = torch.cat((buf.kv, new_kv, zero)).index_select(0, src).view(n_win, m, -1)  # [nW, m, C]
    gate = torch.cat((buf.gate, new_gate, zero)).index_select(0, src).view(n_win, m, -1) + w.ape
    if w.overlap:  # slots 0..m-1: the previous window's first half; m..2m-1: this window's second half
        first_kv, first_gate = kv[..., :width], gate[..., :width]  # [nW, m, width]
        slots_kv = torch.cat((torch.cat((buf.prev_kv[None], first_kv[:-1])), kv[..., width:]), dim=1)  # [nW, 2m, width]
        slots_gate = torch.cat((torch.cat((buf.prev_gate[None], first_gate[:-1])), gate[..., width:]), dim=1)
    else:
        slots_kv, slots_gate = kv, gate  # [nW, m, width]
    rows = w0 + torch.arange(n_win, device=x.device)  # [nW] the windows' rows
    entries = pool_entries(w, slots_kv, slots_gate, rows * m, rope, eps).to(buf.rows.dtype)  # [nW, width]
    buf.rows.index_copy_(0, rows[-1:].clamp(max=buf.rows.shape[0] - 1), entries[-1:])
    if n_win > 1:
        buf.rows.index_copy_(0, rows[:-1], entries[:-1])
    keep = min(t, m)  # the next step's buffered tokens are among the last min(T, m)
    slots = positions[t - keep:] % m  # [keep] distinct
    buf.kv.index_copy_(0, slots, new_kv[t - keep:])
    buf.gate.index_copy_(0, slots, new_gate[t - keep:])
    if w.overlap:
        last = (first + t) // m - 1 - w0  # [1] the last complete window, among the touched ones (-1: none)
        done = (last >= 0).view(1, 1)  # [1, 1] the step completed a window
        pick = last.clamp(min=0)
        buf.prev_kv.copy_(torch.where(done, first_kv.index_select(0, pick)[0], buf.prev_kv))  # [m, width]
        buf.prev_gate.copy_(torch.where(done, first_gate.index_select(0, pick)[0], buf.prev_gate))


def _decode_step(w: CompressorWeights, buf: CompressorBuffers, x: torch.Tensor, pos: torch.Tensor, rope: Rope,
                 eps: float) -> None:
    """T = 1, the decode step's path (half the ops of the general one, on every token): the token goes to
    slot p mod m first, then its window's entry is computed from the whole buffer in slot order."""
    m, width = w.ratio, w.width
    slot = pos % m  # [1]
    new_kv, new_gate = stored_product(x, w.wkv_gate).chunk(2, dim=-1)  # [1, C] each
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
