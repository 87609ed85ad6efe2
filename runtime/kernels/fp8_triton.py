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
SPLIT_K runs of whole blocks (grid axis 2).

Besides its weight bytes, what a decode product costs is its kernels: each is a node of the step's
CUDA graph with its own launch and tail, however little it computes. So the kernel rounds its float32
sums once to x's dtype and stores them itself, and a product is one launch; with K split, split s
writes its float32 partial sums to slice s of a [SPLIT_K, T, N] buffer and one more kernel
(fp8_split_sum_kernel) adds the slices in a fixed order and rounds once: two launches, never a torch
sum and a cast after them. Deterministic, no atomics: the result is the unsplit one up to float32
rounding. A grouped product (`fp8_grouped_linear`: wo_a, whose G groups of M rows each read their own
slice of the heads, DSV4.md) is one launch too: the groups' row tiles share grid axis 1, each program
reads its group's x through strides (the caller's transposed view, no copy), and y is written
[T, G*M], so the caller's `z.transpose(0, 1).reshape(T, -1)` is a view.
Shapes depend only on the arguments' shapes, and nothing waits for the GPU, so a CUDA graph
captures the call.

Not generated per plan: its only shape parameters are arguments, so the runtime ships it as is
(fp8_triton_kernel.py, which imports nothing but Triton, so the tests can compile it for sm_90 and
sm_89 with any Triton, like the generated kernels).
Legend: T tokens, N output rows, K inputs, B = 128 (scale block), KB = K / B, S = SPLIT_K, G groups,
M = N / G rows a group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import torch
import triton

from .fp8_triton_kernel import fp8_linear_kernel, fp8_split_sum_kernel
from .launch import launch
from .scale_layout import check_word_aligned

SCALE_BLOCK = 128
BLOCK_T = (16, 64)  # token rows per program: 16 (tl.dot's least) up to 16 tokens, then 64 for prefill's GEMM
NUM_WARPS = {16: 4, 64: 8}  # 64 x 64 outputs and a 64 x 128 decoded tile need 8 warps' registers (4 spill on sm_89)
BLOCK_N = (64, 32, 16)  # output rows per program, widest first; decode narrows them to fill the GPU
PROGRAMS_PER_SM = 2  # decode's target: enough programs that every SM streams weights, with a second to hide latency
CPU_SMS = 132  # an H200's SM count, assumed on the CPU, so the interpreter runs the tiling an H200 decode gets
DOT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # activation dtype -> the dot's input dtype
SPLIT_SUM_BLOCK, SPLIT_SUM_WARPS = 1024, 4  # fp8_split_sum_kernel: 8 outputs a thread, two 16-byte loads a split


@dataclass(frozen=True)
class Tiling:
    """One call's launch: BT tokens x BN rows per program, K cut into SPLIT_K runs of whole blocks."""

    BT: int
    BN: int
    SPLIT_K: int = 1

    def grid(self, T: int, N: int, groups: int = 1) -> tuple[int, int, int]:
        """(token tiles, row tiles of all `groups` groups of N / groups rows, K runs)."""
        return triton.cdiv(T, self.BT), groups * triton.cdiv(N // groups, self.BN), self.SPLIT_K

    def programs(self, T: int, N: int, groups: int = 1) -> int:
        return math.prod(self.grid(T, N, groups))

    @property
    def num_warps(self) -> int:
        return NUM_WARPS[self.BT]


# Every tile `tiling` picks, as compiled variants (tests compile each for sm_90 and sm_89); SPLIT_K is a grid axis.
TILES = tuple(Tiling(BLOCK_T[0], bn) for bn in BLOCK_N) + (Tiling(BLOCK_T[1], BLOCK_N[0]),)


def tiling(T: int, N: int, K: int, sms: int, groups: int = 1) -> Tiling:
    """The tiling of x [T, K] @ W[N, K]^T (or of `groups` groups of N / groups rows, each its own x) on a GPU
    with `sms` SMs. Prefill (T > 16): 64 x 64, unsplit. Decode (T <= 16, one token block): the widest row
    tile whose grid reaches PROGRAMS_PER_SM x sms programs, else 16 rows with K split into just enough runs
    to reach it (at most KB: one block each)."""
    if T > BLOCK_T[0]:
        return Tiling(BLOCK_T[1], BLOCK_N[0])
    target = PROGRAMS_PER_SM * sms
    row_tiles = {b: groups * triton.cdiv(N // groups, b) for b in BLOCK_N}
    bn = next((b for b in BLOCK_N if row_tiles[b] >= target), BLOCK_N[-1])
    split = min(K // SCALE_BLOCK, triton.cdiv(target, row_tiles[bn]))
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


def fp8_grouped_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [G, T, K] (any strides along G and T) with group g times rows g*M..(g+1)*M-1 of the FP8 matrix
    q [G*M, K] (scale as fp8_linear's) -> [G, T, M] in x's dtype: one launch for every group (wo_a's
    product). The result is a view of a [T, G*M] tensor, so transpose(0, 1).reshape(T, G*M) copies nothing."""
    G, T, K = x.shape
    return fp8_grouped_linear_tiled(x, q, scale, tiling(T, q.shape[0], K, sm_count(x.device), G))


def fp8_linear_tiled(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, tile: Tiling) -> torch.Tensor:
    """fp8_linear with the tiling given (tests run every tiling at small shapes)."""
    if x.dim() != 2:
        raise ValueError(f"fp8_linear: x must be [T, K], got {tuple(x.shape)}")
    return _product(x.unsqueeze(0), q, scale, tile)  # [T, N]


def fp8_grouped_linear_tiled(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, tile: Tiling) -> torch.Tensor:
    """fp8_grouped_linear with the tiling given."""
    if x.dim() != 3:
        raise ValueError(f"fp8_grouped_linear: x must be [G, T, K], got {tuple(x.shape)}")
    G, T, _ = x.shape
    return _product(x, q, scale, tile).view(T, G, -1).transpose(0, 1)  # [T, G*M] -> [G, T, M], a view


def _product(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, tile: Tiling) -> torch.Tensor:
    """x [G, T, K] by groups of q's rows -> y [T, N] (N = G*M; group g's outputs are columns g*M..) in x's dtype:
    one launch, or two with K split (float32 partials [S, T, N], then their fixed-order sum, rounded once)."""
    G, T, K = x.shape
    N = q.shape[0]
    if q.shape[1] != K or N % G or scale.shape != (-(-N // SCALE_BLOCK), -(-K // SCALE_BLOCK)):
        raise ValueError(f"fp8_linear: x {tuple(x.shape)} ([groups, tokens, inputs]), q {tuple(q.shape)}, "
                         f"scale {tuple(scale.shape)} do not match")
    if K % SCALE_BLOCK:  # DeepSeek-V4's are all multiples; the kernel walks whole blocks unmasked
        raise ValueError(f"fp8_linear: K={K} is not a multiple of {SCALE_BLOCK}")
    if x.dtype not in DOT:
        raise ValueError(f"fp8_linear: x is {x.dtype}; the kernel takes {', '.join(map(str, DOT))}")
    check_word_aligned(scale, "fp8_linear")  # the kernel reads scales as 4-byte words (scale_layout.py)
    if x.stride(2) != 1:  # rows are read as contiguous runs of K (vector loads); groups and tokens by stride
        x = x.contiguous()
    y = torch.empty(T, N, dtype=x.dtype, device=x.device)  # [T, N]
    out = y if tile.SPLIT_K == 1 else torch.empty(tile.SPLIT_K, T, N, dtype=torch.float32, device=x.device)
    launch(fp8_linear_kernel, tile.grid(T, N, G), x, q.view(torch.uint8), scale.view(torch.uint8), out,
           T, N, K, scale.stride(0), N // G, x.stride(0), x.stride(1), BT=tile.BT, BN=tile.BN, BK=SCALE_BLOCK,
           DOT_DTYPE=DOT[x.dtype], num_warps=tile.num_warps)
    if tile.SPLIT_K > 1:  # [S, T, N] float32 -> y [T, N]: the splits added in a fixed order, rounded once
        launch(fp8_split_sum_kernel, (triton.cdiv(T * N, SPLIT_SUM_BLOCK),), out, y, T * N, tile.SPLIT_K,
               BLOCK=SPLIT_SUM_BLOCK, num_warps=SPLIT_SUM_WARPS)
    return y
