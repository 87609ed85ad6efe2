"""The Triton kernels of fp8_triton.py (which documents them), alone: they import nothing but Triton, so a
Python with only Triton (tools/triton_compile_check.py, the pinned build/triton-3.6) compiles them."""

import triton
import triton.language as tl


@triton.jit
def _e4m3(code):
    """uint8 e4m3 codes -> float32 values (sign, 4-bit exponent with bias 7, 3-bit mantissa; no inf)."""
    c = code.to(tl.int32)
    e = (c >> 3) & 0xF
    m = c & 0x7
    normal = ((c & 0x80) << 24) | ((e + 120) << 23) | (m << 20)  # float32 bits: bias 127 = 7 + 120
    subnormal = m.to(tl.float32) * 0.001953125  # e == 0: m/8 x 2^-6
    val = tl.where(e == 0, tl.where((c & 0x80) != 0, -subnormal, subnormal), normal.to(tl.float32, bitcast=True))
    return tl.where((e == 15) & (m == 7), float("nan"), val)


@triton.jit
def _e8m0(byte):
    """uint8 e8m0 -> 2^(byte - 127) as float32 (0 is 2^-127, a subnormal; 255 is NaN)."""
    b = byte.to(tl.int32)
    val = tl.where(b == 0, 5.877471754111438e-39, (b << 23).to(tl.float32, bitcast=True))
    return tl.where(b == 255, float("nan"), val)


@triton.jit
def _byte(ptr, index, mask):
    """Bytes ptr[index] read through the aligned int32 words that hold them (a byte load per row would
    be the only narrow load in the loop); masked-off lanes give 127 (2^0)."""
    words = ptr.to(tl.pointer_type(tl.int32))
    word = tl.load(words + (index >> 2), mask=mask, other=127)
    return tl.where(mask, (word >> ((index & 3) * 8)) & 0xFF, 127)


@triton.jit
def fp8_linear_kernel(x_ptr, q_ptr, s_ptr, y_ptr, T, N, K, S_ROW, M, X_GROUP, X_ROW,
                      BT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT_DTYPE: tl.constexpr):
    # program (i, g * row tiles of a group + j, s): tokens i, rows j of group g (W's rows g*M.., which read
    # group g's x), K run s; ungrouped: one group of M = N rows
    t = tl.program_id(0) * BT + tl.arange(0, BT)  # [BT] tokens
    tiles = tl.cdiv(M, BN)  # row tiles per group
    g, j = tl.program_id(1) // tiles, tl.program_id(1) % tiles
    m = j * BN + tl.arange(0, BN)  # [BN] rows within the group
    n = g * M + m  # [BN] rows of W, and columns of y
    split, splits = tl.program_id(2), tl.num_programs(2)  # this program's run of K blocks, of `splits`
    tmask, nmask = t < T, m < M
    # split s of S sums K blocks floor(s KB / S) .. floor((s+1) KB / S) - 1: whole blocks, runs within one of equal
    kb = K // BK
    k_lo, k_hi = (split * kb // splits) * BK, ((split + 1) * kb // splits) * BK
    x_rows = x_ptr + g.to(tl.int64) * X_GROUP + t[:, None].to(tl.int64) * X_ROW  # [BT, 1]: group g's rows of x
    acc = tl.zeros((BT, BN), tl.float32)
    for k0 in range(k_lo, k_hi, BK):  # K is a multiple of BK (the launcher checks): no mask along K, so loads vectorize
        k = k0 + tl.arange(0, BK)  # [BK]
        x = tl.load(x_rows + k[None, :], mask=tmask[:, None], other=0.0)
        code = tl.load(q_ptr + n[:, None].to(tl.int64) * K + k[None, :], mask=nmask[:, None], other=0)
        scale = _e8m0(_byte(s_ptr, (n // BK) * S_ROW + k0 // BK, nmask))  # [BN]: one scale block per row
        w = _e4m3(code) * scale[:, None]  # [BN, BK] float32, exact
        if DOT_DTYPE == 2:
            acc += tl.dot(x.to(tl.bfloat16), tl.trans(w.to(tl.bfloat16)))
        elif DOT_DTYPE == 1:
            acc += tl.dot(x.to(tl.float16), tl.trans(w.to(tl.float16)))
        else:
            acc += tl.dot(x.to(tl.float32), tl.trans(w), input_precision="ieee")
    # y [splits, T, N]: y's element type (x's dtype, rounded once here) when unsplit, else float32 partials
    y = y_ptr + split.to(tl.int64) * T * N + t[:, None].to(tl.int64) * N + n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=tmask[:, None] & nmask[None, :])


@triton.jit
def fp8_split_sum_kernel(p_ptr, y_ptr, NUMEL, SPLITS, BLOCK: tl.constexpr):
    """y[i] = p[0, i] + p[1, i] + ... + p[SPLITS-1, i] in float32, in that order, rounded once to y's dtype:
    the splits' partials [SPLITS, NUMEL] reduced and cast in one pass."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = i < NUMEL
    p = p_ptr + i  # [BLOCK] pointers into split 0, moved a split on at a time (64-bit pointers: no overflow)
    acc = tl.load(p, mask=mask, other=0.0)
    for _ in range(1, SPLITS):
        p += NUMEL
        acc += tl.load(p, mask=mask, other=0.0)
    tl.store(y_ptr + i, acc.to(y_ptr.dtype.element_ty), mask=mask)
