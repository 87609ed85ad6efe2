"""MEASURED, side by side on this machine: a checkpoint FP8 matrix times a few tokens on the CPU, read as
stored by the plan's kernel (`ost_fp8_linear`, templates/cpu/dense_ops.cpp.j2), against the same product
from the bf16 copy a bf16 plan holds (`x @ W.T`, torch's GEMV) and from a float32 copy.

    python -m ostinato.bench.fp8_linear [--rounds 5] [--shapes 1024x4096,32768x1024,4096x8192]
        [--tokens 1,2,4] [--threads N]

Why: a decode token reads every dense matrix once, so its time is the bytes read over the rate they are
read at. The FP8 matrix is 1 byte a weight (plus a scale byte per 128 x 128 block), its bf16 copy 2 and
a float32 copy 4; the kernel widens each e4m3 byte exactly on the way in (a shift and F16C). The default
shapes are V4-Flash's wq_a, wq_b and wo_b; every call's matrix comes from memory (a 64 MB write between
calls), as in a decode step that reads each layer's matrices once. Prints milliseconds per call (the
variants alternating, medians over rounds) and the bytes each variant reads per second.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import torch

from ostinato.bench import matrix_shapes
from ostinato.checkpoint.formats import dequantize_fp8, quantize_fp8
from ostinato.compiler.codegen.dense_ops import build_cpu_dense_ops
from ostinato.host import cpu_model
from ostinato.isa import detect_isa
from ostinato.runtime.kernels.dense_ops import DenseOpsKernel
from ostinato.runtime.model.fp8_matrix import Fp8Matrix

FLUSH_BYTES = 64 * 1024 * 1024
DEFAULT_SHAPES = "1024x4096,32768x1024,4096x8192"
DEFAULT_TOKENS = "1,2,4"


def time_shape(kernel: DenseOpsKernel, n: int, k: int, tokens: list[int], rounds: int,
               calls: int) -> dict[int, dict[str, tuple[float, float]]]:
    """{T: {variant: (median ms a call, GB/s of the matrix's bytes)}} for one [n, k] matrix."""
    w = torch.randn(-(-n // 128) * 128, -(-k // 128) * 128) * k ** -0.5  # whole 128 x 128 blocks, then cut
    q, scale = quantize_fp8(w)
    m = Fp8Matrix.of_bytes(q[:n, :k].contiguous(), scale)
    w32 = dequantize_fp8(m.q, m.scale)  # [n, k], what all three compute with
    w16 = w32.to(torch.bfloat16)  # exact: e4m3 x 2^k
    variants = {
        "fp8": (lambda x: kernel.fp8_linear(x[None], m.q, m.scale, 1)[0], m.q.numel() + m.scale.numel()),
        "bf16": (lambda x: (x.to(torch.bfloat16) @ w16.T).float(), 2 * w16.numel()),
        "float32": (lambda x: x @ w32.T, 4 * w32.numel()),
    }
    flush = torch.empty(FLUSH_BYTES // 4)
    out = {}
    for T in tokens:
        x = torch.randn(T, k)
        ref = (x.double() @ w32.double().T).float()
        for name, (fn, _) in variants.items():
            err = float((fn(x) - ref).abs().max() / ref.abs().max())
            if err > (2 ** -7 if name == "bf16" else 1e-5):  # bf16 rounds x; the others are float32 sums
                raise SystemExit(f"[{n}, {k}] at {T} tokens: {name} differs from float64 by {err:.1e} of its scale")
        times = {name: [] for name in variants}
        for _ in range(rounds):
            for name, (fn, _) in variants.items():
                total = 0.0
                for _ in range(calls):
                    flush.add_(1.0)
                    start = time.perf_counter()
                    fn(x)
                    total += time.perf_counter() - start
                times[name].append(total / calls)
        out[T] = {name: (statistics.median(v) * 1e3, variants[name][1] / statistics.median(v) / 1e9)
                  for name, v in times.items()}
    return out


def main(argv=None) -> None:
    a, shapes, tokens = matrix_shapes.parse(matrix_shapes.parser(__doc__, DEFAULT_SHAPES, DEFAULT_TOKENS, 5, 4), argv,
                                            k_multiple=8, max_tokens=4)
    print(f"{cpu_model()} ({detect_isa()}), {torch.get_num_threads()} threads, load average "
          f"{os.getloadavg()[0]:.2f}, {a.rounds} rounds of {a.calls} calls")
    with tempfile.TemporaryDirectory() as root:
        kernel = DenseOpsKernel(build_cpu_dense_ops(root).path, None)
        tables = {(n, k): time_shape(kernel, n, k, tokens, a.rounds, a.calls) for n, k in shapes}
    for (n, k), table in tables.items():
        print(f"[{n}, {k}]  tokens | fp8 ms (GB/s) | bf16 ms (GB/s) | float32 ms (GB/s) | bf16 / fp8")
        for T, row in table.items():
            cells = " | ".join(f"{ms:7.3f} ({gbs:5.1f})" for ms, gbs in row.values())
            print(f"  {T:>5} | {cells} | {row['bf16'][0] / row['fp8'][0]:.2f}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
