"""MEASURED, side by side on this machine: a checkpoint FP8 matrix times a few tokens on the CPU, read as
stored by the plan's kernel (`ost_fp8_linear`, templates/cpu/dense_ops.cpp.j2) on each of its ISA code paths
this CPU has (AVX2; AVX-512; AVX512_BF16, whose build also takes a bf16 plan's bf16 x on vdpbf16ps: the
"bf16 x" columns), against the same product from the bf16 copy a bf16 plan holds (`x @ W.T`,
torch's GEMV) and from a float32 copy.

    python -m ostinato.bench.fp8_linear [--rounds 5] [--shapes 1024x4096,32768x1024,4096x8192]
        [--tokens 1,2,4] [--threads N] [--isas avx2,avx512,avx512_bf16] [--prefetch 0,4096] [--rows 4,8]

Why: a decode token reads every dense matrix once, so its time is the bytes read over the rate they are
read at. The FP8 matrix is 1 byte a weight (plus a scale byte per 128 x 128 block), its bf16 copy 2 and
a float32 copy 4; the kernel widens each e4m3 byte exactly on the way in (AVX-512: a shift and F16C; AVX2: a
float32's bits made by shifts and unpacks, no conversion instruction). The default
shapes are V4-Flash's wq_a, wq_b and wo_b; every call's matrix comes from memory (a 64 MB write between
calls), as in a decode step that reads each layer's matrices once. --prefetch and --rows build the kernel
with other tuning constants (codegen/dense_ops.py: FP8_PREFETCH_BYTES, FP8_ROWS) to compare them. Prints
milliseconds per call (the variants alternating, medians over rounds) and the bytes each variant reads per
second.
"""

from __future__ import annotations

import os
import tempfile

import torch

from ostinato.bench import matrix_shapes
from ostinato.checkpoint.formats import dequantize_fp8, quantize_fp8
from ostinato.compiler.codegen.dense_ops import CODE_PATHS, FP8_PREFETCH_BYTES, FP8_ROWS, MAX_ROWS, build_cpu_dense_ops
from ostinato.host import cpu_model
from ostinato.isa import detect_isa, supports
from ostinato.runtime.kernels.dense_ops import DenseOpsKernel
from ostinato.runtime.model.fp8_matrix import Fp8Matrix

DEFAULT_SHAPES = "1024x4096,32768x1024,4096x8192"
DEFAULT_TOKENS = "1,2,4"


def _label(isa: str, prefetch: int, rows: int, prefetches: list[int], row_counts: list[int]) -> str:
    """A build's column name: its ISA path, and the tuning constants a run varies."""
    return (isa + (f" {prefetch} B" if len(prefetches) > 1 or prefetch != FP8_PREFETCH_BYTES else "")
            + (f" {rows} rows" if len(row_counts) > 1 or rows != FP8_ROWS else ""))


def time_shape(kernels: dict[str, DenseOpsKernel], n: int, k: int, tokens: list[int], rounds: int,
               calls: int) -> dict[int, dict[str, tuple[float, float]]]:
    """{T: {variant: (median ms a call, GB/s of the matrix's bytes)}} for one [n, k] matrix; `kernels`: the
    host library's builds by label (_label)."""
    w = torch.randn(-(-n // 128) * 128, -(-k // 128) * 128) * k ** -0.5  # whole 128 x 128 blocks, then cut
    q, scale = quantize_fp8(w)
    m = Fp8Matrix.of_bytes(q[:n, :k].contiguous(), scale)
    w32 = dequantize_fp8(m.q, m.scale)  # [n, k], what all three compute with
    w16 = w32.to(torch.bfloat16)  # exact: e4m3 x 2^k
    variants = {
        **{f"fp8 {label}": (lambda x, kernel=kernel: kernel.fp8_linear(x[None], m.q, m.scale, 1)[0],
                            m.q.numel() + m.scale.numel()) for label, kernel in kernels.items()},
        # x as a bf16 plan holds it: the avx512_bf16 build's vdpbf16ps path
        **{f"fp8 {label} bf16 x": (lambda x, kernel=kernel: kernel.fp8_linear(x.bfloat16()[None], m.q, m.scale, 1)[0],
                                   m.q.numel() + m.scale.numel())
           for label, kernel in kernels.items() if kernel.fp8_bf16_dot},
        "bf16": (lambda x: (x.to(torch.bfloat16) @ w16.T).float(), 2 * w16.numel()),
        "float32": (lambda x: x @ w32.T, 4 * w32.numel()),
    }
    out = {}
    for T in tokens:
        x = torch.randn(T, k).bfloat16().float()  # exact in bf16: every variant computes with the same x
        ref = (x.double() @ w32.double().T).float()
        for name, (fn, _) in variants.items():
            err = float((fn(x) - ref).abs().max() / ref.abs().max())
            if err > (2 ** -7 if name == "bf16" else 1e-5):  # bf16 rounds x; the others are float32 sums
                raise SystemExit(f"[{n}, {k}] at {T} tokens: {name} differs from float64 by {err:.1e} of its scale")
        seconds = matrix_shapes.cold_call_seconds({name: lambda fn=fn: fn(x) for name, (fn, _) in variants.items()},
                                                   rounds, calls)
        out[T] = {name: (s * 1e3, variants[name][1] / s / 1e9) for name, s in seconds.items()}
    return out


def main(argv=None) -> None:
    p = matrix_shapes.parser(__doc__, DEFAULT_SHAPES, DEFAULT_TOKENS, 5, 4)
    p.add_argument("--prefetch", default=str(FP8_PREFETCH_BYTES), help="prefetch distances in bytes, comma-separated "
                                                                      "(default: the plan's, %(default)s)")
    p.add_argument("--rows", default=str(FP8_ROWS), help="rows sharing each load of x at one token, comma-separated "
                                                         "(default: the plan's, %(default)s)")
    p.add_argument("--isas", help="the kernel's ISA code paths to time, comma-separated (default: each of "
                                  f"{', '.join(CODE_PATHS)} this CPU has)")
    a, shapes, tokens = matrix_shapes.parse(p, argv, k_multiple=8, max_tokens=4)
    isas = a.isas.split(",") if a.isas else [isa for isa in CODE_PATHS if supports(isa)]
    if not isas or any(isa not in CODE_PATHS or not supports(isa) for isa in isas):
        p.error(f"--isas {a.isas}: each one of {', '.join(CODE_PATHS)} that this CPU has (it has {detect_isa()})")
    prefetch, rows = matrix_shapes.int_list(a.prefetch, "prefetch"), matrix_shapes.int_list(a.rows, "rows", 1, MAX_ROWS)
    builds = {_label(isa, d, r, prefetch, rows): dict(isa=isa, fp8_prefetch_bytes=d, fp8_rows=r)
              for isa in isas for d in prefetch for r in rows}
    print(f"{cpu_model()} ({detect_isa()}), {torch.get_num_threads()} threads, load average "
          f"{os.getloadavg()[0]:.2f}, {a.rounds} rounds of {a.calls} calls")
    with tempfile.TemporaryDirectory() as root:
        kernels = {label: DenseOpsKernel(build_cpu_dense_ops(root, **b).path, None) for label, b in builds.items()}
        tables = {(n, k): time_shape(kernels, n, k, tokens, a.rounds, a.calls) for n, k in shapes}
    for (n, k), table in tables.items():
        names = list(next(iter(table.values())))
        fp8 = [name for name in names if name.startswith("fp8 ")]
        print(f"[{n}, {k}]  tokens | " + " | ".join(f"{name} ms (GB/s)" for name in names) + " | "
              + " | ".join(f"bf16 / {name}" for name in fp8))
        for T, row in table.items():
            cells = " | ".join(f"{ms:7.3f} ({gbs:5.1f})" for ms, gbs in row.values())
            ratios = " | ".join(f"{row['bf16'][0] / row[name][0]:.2f}" for name in fp8)
            print(f"  {T:>5} | {cells} | {ratios}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
