"""MEASURED, side by side on this machine: the plan's LM-head kernel (templates/cpu/dense_ops.cpp.j2,
`ost_head_logits`) at several prefetch distances, against the rate this machine streams memory at.

    python -m ostinato.bench.head_kernel [--vocab 129280] [--hidden 256,4096] [--distances 0,2048,4096,8192]
                                         [--rows 1,2,4] [--rounds 5] [--threads N] [--isa avx2|avx512|avx512_bf16]

A decode step reads the whole head once per token (129,280 bf16 rows: 66 MB at V4's hidden 256 of the
real-vocab preset, 1 GB at V4-Flash's 4,096), so the head runs at memory's rate or below it. For each
hidden size: a random bf16 head and one token; each round times, in turn, every kernel variant (one build
per prefetch distance, 0 = none, and per number of rows sharing each load of x; codegen/dense_ops.py
HEAD_PREFETCH_BYTES and HEAD_ROWS are the plan's) and a float32
sum over the same bytes (torch, the same threads: a plain stream of those bytes, a reference for memory's
rate, not a proven peak). The library is built for one ISA code path (--isa; default the widest this CPU
has: the plan's for a spec naming the host's ISA); an avx512_bf16 build also times each variant on a bf16
plan's h (rounded to bf16: its vdpbf16ps path, the "bf16 h" rows). Prints the median milliseconds per call, GB/s and the
ratio to the stream, and checks that every variant gives the same logits bit for bit (neither a prefetch nor
rows sharing a load of x changes a row's sums).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from ostinato.bench.matrix_shapes import int_list
from ostinato.compiler.codegen.dense_ops import (
    CODE_PATHS,
    HEAD_PREFETCH_BYTES,
    HEAD_ROWS,
    MAX_ROWS,
    build_cpu_dense_ops,
    code_path,
)
from ostinato.host import cpu_model
from ostinato.isa import detect_isa, supports
from ostinato.runtime.kernels.dense_ops import DenseOpsKernel


def _median_call(fn, calls: int) -> float:
    """Seconds per call: the median of `calls` timed calls after one untimed."""
    fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(vocab: int, hidden: int, kernels: dict[str, DenseOpsKernel], rounds: int, calls: int) -> dict:
    """{variant: median seconds per call} over the rounds, the stream's included as "float32 stream"."""
    g = torch.Generator().manual_seed(hidden)
    w = (torch.randn(vocab, hidden, generator=g) * 0.05).bfloat16()  # [V, D] as a checkpoint stores it
    h = torch.randn(1, hidden, generator=g)  # [1, D]: one token
    stream = torch.randn(w.numel() // 2, generator=g)  # the head's bytes as float32
    outs = {name: k.head_logits(h, w) for name, k in kernels.items()}
    first = next(iter(outs.values()))
    for name, out in outs.items():
        if not torch.equal(out, first):
            raise SystemExit(f"{name}: its logits differ from {next(iter(outs))}'s (the variants must not change them)")
    # a bf16 plan's h on builds with the vdpbf16ps head: its own row (its logits are the rounded h's)
    runs = {name: (k, h) for name, k in kernels.items()}
    runs.update({f"{name}, bf16 h": (k, h.bfloat16()) for name, k in kernels.items() if k.head_bf16_dot})
    times: dict[str, list[float]] = {name: [] for name in (*runs, "float32 stream")}
    for _ in range(rounds):
        for name, (k, x) in runs.items():
            times[name].append(_median_call(lambda k=k, x=x: k.head_logits(x, w), calls))
        times["float32 stream"].append(_median_call(lambda: stream.sum(), calls))
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=129_280, help="head rows (V4's vocabulary)")
    p.add_argument("--hidden", default="256,4096", help="hidden sizes, comma-separated (real-vocab, V4-Flash)")
    p.add_argument("--distances", default="0,2048,4096,8192", help="prefetch distances in bytes, 0 = none")
    p.add_argument("--rows", default=str(HEAD_ROWS), help="rows sharing each load of x at one token, comma-separated "
                                                          f"(1-{MAX_ROWS}; default the plan's, {HEAD_ROWS})")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20, help="timed calls per variant per round")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--isa", choices=CODE_PATHS, help="the library's ISA code path (default: the widest this CPU has)")
    a = p.parse_args(argv)
    isa = a.isa or code_path(detect_isa())
    if not supports(isa):
        raise SystemExit(f"--isa {isa}: this CPU runs at most {detect_isa()} code")
    hidden, distances = int_list(a.hidden, "hidden"), int_list(a.distances, "distances")
    rows = int_list(a.rows, "rows", 1, MAX_ROWS)
    if a.vocab < 1 or a.rounds < 1 or a.calls < 1 or a.threads < 1 or any(d % 8 for d in hidden):
        raise SystemExit("--vocab, --rounds, --calls and --threads at least 1; hidden sizes multiples of 8")
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as root:
        kernels = {}
        for d in distances:
            for r in rows:
                k = DenseOpsKernel(build_cpu_dense_ops(root, head_prefetch_bytes=d, isa=isa, head_rows=r).path, None)
                k.threads = a.threads
                name = f"prefetch {d} B" + (f", {r} rows a load of x" if rows != [HEAD_ROWS] else "")
                kernels[name + (" (the plan's)" if (d, r) == (HEAD_PREFETCH_BYTES, HEAD_ROWS) else "")] = k
        print(f"# {cpu_model()} ({isa} code path), {a.threads} threads, {a.rounds} rounds of {a.calls} calls, "
              f"head {a.vocab} rows")
        for D in hidden:
            med = measure(a.vocab, D, kernels, a.rounds, a.calls)
            nbytes = a.vocab * D * 2
            limit = nbytes / med["float32 stream"]
            print(f"\nhidden {D} ({nbytes / 1e6:.0f} MB of bf16 rows): float32 stream {limit / 1e9:.1f} GB/s")
            print("| variant | ms | GB/s | / stream |\n|---|---|---|---|")
            for name, s in med.items():
                print(f"| {name} | {s * 1e3:.2f} | {nbytes / s / 1e9:.1f} | {nbytes / s / limit:.2f} |")


if __name__ == "__main__":
    main()
