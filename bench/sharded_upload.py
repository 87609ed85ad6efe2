"""MEASURED on the CPU twin, side by side: a sharded upload's exchange of activations against its uploads, and
beside them what the cost model prices for the same bytes on a GPU spec.

    python -m ostinato.bench.sharded_upload [--gpus 2,4] [--tokens 500,1000,4096] [--experts 32]
                                            [--dims 4096,2048] [--hardware rtx4090d-x4]

Sharded upload-once (runtime/engine/sharded_upload.py) moves two things per layer: the slices of its
distinct cold experts (host -> each GPU, n x expert bytes in all, 1/G over each link) and the activations
(x [T, D] out to the G - 1 other GPUs in the compute dtype, bf16 here, and their float32 partials [T, D]
back). Per layer, for each G and T, this prints the bytes each moves (the exchange's as ShardedUpload counts
what it copies) and the time of each through the engine's own copy paths (ShardedUpload's copies into
staging and its exchange, every planned GPU the CPU, random experts of --dims D,I: V4-Flash's by default),
alternating the two in every round, as ratios exchange / upload. On the CPU both are memory copies, so the
time ratio says what the exchange costs against the uploads where both cross one memory system.

Beside them, the cost model (ostinato.compiler.cost_model) on --hardware with G GPUs: its exchange_bytes for
T tokens (which must equal what the runtime moved: the row says so), its exchange_time (out + back, through
the host: the spec's GPUs have no peer access) and its upload of the same slices over the G links
(upload_time), and their ratio: what the exchange costs against the upload where it crosses PCIe.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.reader import PackedExpert
from ostinato.compiler.cost_model import CostModel
from ostinato.hardware import HardwareSpec, load_hardware
from ostinato.plans import plans_dir
from ostinato.runtime.engine.counters import Counters
from ostinato.runtime.engine.hot_compute import TorchPoolCompute
from ostinato.runtime.engine.sharded_upload import ShardedUpload, expert_slice, slice_width
from ostinato.runtime.engine.span_timer import SpanTimer
from ostinato.runtime.kernels.triton_experts import HotPool

GROUP = 4  # slices per staging buffer (a plan's upload_group)
MODEL = "deepseek-v4-flash"  # the config whose shapes --dims replaces


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


def cost_model(hardware: HardwareSpec, G: int, D: int, I: int) -> CostModel:
    """The cost model of V4-Flash's shapes with hidden D and intermediate I, on `hardware` with G GPUs, its
    dense weights fp8 (x exchanged in bf16, as the runtime's compute dtype): only its link and exchange
    pricing are asked, so it has no layers."""
    cfg = dataclasses.replace(ModelConfig.from_json(plans_dir() / "models" / MODEL), hidden_size=D,
                              moe_intermediate_size=I)
    spec = hardware.model_copy(update={"gpus": hardware.gpus.model_copy(update={"count": G})})
    expert_bytes = 3 * (I * D // 2 + I * D // 32)  # w1, w3 [I, D/2] + [I, D/32]; w2 [D, I/2] + [D, I/32]
    return CostModel(cfg, spec, [], expert_bytes, 0, context=4096, dense_format="fp8")


def measure(G: int, T: int, experts: list[PackedExpert], hardware: HardwareSpec, rounds: int) -> dict:
    """One row: the runtime's upload and exchange of a layer (bytes, median seconds on the CPU twin) and the
    cost model's for the same G, T and experts on `hardware`."""
    D, I = experts[0].w2.shape[0], experts[0].w1.shape[0]
    sharded, timer = _sharded(G, D, I), SpanTimer(Counters())
    x = torch.randn(T, D).to(torch.bfloat16)
    partials = [torch.randn(T, D) for _ in range(G)]
    out = torch.zeros(T, D)
    _upload(sharded, experts, timer), _exchange(sharded, x, partials, out)  # warm-up: first touch of pages
    before = sharded.bytes_exchanged
    up, ex = [], []
    for _ in range(rounds):  # alternating, side by side
        start = time.perf_counter()
        _upload(sharded, experts, timer)
        up.append(time.perf_counter() - start)
        start = time.perf_counter()
        _exchange(sharded, x, partials, out)
        ex.append(time.perf_counter() - start)
    model = cost_model(hardware, G, D, I)
    x_bytes, partial_bytes = model.exchange_bytes(T)
    out_s, back_s = model.exchange_time(T)
    return {"G": G, "T": T, "upload_bytes": len(experts) * experts[0].nbytes,
            "exchange_bytes": (sharded.bytes_exchanged - before) // rounds,
            "upload_s": statistics.median(up), "exchange_s": statistics.median(ex),
            "model_exchange_bytes": (G - 1) * (x_bytes + partial_bytes),
            "model_exchange_s": out_s + back_s, "model_upload_s": model.upload_time(len(experts), links=G)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="2,4")
    ap.add_argument("--tokens", default="500,1000,4096")
    ap.add_argument("--experts", type=int, default=32, help="distinct cold experts of the layer")
    ap.add_argument("--dims", default="4096,2048", help="D,I (hidden, expert intermediate)")
    ap.add_argument("--hardware", default="rtx4090d-x4", help="the spec the cost model prices (preset or YAML)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch's threads for the copies")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    D, I = (int(v) for v in args.dims.split(","))
    experts = _experts(args.experts, D, I)
    hardware = load_hardware(args.hardware)
    print(f"per layer: {args.experts} distinct cold experts of {experts[0].nbytes / 2**20:.1f} MiB, D={D}, I={I}; "
          f"x bf16, partials float32; median of {args.rounds} rounds, {args.threads} thread(s), CPU twin (memory "
          f"copies); model: the cost model on {hardware.name} with G GPUs (exchange through the host)")
    print(f"{'G':>2} {'T':>5} {'upload MiB':>10} {'exchange MiB':>12} {'bytes ratio':>11} {'per link':>8} "
          f"{'upload ms':>9} {'exchange ms':>11} {'time ratio':>10} {'model bytes':>11} {'model up ms':>11} "
          f"{'model ex ms':>11} {'model ratio':>11}")
    for G in (int(v) for v in args.gpus.split(",")):
        for T in (int(v) for v in args.tokens.split(",")):
            r = measure(G, T, experts, hardware, args.rounds)
            upload, exchange = r["upload_bytes"], r["exchange_bytes"]
            # per link: GPU g's slices against its x and partial (the home GPU's link carries no exchange)
            link = exchange / (G - 1) / (upload / G)
            same = "same" if exchange == r["model_exchange_bytes"] else f"{r['model_exchange_bytes'] / 2**20:.1f} MiB"
            print(f"{G:>2} {T:>5} {upload / 2**20:>10.1f} {exchange / 2**20:>12.1f} {exchange / upload:>11.3f} "
                  f"{link:>8.3f} {r['upload_s'] * 1e3:>9.1f} {r['exchange_s'] * 1e3:>11.1f} "
                  f"{r['exchange_s'] / r['upload_s']:>10.3f} {same:>11} {r['model_upload_s'] * 1e3:>11.2f} "
                  f"{r['model_exchange_s'] * 1e3:>11.2f} {r['model_exchange_s'] / r['model_upload_s']:>11.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
