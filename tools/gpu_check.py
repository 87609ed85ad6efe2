"""GPU check: the CUDA paths measured on one GPU, against what the plan and the cost model assume.

One command, a few minutes on an H200; prints one table row per measurement and a last line of ratios.
  kernels   the plan's Triton expert kernels (prefill, decode) vs the float32 reference, at the tiny
            model's and V4-Flash's shapes, float32 / float16 / bfloat16 inputs; its mHC mixing, norm,
            rope and head-logits kernels vs the torch reference
  decode    (a) the hot decode kernel at V4-Flash shapes (6 routes, D=4096, I=2048), several launches
            over distinct experts (no L2 reuse) replayed from one CUDA graph: GB/s of packed weights
            vs the GPU's peak (--peak-gbs); the replay vs the same launches run eagerly
  prefill   (b) the prefill kernel's two launches (graph-replayed) at 16..4096 routes per expert:
            TFLOP/s, and its speed vs the cost model's time for the same experts and routes
  upload    (e) pinned host-to-device copies of whole experts (13.4 MB each), as the executor issues
            them, vs the spec's link; then the executor's upload-once path over 3 groups: the share
            of the shorter of (upload, compute) that its double buffering hides, and its result vs the
            same routes on resident experts
  hostnode  (d) one layer's cold-route bridge with zero cold routes (every route hot): the stream
            fork, memcpy, host function, memcpy, join of the decode step, captured 32 times in one
            graph: its cost per layer vs the cost model's (two link latencies plus the activations)
  step      (c) the engine's decode step on the tiny model compiled for one H200 (bf16, at most 6 hot
            experts per layer, so cold routes cross through host nodes): ms/token replayed from its
            CUDA graphs vs run eagerly, steady state (capture and the first tokens excluded), and
            their logits; (g) the same bf16 engine vs the float32 model on the CPU, fed the float32
            model's greedy tokens: max logit error over the logit scale and greedy agreement (a
            different pick is allowed only where float32's top two are within 1% of the scale)
  bucket    (i) short prefills of 16, 64 and 120 tokens (after 100) on the same tiny engine with buckets
            8..64: the bucket steps replayed from their CUDA graphs vs the same steps eagerly vs the
            dynamic model (median of 5), and the graphs' logits vs the eager steps'
  memory    (f) an engine filled to the plan's context: its tensors by planned row and component
            (runtime/engine/held_memory.py) vs the plan's rows; torch.cuda.memory_allocated growth
            vs the plan's row without its headroom
  fp8       (h) the FP8 dense kernel (dense weights as stored): a decode token through a 32768 x 1024
            matrix in GB/s vs peak, a 4096-token GEMM in TFLOP/s vs the spec, both vs float32
Each measurement that fails with an exception becomes a failed row; the others still run.

Without CUDA it lists the measurements as unverified and exits 0. `--cpu` runs all of them on the CPU
at the tiny model's shapes (Triton kernels in its interpreter, the decode step's graphs as their
eager twin, no pinned memory): timings mean nothing there, but every code path up to the CUDA calls
runs and the checks hold (tests/test_gpu_check_plumbing.py).

Usage: python tools/gpu_check.py [--cpu] [--only NAME,...] [--peak-gbs 4800] [--host-isa avx2|native]
                                 [--build-root DIR]
Runs from a checkout with the project installed (tools/setup.sh) or not: the checkout's folders
serve the package either way.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import ostinato  # noqa: E402

# pyproject.toml maps compiler/, runtime/, templates/ and plans/ into the package, which a plain
# PYTHONPATH cannot; so the checkout's root also serves the package's subpackages (same files as an
# editable install).
if str(ROOT) not in ostinato.__path__:
    ostinato.__path__.append(str(ROOT))

if TYPE_CHECKING:
    from ostinato.checkpoint.config import ModelConfig
    from ostinato.compiler.cost_model import CostModel
    from ostinato.plan import Plan

MEASUREMENTS = ("kernels", "decode", "prefill", "upload", "hostnode", "step", "bucket", "memory", "fp8")
ROUTES_PER_EXPERT = (16, 64, 256, 1024, 4096)
NEAR_TIE = 0.01         # of the logit scale: where float32's top two are closer, bf16 may pick the other
CONTEXT = 512           # the tiny plan's context: the memory check fills a session to it
UPLOAD_GROUPS = 3


@dataclass
class Row:
    name: str                 # the measurement it belongs to
    what: str
    value: str                # what was measured
    reference: str = ""       # what it is compared with
    ratio: float | None = None
    ratio_key: str = ""       # its name in the ratio line, saying what over what
    ok: bool | None = None    # a check's verdict; None: a measurement only
    seconds: float = 0.0


@dataclass
class Context:
    device: torch.device
    build_root: Path          # where kernels are built (content-addressed: reruns reuse them)
    peak_gbs: float
    ckpt: Path                # the tiny model
    plan: Plan                # the tiny model compiled for h200-x1 (its default: FP8 dense, bf16 compute)
    cfg: ModelConfig          # the expert shapes of kernels/decode/prefill/upload: V4-Flash on CUDA, tiny on the CPU
    cost: CostModel           # the cost model of the h200-x1 spec at cfg's shapes
    _kernels: dict = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def kernels(self, cfg):
        """The (prefill, decode) Triton modules a plan of `cfg` runs, rendered and loaded once."""
        from ostinato.compiler.codegen.kernels import render_triton_experts
        from ostinato.compiler.codegen.plan_kernels import triton_expert_params
        from ostinato.runtime.kernels.triton_experts import load_triton_module

        key = (cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok)
        if key not in self._kernels:
            params = triton_expert_params(*key, float(cfg.swiglu_limit))
            self._kernels[key] = tuple(load_triton_module(render_triton_experts(p, self.build_root).path)
                                       for p in params)
        return self._kernels[key]


# ----- timing ---------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_call(fn, device: torch.device, n: int) -> float:
    """Seconds per call of fn over n calls after one warm-up call: CUDA events on the current stream
    (what the device took, the host running ahead), or the wall clock on the CPU."""
    fn()
    sync(device)
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / n


def wall(fn, device: torch.device, n: int) -> float:
    """Wall seconds per call of a host-driven fn (it syncs with the device itself), after one warm-up."""
    fn()
    sync(device)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync(device)
    return (time.perf_counter() - start) / n


def captured(fn, device: torch.device):
    """fn captured once as a CUDA graph (after a warm-up run: compilation, allocator) -> its replay;
    on the CPU fn itself, run eagerly each time (as the streams twin does)."""
    from ostinato.runtime.engine.streams import streams_for

    fn()
    if device.type != "cuda":
        return fn
    s = streams_for(device)
    stream = s.new(device)
    s.wait_stream(stream, s.current(device))
    with s.capture(stream) as graph:
        fn()
    s.wait_stream(s.current(device), stream)
    return graph.replay


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max |ours - ref| / max |ref|, on the CPU in float32."""
    ours, ref = ours.float().cpu(), ref.float().cpu()
    return ((ours - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()


# ----- set-up ---------------------------------------------------------------------------------------
def setup(device: torch.device, work: Path, build_root: Path, peak_gbs: float, host_isa: str) -> Context:
    """The tiny checkpoint, its plan for one H200, and the shapes and cost model of the kernel checks."""
    import yaml

    from ostinato.checkpoint.config import ModelConfig
    from ostinato.checkpoint.sizes import model_sizes
    from ostinato.compiler.compile import CompileOptions, compile_plan
    from ostinato.compiler.cost_model import CostModel
    from ostinato.hardware import load_hardware
    from ostinato.isa import detect_isa
    from ostinato.plans import plans_dir
    from ostinato.tiny import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(work / "tiny", "tiny", seed=0, progress=False)
    # the h200-x1 preset with a host ISA this machine has; avx2 by default, the CPU kernel variant that has
    # run (its AVX-512 ones have not yet: --host-isa native tries this machine's best)
    spec = yaml.safe_load((plans_dir() / "hardware" / "h200-x1.yaml").read_text())
    spec["host"]["isa"] = detect_isa() if host_isa == "native" else host_isa
    (work / "h200.yaml").write_text(yaml.safe_dump(spec))
    plan = compile_plan(CompileOptions(ckpt, work / "plan.yaml", str(work / "h200.yaml"), context=CONTEXT,
                                       max_hot_per_layer=6, kernel_dir=build_root)).plan
    plan.write(work / "plan.yaml")
    cfg = ModelConfig.from_json(plans_dir() / "models" / "deepseek-v4-flash" if device.type == "cuda" else ckpt)
    cost = CostModel(cfg, load_hardware("h200-x1"), [], model_sizes(cfg).expert_bytes, 0, CONTEXT)
    return Context(device, build_root, peak_gbs, ckpt, plan, cfg, cost)


def random_experts(cfg, n: int, seed: int) -> list:
    from ostinato.runtime.kernels.testing import random_packed_expert

    g = torch.Generator().manual_seed(seed)
    return [random_packed_expert(cfg.hidden_size, cfg.moe_intermediate_size, g) for _ in range(n)]


def tensors(expert) -> list[torch.Tensor]:
    return [getattr(expert, f.name) for f in fields(expert)]


# ----- the measurements -----------------------------------------------------------------------------
def check_kernels(ctx: Context) -> list[Row]:
    """The plan's two Triton kernels vs the float32 reference (a prefill, one decode launch per token)."""
    from ostinato.checkpoint.config import ModelConfig
    from ostinato.runtime.kernels import triton_experts as tx
    from ostinato.runtime.kernels.reference import dequantize_expert, moe_experts_reference
    from ostinato.runtime.kernels.routes import group_routes

    dev, rows = ctx.device, []
    shapes = [ModelConfig.from_json(ctx.ckpt)] + ([ctx.cfg] if ctx.cuda else [])
    dtypes = (torch.float32, torch.float16, torch.bfloat16) if ctx.cuda else (torch.float32,)
    for cfg in shapes:
        D, I, k, E = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok, 8
        T = 24 if ctx.cuda else 3
        pre, dec = ctx.kernels(cfg)
        experts = random_experts(cfg, E, D)
        pool = tx.HotPool.stack(experts, dev)
        g = torch.Generator().manual_seed(1)
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])  # [T, k]
        weights = torch.rand(T, k, generator=g)
        routes = group_routes(ids, weights, E)
        x = torch.randn(T, D, generator=g)
        dense, worst = [dequantize_expert(e) for e in experts], 0.0
        for dtype in dtypes:
            xd = x.to(dtype)
            ref = moe_experts_reference(xd.float(), routes, experts, torch.zeros(T, D), float(cfg.swiglu_limit), dense)
            out = tx.prefill_experts(pre, xd.to(dev), routes, pool, torch.zeros(T, D, device=dev))
            out_d = torch.zeros(T, D, device=dev)
            h = torch.empty(k, I, device=dev)
            for t in range(T):
                tx.decode_experts(dec, xd.to(dev), ids[t].int().to(dev), torch.full((k,), t, dtype=torch.int32,
                                  device=dev), weights[t].to(dev), pool, out_d, h)
            worst = max(worst, rel_err(out, ref), rel_err(out_d, ref))
        inputs = "/".join(str(d).removeprefix("torch.") for d in dtypes)
        rows.append(Row("kernels", f"kernels exact D={D} I={I}, {inputs} inputs",
                        f"max rel err {worst:.1e}", "float32 reference, tol 1e-4", ok=worst <= 1e-4))
    return rows + dense_kernels(ctx, dtypes)


def dense_kernels(ctx: Context, dtypes) -> list[Row]:
    """The plan's mHC mixing, norm and rope kernels (the dense path's generated ops) vs the torch reference,
    at V4-Flash's widths on CUDA (N x D = 16,384-channel norms, 64 heads of 512 with 64 rope channels)."""
    from ostinato.plan import KernelName
    from ostinato.runtime.kernels.dense_ops import DenseOpsKernel
    from ostinato.runtime.kernels.hc_mix import HcMixKernel
    from ostinato.runtime.kernels.triton_experts import load_triton_module
    from ostinato.runtime.model.hyper_connection import HcWeights, mix_weights
    from ostinato.runtime.model.norms import rms_norm, unweighted_rms_norm
    from ostinato.runtime.model.rope import apply_rope

    def artifact(name):
        return ctx.plan.resolve(ctx.plan.kernel(name).path)

    mixk = HcMixKernel(artifact(KernelName.HC_MIX_CPU), load_triton_module(artifact(KernelName.HC_MIX_TRITON)))
    ops = DenseOpsKernel(artifact(KernelName.DENSE_OPS_CPU), load_triton_module(artifact(KernelName.DENSE_OPS_TRITON)))
    dev, g = ctx.device, torch.Generator().manual_seed(3)
    T, heads, C = (16, 64, 512) if ctx.cuda else (3, 2, 128)
    n, D = mixk.n, ctx.cfg.hidden_size
    mix, m = torch.randn(T, (2 + n) * n, generator=g) * 3, (2 + n) * n
    hw = HcWeights(torch.empty(m, 0), torch.randn(m, generator=g), torch.rand(3, generator=g) + 0.5)
    ref = mix_weights(mix, hw, n, mixk.iters, mixk.eps)
    got = mixk(mix.to(dev), hw.base.to(dev), hw.scale.to(dev))
    mix_err = max(rel_err(a.cpu(), b) for a, b in zip(got, ref))
    worst = 0.0
    angles = torch.rand(T, 32, generator=g) * 1000
    cos, sin = angles.cos().to(dev), angles.sin().to(dev)
    w = torch.randn(n * D, generator=g).to(dev)
    for dtype in dtypes:  # a reference in the same dtype on the same device: both round once to it
        x = (torch.randn(T, n * D, generator=g) * 3).to(dtype).to(dev)
        heads_x = (torch.randn(T, heads, C, generator=g) * 3).to(dtype).to(dev)
        pairs = ((ops.rms_norm(x, w, 1e-6), rms_norm(x, w, 1e-6)), (ops.unweighted_rms_norm(x, 1e-6),
                 unweighted_rms_norm(x, 1e-6)), (ops.rope(heads_x, cos, sin, False), apply_rope(heads_x, cos, sin)),
                 (ops.rope(heads_x, cos, sin, True), apply_rope(heads_x, cos, sin, inverse=True)))
        worst = max(worst, *(rel_err(a.float(), b.float()) for a, b in pairs))
    V, Dh = (8192, 4096) if ctx.cuda else (300, 64)
    h, head = torch.randn(2, Dh, generator=g).to(dev), (torch.randn(V, Dh, generator=g) * 0.05).bfloat16().to(dev)
    head_err = rel_err(ops.head_logits(h, head), h @ head.float().T)
    inputs = "/".join(str(d).removeprefix("torch.") for d in dtypes)
    return [Row("kernels", f"head logits kernel, 2 tokens x {V} bf16 rows of {Dh}", f"max rel err {head_err:.1e}",
                "float32 product, tol 1e-5", ok=head_err <= 1e-5),
            Row("kernels", f"hc_mix kernel N={n} ({mixk.iters} Sinkhorn iterations)", f"max rel err {mix_err:.1e}",
                "float32 reference, tol 1e-5", ok=mix_err <= 1e-5),
            Row("kernels", f"norm and rope kernels, {inputs} inputs", f"max rel err {worst:.1e}",
                "reference in the same dtype, tol 1e-2 (one bf16 rounding)", ok=worst <= 1e-2)]


def hot_decode(ctx: Context) -> list[Row]:
    """(a) Hot decode launches over distinct experts, replayed from one CUDA graph."""
    from ostinato.runtime.kernels import triton_experts as tx

    cfg, dev = ctx.cfg, ctx.device
    D, I, k = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    launches = 10 if ctx.cuda else 2
    experts = random_experts(cfg, launches * k, 2)
    pool = tx.HotPool.stack(experts, dev)
    _, dec = ctx.kernels(cfg)
    x, out, h = torch.randn(1, D, device=dev), torch.zeros(1, D, device=dev), torch.empty(k, I, device=dev)
    token, weight = torch.zeros(k, dtype=torch.int32, device=dev), torch.rand(k, device=dev)
    slots = [torch.arange(k * j, k * (j + 1), dtype=torch.int32, device=dev) for j in range(launches)]

    def step():
        for slot in slots:
            tx.decode_experts(dec, x, slot, token, weight, pool, out, h)

    replay = captured(step, dev)
    sec = per_call(replay, dev, 50 if ctx.cuda else 1) / launches
    gbs = k * experts[0].nbytes / sec / 1e9
    slots[-1][-1] = -1  # a masked padding route, as when a route is cold: written into the captured buffer
    out.zero_()
    replay()
    graph_out = out.clone()
    out.zero_()
    step()
    err = rel_err(graph_out, out)
    return [Row("decode", f"(a) hot decode, {k} routes D={D} I={I}, graph of {launches} launches",
                f"{sec * 1e6:.1f} us/launch, {gbs:.0f} GB/s", f"peak {ctx.peak_gbs:.0f} GB/s", gbs / ctx.peak_gbs,
                "decode_bw/peak"),
            Row("decode", "(a) graph replay vs eager launches", f"max rel diff {err:.1e}", "tol 1e-5",
                ok=err <= 1e-5)]


def prefill_rate(ctx: Context) -> list[Row]:
    """(b) The prefill kernel at r routes per expert: k experts, r tokens each routed to all of them."""
    from ostinato.runtime.kernels.triton_experts import HotPool

    cfg = ctx.cfg
    pool = HotPool.stack(random_experts(cfg, cfg.num_experts_per_tok, 3), ctx.device)
    return [prefill_at(ctx, pool, r) for r in (ROUTES_PER_EXPERT if ctx.cuda else ROUTES_PER_EXPERT[:1])]


def prefill_at(ctx: Context, pool, r: int) -> Row:
    from ostinato.runtime.kernels import triton_experts as tx
    from ostinato.runtime.kernels.routes import group_routes

    cfg, dev, cost = ctx.cfg, ctx.device, ctx.cost
    D, I, E = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    pre, _ = ctx.kernels(cfg)
    g = torch.Generator().manual_seed(r)
    routes = group_routes(torch.arange(E).repeat(r, 1), torch.rand(r, E, generator=g), E)
    R = routes.token.numel()
    x, out = torch.randn(r, D, generator=g).to(dev), torch.zeros(r, D, device=dev)
    # prefill_experts' two launches on device-resident route blocks: a graph cannot hold its copies
    slot, start, end = (t.to(dev) for t in tx.route_blocks(routes, pre.BLOCK_M))
    token, weight, h = routes.token.to(dev), routes.weight.to(dev), torch.empty(R, I, device=dev)

    def launch():
        pre.gate_up_kernel[(slot.numel(), I // pre.BLOCK_N)](x, pool.w1, pool.w1_scale, pool.w3, pool.w3_scale, h,
                                                             token, slot, start, end)
        pre.down_kernel[(slot.numel(), D // pre.BLOCK_N)](h, pool.w2, pool.w2_scale, out, token, weight, slot,
                                                          start, end)

    replay = captured(launch, dev)
    sec = per_call(replay, dev, 20 if ctx.cuda else 1)
    flops, model = cost.expert_flops * R, cost.gpu_experts_time(E, R)
    out.zero_()
    replay()
    err = rel_err(out, tx.prefill_experts(pre, x, routes, pool, torch.zeros(r, D, device=dev)))
    return Row("prefill", f"(b) prefill, {r} routes/expert x {E} experts D={D} I={I}, vs the launcher",
               f"{flops / sec / 1e12:.1f} TFLOP/s, {sec * 1e3:.3f} ms", f"cost model {model * 1e3:.3f} ms",
               model / sec, f"prefill{r}/model", ok=err <= 1e-5)


def upload(ctx: Context) -> list[Row]:
    """(e) Pinned expert uploads, then the executor's upload-once path vs upload alone and compute alone."""
    from ostinato.checkpoint.reader import PackedExpert
    from ostinato.runtime.engine.executor import LayerExperts, PlacementExecutor
    from ostinato.runtime.engine.hot_compute import TorchPoolCompute, TritonPoolCompute
    from ostinato.runtime.kernels.triton_experts import HotPool

    cfg, dev, cost = ctx.cfg, ctx.device, ctx.cost
    D, k = cfg.hidden_size, cfg.num_experts_per_tok
    group = ctx.plan.policy.upload_group if ctx.cuda else 2
    n = UPLOAD_GROUPS * group
    experts = random_experts(cfg, n, 4)
    if ctx.cuda:  # as the loader holds cold experts with a GPU: pinned bytes, so copies are async DMA
        experts = [PackedExpert(*(t.view(torch.uint8).pin_memory() for t in tensors(e))) for e in experts]
    staging = [HotPool.stack(experts[:group], dev) for _ in range(2)]

    def copy_all():  # expert by expert, tensor by tensor, into the staging buffers (as _copy_group)
        for i, e in enumerate(experts):
            pool = staging[(i // group) % 2]
            for name, src in zip(("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale"), tensors(e)):
                getattr(pool, name)[i % group].copy_(src.view(torch.uint8), non_blocking=True)

    t_up = per_call(copy_all, dev, 5 if ctx.cuda else 1)
    h2d = n * experts[0].nbytes / t_up / 1e9
    model_h2d = cost.hw.link.h2d_bandwidth / 1e9

    T = 2048 if ctx.cuda else 16  # on an H200 about as long to compute as to upload (T k / n routes per expert)
    g = torch.Generator().manual_seed(4)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(T)]).to(dev)
    weights = torch.rand(T, k, generator=g).to(dev)
    x = torch.randn(T, D, generator=g).to(dev, torch.bfloat16)
    if ctx.cuda:
        pre, dec = ctx.kernels(cfg)
        compute = TritonPoolCompute(pre, dec)
    else:
        compute = TorchPoolCompute(float(cfg.swiglu_limit))
        compute.prepare(dev, x.dtype)
    layer = LayerExperts(dev, torch.full((n,), -1, dtype=torch.int64, device=dev), torch.arange(n), staging[0],
                         experts, None, staging)  # every expert cold, no hot ones (slot_of all -1)
    executor = PlacementExecutor([layer], compute, None, 1, group, experts[0].nbytes, x.dtype, k)
    executor.set_mode("upload")
    resident = HotPool.stack(experts, dev)
    token = torch.arange(T, device=dev).repeat_interleave(k)
    out_resident = torch.zeros(T, D, device=dev)

    def on_resident():
        out_resident.zero_()
        compute.prefill(resident, x, token, ids.reshape(-1), weights.reshape(-1).float(), out_resident)

    t_compute = wall(on_resident, dev, 3 if ctx.cuda else 1)
    t_both = wall(lambda: executor(0, x, ids, weights), dev, 3 if ctx.cuda else 1)
    err = rel_err(executor(0, x, ids, weights), out_resident.to(x.dtype))
    executor.close()
    hidden = (t_up + t_compute - t_both) / min(t_up, t_compute)
    return [Row("upload", f"(e) {'pinned ' if ctx.cuda else ''}H2D, {n} experts of {experts[0].nbytes / 1e6:.1f} MB",
                f"{h2d:.1f} GB/s", f"spec link {model_h2d:.0f} GB/s", h2d / model_h2d, "h2d/link"),
            Row("upload", f"(e) upload-once, {UPLOAD_GROUPS} groups of {group}, {T * k // n} routes/expert",
                f"{t_both * 1e3:.2f} ms; alone: upload {t_up * 1e3:.2f}, compute {t_compute * 1e3:.2f} ms",
                "result vs resident experts, tol 1e-2", hidden, "overlap", ok=err <= 1e-2)]


def tiny_engine(ctx: Context, graphs: bool):
    from ostinato.runtime.engine.loader import load_engine

    return load_engine(ctx.plan, ctx.ckpt, device=ctx.device.type, decode_graphs=graphs)


def host_node(ctx: Context) -> list[Row]:
    """(d) One layer's cold-route bridge with zero cold routes, 32 times in one graph."""
    engine = tiny_engine(ctx, graphs=False)
    try:
        ex, link = engine.executor, ctx.cost.hw.link
        layer = next(i for i, b in enumerate(ex.bridges) if b is not None)
        bridge, le = ex.bridges[layer], ex.layers[layer]
        k, D = ex.top_k, engine.model.config.hidden_size
        ids = torch.nonzero(le.cold_of < 0).flatten()[:k].to(le.device)  # hot experts: no cold route
        if ids.numel() < k:
            raise RuntimeError(f"layer {layer} has fewer than {k} hot experts: no all-hot token to route")
        x = torch.randn(1, D, device=le.device).to(engine.model.dtype)
        weights = torch.ones(k, device=le.device)
        n = 32 if ctx.cuda else 4

        def bridges():
            for _ in range(n):
                bridge.start(x, ids[None], weights[None])
                bridge.finish()

        sec = per_call(captured(bridges, le.device), le.device, 20 if ctx.cuda else 2) / n
        bridge.check()
    finally:
        engine.close()
    act = D * 4  # the crossing part of CostModel.cpu_experts_time: two latencies, activations both ways
    model = 2 * link.latency_s + act / link.d2h_bandwidth + act / link.h2d_bandwidth
    return [Row("hostnode", f"(d) host node per layer, 0 cold routes (tiny, D={D}), {n} per graph",
                f"{sec * 1e6:.1f} us", f"cost model {model * 1e6:.1f} us", sec / model, "hostnode/model")]


def decode_step(ctx: Context) -> list[Row]:
    """(c) The decode step replayed vs eager, and (g) the bf16 engine vs the float32 model."""
    from ostinato.runtime import load_model

    warmup, steps, prompt = (4, 32, 100) if ctx.cuda else (1, 6, 24)
    engines = [tiny_engine(ctx, graphs=True), tiny_engine(ctx, graphs=False)]
    try:
        # on the CPU: the float32 model (the reference), and the bf16 model, whose own error says how far
        # bf16 rounding alone moves this random model's logits
        models = [load_model(ctx.ckpt), load_model(ctx.ckpt, dtype=torch.bfloat16)]
        ids = torch.randint(0, models[0].config.vocab_size, (prompt,), generator=torch.Generator().manual_seed(0))
        sessions = [m.new_session() for m in (*engines, *models)]  # graph, eager, float32, bf16
        logits = [s.prefill(ids, last_only=True)[-1].float().cpu() for s in sessions]
        times, graph_eager, engine_err, model_err, flips, clear_flips = [0.0, 0.0], 0.0, 0.0, 0.0, 0, 0
        for i in range(warmup + steps):
            ref = logits[2]
            scale, top = ref.abs().max(), ref.topk(2).values
            graph_eager = max(graph_eager, ((logits[0] - logits[1]).abs().max() / scale).item())
            engine_err = max(engine_err, rel_err(logits[0], ref), rel_err(logits[1], ref))
            model_err = max(model_err, rel_err(logits[3], ref))
            token = int(ref.argmax())  # every session is fed the float32 model's greedy token
            if int(logits[0].argmax()) != token:
                flips += 1
                clear_flips += bool((top[0] - top[1]) / scale >= NEAR_TIE)
            for j, s in enumerate(sessions):
                start = time.perf_counter()
                out = s.decode(token)
                if j < 2 and i >= warmup:
                    times[j] += time.perf_counter() - start
                logits[j] = out.float().cpu()
        counters = engines[0].executor.counters
    finally:
        for e in engines:
            e.close()
    graph_ms, eager_ms = (t / steps * 1e3 for t in times)
    compared = warmup + steps  # the prefill's last logits and every decode step's but the last
    return [Row("step", f"(c) decode step, tiny bf16, {steps} tokens after {warmup}: graph vs eager",
                f"{graph_ms:.2f} ms/token", f"eager {eager_ms:.2f} ms/token", eager_ms / graph_ms, "eager/graph"),
            Row("step", f"(c) graph vs eager logits, cold routes {counters.routes_cold} of {counters.routes}",
                f"max diff {graph_eager:.1e} of the logit scale", "tol 1e-3",
                ok=graph_eager <= 1e-3 and counters.routes_cold > 0),
            Row("step", "(g) bf16 engine vs the float32 model: max logit error", f"{engine_err:.1e} of the logit scale",
                f"CPU bf16 model {model_err:.1e}", engine_err / model_err, "bf16_err/cpu_bf16"),
            Row("step", f"(g) greedy picks, teacher-forced, {compared} positions",
                f"{compared - flips} of {compared} agree", f"flips only at near-ties (<{NEAR_TIE:.0%})",
                (compared - flips) / compared, "greedy_agree",
                ok=not clear_flips and flips <= max(1, compared // 8))]


def bucket_steps(ctx: Context) -> list[Row]:
    """(i) Short prefills as captured bucket steps vs the same steps eagerly vs the dynamic model, and
    the graphs' logits vs the eager steps'."""
    from ostinato.runtime.engine.loader import load_engine

    buckets, prompt, sizes, reps = [8, 16, 32, 64], 100, (16, 64, 120), (5 if ctx.cuda else 1)
    plan = ctx.plan.replace(policy=ctx.plan.policy.replace(prefill_buckets=buckets))
    kinds = {"graph": (plan, True), "eager steps": (plan, False),
             "dynamic": (plan.replace(policy=plan.policy.replace(prefill_buckets=[])), False)}
    engines = {name: load_engine(p, ctx.ckpt, device=ctx.device.type, decode_graphs=g) for name, (p, g) in kinds.items()}
    rows = []
    try:
        vocab = engines["graph"].model.config.vocab_size
        ids = torch.randint(0, vocab, (prompt + max(sizes),), generator=torch.Generator().manual_seed(1))
        for n in sizes:
            times, logits = {}, {}
            for name, engine in engines.items():
                times[name] = []
                for r in range(reps + 1):  # the first run binds (and captures, for the graph engine)
                    s = engine.new_session()
                    s.prefill(ids[:prompt], last_only=True)
                    sync(ctx.device)
                    start = time.perf_counter()
                    logits[name] = s.prefill(ids[prompt:prompt + n], last_only=True)[-1].float().cpu()
                    sync(ctx.device)
                    if r:
                        times[name].append(time.perf_counter() - start)
            g, e, d = (sorted(times[k])[len(times[k]) // 2] * 1e3 for k in ("graph", "eager steps", "dynamic"))
            diff = ((logits["graph"] - logits["eager steps"]).abs().max() / logits["eager steps"].abs().max()).item()
            rows.append(Row("bucket", f"(i) {n}-token prefill after {prompt}, tiny: bucket graphs vs eager steps",
                            f"{g:.2f} ms", f"eager steps {e:.2f} ms, dynamic {d:.2f} ms", d / g, "dynamic/graph"))
            rows.append(Row("bucket", f"(i) {n}-token prefill: graph vs eager-step logits", f"max diff {diff:.1e}",
                            "tol 1e-3", ok=diff <= 1e-3))
    finally:
        for engine in engines.values():
            engine.close()
    return rows


def memory(ctx: Context) -> list[Row]:
    """(f) An engine filled to the plan's context: held tensors and the CUDA allocator vs the plan's rows."""
    from ostinato.runtime.engine.held_memory import BOUNDS, held_memory

    gc.collect()
    gpus = range(ctx.plan.hardware.gpus.count)
    before = {gpu: torch.cuda.memory_allocated(gpu) for gpu in gpus} if ctx.cuda else {}
    engine = tiny_engine(ctx, graphs=True)
    try:
        session = engine.new_session()
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(0, engine.model.config.vocab_size, (CONTEXT - 1,), generator=gen)
        session.prefill(ids[: CONTEXT // 2], last_only=True)
        session.prefill(ids[CONTEXT // 2:], last_only=True)
        session.decode(0)  # the last planned position, through the decode step (captured on the first decode)
        sync(ctx.device)
        held = held_memory(engine, [session])
        grown = {gpu: torch.cuda.memory_allocated(gpu) - before[gpu] for gpu in gpus} if ctx.cuda else {}
    finally:
        engine.close()
    differences = held.differences(ctx.plan, 0.01)
    rows = []
    for m in ctx.plan.memory:
        if m.device == "host":
            continue
        planned = sum(b for c, b in m.components.items() if c not in BOUNDS)
        got = sum(b for c, b in held.rows.get(m.device, {}).items() if c not in BOUNDS)
        rows.append(Row("memory", f"(f) {m.device} held tensors by component vs the plan (tol 1%)",
                        f"{got / 1e6:.2f} MB, {len(differences)} components differ, "
                        f"{sum(b for _, b in held.unplanned) / 1e6:.2f} MB unplanned", f"plan {planned / 1e6:.2f} MB",
                        got / planned, f"held/plan_{m.device}", ok=not differences))
        if ctx.cuda:
            bound = m.total_bytes - m.components.get("headroom", 0)
            got = grown[int(m.device.removeprefix("gpu"))]
            rows.append(Row("memory", f"(f) {m.device} memory_allocated growth vs the plan less headroom",
                            f"{got / 1e6:.2f} MB", f"plan {bound / 1e6:.2f} MB", got / bound, f"alloc/plan_{m.device}",
                            ok=got <= bound))
    for line in differences:
        print(f"memory: {line}")
    return rows


def fp8_dense(ctx: Context) -> list[Row]:
    """(h) The FP8 dense kernel: a decode token through V4-Flash's largest dense matrix (wq_b, 32768 x
    1024) in GB/s of FP8 bytes read, and a 4096-token prefill through wo_b (4096 x 8192) in TFLOP/s;
    both against the float32 reference on the dequantized weights. Tiny shapes on the CPU."""
    from ostinato.checkpoint.formats import dequantize_fp8, quantize_fp8
    from ostinato.runtime.kernels.fp8_triton import fp8_linear

    dev, rows = ctx.device, []
    shapes = ((1, 32768, 1024), (4096, 4096, 8192)) if ctx.cuda else ((1, 256, 128), (64, 128, 256))
    act = torch.bfloat16 if ctx.cuda else torch.float16  # Triton's interpreter computes bf16 wrongly
    for T, N, K in shapes:
        q, s = quantize_fp8(torch.randn(N, K) * 0.02)
        x = torch.randn(T, K)
        ref = x @ dequantize_fp8(q, s).T
        qd, sd, xd = q.to(dev), s.view(torch.uint8).to(dev), x.to(dev, act)
        err = rel_err(fp8_linear(xd, qd, sd).float().cpu(), ref)
        sec = per_call(lambda: fp8_linear(xd, qd, sd), dev, 50 if ctx.cuda else 1)
        if T == 1:
            gbs = N * K / sec / 1e9
            rows.append(Row("fp8", f"(h) FP8 dense GEMV {N}x{K}, 1 token", f"{sec * 1e6:.1f} us, {gbs:.0f} GB/s",
                            f"peak {ctx.peak_gbs:.0f} GB/s", gbs / ctx.peak_gbs, "fp8_gemv_bw/peak"))
        else:
            tflops = 2 * T * N * K / sec / 1e12
            peak = ctx.plan.hardware.gpus.matmul_flops / 1e12
            rows.append(Row("fp8", f"(h) FP8 dense GEMM {T}x{N}x{K}", f"{tflops:.1f} TFLOP/s", f"spec {peak:.0f} TFLOP/s",
                            tflops / peak, "fp8_gemm_flops/spec"))
        rows.append(Row("fp8", f"(h) FP8 dense {T}x{N}x{K} vs float32 reference ({str(act)[6:]} activations)",
                        f"max rel err {err:.1e}", "tol 1e-2", ok=err <= 1e-2))
    return rows


RUNS = {"kernels": check_kernels, "decode": hot_decode, "prefill": prefill_rate, "upload": upload,
        "hostnode": host_node, "step": decode_step, "bucket": bucket_steps, "memory": memory,
        "fp8": fp8_dense}


# ----- output ---------------------------------------------------------------------------------------
def table(rows: list[Row]) -> str:
    head = ("what", "measured", "reference", "ratio", "check", "s")
    cells = [(r.what, r.value, r.reference, "" if r.ratio is None else f"{r.ratio:.3g}",
              {True: "ok", False: "FAIL", None: ""}[r.ok], f"{r.seconds:.1f}" if r.seconds else "") for r in rows]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *cells]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def ratio_line(rows: list[Row]) -> str:
    return "ratios: " + (" ".join(f"{r.ratio_key}={r.ratio:.3g}" for r in rows if r.ratio_key) or "none")


def measure(name: str, ctx: Context) -> list[Row]:
    """Run one measurement; its rows are printed at once too, so a run cut short still shows them."""
    start = time.perf_counter()
    try:
        rows = RUNS[name](ctx)
        sync(ctx.device)
    except Exception as e:  # noqa: BLE001 - one broken measurement must not cost the others
        traceback.print_exc()
        rows = [Row(name, f"{name}: raised {type(e).__name__}", str(e).splitlines()[0][:100] if str(e) else "",
                    ok=False)]
    rows[-1].seconds = time.perf_counter() - start
    for r in rows:
        print(f"[{name}] {r.what}: {r.value}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="run on the CPU at the tiny model's shapes (plumbing)")
    ap.add_argument("--only", default=",".join(MEASUREMENTS), help=f"comma-separated subset of {MEASUREMENTS}")
    ap.add_argument("--peak-gbs", type=float, default=4800.0, help="GPU memory bandwidth peak, GB/s (H200: 4800)")
    ap.add_argument("--host-isa", default="avx2", help="the tiny plan's host ISA, or 'native' (this CPU's best)")
    ap.add_argument("--build-root", default=str(ROOT / "build" / "kernels"), help="kernel build folder")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    if unknown := set(names) - set(MEASUREMENTS):
        ap.error(f"--only: unknown {sorted(unknown)}; choose from {MEASUREMENTS}")
    cuda = torch.cuda.is_available() and not args.cpu
    if not cuda and not args.cpu:
        print("gpu_check: no CUDA device: these stay UNVERIFIED (--cpu runs their CPU side):")
        for name in names:
            print(f"  {name:9s} {RUNS[name].__doc__.splitlines()[0]}")
        return 0
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # read when triton is first imported, which is later
    device = torch.device("cuda" if cuda else "cpu")
    print(f"device: {torch.cuda.get_device_name(device) if cuda else 'cpu (plumbing only: timings mean nothing)'}"
          f", torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        ctx = setup(device, Path(tmp), Path(args.build_root).resolve(), args.peak_gbs, args.host_isa)
        print(f"set-up: tiny checkpoint and its h200-x1 plan ({ctx.plan.model.dense_format}) in "
              f"{time.perf_counter() - start:.1f} s")
        rows = [row for name in names for row in measure(name, ctx)]
    failed = sum(r.ok is False for r in rows)
    checks = sum(r.ok is not None for r in rows)
    print(table(rows))
    print(f"gpu_check: {checks - failed} of {checks} checks ok" + (f", {failed} FAILED" if failed else ""))
    print(ratio_line(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
