"""The Triton kernel of triton_indexer.py (which documents it), alone: it imports nothing but Triton, so a
Python with only Triton (tools/triton_compile_check.py, the pinned build/triton-3.6) compiles it."""

import triton
import triton.language as tl


@triton.jit
def index_scores_kernel(q_ptr, w_ptr, k_ptr, vis_ptr, out_ptr, T, N, HI, DI, Q_T, Q_H, W_T, K_N, SCALE,
                        BT: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr,
                        DOT_DTYPE: tl.constexpr, MASKED: tl.constexpr):
    # program (i, j): queries i*BT.., rows j*BN..; out[t, w] = sum_h weight[t, h] * (relu(q[t, h] . K[w]) * SCALE),
    # -inf where w >= visible[t] (MASKED); the [BT, BN] sum stays in registers over all HI heads
    t = tl.program_id(0) * BT + tl.arange(0, BT)  # [BT] queries
    n = tl.program_id(1) * BN + tl.arange(0, BN)  # [BN] rows of K
    tmask, nmask = t < T, n < N
    q_rows = q_ptr + t[:, None].to(tl.int64) * Q_T  # [BT, 1] pointers to head 0
    k_rows = k_ptr + n[:, None].to(tl.int64) * K_N  # [BN, 1]
    w_rows = w_ptr + t.to(tl.int64) * W_T  # [BT]
    acc = tl.zeros((BT, BN), tl.float32)
    for h in range(HI):
        dot = tl.zeros((BT, BN), tl.float32)
        # dI (padded to BD, a power of two) in steps of BK: all of it for fp16 / bf16; 16 for float32, whose
        # IEEE dot runs on the CUDA cores and spills registers over all 128 dims at once
        for d0 in tl.static_range(0, BD, BK):
            d = d0 + tl.arange(0, BK)  # [BK]
            dmask = d < DI
            keys = tl.load(k_rows + d[None, :], mask=nmask[:, None] & dmask[None, :], other=0.0)  # [BN, BK]
            q = tl.load(q_rows + h * Q_H + d[None, :], mask=tmask[:, None] & dmask[None, :], other=0.0)  # [BT, BK]
            if DOT_DTYPE == 0:  # float32 (or q and keys of two dtypes): every product exact, as torch's float32 matmul
                dot = tl.dot(q.to(tl.float32), tl.trans(keys.to(tl.float32)), dot, input_precision="ieee")
            else:  # fp16 / bf16 q and keys: exact products, float32 sums, on the tensor cores
                dot = tl.dot(q, tl.trans(keys), dot)  # [BT, BN]
        weight = tl.load(w_rows + h, mask=tmask, other=0.0)  # [BT] float32
        # torch's order: relu(q K^T) * dI^-0.5, then * weight, summed over heads
        acc += (tl.maximum(dot, 0.0) * SCALE) * weight[:, None]
    if MASKED:  # entries not complete at t score -inf: the visibility mask torch applies after the sum
        visible = tl.load(vis_ptr + t, mask=tmask, other=0)  # [BT]
        acc = tl.where(n[None, :] >= visible[:, None], float("-inf"), acc)
    out = out_ptr + t[:, None].to(tl.int64) * N + n[None, :]  # [BT, BN]: the only store, [T, n] float32
    tl.store(out, acc, mask=tmask[:, None] & nmask[None, :])
