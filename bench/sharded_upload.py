"""MEASURED on the CPU twin, side by side: a sharded upload's exchange of activations against its uploads.

    python -m ostinato.bench.sharded_upload [--gpus 2,4] [--tokens 512,1024,4096] [--experts 32] [--dims 4096,2048]

Sharded upload-once (runtime/engine/sharded_upload.py) moves two things per layer: the slices of its
distinct cold experts (host -> each GPU, n x expert bytes in all, 1/G over each link) and the activations
(x [T, D] out to the G - 1 other GPUs in the compute dtype, bf16 here, and their float32 partials [T, D]
back). Per layer, for each G and T, this prints the bytes each moves and the time of each through the
engine's own copy paths (ShardedUpload's copies into staging and its exchange, every planned GPU the CPU,
random experts of --dims D,I: V4-Flash's by default), alternating the two in every round, as ratios
exchange / upload. On the CPU both are memory copies, so the time ratio says what the exchange costs
against the uploads where both cross one memory system; on GPUs the uploads cross the G host links and
the exchange peer links or the host (not measured here).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ostinato.checkpoint.reader import PackedExpert
from ostinato.runtime.engine.counters import Counters
from ostinato.runtime.engine.hot_compute import TorchPoolCompute
from ostinato.runtime.engine.sharded_upload import ShardedUpload, expert_slice, slice_width
from ostinato.runtime.engine.span_timer import SpanTimer
from ostinato.runtime.kernels.triton_experts import HotPool

GROUP = 4  # slices per staging buffer (a plan's upload_group)


def _experts(n: int, D: int, I: int) -> list[PackedExpert]:
    """n random experts, each its own memory (so every copy reads memory, not cache)."""
    def b(rows, cols):
        return torch.randint(0, 256, (rows, cols), dtype=torch.uint8)
    return [PackedExpert(b(I, D // 2), b(I, D // 32), b(I, D // 2), b(I, D // 32), b(D, I // 2), b(D, I // 32))
            for _ in range(n)]


def _sharded(G: int, D: int, I: int) -> ShardedUpload:
    W = slice_width(I, G)
    def pool():
        return HotPool(*(torch.zeros(GROUP, r, c, dtype=torch.uint8) for r, c in (
            (W, D // 2), (W, D // 32), (W, D // 2), (W, D // 32), (D, W // 2), (D, W // 32))))
    return ShardedUpload([torch.device("cpu")] * G, [[pool(), pool()] for _ in range(G)], TorchPoolCompute(10.0), [0])


def _upload(sharded: ShardedUpload, experts: list[PackedExpert], timer: SpanTimer) -> None:
    """Every GPU's slices of every expert, in groups through its two buffers (what run() copies)."""
    for g in range(sharded.shards):
        slices = [expert_slice(e, g, sharded.width) for e in experts]
        for i in range(0, len(slices), GROUP):
            sharded._copy_group(g, slices[i:i + GROUP], sharded.staging[g][(i // GROUP) % 2], timer)


def _exchange(sharded: ShardedUpload, x: torch.Tensor, partials: list[torch.Tensor], out: torch.Tensor) -> None:
    """x out to GPUs 1.. and their partials back, added in order (what run() exchanges; GPU 0 is home)."""
    for _ in range(1, sharded.shards):
        sharded._exchange(x, torch.device("cpu"))
    out += partials[0]
    for g in range(1, sharded.shards):
        out += sharded._exchange(partials[g], out.device)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="2,4")
    ap.add_argument("--tokens", default="512,1024,4096")
    ap.add_argument("--experts", type=int, default=32, help="distinct cold experts of the layer")
    ap.add_argument("--dims", default="4096,2048", help="D,I (hidden, expert intermediate)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch's threads for the copies")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    D, I = (int(v) for v in args.dims.split(","))
    experts = _experts(args.experts, D, I)
    timer = SpanTimer(Counters())
    print(f"per layer: {args.experts} distinct cold experts of {experts[0].nbytes / 2**20:.1f} MiB, D={D}, I={I}; "
          f"x bf16, partials float32; median of {args.rounds} rounds, {args.threads} thread(s), CPU twin (memory "
          f"copies)")
    print(f"{'G':>2} {'T':>5} {'upload MiB':>10} {'exchange MiB':>12} {'bytes ratio':>11} {'per link':>8} "
          f"{'upload ms':>9} {'exchange ms':>11} {'time ratio':>10}")
    for G in (int(v) for v in args.gpus.split(",")):
        sharded = _sharded(G, D, I)
        for T in (int(v) for v in args.tokens.split(",")):
            x = torch.randn(T, D).to(torch.bfloat16)
            partials = [torch.randn(T, D) for _ in range(G)]
            out = torch.zeros(T, D)
            up, ex = [], []
            _upload(sharded, experts, timer), _exchange(sharded, x, partials, out)  # warm-up: first touch of pages
            for _ in range(args.rounds):  # alternating, side by side
                start = time.perf_counter()
                _upload(sharded, experts, timer)
                up.append(time.perf_counter() - start)
                start = time.perf_counter()
                _exchange(sharded, x, partials, out)
                ex.append(time.perf_counter() - start)
            upload = args.experts * experts[0].nbytes
            exchange = (G - 1) * (x.numel() * x.element_size() + out.numel() * 4)
            # per link: GPU g's slices against its x and partial (the home GPU's link carries no exchange)
            link = (x.numel() * x.element_size() + out.numel() * 4) / (upload / G)
            u, e = statistics.median(up), statistics.median(ex)
            print(f"{G:>2} {T:>5} {upload / 2**20:>10.1f} {exchange / 2**20:>12.1f} {exchange / upload:>11.3f} "
                  f"{link:>8.3f} {u * 1e3:>9.1f} {e * 1e3:>11.1f} {e / u:>10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
