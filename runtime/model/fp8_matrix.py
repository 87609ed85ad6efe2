"""Dense matrices as the checkpoint stores them: FP8 e4m3 with e8m0 128x128 block scales.

A plan whose `dense_format` is `fp8` keeps every FP8 matrix of the checkpoint so (half the bytes of
bf16: what the plan counted, and what a decode token reads), and `linear(x, w)` computes x @ W^T:
- on a GPU with the Triton block-scaled kernel (kernels/fp8_triton.py), which decodes each weight
  tile in registers;
- on the CPU at up to 4 tokens (a decode step, a speculative verify), in a plan's forward, with the plan's
  host kernel (`ost_fp8_linear`, kernels/dense_ops.py), which widens each e4m3 byte exactly as it reads
  it: a decode token reads 1 byte a weight where a bf16 plan reads 2 (`python -m ostinato.bench.fp8_linear`);
  a bf16 plan's x goes to it as bf16 (exact there), which an avx512_bf16 build multiplies with vdpbf16ps;
- otherwise on the CPU (more tokens, or a model loaded without a plan) by dequantizing a slab of W's rows
  at a time to float32 (bf16_widening.slab_product), never the whole matrix; a bf16 x on a host with bf16
  arithmetic, to bf16 (exact as well) for torch's bf16 GEMM (bf16_widening.bf16_slab_product).
Every path is the float32 sum of the dequantized weights' exact products (e4m3 x 2^k is exact in float32)
rounded once to x's dtype: an fp8 plan computes what a bf16 plan does up to summation order (in bf16, a
rounding step here and there), and in float32 what the float32 reference does.
Plain tensors (bf16 / float32 plans) go through `x @ w.T` as before, except bf16 products of many tokens on a
CPU without bf16 arithmetic (float32 a slab at a time, model/bf16_widening.py) and in a CPU decode step that
torch.compile is tracing (engine/cpu_step.py): there a small float32 matrix at one token becomes row
dots, `(x * W).sum(-1)`, which Inductor generates as a loop in its own code, fused with its neighbours.
With the rows coming from memory, as in a decode step, an aten matmul called from the compiled code took
~60 us a matrix at these sizes and the generated loop ~40 (`python -m ostinato.bench.row_dots`: the
real-vocab plan's 54 matrices, 3.2 against 2.2 ms). Larger matrices keep the matmul: the generated
loops run on one thread (cpu_step.INDUCTOR_OPTIONS), the matmul on all.

Legend: N output rows, K inputs, B = 128 (block), T tokens, G groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ostinato.checkpoint.formats import FP8_BLOCK, dequantize_fp8

from ..kernels.scale_layout import word_aligned
from .bf16_widening import NATIVE_BF16, bf16_slab_product, slab_product, widened_grouped, widened_linear, widens
from .fused import active, inductor_generates

ROW_DOT_MAX_ELEMENTS = 1 << 20  # largest matrix read as row dots in a compiled step (4 MB in float32)


@dataclass(frozen=True)
class Fp8Matrix:
    q: torch.Tensor      # [N, K] float8_e4m3fn
    scale: torch.Tensor  # [ceil(N/B), ceil(K/B)] uint8 (e8m0 bytes), rows on 4-byte words (of_bytes)

    @staticmethod
    def of_bytes(q: torch.Tensor, scale: torch.Tensor) -> Fp8Matrix:
        """The matrix with its scales laid out for the GPU kernel's word reads (kernels/scale_layout.py)."""
        return Fp8Matrix(q, word_aligned(scale))

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_fp8(self.q, self.scale, dtype)  # [N, K]

    def rows(self, start: int, end: int) -> Fp8Matrix:
        """Rows start..end-1 (block-aligned: whole scale rows)."""
        if start % FP8_BLOCK or (end % FP8_BLOCK and end != self.q.shape[0]):
            raise ValueError(f"FP8 rows {start}:{end} cut a {FP8_BLOCK}-row scale block")
        return Fp8Matrix(self.q[start:end], self.scale[start // FP8_BLOCK: -(-end // FP8_BLOCK)])

    @staticmethod
    def cat(parts: list[Fp8Matrix]) -> Fp8Matrix:
        """Rows of each part in order (every part but the last a whole number of blocks)."""
        if any(p.q.shape[0] % FP8_BLOCK for p in parts[:-1]):
            raise ValueError(f"FP8 matrices can be stacked only at {FP8_BLOCK}-row block boundaries")
        return Fp8Matrix.of_bytes(torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]))

    def to(self, device) -> Fp8Matrix:
        return Fp8Matrix.of_bytes(self.q.to(device), self.scale.to(device))


Matrix = torch.Tensor | Fp8Matrix


def linear(x: torch.Tensor, w: Matrix) -> torch.Tensor:
    """x [T, K] @ W[N, K]^T -> [T, N] in x's dtype."""
    if isinstance(w, torch.Tensor):
        if _as_row_dots(x, w):
            return (x.unsqueeze(-2) * w).sum(-1)  # [T, 1, K] * [N, K] -> [T, N]
        if widens(x, w):
            return widened_linear(x, w)
        return x @ w.T
    if on_gpu(w):
        from ..kernels.fp8_triton import fp8_linear  # Triton only where there is a GPU
        return fp8_linear(x, w.q, w.scale)
    return _on_host(x.reshape(1, -1, x.shape[-1]), w).reshape(*x.shape[:-1], w.shape[0])


def grouped_linear(x: torch.Tensor, w: Matrix) -> torch.Tensor:
    """x [G, T, K], W [G*M, K] (group g: rows g*M..(g+1)*M-1) -> [G, T, M]. Attention's wo_a product: on a
    GPU one launch of the grouped FP8 kernel for all groups (kernels/fp8_triton.fp8_grouped_linear), whose
    result is a view of [T, G*M], so the caller's transpose and reshape back to [T, G*M] copy nothing."""
    G = x.shape[0]
    if isinstance(w, Fp8Matrix) and on_gpu(w):
        from ..kernels.fp8_triton import fp8_grouped_linear  # Triton only where there is a GPU
        return fp8_grouped_linear(x, w.q, w.scale)
    if isinstance(w, Fp8Matrix):
        return _on_host(x, w)
    if widens(x, w):
        return widened_grouped(x, w)
    if _as_row_dots(x, w):
        return (x.unsqueeze(-2) * w.view(G, 1, -1, x.shape[-1])).sum(-1)  # [G, T, 1, K] * [G, 1, M, K] -> [G, T, M]
    return torch.bmm(x, w.view(G, -1, x.shape[-1]).transpose(1, 2))


def on_gpu(w: Fp8Matrix) -> bool:
    """Whether w's products run the GPU's Triton kernel (tests replace it to run that path on the CPU: in
    Triton's interpreter, or with its launches recorded)."""
    return w.q.is_cuda


def _on_host(x: torch.Tensor, w: Fp8Matrix) -> torch.Tensor:
    """x [G, T, K] @ W [G*M, K]^T by groups -> [G, T, M] in x's dtype, W as stored, on the CPU: a few tokens
    through the plan's FP8 kernel (kernels/dense_ops.py; one read of W's bytes, a decode step's case), more
    (or a model without a plan) a slab of W's rows dequantized at a time (bf16_widening.py: to float32, or to
    bf16 for a bf16 x on a host with bf16 arithmetic). Each way float32 sums of the dequantized weights' exact
    products, rounded once to x's dtype."""
    G, T, K = x.shape
    kernels = active()
    # bf16 x as it is: exact in bf16, the kernel's vdpbf16ps path takes it (float32 x, the widening path)
    xk = x if x.dtype == torch.bfloat16 else x.float()
    if kernels is not None and kernels.takes_fp8(xk, w.q, w.scale, G):
        return kernels.fp8_linear(xk.contiguous(), w.q, w.scale, G).to(x.dtype)
    M = w.shape[0] // G
    # bf16 slabs and torch's bf16 GEMM (float32 sums, rounded once) where the host has bf16 arithmetic (and the
    # plan's library decodes to bf16: one built before that keeps the float32 slabs)
    if x.dtype == torch.bfloat16 and NATIVE_BF16 and (kernels is None or kernels.dequantizes_bf16):
        product, xs = bf16_slab_product, x
    else:
        product, xs = slab_product, x.float()
    return torch.stack([product(xs[g], M, lambda r0, r1, part, o=g * M: _dequantize_rows(w, o + r0, o + r1, part,
                                                                                          kernels),
                                align=FP8_BLOCK) for g in range(G)]).to(x.dtype)


def _dequantize_rows(w: Fp8Matrix, r0: int, r1: int, out: torch.Tensor, kernels=None) -> None:
    """W's rows r0..r1-1 into out [r1 - r0, K], float32 or bf16 (exact in either: e4m3 x 2^k): with the plan's
    host library where there is one (torch's e4m3 conversion is ~18x slower), else with the checkpoint
    reader's dequantize_fp8 from the start of r0's scale block."""
    if kernels is not None and kernels.fp8_dequantize_rows(w.q, w.scale, r0, r1, out):
        return
    b0 = r0 // FP8_BLOCK * FP8_BLOCK
    out.copy_(dequantize_fp8(w.q[b0:r1], w.scale[b0 // FP8_BLOCK: -(-r1 // FP8_BLOCK)])[r0 - b0:])


def _as_row_dots(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether a compiled step reads W as row dots (module docstring): one token, float32, a small matrix."""
    return (inductor_generates() and x.shape[-2] == 1 and x.dtype == w.dtype == torch.float32
            and w.numel() <= ROW_DOT_MAX_ELEMENTS)
