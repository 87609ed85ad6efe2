"""MEASURED, side by side on this machine: a bf16 dense product `x @ W.T` as torch runs it, against the same
product widened to float32 a slab of W's rows at a time (the runtime's, model/bf16_widening.py) and widened
whole (`(x.float() @ W.float().T).bfloat16()`), at T tokens.

    python -m ostinato.bench.bf16_matmul [--rounds 3] [--shapes 1024x4096,32768x1024,4096x8192]
        [--tokens 1,4,8,16,32,128,512] [--threads N]

Why: on a CPU without bf16 arithmetic (no AVX512-BF16 or AMX: AVX2-only Zen 3, AVX-512 Skylake) torch's
bf16 GEMM converts its operands tile by tile inside the kernel and runs at a fraction of its float32
rate, while a one-token product is bound by the bytes read, where bf16's half size wins. Widening whole
writes a fresh float32 copy of W every call, whose page faults cost more than the product at short
lengths; the slab buffer stays in cache. The crossover is the token count from which the slabs win at
every larger count measured: model/bf16_widening.py's WIDEN_MIN_TOKENS. The default shapes are V4-Flash's
(wq_a, wq_b, wo_b); each call's weight comes from memory (a 64 MB write between calls), as in a forward
that reads every layer's matrices once.
Prints milliseconds per call (median over rounds, the variants alternating in each round) and the ratio.
"""

from __future__ import annotations

import os

import torch

from ostinato.bench import matrix_shapes
from ostinato.host import cpu_model
from ostinato.isa import detect_isa
from ostinato.runtime.model.bf16_widening import widened_linear

DEFAULT_SHAPES = "1024x4096,32768x1024,4096x8192"
DEFAULT_TOKENS = "1,4,8,16,32,128,512"


def as_bf16(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w.T


def widened_whole(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.float() @ w.float().T).to(torch.bfloat16)


VARIANTS = {"bf16": as_bf16, "slabs": widened_linear, "whole": widened_whole}


def time_shape(n: int, k: int, tokens: list[int], rounds: int, calls: int) -> dict[int, dict[str, float]]:
    """{T: {variant: median ms a call}} for one [n, k] matrix."""
    w = (torch.randn(n, k) * k ** -0.5).to(torch.bfloat16)
    out = {}
    for T in tokens:
        x = torch.randn(T, k).to(torch.bfloat16)
        a = as_bf16(x, w).float()
        for name, fn in VARIANTS.items():
            err = float((fn(x, w).float() - a).abs().max() / a.abs().max().clamp(min=1e-30))
            if err > 2 ** -7:  # each rounds one float32 sum to bf16: a unit or two of its last place apart
                raise SystemExit(f"[{n}, {k}] at {T} tokens: {name} differs from torch's by {err:.1e} of its scale")
        seconds = matrix_shapes.cold_call_seconds({name: lambda fn=fn: fn(x, w) for name, fn in VARIANTS.items()},
                                                   rounds, calls)
        out[T] = {name: s * 1e3 for name, s in seconds.items()}
    return out


def crossover(table: dict[int, dict[str, float]]) -> int | None:
    """The smallest T from which the slabs are faster at every larger T measured (None: never)."""
    best = None
    for T in sorted(table, reverse=True):
        if table[T]["slabs"] < table[T]["bf16"]:
            best = T
        else:
            break
    return best


def main(argv=None) -> None:
    a, shapes, tokens = matrix_shapes.parse(matrix_shapes.parser(__doc__, DEFAULT_SHAPES, DEFAULT_TOKENS, 3, 2), argv)
    print(f"{cpu_model()} ({detect_isa()}), {torch.get_num_threads()} threads, load average "
          f"{os.getloadavg()[0]:.2f}, {a.rounds} rounds of {a.calls} calls")
    crossings = []
    for n, k in shapes:
        table = time_shape(n, k, tokens, a.rounds, a.calls)
        print(f"[{n}, {k}]  tokens | bf16 ms | slabs ms | whole ms | bf16 / slabs")
        for T, row in table.items():
            print(f"  {T:>5} | {row['bf16']:8.2f} | {row['slabs']:8.2f} | {row['whole']:8.2f} | "
                  f"{row['bf16'] / row['slabs']:.2f}")
        crossings.append(crossover(table))
        print(f"  the slabs win from {crossings[-1]} tokens on" if crossings[-1] else "  the slabs never win")
    known = [c for c in crossings if c is not None]
    print(f"load average {os.getloadavg()[0]:.2f}; widen from: "
          + (f"{max(known)} tokens (the largest crossover)" if len(known) == len(crossings) else "no common crossover"))


if __name__ == "__main__":
    main()
