"""MEASURED, side by side on this machine: a checkpoint FP8 matrix times many tokens (a prefill's product) on
the CPU, its rows decoded a slab at a time by the plan's library (model/fp8_matrix.py) to float32 for
torch's float32 GEMM (`slab_product`), or to bf16 for torch's bf16 GEMM (`bf16_slab_product`, the path a
bf16 plan takes on a host with bf16 arithmetic), against the bf16 copy a bf16 plan would hold (`x @ W.T`).

    python -m ostinato.bench.fp8_prefill [--rounds 3] [--shapes 1024x4096,32768x1024,4096x8192]
        [--tokens 16,64,200,512] [--threads N]

Why: at prefill lengths the product is bound by arithmetic, not by the bytes read; torch's bf16 GEMM runs
at about 3x its float32 rate where the CPU has bf16 dot products (AVX512-BF16, AMX) and at a fraction of it
where it has not (bench/bf16_matmul.py), which is why the runtime picks the slabs' dtype by the host
(bf16_widening.NATIVE_BF16). Every call's matrix comes from memory (a 64 MB write between calls). Prints
milliseconds per call (medians over rounds, the variants alternating), GFLOP/s, and float32 / bf16 slabs.
"""

from __future__ import annotations

import os
import tempfile

import torch

from ostinato.bench import matrix_shapes
from ostinato.checkpoint.formats import FP8_BLOCK, dequantize_fp8, quantize_fp8
from ostinato.compiler.codegen.dense_ops import build_cpu_dense_ops
from ostinato.host import cpu_model
from ostinato.isa import detect_isa
from ostinato.runtime.kernels.dense_ops import DenseOpsKernel
from ostinato.runtime.model.bf16_widening import NATIVE_BF16, bf16_slab_product, slab_product
from ostinato.runtime.model.fp8_matrix import Fp8Matrix

DEFAULT_SHAPES = "1024x4096,32768x1024,4096x8192"
DEFAULT_TOKENS = "16,64,200,512"


def time_shape(kernel: DenseOpsKernel, n: int, k: int, tokens: list[int], rounds: int,
               calls: int) -> dict[int, dict[str, float]]:
    """{T: {variant: median ms a call}} for one [n, k] FP8 matrix."""
    blocks = -(-n // FP8_BLOCK) * FP8_BLOCK, -(-k // FP8_BLOCK) * FP8_BLOCK
    w = torch.randn(*blocks) * k ** -0.5  # whole 128 x 128 blocks, then cut
    q, scale = quantize_fp8(w)
    m = Fp8Matrix.of_bytes(q[:n, :k].contiguous(), scale)
    w16 = dequantize_fp8(m.q, m.scale).to(torch.bfloat16)  # exact: e4m3 x 2^k

    def fill(r0, r1, part):
        if not kernel.fp8_dequantize_rows(m.q, m.scale, r0, r1, part):
            raise SystemExit(f"the plan's library does not decode [{n}, {k}] to {part.dtype}")

    variants = {
        "float32 slabs": lambda x: slab_product(x.float(), n, fill, align=FP8_BLOCK).to(torch.bfloat16),
        "bf16 slabs": lambda x: bf16_slab_product(x, n, fill, align=FP8_BLOCK),
        "bf16 copy": lambda x: x @ w16.T,
    }
    out = {}
    for T in tokens:
        x = torch.randn(T, k).to(torch.bfloat16)
        ref = x.double() @ w16.double().T
        for name, fn in variants.items():
            err = float((fn(x).double() - ref).abs().max() / ref.abs().max())
            if err > 2 ** -7:  # each rounds a float32 sum of the same exact products to bf16
                raise SystemExit(f"[{n}, {k}] at {T} tokens: {name} differs from float64 by {err:.1e} of its scale")
        seconds = matrix_shapes.cold_call_seconds({name: lambda fn=fn: fn(x) for name, fn in variants.items()},
                                                   rounds, calls)
        out[T] = {name: s * 1e3 for name, s in seconds.items()}
    return out


def main(argv=None) -> None:
    a, shapes, tokens = matrix_shapes.parse(matrix_shapes.parser(__doc__, DEFAULT_SHAPES, DEFAULT_TOKENS, 3, 2), argv,
                                            k_multiple=8)
    print(f"{cpu_model()} ({detect_isa()}; bf16 arithmetic: {'yes' if NATIVE_BF16 else 'no'}), "
          f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}, "
          f"{a.rounds} rounds of {a.calls} calls")
    with tempfile.TemporaryDirectory() as root:
        kernel = DenseOpsKernel(build_cpu_dense_ops(root, isa=detect_isa()).path, None)
        for n, k in shapes:
            table = time_shape(kernel, n, k, tokens, a.rounds, a.calls)
            names = list(next(iter(table.values())))
            print(f"[{n}, {k}]  tokens | " + " | ".join(f"{name} ms (GFLOP/s)" for name in names)
                  + " | float32 / bf16 slabs")
            for T, row in table.items():
                cells = " | ".join(f"{ms:8.2f} ({2 * T * n * k / ms / 1e6:5.0f})" for ms in row.values())
                print(f"  {T:>5} | {cells} | {row['float32 slabs'] / row['bf16 slabs']:.2f}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
