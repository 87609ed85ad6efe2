"""Random MXFP4 experts for kernel tests and benchmarks: uniform random bytes, so every FP4 code
appears in both nibbles; scale bytes drawn from a range the caller picks (e8m0: 2^(b - 127))."""

from __future__ import annotations

import torch

from ostinato.checkpoint.reader import PackedExpert


def random_packed_expert(D: int, I: int, gen: torch.Generator, scale_lo: int = 118, scale_hi: int = 124,
                         down_lo: int | None = None, down_hi: int | None = None) -> PackedExpert:
    """w1, w3 [I, D/2] and w2 [D, I/2] random bytes; scales uniform in [lo, hi] (down: [down_lo, down_hi])."""
    def packed(n, k):
        return torch.randint(-128, 128, (n, k // 2), dtype=torch.int8, generator=gen)

    def scale(n, k, lo, hi):
        return torch.randint(lo, hi + 1, (n, k // 32), dtype=torch.uint8, generator=gen).view(torch.float8_e8m0fnu)

    dl, dh = (scale_lo if down_lo is None else down_lo), (scale_hi if down_hi is None else down_hi)
    return PackedExpert(packed(I, D), scale(I, D, scale_lo, scale_hi), packed(I, D), scale(I, D, scale_lo, scale_hi),
                        packed(D, I), scale(D, I, dl, dh))
