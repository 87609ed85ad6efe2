"""Dense FP8 matmul on the GPU from the checkpoint's bytes: y = x @ W^T, W e4m3 with e8m0 128x128 scales.

One kernel serves decode (T = 1: a GEMV padded to BLOCK_T rows, bandwidth-bound: it reads each
weight byte once, half of what a bf16 copy would) and prefill (T in the thousands: a GEMM on the
tensor cores). Each program owns BLOCK_N output rows for BLOCK_T tokens and walks K in steps of
BLOCK_K = 128, one scale block: the weight tile is loaded as bytes (contiguous along K, so the loads
vectorize), decoded by bit operations (e4m3 -> float32 bits, the e8m0 scale -> 2^(b-127) bits),
cast to the dot dtype (exact in bf16 and fp16: 4 significant bits times a power of two) and fed to
tl.dot with float32 accumulation. Bit decoding rather than the hardware fp8 conversion keeps one
kernel for sm_80 and later and lets the interpreter run it (tests: float32 and float16).

Not generated per plan: its only shape parameters are arguments, so the runtime ships it as is
(fp8_triton_kernel.py, which imports nothing but Triton, so the tests can compile it for sm_90 and
sm_89 with any Triton, like the generated kernels).
Legend: T tokens, N output rows, K inputs, B = 128 (scale block).
"""

from __future__ import annotations

import torch
import triton

from .fp8_triton_kernel import fp8_linear_kernel
from .scale_layout import check_word_aligned

SCALE_BLOCK = 128
BLOCK_T = (16, 64)  # token rows per program: 16 (tl.dot's least) up to 16 tokens, then 64 for prefill's GEMM
NUM_WARPS = {16: 4, 64: 8}  # 64 x 64 outputs and a 64 x 128 decoded tile need 8 warps' registers (4 spill on sm_89)
BLOCK_N = 64
DOT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # activation dtype -> the dot's input dtype


def fp8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [T, K] (float32 / float16 / bfloat16) @ (q [N, K] e4m3 x scale [ceil(N/B), ceil(K/B)] e8m0)^T
    -> [T, N] in x's dtype, accumulated in float32. scale is laid out on words (scale_layout.word_aligned);
    the kernel walks its rows by its row stride."""
    T, K = x.shape
    N = q.shape[0]
    if q.shape[1] != K or scale.shape != (-(-N // SCALE_BLOCK), -(-K // SCALE_BLOCK)):
        raise ValueError(f"fp8_linear: x {tuple(x.shape)}, q {tuple(q.shape)}, scale {tuple(scale.shape)} do not match")
    if K % SCALE_BLOCK:  # DeepSeek-V4's are all multiples; the kernel walks whole blocks unmasked
        raise ValueError(f"fp8_linear: K={K} is not a multiple of {SCALE_BLOCK}")
    check_word_aligned(scale, "fp8_linear")  # the kernel reads scales as 4-byte words (scale_layout.py)
    y = torch.empty(T, N, dtype=torch.float32, device=x.device)
    bt = BLOCK_T[0] if T <= BLOCK_T[0] else BLOCK_T[1]
    grid = (triton.cdiv(T, bt), triton.cdiv(N, BLOCK_N))
    fp8_linear_kernel[grid](x.contiguous(), q.view(torch.uint8), scale.view(torch.uint8), y, T, N, K, scale.stride(0),
                            BT=bt, BN=BLOCK_N, BK=SCALE_BLOCK, DOT_DTYPE=DOT[x.dtype], num_warps=NUM_WARPS[bt])
    return y.to(x.dtype)
