"""Dense FP8 matmul on the GPU from the checkpoint's bytes: y = x @ W^T, W e4m3 with e8m0 128x128 scales.

One kernel serves decode (T <= 16: a GEMV padded to BLOCK_T rows, bandwidth-bound: it reads each
weight byte once, half of what a bf16 copy would) and prefill (T in the thousands: a GEMM on the
tensor cores). Each program owns BN output rows for BT tokens and one run of K, and walks it in steps
of BK = 128, one scale block: the weight tile is loaded as bytes (contiguous along K, so the loads
vectorize), decoded by bit operations (e4m3 -> float32 bits, the e8m0 scale -> 2^(b-127) bits),
cast to the dot dtype (exact in bf16 and fp16: 4 significant bits times a power of two) and fed to
tl.dot with float32 accumulation. Bit decoding rather than the hardware fp8 conversion keeps one
kernel for sm_80 and later and lets the interpreter run it (tests: float32 and float16).

Tiling (`tiling`, a pure function of T, N, K and the GPU's SM count): prefill keeps 64 x 64 tiles
over all of K, whose grid is already thousands of programs. A decode token's grid of 64-row tiles
is N / 64 programs: 8 to 64 for most of V4-Flash's matrices against an H200's 132 SMs, too few to
keep enough loads in flight to reach HBM bandwidth. So decode asks for PROGRAMS_PER_SM programs per
SM, first with narrower row tiles (64 -> 32 -> 16; 16 is tl.dot's least), then by splitting K into
SPLIT_K runs of whole blocks (grid axis 2). Splits are deterministic, with no atomics: split s
writes its float32 partial sums to slice s of a [SPLIT_K, T, N] buffer and the launcher adds the
slices with one torch sum, in the same order on every call; the result is the unsplit one up to
float32 rounding. Shapes depend only on the arguments' shapes, and nothing waits for the GPU, so a
CUDA graph captures the call.

Not generated per plan: its only shape parameters are arguments, so the runtime ships it as is
(fp8_triton_kernel.py, which imports nothing but Triton, so the tests can compile it for sm_90 and
sm_89 with any Triton, like the generated kernels).
Legend: T tokens, N output rows, K inputs, B = 128 (scale block), KB = K / B, S = SPLIT_K.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import torch
import triton

from .fp8_triton_kernel import fp8_linear_kernel
from .launch import launch
from .scale_layout import check_word_aligned

SCALE_BLOCK = 128
BLOCK_T = (16, 64)  # token rows per program: 16 (tl.dot's least) up to 16 tokens, then 64 for prefill's GEMM
NUM_WARPS = {16: 4, 64: 8}  # 64 x 64 outputs and a 64 x 128 decoded tile need 8 warps' registers (4 spill on sm_89)
BLOCK_N = (64, 32, 16)  # output rows per program, widest first; decode narrows them to fill the GPU
PROGRAMS_PER_SM = 2  # decode's target: enough programs that every SM streams weights, with a second to hide latency
CPU_SMS = 132  # an H200's SM count, assumed on the CPU, so the interpreter runs the tiling an H200 decode gets
DOT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # activation dtype -> the dot's input dtype


@dataclass(frozen=True)
class Tiling:
    """One call's launch: BT tokens x BN rows per program, K cut into SPLIT_K runs of whole blocks."""

    BT: int
    BN: int
    SPLIT_K: int = 1

    def grid(self, T: int, N: int) -> tuple[int, int, int]:
        return triton.cdiv(T, self.BT), triton.cdiv(N, self.BN), self.SPLIT_K

    def programs(self, T: int, N: int) -> int:
        return math.prod(self.grid(T, N))

    @property
    def num_warps(self) -> int:
        return NUM_WARPS[self.BT]


# Every tile `tiling` picks, as compiled variants (tests compile each for sm_90 and sm_89); SPLIT_K is a grid axis.
TILES = tuple(Tiling(BLOCK_T[0], bn) for bn in BLOCK_N) + (Tiling(BLOCK_T[1], BLOCK_N[0]),)


def tiling(T: int, N: int, K: int, sms: int) -> Tiling:
    """The tiling of x [T, K] @ W[N, K]^T on a GPU with `sms` SMs. Prefill (T > 16): 64 x 64, unsplit.
    Decode (T <= 16, one token block): the widest row tile whose grid reaches PROGRAMS_PER_SM x sms
    programs, else 16 rows with K split into just enough runs to reach it (at most KB: one block each)."""
    if T > BLOCK_T[0]:
        return Tiling(BLOCK_T[1], BLOCK_N[0])
    target = PROGRAMS_PER_SM * sms
    bn = next((b for b in BLOCK_N if triton.cdiv(N, b) >= target), BLOCK_N[-1])
    split = min(K // SCALE_BLOCK, triton.cdiv(target, triton.cdiv(N, bn)))
    return Tiling(BLOCK_T[0], bn, max(split, 1))


@cache
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """The SMs of the GPU `device` is (queried once per GPU), or CPU_SMS on the CPU (the interpreter)."""
    if device.type != "cuda":
        return CPU_SMS
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())


def fp8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [T, K] (float32 / float16 / bfloat16) @ (q [N, K] e4m3 x scale [ceil(N/B), ceil(K/B)] e8m0)^T
    -> [T, N] in x's dtype, accumulated in float32. scale is laid out on words (scale_layout.word_aligned);
    the kernel walks its rows by its row stride."""
    T, K = x.shape
    return fp8_linear_tiled(x, q, scale, tiling(T, q.shape[0], K, sm_count(x.device)))


def fp8_linear_tiled(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, tile: Tiling) -> torch.Tensor:
    """fp8_linear with the tiling given (tests run every tiling at small shapes)."""
    T, K = x.shape
    N = q.shape[0]
    if q.shape[1] != K or scale.shape != (-(-N // SCALE_BLOCK), -(-K // SCALE_BLOCK)):
        raise ValueError(f"fp8_linear: x {tuple(x.shape)}, q {tuple(q.shape)}, scale {tuple(scale.shape)} do not match")
    if K % SCALE_BLOCK:  # DeepSeek-V4's are all multiples; the kernel walks whole blocks unmasked
        raise ValueError(f"fp8_linear: K={K} is not a multiple of {SCALE_BLOCK}")
    check_word_aligned(scale, "fp8_linear")  # the kernel reads scales as 4-byte words (scale_layout.py)
    partial = torch.empty(tile.SPLIT_K, T, N, dtype=torch.float32, device=x.device)  # [S, T, N]
    launch(fp8_linear_kernel, tile.grid(T, N), x.contiguous(), q.view(torch.uint8), scale.view(torch.uint8), partial,
           T, N, K, scale.stride(0), BT=tile.BT, BN=tile.BN, BK=SCALE_BLOCK, DOT_DTYPE=DOT[x.dtype],
           num_warps=tile.num_warps)
    y = partial[0] if tile.SPLIT_K == 1 else partial.sum(0)  # [T, N]: the splits added in a fixed order
    return y.to(x.dtype)
