"""The lightning indexer's scores in one Triton kernel (runtime/model/indexer.py `index_scores`, fused).

scores[t, w] = sum_h weight[t, h] * relu(q[t, h] . K[w]) * dI^-0.5, and -inf where w >= visible[t]
(the entry is not complete at t). torch computes this as a matmul into a [T, HI, n] float32 tensor, then
its relu, the scaled and the head-weighted copies, then the sum over heads: four or five passes of
T x HI x n x 4 bytes through GPU memory per CSA layer, where the result is only [T, n] (HI = 64 on
V4-Flash). Here each program owns BT queries x BN rows: for each head it multiplies that head's queries
by its rows of K (tl.dot: tensor cores for fp16 / bf16 q and K, whose products are exact in float32 as
torch's q.float() @ K.float() are; float32 at IEEE precision, not tf32; the rows come from the cache after
the first head) and adds the relu'd, scaled, weighted products to a [BT, BN] float32 sum in registers; it
writes only [T, n] float32, the mask applied there too. The same function as the torch path up to float32 summation
order (tests/test_triton_indexer.py), so top-k picks it the same entries but at near-ties.

Shapes depend only on the arguments' shapes and nothing waits for the GPU, so the static decode step's
CUDA graph captures the launch. Not generated per plan: its shape parameters are arguments (HI, dI
and the strides; BD the power of two that holds dI), so the runtime ships it as it is
(triton_indexer_kernel.py imports nothing but Triton: the tests compile it for sm_90 and sm_89).
Legend: T queries, HI indexer heads, dI index head dim, n rows of K (compressed entries).
"""

from __future__ import annotations

import torch
import triton

from .launch import launch
from .triton_indexer_kernel import index_scores_kernel

BLOCK_T = (16, 64)  # queries per program: 16 (tl.dot's least) for decode's few tokens, 64 for a prefill's
BLOCK_N = 64  # rows of K per program
NUM_WARPS = {16: 4, 64: 8}  # fp16 / bf16 dots, by BT; float32's IEEE dots take FLOAT32_WARPS
FLOAT32_WARPS = 8  # at 4 warps they spill registers (ptxas, Triton 3.6 and 3.9, sm_90 and sm_89)
FLOAT32_BLOCK_K = 16  # float32 dots over 16 dims at a time: 128 or 32 at once spill (ptxas, Triton 3.9)
DOT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # the dot's input dtype (0: float32, IEEE)


def block_t(T: int) -> int:
    return BLOCK_T[0] if T <= BLOCK_T[0] else BLOCK_T[1]


def block_d(dI: int) -> int:
    """The power of two (at least 16, tl.dot's least) that holds a row of dI index dims."""
    return max(16, triton.next_power_of_2(dI))


def block_k(dI: int, dot: int) -> int:
    """dI's step per tl.dot: the whole padded row for fp16 / bf16; FLOAT32_BLOCK_K for float32's IEEE dot."""
    return block_d(dI) if dot else min(FLOAT32_BLOCK_K, block_d(dI))


def dot_dtype(q: torch.Tensor, keys: torch.Tensor) -> int:
    """fp16 / bf16 when q and keys share it, else float32 (both cast in the kernel)."""
    return DOT[q.dtype] if q.dtype == keys.dtype else 0


def fused_index_scores(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor,
                       visible: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, HI, dI], weights [T, HI] float32, keys [n, dI] (q and keys float32 / fp16 / bf16), visible [T]
    integer (complete entries at each query) or None -> scores [T, n] float32, -inf where w >= visible[t]."""
    if q.dim() != 3 or weights.shape != q.shape[:2] or keys.dim() != 2 or keys.shape[1] != q.shape[2]:
        raise ValueError(f"fused_index_scores: q {tuple(q.shape)} ([T, HI, dI]), weights {tuple(weights.shape)} "
                         f"([T, HI]), keys {tuple(keys.shape)} ([n, dI]) do not match")
    if q.dtype not in DOT or keys.dtype not in DOT:
        raise ValueError(f"fused_index_scores: q is {q.dtype}, keys {keys.dtype}; the kernel takes "
                         f"{', '.join(map(str, DOT))}")
    if visible is not None and (visible.shape != (q.shape[0],) or visible.is_floating_point()):
        raise ValueError(f"fused_index_scores: visible must be [T] = [{q.shape[0]}] integers, got "
                         f"{tuple(visible.shape)} {visible.dtype}")
    T, HI, dI = q.shape
    n = keys.shape[0]
    if q.stride(2) != 1:  # a row of dI is read as one contiguous run; queries and heads by stride
        q = q.contiguous()
    if keys.stride(1) != 1:
        keys = keys.contiguous()
    weights = weights.float()
    if weights.stride(1) != 1:
        weights = weights.contiguous()
    out = torch.empty(T, n, dtype=torch.float32, device=q.device)  # [T, n]
    if T == 0 or n == 0:
        return out
    bt, dot = block_t(T), dot_dtype(q, keys)
    vis = visible.contiguous() if visible is not None else out  # not read unless MASKED
    launch(index_scores_kernel, (triton.cdiv(T, bt), triton.cdiv(n, BLOCK_N)), q, weights, keys, vis, out,
           T, n, HI, dI, q.stride(0), q.stride(1), weights.stride(0), keys.stride(0), dI ** -0.5,
           BT=bt, BN=BLOCK_N, BD=block_d(dI), BK=block_k(dI, dot), DOT_DTYPE=dot, MASKED=visible is not None,
           num_warps=NUM_WARPS[bt] if dot else FLOAT32_WARPS)
    return out
