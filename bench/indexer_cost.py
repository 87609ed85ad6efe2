"""MEASURED on this machine's CPU: what the CSA lightning indexer's selection costs per (query, compressed row),
set beside what the cost model prices for it (compiler/cost_model/indexer.py, indexer_time).

    python -m ostinato.bench.indexer_cost [--points 1x30000,128x7500,128x30000,800x7500] [--repeats 3]
        [--dims tiny,v4-flash] [--threads 1]

A prefill of n tokens after a cached prefix scores every compressed row (one per 4 tokens) for every query
(runtime/model/indexer.py `select`). For each n x R point (R rows: a prefix of about 4R tokens) it times, on
fresh random inputs (the query tokens are the last n positions, so R rows are visible to the last query):
`select` itself, and its parts on one query block: `index_scores` (the per-(query, row, head) scores, relu,
head weighting, sum over heads), the mask and `top_k_earliest_by_topk` (the top-k over rows). Each figure is
the median of --repeats runs. Printed per point: the seconds, the seconds and effective bytes/s per
(query, row) against the indexer's counted bytes (cost_model.INDEXER_BYTES_PER_QUERY_ROW_HEAD x heads +
INDEXER_BYTES_PER_QUERY_ROW), and the cost model's priced seconds at the cpu-only spec's rates
(plans/hardware/cpu-only.yaml, scaled by --threads over its cores) with their ratio to the measurement. The
load average is printed at the start and the end: other work on the cores inflates the measurement, not the
prediction.

The inputs are random (bf16 queries and keys, float32 head weights of either sign): with the tiny dims' 4 heads
about 1 query in 16 has every head weight negative, so all its scores are <= 0 and tie at the k-th place, and
top_k_earliest_by_topk takes its full-sort fallback for that query (part of the top-k column).

Dims: `tiny` (index_n_heads 4, index_head_dim 128, index_topk 128: the demo model) and `v4-flash`
(64, 128, 512: DeepSeek-V4-Flash). The default points take well under a minute on 2 idle cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from ostinato.compiler.cost_model import indexer_bytes, indexer_time
from ostinato.hardware import load_hardware
from ostinato.runtime.model.indexer import CPU_SCORE_BLOCK_ELEMENTS, index_scores, select, top_k_earliest_by_topk

DIMS = {"tiny": (4, 128, 128), "v4-flash": (64, 128, 512)}  # index_n_heads, index_head_dim, index_topk
RATIO = 4  # a CSA layer's compress ratio: one index key per 4 tokens
CPU_SPEC = Path(__file__).resolve().parents[1] / "plans" / "hardware" / "cpu-only.yaml"


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm: allocator, thread pool
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(n: int, rows: int, heads: int, head_dim: int, topk: int, repeats: int) -> dict:
    """Seconds of `select` and of its parts for n queries over `rows` index keys, as the runtime holds them."""
    g = torch.Generator().manual_seed(n * 1_000_003 + rows)
    q = torch.randn(n, heads, head_dim, generator=g).to(torch.bfloat16)          # [n, HI, dI]
    weights = torch.randn(n, heads, generator=g) * heads ** -0.5                # [n, HI] float32
    keys = torch.randn(rows, head_dim, generator=g).to(torch.bfloat16)          # [R, dI]
    positions = torch.arange(RATIO * rows - n, RATIO * rows).clamp(min=0)       # [n]: the last query sees R rows
    k = min(topk, rows)
    block = max(1, CPU_SCORE_BLOCK_ELEMENTS // max(1, heads * rows))            # select's own query block
    qb, wb = q[:block], weights[:block]
    scores = index_scores(qb, wb, keys)                                         # [Tb, R]
    future = torch.arange(rows) >= ((positions[:block] + 1) // RATIO)[:, None]  # [Tb, R]
    masked = scores.masked_fill(future, float("-inf"))
    blocks = -(-n // block)
    # the parts on one block, scaled to the whole n (the last block may be shorter: a slight over-count)
    part = n / min(block, n)
    return {
        "select": median_seconds(lambda: select(q, weights, keys, positions, RATIO, topk), repeats),
        "scores": part * median_seconds(lambda: index_scores(qb, wb, keys), repeats),
        "matmul": part * median_seconds(lambda: torch.matmul(qb.float(), keys.float().T), repeats),
        "topk": part * median_seconds(lambda: top_k_earliest_by_topk(scores.masked_fill(future, float("-inf")), k),
                                      repeats),
        "torch.topk": part * median_seconds(lambda: masked.topk(k, dim=-1), repeats),
        "blocks": blocks,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--points", default="1x30000,128x7500,128x30000,800x7500",
                   help="n x R points: n query tokens over R compressed rows (default %(default)s)")
    p.add_argument("--dims", default="tiny,v4-flash", help=f"comma-separated, of {list(DIMS)} (default %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per figure; the median is printed")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on a shared, loaded machine two threads' barriers wait on other "
                        "work, measured 5-10x slower than one; the priced rates are scaled to the threads)")
    a = p.parse_args()
    if a.threads < 1:
        raise SystemExit(f"--threads {a.threads}: at least 1")
    torch.set_num_threads(a.threads)
    try:
        points = [tuple(int(v) for v in s.lower().split("x")) for s in a.points.split(",")]
    except ValueError:
        raise SystemExit(f"--points {a.points!r}: comma-separated NxR pairs, e.g. 800x7500") from None
    dims = a.dims.split(",")
    if unknown := [d for d in dims if d not in DIMS]:
        raise SystemExit(f"--dims: unknown {unknown}, of {list(DIMS)}")
    spec = load_hardware(CPU_SPEC)
    share = min(1.0, a.threads / spec.host.cores)  # the spec's rates are its cores' together
    bandwidth, flops = share * spec.gpus.bandwidth, share * spec.gpus.matmul_flops
    load0 = os.getloadavg()[0]
    print(f"{torch.get_num_threads()} threads, load average {load0:.2f}; priced at {spec.name}'s rates x "
          f"{a.threads}/{spec.host.cores} cores (bandwidth {bandwidth:.3g} B/s, matmul {flops:.3g} FLOP/s)")
    print("| dims | n | R | select s | scores s | matmul s | top-k s | torch.topk s | ns/(q,row) | bytes/(q,row) "
          "| GB/s eff. | priced s | measured/priced |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d in dims:
        heads, head_dim, topk = DIMS[d]
        for n, rows in points:
            m = measure(n, rows, heads, head_dim, topk, a.repeats)
            pairs = n * rows
            counted = indexer_bytes(heads, 1, 1)
            priced = indexer_time(heads, head_dim, n, rows, bandwidth, flops)
            print(f"| {d} | {n} | {rows} | {m['select']:.4f} | {m['scores']:.4f} | {m['matmul']:.4f} | "
                  f"{m['topk']:.4f} | {m['torch.topk']:.4f} | {1e9 * m['select'] / pairs:.2f} | {counted:.0f} | "
                  f"{counted * pairs / m['select'] / 1e9:.1f} | {priced:.4f} | {m['select'] / priced:.2f} |",
                  flush=True)
    print(f"load average {load0:.2f} -> {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
