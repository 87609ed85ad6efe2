"""MEASURED, side by side on this machine: one token's products with a model's dense matrices inside a
compiled step, as aten matmuls (`x @ W.T`, what the eager step runs) against row dots (`(x * W).sum(-1)`,
which Inductor generates as its own loop; model/fp8_matrix.py), each at torch's threads and at one.

    python -m ostinato.bench.row_dots PLAN [--rounds 5] [--sizes 65536,262144,1048576,4194304]

Two parts, both compiled the way engine/cpu_step.py compiles a step (INDUCTOR_OPTIONS), alternating the
variants in each round, every call after a write of 66 MB (a real-vocabulary head's bytes) so the
matrices come from memory as they do in a decode step, which streams the head between two layers' reads:
- the plan's model: every 2-D float32 matrix of its layers, in order (what a decode step reads);
- single matrices of --sizes elements (256 columns up to 256K elements, 1,024 up to 4M, else 4,096):
  where the crossover lies that ROW_DOT_MAX_ELEMENTS stands for.
Prints milliseconds per call (median of the rounds) and the bytes' rate.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from ostinato.host import cpu_model
from ostinato.plan import PlanError
from ostinato.runtime.engine.cpu_step import INDUCTOR_OPTIONS, inductor_cache, intra_op_threads
from ostinato.runtime.engine.held_memory import tensors_in

FLUSH_BYTES = 66 * 1024 * 1024


def _matmuls(x: list[torch.Tensor], ws: list[torch.Tensor]) -> list[torch.Tensor]:
    return [xi @ w.T for xi, w in zip(x, ws)]


def _row_dots(x: list[torch.Tensor], ws: list[torch.Tensor]) -> list[torch.Tensor]:
    return [(xi.unsqueeze(-2) * w).sum(-1) for xi, w in zip(x, ws)]


def _variants(threads: int) -> dict[str, tuple]:
    out = {}
    for name, fn in (("matmul", _matmuls), ("row dots", _row_dots)):
        compiled = torch.compile(fn, fullgraph=True, dynamic=False, options=INDUCTOR_OPTIONS)
        for n in sorted({threads, 1}, reverse=True):
            out[f"{name}, {n} thread{'s' if n > 1 else ''}"] = (compiled, n)
    return out


def _time(variants: dict, ws: list[torch.Tensor], rounds: int, calls: int = 20) -> dict[str, float]:
    x = [torch.randn(1, w.shape[1]) for w in ws]
    flush = torch.empty(FLUSH_BYTES // 4)
    reference = _matmuls(x, ws)
    for name, (fn, n) in variants.items():  # trace and build each, and check it against the eager product
        with intra_op_threads(n):
            got = fn(x, ws)
        err = max(float((g - r).abs().max() / r.abs().max().clamp(min=1e-30)) for g, r in zip(got, reference))
        if err > 1e-5:
            raise SystemExit(f"{name}: differs from the eager matmul by {err:.1e} of its scale")
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (fn, n) in variants.items():
            total = 0.0
            with intra_op_threads(n):
                for _ in range(calls):
                    flush.add_(1.0)
                    start = time.perf_counter()
                    fn(x, ws)
                    total += time.perf_counter() - start
            times[name].append(total / calls)
    return {name: statistics.median(t) for name, t in times.items()}


def _print(title: str, ws: list[torch.Tensor], ms: dict[str, float]) -> None:
    nbytes = sum(w.numel() * w.element_size() for w in ws)
    print(f"\n{title}: {len(ws)} matri{'ces' if len(ws) > 1 else 'x'}, {nbytes / 1e6:.2f} MB")
    print("| variant | ms per call | GB/s |")
    print("|---|---|---|")
    for name, s in ms.items():
        print(f"| {name} | {s * 1e3:.3f} | {nbytes / s / 1e9:.1f} |")


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated element counts wanted, got {text!r}") from None
    if any(n < 256 for n in sizes):
        raise argparse.ArgumentTypeError(f"each size must be at least 256 elements (one row), got {text!r}")
    return sizes


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("plan")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sizes", type=_sizes, default="65536,262144,1048576,4194304",
                   help="elements of the single matrices, comma-separated, each at least 256 (columns: see the "
                        "docstring)")
    a = p.parse_args(argv)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(inductor_cache()))
    from ostinato.runtime.engine.loader import load_engine

    try:
        engine = load_engine(a.plan, device="cpu", speculative="off", adapt="off", cpu_step="eager", progress=None)
    except PlanError as e:
        raise SystemExit(f"row_dots: {e}") from None
    ws = [t for _, t in tensors_in(engine.model.weights.layers) if t.dim() == 2 and t.dtype == torch.float32]
    threads = torch.get_num_threads()
    load = os.getloadavg()[0]
    print(f"{cpu_model()}, {threads} threads, load average {load:.2f}; {a.plan}, {a.rounds} alternating rounds")
    _print("the plan's layers", ws, _time(_variants(threads), ws, a.rounds))
    for n in a.sizes:
        cols = 256 if n <= 1 << 18 else 1024 if n <= 1 << 22 else 4096
        w = [torch.randn(n // cols, cols)]
        torch._dynamo.reset()  # a fresh trace for the new shape
        _print(f"one [{n // cols}, {cols}] matrix", w, _time(_variants(threads), w, a.rounds))
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
