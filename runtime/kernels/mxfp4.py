"""MXFP4 dequantization for compute: one matrix at a time, through one lookup table.

The same function as `ostinato.checkpoint.formats.dequantize_mxfp4`, bit for bit in float32 and
bfloat16: the table holds, for every (e8m0 scale byte, packed byte) pair, the byte's two e2m1 values
times the scale, computed in float32 and cast to the compute dtype, exactly as that decoder does
(255, the format's NaN scale, gives NaN). A group of 32 values is its scale byte and 16 packed bytes,
so dequantizing is one integer add (scale * 256 + byte) and one table lookup per packed byte: a few
device ops with fixed shapes and no host reads, so it can run inside the decode step.

The table (65,536 x 2 values: 512 KiB in float32) is made once per device and dtype
(`Mxfp4Table.make`), before any CUDA graph capture: a graph must not make tensors from host data.

Legend: N rows, K columns (the contraction), G = 32 (MXFP4 group).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ostinato.checkpoint.formats import FP4_VALUES, MXFP4_GROUP, e8m0_to_float


@dataclass(frozen=True)
class Mxfp4Table:
    # [256 * 256, 2] dtype: row scale_byte * 256 + packed_byte -> its two values (low nibble first)
    values: torch.Tensor

    @classmethod
    def make(cls, device: torch.device | str, dtype: torch.dtype) -> Mxfp4Table:
        byte = torch.arange(256)
        fp4 = torch.tensor(FP4_VALUES, dtype=torch.float32)
        pair = torch.stack((fp4[byte & 0xF], fp4[byte >> 4]), dim=-1)  # [256, 2]
        scale = e8m0_to_float(byte.to(torch.uint8))  # [256]
        return cls((scale[:, None, None] * pair).reshape(256 * 256, 2).to(device, dtype))


def dequantize(packed: torch.Tensor, scale: torch.Tensor, table: Mxfp4Table) -> torch.Tensor:
    """packed [..., N, K/2] int8 or uint8, scale [..., N, K/G] uint8 (e8m0 bytes) -> W [rows, K] in the
    table's dtype, rows = the product of the leading dims and N (one matrix: [N, K])."""
    groups = scale.shape[-1]
    if packed.shape[:-1] != scale.shape[:-1] or packed.shape[-1] != groups * MXFP4_GROUP // 2:
        raise ValueError(f"packed {tuple(packed.shape)} and scale {tuple(scale.shape)} do not match "
                         f"(a group of {MXFP4_GROUP} values is 1 scale byte and {MXFP4_GROUP // 2} packed bytes)")
    rows = scale.numel() // groups
    if packed.dtype != torch.uint8:  # the checkpoint's int8 (pools hold uint8: no op per call)
        packed = packed.view(torch.uint8)
    index = torch.add(packed.view(rows, groups, MXFP4_GROUP // 2), scale.view(rows, groups, 1).int(),
                      alpha=256)  # [rows, K/G, G/2] int32: scale byte * 256 + packed byte
    return F.embedding(index, table.values).view(rows, groups * MXFP4_GROUP)  # a row lookup per packed byte
