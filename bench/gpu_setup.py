"""What a GPU run's checks (tests/gpu) and its throughput report (gpu_report) share: the tiny model
compiled for one H200 (as planned; in float32 for the graph-vs-eager comparisons; in float32 with MTP
speculation and re-placement on, for the check of both), the expert shapes
the kernel runs use, the plan's Triton expert kernels, CUDA graph capture, the kernel launches and
upload-once path that the report times and the checks check, V4-Flash's dense FP8 matrix shapes, and
the tolerance rule every comparison uses.

On CUDA the kernel runs use V4-Flash's expert shapes; on the CPU (the plumbing runs: the checks with
OSTINATO_GPU_TESTS_ON_CPU=1, `gpu_report --cpu`) the tiny model's, with Triton in its interpreter and
each graph replaced by its eager twin: every code path up to the CUDA calls runs.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import yaml

from ostinato.buckets import bucket_pieces
from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.reader import PackedExpert
from ostinato.checkpoint.sizes import model_sizes
from ostinato.checkpoint.tensor_specs import layer_specs
from ostinato.compiler.codegen.kernels import render_triton_experts
from ostinato.compiler.codegen.plan_kernels import triton_expert_params
from ostinato.compiler.compile import CompileOptions, compile_plan
from ostinato.compiler.cost_model import CostModel
from ostinato.hardware import load_hardware
from ostinato.isa import detect_isa
from ostinato.plan import Plan, load_plan
from ostinato.plans import plans_dir
from ostinato.runtime.engine.executor import LayerExperts, PlacementExecutor
from ostinato.runtime.engine.hot_compute import TorchPoolCompute, TritonPoolCompute
from ostinato.runtime.engine.loader import Engine, load_engine
from ostinato.runtime.engine.streams import streams_for
from ostinato.runtime.kernels.cold_task import ColdBridge
from ostinato.runtime.kernels.launch import launch
from ostinato.runtime.kernels.routes import group_routes
from ostinato.runtime.kernels.testing import random_packed_expert
from ostinato.runtime.kernels.triton_experts import (
    HotPool,
    decode_experts,
    load_triton_module,
    prefill_experts,
    prefill_h_dtype,
    route_blocks,
)
from ostinato.tiny import write_tiny_checkpoint

CONTEXT = 512        # the tiny plan's context: the memory check fills a session to it
MAX_HOT = 6          # hot experts per layer of the tiny plan's 16: cold routes cross through host nodes
# Short prefills (after a 100-token prompt) that the bucket check and report run: each must run as the
# plan's bucket steps (the compiler picks buckets 2..128 for the tiny plan's context: 120 = 64+32+16+8).
SHORT_PREFILLS = (16, 64, 120)


@dataclass(frozen=True)
class GpuSetup:
    device: torch.device
    work: Path           # the checkpoint, the plan and its kernels
    ckpt: Path           # the tiny model
    plan: Plan           # the tiny model compiled for h200-x1 (its default: FP8 dense, bf16 compute)
    plan_f32: Plan       # the same with dense_format float32 (float32 compute): graph vs eager to 1e-5
    plan_spec: Plan      # plan_f32 with MTP speculation and re-placement on (policy.speculative mtp, adapt idle)
    cfg: ModelConfig     # the expert shapes of the kernel runs: V4-Flash on CUDA, tiny on the CPU
    cost: CostModel      # the h200-x1 spec's cost model at cfg's shapes

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def tiny(self) -> ModelConfig:
        return ModelConfig.from_json(self.ckpt)

    def expert_kernels(self, cfg: ModelConfig):
        """The (prefill, decode) Triton modules a plan of `cfg` runs."""
        shape = (cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok, float(cfg.swiglu_limit))
        return _expert_kernels(shape, self.work / "kernels")

    def engine(self, graphs: bool, plan: Plan | None = None) -> Engine:
        return load_engine(plan or self.plan, self.ckpt, device=self.device.type, decode_graphs=graphs)


def make_setup(device: torch.device, work: Path, host_isa: str = "avx2") -> GpuSetup:
    """The tiny checkpoint and its plans for one H200, written into `work` or read from there: the device
    script runs each check file (and each report measurement) in its own process over one folder, so only
    the first one writes them. `host_isa`: the plans' CPU kernel variant; avx2 has run, the AVX-512 ones
    not yet ('native': this machine's best)."""
    ckpt, plan_file = work / "tiny", work / "plan.yaml"
    f32_file, spec_file = work / "plan-float32.yaml", work / "plan-float32-spec-adapt.yaml"
    work.mkdir(parents=True, exist_ok=True)
    if not plan_file.exists():  # plan.yaml is written last, atomically: the checkpoint and the other plans exist
        write_tiny_checkpoint(ckpt, "tiny", seed=0, progress=False)
        spec = yaml.safe_load((plans_dir() / "hardware" / "h200-x1.yaml").read_text())
        spec["host"]["isa"] = detect_isa() if host_isa == "native" else host_isa
        (work / "h200.yaml").write_text(yaml.safe_dump(spec))
        _compile(work, f32_file, "float32")
        _compile(work, spec_file, "float32", speculative="mtp", adapt="idle")
        _compile(work, plan_file, None)
    for file, extra in ((f32_file, {}), (spec_file, {"speculative": "mtp", "adapt": "idle"})):
        if not file.exists():  # a folder an older setup wrote
            _compile(work, file, "float32", **extra)
    cfg = ModelConfig.from_json(plans_dir() / "models" / "deepseek-v4-flash" if device.type == "cuda" else ckpt)
    cost = CostModel(cfg, load_hardware("h200-x1"), [], model_sizes(cfg).expert_bytes, 0, CONTEXT)
    return GpuSetup(device, work, ckpt, load_plan(plan_file), load_plan(f32_file), load_plan(spec_file), cfg, cost)


def _compile(work: Path, plan_file: Path, dense_format: str | None, speculative: str = "off",
             adapt: str = "off") -> None:
    """The tiny checkpoint compiled for work/h200.yaml into plan_file (dense_format None: the compiler's); by
    default plain, no MTP speculation and no re-placement: the steps and placement the report times."""
    compile_plan(CompileOptions(work / "tiny", plan_file, str(work / "h200.yaml"), context=CONTEXT,
                                max_hot_per_layer=MAX_HOT, kernel_dir=work / "kernels", dense_format=dense_format,
                                speculative=speculative, adapt=adapt)).plan.write(plan_file)


@functools.cache  # loaded once per process: Triton compiles each on its first launch
def _expert_kernels(shape: tuple, build_root: Path):
    return tuple(load_triton_module(render_triton_experts(p, build_root).path) for p in triton_expert_params(*shape))


def captured(fn, device: torch.device):
    """fn captured once as a CUDA graph (after a warm-up run: compilation, allocator) -> its replay;
    on the CPU fn itself, run eagerly each time (as the streams twin does)."""
    fn()
    if device.type != "cuda":
        return fn
    s = streams_for(device)
    stream = s.named(device, "capture")  # the engine's: a new pool stream per capture would wrap the pool
    s.wait_stream(stream, s.current(device))
    with s.capture(stream) as graph:
        fn()
    s.wait_stream(s.current(device), stream)
    return graph.replay


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def activation_dtype(device: torch.device) -> torch.dtype:
    """The dense activations' dtype as the engine runs it: bf16 on GPUs (an FP8 plan's compute dtype);
    float16 on the CPU, where Triton's interpreter computes bf16 wrongly (it multiplies raw uint16)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float16


# ----- how close is equal ------------------------------------------------------------------------------
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
ULPS = 4               # "a few" unit roundoffs per rounding: two results of one rounding differ by up to 2
GRAPH_VS_EAGER = 1e-5  # the goal: graph replays equal eager steps to 1e-5 of the logit scale, float32


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max |ours - ref| / max |ref|, on the CPU in float32."""
    ours, ref = ours.float().cpu(), ref.float().cpu()
    return ((ours - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()


def tolerance(dtype: torch.dtype, terms: int = 1, accumulate: torch.dtype = torch.float32) -> float:
    """The rel_err allowed between two computations of the same values that differ only in rounding: a
    result rounded to `dtype` on both sides, from sums of `terms` terms accumulated in `accumulate` in
    another order (atomic adds, split-K, graph vs eager, a reference's matmul). The rule: ULPS unit
    roundoffs of the result's dtype (float32 2^-24, float16 2^-11, bf16 2^-8), plus ULPS of the
    accumulator's times sqrt(terms) (a sum's rounding errors in an unknown order add like a random walk;
    rel_err divides by the largest output). The kernels accumulate in float32, so: float32 over 4096 +
    2048 terms 1.9e-5; bf16 or float16 results about 4 of their own unit roundoffs (0.016, 0.002)."""
    return ULPS * (UNIT_ROUNDOFF[dtype] + UNIT_ROUNDOFF[accumulate] * math.sqrt(terms))


def logit_tolerance(dtype: torch.dtype) -> float:
    """The rel_err allowed between graph and eager logits (whole-model steps, of the logit scale): the
    issue's goal GRAPH_VS_EAGER in float32 (about 168 unit roundoffs: a step's many reductions, each
    summed by atomics in any order, through every layer), the same number of `dtype`'s unit roundoffs
    in another dtype (bf16: 0.66, no check at all: hence those comparisons run in float32)."""
    return GRAPH_VS_EAGER * UNIT_ROUNDOFF[dtype] / UNIT_ROUNDOFF[torch.float32]


def random_experts(cfg: ModelConfig, n: int, seed: int) -> list[PackedExpert]:
    g = torch.Generator().manual_seed(seed)
    return [random_packed_expert(cfg.hidden_size, cfg.moe_intermediate_size, g) for _ in range(n)]


def expert_tensors(expert: PackedExpert) -> list[torch.Tensor]:
    return [getattr(expert, f.name) for f in fields(expert)]


@dataclass(frozen=True)
class UploadRig:
    """The executor's upload-once path over `groups` groups of cold experts, and the same routes on the
    same experts held resident (what the upload path must compute)."""
    experts: list[PackedExpert]   # pinned on CUDA (as the loader holds cold experts): copies are async DMA
    group: int
    staging: list[HotPool]        # the executor's two staging pools
    executor: PlacementExecutor   # every expert cold
    compute: TorchPoolCompute | TritonPoolCompute  # the hot compute both paths run
    x: torch.Tensor               # [T, D] bf16
    ids: torch.Tensor             # [T, k]
    weights: torch.Tensor         # [T, k]
    resident: HotPool             # every expert

    def upload(self) -> torch.Tensor:
        return self.executor(0, self.x, self.ids, self.weights)

    def on_resident(self, out: torch.Tensor) -> torch.Tensor:
        token = torch.arange(self.x.shape[0], device=self.x.device).repeat_interleave(self.ids.shape[1])
        out.zero_()
        self.compute.prefill(self.resident, self.x, token, self.ids.reshape(-1), self.weights.reshape(-1).float(), out)
        return out

    def close(self) -> None:
        self.executor.close()


def upload_rig(setup: GpuSetup, groups: int, tokens: int) -> UploadRig:
    cfg, dev = setup.cfg, setup.device
    group = setup.plan.policy.upload_group if setup.cuda else 2
    n, k = groups * group, cfg.num_experts_per_tok
    experts = random_experts(cfg, n, 4)
    if setup.cuda:
        experts = [PackedExpert(*(t.view(torch.uint8).pin_memory() for t in expert_tensors(e))) for e in experts]
    staging = [HotPool.stack(experts[:group], dev) for _ in range(2)]
    g = torch.Generator().manual_seed(4)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(tokens)]).to(dev)
    weights = torch.rand(tokens, k, generator=g).to(dev)
    x = torch.randn(tokens, cfg.hidden_size, generator=g).to(dev, torch.bfloat16)
    if setup.cuda:
        compute = TritonPoolCompute(*setup.expert_kernels(cfg))
    else:
        compute = TorchPoolCompute(float(cfg.swiglu_limit))
        compute.prepare(dev, x.dtype)
    layer = LayerExperts(dev, torch.full((n,), -1, dtype=torch.int64, device=dev), torch.arange(n), staging[0],
                         experts, None, staging)  # every expert cold, no hot ones (slot_of all -1)
    executor = PlacementExecutor([layer], compute, None, 1, group, experts[0].nbytes, x.dtype, k)
    executor.set_mode("upload")
    return UploadRig(experts, group, staging, executor, compute, x, ids, weights, HotPool.stack(experts, dev))


@dataclass(frozen=True)
class HotDecodeLaunches:
    """`launches` hot decode launches of one token, each over its own k experts (no L2 reuse between them),
    on activations in the engine's dtype (activation_dtype)."""
    run: Callable[[], None]
    slots: list[torch.Tensor]   # each launch's expert slots [k]: buffers a captured graph reads
    out: torch.Tensor           # [1, D]
    bytes_per_launch: int       # the packed weights one launch reads


def hot_decode_launches(setup: GpuSetup, launches: int) -> HotDecodeLaunches:
    cfg, dev = setup.cfg, setup.device
    D, I, k = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    experts = random_experts(cfg, launches * k, 2)
    pool = HotPool.stack(experts, dev)
    _, dec = setup.expert_kernels(cfg)
    x = torch.randn(1, D).to(dev, activation_dtype(dev))
    out, h = torch.zeros(1, D, device=dev), torch.empty(k, I, device=dev)
    token, weight = torch.zeros(k, dtype=torch.int32, device=dev), torch.rand(k, device=dev)
    slots = [torch.arange(k * j, k * (j + 1), dtype=torch.int32, device=dev) for j in range(launches)]

    def run():
        for slot in slots:
            decode_experts(dec, x, slot, token, weight, pool, out, h)

    return HotDecodeLaunches(run, slots, out, k * experts[0].nbytes)


@dataclass(frozen=True)
class PrefillLaunches:
    """The prefill kernel's two launches at r routes per expert: k experts, r tokens each routed to all of
    them, on device-resident route blocks (a graph cannot hold the launcher's copies), on activations in
    the engine's dtype (bf16 on GPUs: the tensor-core path the engine runs, not float32's)."""
    run: Callable[[], None]
    launcher: Callable[[], torch.Tensor]  # prefill_experts on the same routes, into a fresh output
    out: torch.Tensor                     # [r, D], run's output
    routes: int                           # r x k


def prefill_launches(setup: GpuSetup, routes_per_expert: int) -> PrefillLaunches:
    cfg, dev, r = setup.cfg, setup.device, routes_per_expert
    D, I, E = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    pool = HotPool.stack(random_experts(cfg, E, 3), dev)
    pre, _ = setup.expert_kernels(cfg)
    g = torch.Generator().manual_seed(r)
    routes = group_routes(torch.arange(E).repeat(r, 1), torch.rand(r, E, generator=g), E)
    x, out = torch.randn(r, D, generator=g).to(dev, activation_dtype(dev)), torch.zeros(r, D, device=dev)
    slot, start, end = (t.to(dev) for t in route_blocks(routes, pre.BLOCK_M))
    token, weight = routes.token.to(dev), routes.weight.to(dev)
    h = torch.empty(routes.token.numel(), I, dtype=prefill_h_dtype(pre, x.dtype), device=dev)

    def run():
        launch(pre.gate_up_kernel, (slot.numel(), I // pre.BLOCK_N), x, pool.w1, pool.w1_scale, pool.w3,
               pool.w3_scale, h, token, slot, start, end)
        launch(pre.down_kernel, (slot.numel(), D // pre.BLOCK_N), h, pool.w2, pool.w2_scale, out, token, weight,
               slot, start, end)

    def launcher():
        return prefill_experts(pre, x, routes, pool, torch.zeros(r, D, device=dev))

    return PrefillLaunches(run, launcher, out, routes.token.numel())


@dataclass(frozen=True)
class AllHotBridges:
    """One layer's cold-route bridge with zero cold routes (its token routed to hot experts only), `n` times
    in a row: the stream fork, copies, host function, copy and join a decode step pays per layer."""
    run: Callable[[], None]
    bridge: ColdBridge
    n: int
    hidden_size: int


def all_hot_bridges(engine: Engine, n: int) -> AllHotBridges:
    ex = engine.executor
    layer = next(i for i, b in enumerate(ex.bridges) if b is not None)
    bridge, le = ex.bridges[layer], ex.layers[layer]
    k, D = ex.top_k, engine.model.config.hidden_size
    ids = torch.nonzero(le.cold_of < 0).flatten()[:k].to(le.device)  # hot experts: no cold route
    if ids.numel() < k:
        raise RuntimeError(f"layer {layer} has fewer than {k} hot experts: no all-hot token to route")
    x = torch.randn(1, D, device=le.device).to(engine.model.dtype)
    weights = torch.ones(k, device=le.device)

    def run():
        for _ in range(n):
            bridge.start(x, ids[None], weights[None])
            bridge.finish()

    return AllHotBridges(run, bridge, n, D)


def dense_fp8_shapes(cfg: ModelConfig) -> dict[tuple[int, int], list[str]]:
    """Every distinct shape (N, K) of the model's dense FP8 matrices (F8_E4M3 in tensor_specs' layer_specs,
    over all layers) -> the matrices of that shape, e.g. (32768, 1024): ['wq_b']; largest first."""
    shapes: dict[tuple[int, int], set[str]] = {}
    for layer in range(cfg.num_hidden_layers):
        for spec in layer_specs(cfg, layer, with_experts=False):
            if spec.dtype == "F8_E4M3":
                name = re.sub(r"^layers\.\d+\.(attn|ffn)\.", "", spec.name).removesuffix(".weight")
                shapes.setdefault(spec.shape, set()).add(name)
    return {shape: sorted(shapes[shape]) for shape in sorted(shapes, key=lambda s: (-s[0] * s[1], s))}


def bucket_steps(session, plan: Plan, tokens: int) -> list[int]:
    """The bucket steps (token counts) a session runs for a `tokens`-token prefill of the last logits;
    ValueError if the engine would run it otherwise (the plan's largest bucket is smaller): a bucket
    check or figure must time and compare what the engine runs, not the dynamic model."""
    if session.prefill_mode(tokens, last_only=True) != "bucket":
        raise ValueError(f"a {tokens}-token prefill does not run as bucket steps with the plan's buckets "
                         f"{plan.policy.prefill_buckets}")
    return bucket_pieces(tokens, plan.policy.prefill_buckets)
