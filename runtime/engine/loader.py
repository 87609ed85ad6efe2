"""Load a plan and run its model as planned: checks, weight placement, kernels, the executor.

    engine = load_engine("plan.yaml", device="cpu")
    session = engine.new_session()       # prefill picks split-route or upload-once by the plan's threshold

load_engine runs four named stages, each a function that returns what it builds, whole: the model and the
step runner get everything the plan adds to them when they are made, and nothing edits them afterwards.

    spec = read_plan(plan, ...)                         # the plan checked, every choice resolved: LoadSpec
    executor = place_experts(spec)                      # the routed experts placed: PlacementExecutor
    model = load_planned_model(spec, executor)          # dense weights and the plan's kernels: Model
    runner = build_steps(spec, model, executor)         # fixed-shape steps, compiled / captured: StepRunner

The plan is checked against the checkpoint first (fingerprints of config, index and each weight shard's
bytes; a mismatch names the field or the shard). Each
layer's hot experts go to its planned device, packed as stored (both hot backends compute from the
packed pool); its cold experts stay where the checkpoint is, memory-mapped (views of the safetensors
files, no copies) behind the generated CPU kernel; when a GPU is used they are copied once into one
pinned arena per NUMA node instead (pinned_arena.py: the uploads DMA from them), and so are the hot
experts' rows of the layers that re-place between turns (policy.adapt idle: an evicted expert is
uploaded from its row, a re-promoted one copied into its slot from it). Each
device has two upload staging buffers, shared by its layers. So the runtime holds what the plan's
memory rows count for experts. With device="cpu" every planned GPU maps to the CPU, which is how
tests and CI run all of it.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ostinato.adaptation import AdaptPolicy
from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.fingerprint import model_fingerprint
from ostinato.checkpoint.reader import Checkpoint, PackedExpert
from ostinato.checkpoint.weight_fingerprint import weight_fingerprint
from ostinato.isa import detect_isa, supports
from ostinato.plan import (
    KernelEntry,
    KernelName,
    LayerPlan,
    Plan,
    PlanError,
    check_fingerprint,
    check_weights,
    load_plan,
)

from ..kernels.cpu_experts import CpuExpertKernel
from ..kernels.dense_ops import DenseOpsKernel
from ..kernels.hc_mix import HcMixKernel
from ..kernels.triton_experts import HotPool, load_triton_module
from ..model.model import Model, load_model
from . import pinned_arena
from .adapter import Adapter
from .batch_runner import BatchRunner
from .cpu_step import ONE_THREAD_PREFILL_TOKENS, small_matrices
from .cpu_threads import CpuThreads, cpu_threads
from .executor import LayerExperts, PlacementExecutor
from .held_memory import tensors_in
from .hot_compute import CpuPoolCompute, TorchPoolCompute, TritonPoolCompute
from .prefetch import prefetch_mapped
from .session import EngineSession
from .shard_rows import shard_major_down
from .sharded_upload import ShardedUpload, slice_compute, slice_width, upload_choice, upload_shards
from .step_runner import StepRunner

DENSE_DTYPES = {"fp8": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32}  # dense_format -> compute


@dataclass
class Engine:
    plan: Plan
    model_dir: Path                     # the checkpoint it runs (the plan's, or the one given)
    model: Model
    executor: PlacementExecutor
    devices: list
    step_runner: StepRunner | None      # the fixed-shape steps (decode, prefill buckets); None: dynamic
    cpu_threads: CpuThreads             # the cold kernel's threads: the plan's, clamped to this machine
    speculative: bool = False           # sessions draft with the MTP block (engine/drafter.py)
    adapter: Adapter | None = None      # the hot set follows the session between turns (policy.adapt: idle)
    batcher: BatchRunner | None = None  # sessions decode together, up to its size (load_engine's `parallel`)

    def new_session(self) -> EngineSession:
        return EngineSession(self.model.new_session(), self.executor, self.plan.policy.prefill_threshold,
                             self.step_runner, self.speculative, self.adapter, self.prefill_threads,
                             self.plan.policy.context, self.batcher)

    @property
    def parallel(self) -> int:
        """Sessions that may decode together in one step (1: one at a time)."""
        return 1 if self.batcher is None else self.batcher.size

    def prefill_threads(self, tokens: int) -> int:
        """torch's intra-op threads for a dynamic prefill of `tokens` tokens: one for a short prompt
        (cpu_step.ONE_THREAD_PREFILL_TOKENS) on a CPU-only engine of small matrices, else torch's count."""
        if self._small_cpu_model and tokens <= ONE_THREAD_PREFILL_TOKENS:
            return 1
        return torch.get_num_threads()

    @functools.cached_property
    def _small_cpu_model(self) -> bool:
        """No GPU, and every matrix small enough that torch's threads do not repay (cpu_step.small_matrices)."""
        return all(torch.device(d).type == "cpu" for d in self.devices) and small_matrices(self.model.weights.layers)

    def end_turn(self, session: EngineSession) -> None:
        """A turn of `session` ended (its reply is out; the agent's tool runs): re-place hot experts for it."""
        if self.adapter is not None:
            self.adapter.after_turn(session.routes)

    def close(self) -> None:
        if self.adapter is not None:
            self.adapter.close()
        self.executor.close()


def plan_devices(plan: Plan, device: str | None) -> list[torch.device]:
    """The torch device of each planned GPU. device='cpu' (or a cpu_only plan) maps them all to the
    CPU; 'cuda' demands CUDA; None takes CUDA when there is one, else the CPU."""
    n = plan.hardware.gpus.count
    if device not in (None, "cpu", "cuda"):
        raise PlanError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise PlanError("--device cuda: this machine has no CUDA device (or this PyTorch was built without CUDA); "
                        "use --device cpu")
    if device == "cpu" or plan.hardware.cpu_only or not torch.cuda.is_available():
        return [torch.device("cpu")] * n
    if torch.cuda.device_count() < n:
        raise PlanError(f"the plan needs {n} GPUs (hardware.gpus.count), this machine has {torch.cuda.device_count()}")
    return [torch.device("cuda", g) for g in range(n)]


def _artifact(plan: Plan, entry: KernelEntry) -> Path:
    path = plan.resolve(entry.path)
    if not path.is_file():
        raise PlanError(f"kernel artifact {path} (field 'kernels[{entry.name.value}].path', relative to the plan's "
                        f"folder {plan.folder}) not found: run ostinato-compile again")
    return path


def _cpu_kernel_for_this_host(plan: Plan, name: KernelName = KernelName.COLD_EXPERTS_CPU) -> Path:
    """One of the plan's CPU kernel libraries, after checking this CPU can run its ISA (else SIGILL on load).
    Plans from before the dense ops took the host ISA built them for avx2, and record no isa."""
    entry = plan.kernel(name)
    path, isa = _artifact(plan, entry), entry.params.get("isa", "avx2")
    if not supports(isa):
        raise PlanError(f"the plan's CPU kernel {path} was built for {isa} (its hardware spec's host.isa), but this "
                        f"CPU supports at most {detect_isa()}: compile the plan with a hardware spec whose host.isa "
                        f"this machine has")
    return path


def _hc_mix_kernel(plan: Plan, cfg, cuda: bool) -> HcMixKernel:
    """The plan's mHC mixing kernels: the host library always, the Triton module on GPUs."""
    triton_module = load_triton_module(_artifact(plan, plan.kernel(KernelName.HC_MIX_TRITON))) if cuda else None
    kernel = HcMixKernel(_artifact(plan, plan.kernel(KernelName.HC_MIX_CPU)), triton_module)
    if not kernel.matches(cfg.hc_mult, cfg.hc_sinkhorn_iters, float(cfg.hc_eps)):
        raise PlanError(f"the plan's hc_mix kernel was built for N={kernel.n} iters={kernel.iters} eps={kernel.eps}, "
                        f"the model has hc_mult={cfg.hc_mult} hc_sinkhorn_iters={cfg.hc_sinkhorn_iters} "
                        f"hc_eps={cfg.hc_eps}: run ostinato-compile again")
    return kernel


def model_directory(plan: Plan, model_dir: str | Path | None) -> Path:
    """The checkpoint to run: `model_dir` when given (a moved model), else the plan's model.path."""
    path = Path(model_dir) if model_dir is not None else plan.model_dir
    if not path.exists():
        raise PlanError(f"model directory {path} not found" + (
            "" if model_dir is not None else f" (the plan's model.path, relative to {plan.folder}); "
                                             "give the checkpoint with --model"))
    if not path.is_dir():
        raise PlanError(f"model {path} is not a directory (a checkpoint is a folder with config.json)")
    return path


def _packed(ckpt: Checkpoint, layer: int, experts: list[int]) -> list[PackedExpert]:
    """The experts as stored: views of the checkpoint's memory-mapped files (scales viewed as uint8; the
    stored tensors are contiguous, so `.contiguous()` copies nothing)."""
    out = []
    for e in experts:
        p = ckpt.expert_packed(layer, e)
        tensors = [t.view(torch.uint8) if t.dtype == torch.float8_e8m0fnu else t for t in (
            p.w1, p.w1_scale, p.w3, p.w3_scale, p.w2, p.w2_scale)]
        out.append(PackedExpert(*(t.contiguous() for t in tensors)))
    return out


def _dma_rows(placed: list[LayerPlan], E: int, adapted: int) -> list[list[int]]:
    """[placed layer] the experts whose host rows are DMA sources (pinned with GPUs), by id: the cold ones, and
    every one in the first `adapted` layers (see _expert_rows)."""
    return [list(range(E)) if i < adapted else sorted(set(range(E)) - set(lp.hot_experts))
            for i, lp in enumerate(placed)]


def _expert_rows(ckpt: Checkpoint, placed: list[LayerPlan], devices: list[torch.device], adapted: int,
                 disable: bool | None) -> list[list[PackedExpert]]:
    """[placed layer][E] every expert's host row, by id: views of the checkpoint's mmap (a CPU run copies
    nothing: it holds the experts once, in the page cache). With GPUs the rows the engine may DMA from are
    copied into one pinned arena per NUMA node (pinned_arena.py): each layer's cold experts (uploads, the
    cold bridges), and in the first `adapted` layers, which re-place between turns (engine/adapter.py),
    the hot ones' too: an evicted expert is uploaded from its row and a re-promoted one copied into its
    slot from it, and a pageable source would make those copies staged and blocking."""
    E = ckpt.config.n_routed_experts
    rows = [_packed(ckpt, lp.layer, list(range(E))) for lp in placed]  # views of the mapped files: no copies
    if not pinned_arena.pinning(devices):
        return rows
    pinned = _dma_rows(placed, E, adapted)
    sources = [[row[e] for e in experts] for row, experts in zip(rows, pinned)]
    total = sum(e.nbytes for experts in sources for e in experts)
    with tqdm(total=total, desc="pinning host experts", unit="B", unit_scale=True, unit_divisor=1024,
              file=sys.stderr, disable=disable) as bar:
        copies = pinned_arena.pinned_experts(sources, progress=bar.update)
    for row, experts, copied in zip(rows, pinned, copies):
        for e, packed in zip(experts, copied):
            row[e] = packed
    return rows


def _staging(n: int, D: int, I: int, device: torch.device) -> HotPool:
    def z(rows, cols, dtype):
        return torch.zeros(n, rows, cols, dtype=dtype, device=device)
    return HotPool(*(z(rows, cols, torch.uint8) for rows, cols in ((I, D // 2), (I, D // 32), (I, D // 2),
                                                                     (I, D // 32), (D, I // 2), (D, I // 32))))


def compute_dtype(plan: Plan, dtype: torch.dtype | None, cuda: bool) -> torch.dtype:
    """The plan's dense format as a torch dtype, or `dtype` when given: on the CPU a run may take
    another dtype (a float32 reference of a bf16 plan), on GPUs it would not hold what the plan sized."""
    planned = DENSE_DTYPES[plan.model.dense_format]
    if dtype is None or dtype == planned:
        return planned
    if cuda:
        raise PlanError(f"the plan is sized for {plan.model.dense_format} (model.dense_format) and a {dtype} run on "
                        f"GPUs would hold other sizes than it planned: recompile with --dense-format, "
                        f"or run on the CPU")
    return dtype


def speculating(plan: Plan, speculative: str | None) -> bool:
    """Whether the engine drafts with the MTP block: the plan's policy.speculative, or `speculative`
    ("off" / "mtp", ostinato-run --speculative) when given; "mtp" needs the plan to have placed the block."""
    choice = plan.policy.speculative if speculative is None else speculative
    if choice not in ("off", "mtp"):
        raise ValueError(f"speculative must be 'off' or 'mtp', got {speculative!r}")
    if choice == "mtp" and plan.mtp is None:
        raise PlanError("--speculative mtp: the plan places no MTP block (field 'mtp' is null: the checkpoint has "
                        "none, or the plan was compiled with --speculative off); recompile with "
                        "ostinato-compile --speculative mtp")
    return choice == "mtp"


@dataclass(frozen=True)
class LoadSpec:
    """What the first stage decides (read_plan): the plan, checked against the checkpoint, and every choice
    of the load resolved, before any weight is placed."""
    plan: Plan
    model_dir: Path
    config: ModelConfig                 # the checkpoint's config.json
    devices: list[torch.device]         # each planned GPU's torch device
    cuda: bool
    dtype: torch.dtype                  # the dense compute dtype (compute_dtype)
    hot_backend: str                    # "triton" / "torch" / "cpu"
    speculative: bool                   # the MTP block is placed and sessions draft with it
    adapt: AdaptPolicy
    cpu_threads: CpuThreads
    placed: list[LayerPlan]             # the layers whose experts are placed: the model's, then the MTP block

    @property
    def layer_devices(self) -> list[torch.device]:
        return [self.devices[lp.gpu] for lp in self.plan.layers]


def load_engine(plan: str | Path | Plan, model_dir: str | Path | None = None, device: str | None = None,
                dtype: torch.dtype | None = None, hot_backend: str | None = None, static_decode: bool = True,
                decode_graphs: bool = True, progress: bool | None = False, speculative: str | None = None,
                adapt: str | None = None, cpu_step: str | None = None, parallel: int = 1) -> Engine:
    """The plan's engine, in four stages: read the plan (read_plan), place the experts (place_experts), load
    the model (load_planned_model), build the fixed-shape steps (build_steps). Each stage builds what it
    makes whole: nothing edits the model after it is built.
    `dtype`: the compute dtype, default the plan's dense format (see compute_dtype).
    `static_decode`: decode through the fixed-shape step sized for the plan's context (else the
    dynamic model); `decode_graphs`: capture that step as CUDA graphs on GPUs. `progress`: bars over
    the layers on stderr while weights are placed (routed experts, then the rest of each layer);
    None: only when stderr is a terminal. `speculative`: "off" / "mtp" instead of the plan's
    policy.speculative (see speculating()); `adapt`: "off" / "idle" instead of policy.adapt's mode;
    `cpu_step`: "compiled" / "eager" instead of policy.cpu_step (the decode step's CPU segments, compiled
    into one call with decode_graphs; default: $OSTINATO_CPU_STEP if set, else the plan's). `parallel`:
    sessions that may decode together (batch_runner.py), at most the plan's policy.sessions (their memory)."""
    disable = None if progress is None else not progress  # tqdm: None = only on a terminal
    spec = read_plan(plan, model_dir, device, dtype, hot_backend, speculative, adapt)
    check_parallel(spec.plan, parallel, static_decode)
    executor = place_experts(spec, disable, parallel)
    model = load_planned_model(spec, executor, disable)
    runner = build_steps(spec, model, executor, decode_graphs, cpu_step, disable) if static_decode else None
    engine = Engine(spec.plan, spec.model_dir, model, executor, spec.devices, runner, spec.cpu_threads,
                    spec.speculative, _adapter(spec.plan, executor, spec.adapt), _batcher(runner, parallel, disable))
    if not spec.cuda:  # the cold experts and the embedding are read from the mapped checkpoint: read it ahead
        prefetch_mapped(t for _, t in tensors_in(engine))
    return engine


def check_parallel(plan: Plan, parallel: int, static_decode: bool = True) -> None:
    """`parallel` sessions at once fit the plan: at least 1, at most its policy.sessions (the memory model counts
    that many sessions' KV caches), and batched decoding needs the fixed-shape steps."""
    if parallel < 1:
        raise PlanError(f"parallel sessions must be at least 1, got {parallel}")
    if parallel > plan.policy.sessions:
        raise PlanError(f"{parallel} sessions at once, but the plan counts memory for {plan.policy.sessions} "
                        f"(policy.sessions): compile it with ostinato-compile --sessions {parallel}")
    if parallel > 1 and not static_decode:
        raise PlanError("sessions decode together through the fixed-shape steps: not with the dynamic decode")


def read_plan(plan: str | Path | Plan, model_dir: str | Path | None = None, device: str | None = None,
              dtype: torch.dtype | None = None, hot_backend: str | None = None, speculative: str | None = None,
              adapt: str | None = None) -> LoadSpec:
    """Stage 1: the plan read and checked against the checkpoint (fingerprints of its config, index and
    weight shards), and the load's choices resolved (load_engine's arguments)."""
    if not isinstance(plan, Plan):
        plan = load_plan(plan)
    spec = speculating(plan, speculative)
    adapt_policy = _adapt_policy(plan, adapt)
    model_dir = model_directory(plan, model_dir)
    fp = model_fingerprint(model_dir)
    check_fingerprint(plan, fp.config_sha256, fp.index_sha256)  # cheap: refuses another layout before any hashing
    weights = weight_fingerprint(model_dir)  # hashed once per shard (cached); a bar when that is long
    check_weights(plan, weights.shards if weights else None)
    devices = plan_devices(plan, device)
    cuda = devices[0].type == "cuda"
    dtype = compute_dtype(plan, dtype, cuda)
    backend = hot_backend or ("triton" if cuda else "cpu")
    if backend not in ("triton", "torch", "cpu"):
        raise ValueError(f"hot_backend must be 'triton', 'torch' or 'cpu', got {backend!r}")
    if backend == "cpu" and cuda:
        raise PlanError("the cpu hot backend computes the hot pools in host memory: it runs with --device cpu only")
    if backend == "triton" and not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise PlanError("the triton hot backend on the CPU needs TRITON_INTERPRET=1 (or use the torch backend)")
    placed = [*plan.layers, plan.mtp] if spec else list(plan.layers)  # the MTP block is layer index model.layers
    return LoadSpec(plan, model_dir, ModelConfig.from_json(model_dir / "config.json"), devices, cuda, dtype, backend,
                    spec, adapt_policy,
                    cpu_threads(plan.policy.cpu_threads, cuda, decode=plan.policy.decode_cpu_threads), placed)


def place_experts(spec: LoadSpec, disable: bool | None = False, parallel: int = 1) -> PlacementExecutor:
    """Stage 2: every placed layer's routed experts where the plan puts them (hot pools on their device,
    cold ones behind the CPU kernel, the upload staging), and the executor over them; its fixed-shape steps'
    cold staging holds the decode step, the prefill buckets, the verify step and batches of up to `parallel`."""
    plan, devices, dtype, cfg = spec.plan, spec.devices, spec.dtype, spec.config
    cpu_kernel = CpuExpertKernel(_cpu_kernel_for_this_host(plan))
    threads = spec.cpu_threads
    # the plan's policy.shard_threshold, or $OSTINATO_UPLOAD's override (sharded_upload.py)
    shards = upload_shards(plan.hardware.gpus.count, plan.policy.shard_threshold)
    width = slice_width(cfg.moe_intermediate_size, shards)  # refused before any weight is placed
    layers = []
    with Checkpoint.open(spec.model_dir) as ckpt, tqdm(total=len(spec.placed), desc="placing experts", unit="layer",
                                                      file=sys.stderr, disable=disable) as bar:
        if spec.hot_backend == "triton":
            compute = TritonPoolCompute(
                load_triton_module(_artifact(plan, plan.kernel(KernelName.HOT_EXPERTS_PREFILL))),
                load_triton_module(_artifact(plan, plan.kernel(KernelName.HOT_EXPERTS_DECODE))))
        elif spec.hot_backend == "torch":
            compute = TorchPoolCompute(cfg.swiglu_limit)
        else:
            compute = CpuPoolCompute(cpu_kernel, threads.threads)
        E, D, I = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        adapted = len(plan.layers) if spec.adapt.mode == "idle" else 0  # these pin their hot experts' rows too
        rows = _expert_rows(ckpt, spec.placed, devices, adapted, disable)
        staging = {}  # planned GPU -> its two upload buffers, shared by its layers (the plan counts one pair per
        # GPU; keyed by the plan's index so a CPU run holds what the GPUs would)
        for lp, table in zip(spec.placed, rows):
            dev = devices[lp.gpu]
            compute.prepare(dev, dtype)
            if lp.gpu not in staging:
                staging[lp.gpu] = [_staging(plan.policy.upload_group, D, I, dev) for _ in range(2)]
            hot = list(lp.hot_experts)
            cold = sorted(set(range(E)) - set(hot))
            slot_of = torch.full((E,), -1, dtype=torch.int64)
            slot_of[hot] = torch.arange(len(hot))
            cold_of = torch.full((E,), -1, dtype=torch.int64)
            cold_of[cold] = torch.tensor(cold, dtype=torch.int64)  # the table holds every expert, by id
            pool = HotPool.stack([table[e] for e in hot], dev) if hot else _staging(0, D, I, dev)
            layers.append(LayerExperts(dev, slot_of.to(dev), cold_of, pool, table,
                                       cpu_kernel.table(table) if cold else None, staging[lp.gpu]))
            bar.update()
    sharded = None
    if shards > 1:  # each planned GPU's two buffers of expert slices [I/G] (the plan's upload_staging counts them
        # when it shards), computed by the hot backend where it takes that width (slice_compute)
        # where the rows are DMA sources and the plan holds the copy (policy.shard_major_copy: the host has room),
        # their down matrices shard-major too: each w2 slice one contiguous copy; else strided views of the rows
        down = (shard_major_down([le.cold for le in layers], _dma_rows(spec.placed, E, adapted), shards)
                if plan.policy.shard_major_copy and pinned_arena.pinning(devices) else None)
        sharded = ShardedUpload(devices, [[_staging(plan.policy.upload_group, D, width, dev) for _ in range(2)]
                                          for dev in devices], slice_compute(compute, cfg.swiglu_limit),
                                [lp.gpu for lp in spec.placed], plan.policy.shard_threshold, down)
    # the decode-sized calls' token counts: a decode step (and the MTP draft), a batched one of up to `parallel`
    # sessions, the 2-token verify step; their cold tasks run on the plan's decode threads (cpu_threads.py)
    decode_tokens = {1, *range(2, parallel + 1)} | ({2} if spec.speculative else set())
    executor = PlacementExecutor(layers, compute, cpu_kernel, threads.threads, plan.policy.upload_group,
                                 plan.model.expert_bytes, dtype, cfg.num_experts_per_tok,
                                 sorted({*plan.policy.prefill_buckets} | decode_tokens), sharded,
                                 decode_threads=threads.decode, decode_tokens=decode_tokens)
    if sharded is not None and upload_choice() != "sharded":  # the plan's choice: prefills up to its shard
        executor.upload_as = "upload"  # threshold upload over one link, longer ones sharded (prefill_mode)
    return executor


def load_planned_model(spec: LoadSpec, executor: PlacementExecutor, disable: bool | None = False) -> Model:
    """Stage 3: the model's dense weights on their layers' devices, built with the executor and what the plan
    adds to it (its context and snapshots, the mHC mixing and dense-op kernels)."""
    plan, cuda, threads = spec.plan, spec.cuda, spec.cpu_threads.threads
    # on the CPU the dense path's torch ops and Inductor's code share the plan kernels' OpenMP threads: the
    # head's too, whatever a compiled step sets torch's to
    dense_ops = DenseOpsKernel(_cpu_kernel_for_this_host(plan, KernelName.DENSE_OPS_CPU), load_triton_module(
        _artifact(plan, plan.kernel(KernelName.DENSE_OPS_TRITON))) if cuda else None, None if cuda else threads)
    with tqdm(total=len(plan.layers), desc="loading layers", unit="layer", file=sys.stderr, disable=disable) as bar:
        model = load_model(spec.model_dir, dtype=spec.dtype, device=spec.devices[plan.layers[0].gpu],
                           executor=executor, prefill_chunk=plan.policy.prefill_chunk,
                           layer_devices=spec.layer_devices, on_layer=lambda layer: bar.update(),
                           fp8=plan.model.dense_format == "fp8", mtp=spec.speculative,
                           max_context=plan.policy.context, max_snapshots=plan.policy.snapshots,
                           hc_mix=_hc_mix_kernel(plan, spec.config, cuda), dense_ops=dense_ops)
    if not cuda:
        torch.set_num_threads(threads)
    return model


def build_steps(spec: LoadSpec, model: Model, executor: PlacementExecutor, decode_graphs: bool = True,
                cpu_step: str | None = None, disable: bool | None = False) -> StepRunner:
    """Stage 4: the fixed-shape steps (decode, prefill buckets, the 2-token verify step when speculating) sized
    for the plan's context; the CPU decode step compiled and the CUDA graphs captured now, not on the first
    request."""
    plan = spec.plan
    step_mode, why = _cpu_step(plan, cpu_step) if decode_graphs else ("eager", "the step runs without graphs "
                                                                               "(--decode eager)")
    runner = StepRunner(model, executor, plan.policy.context, decode_graphs, [lp.gpu for lp in plan.layers],
                        plan.policy.prefill_buckets, spec.speculative, step_mode, eager_why=why)
    if runner.cpu_step == "compiled":  # at load, as a capture: a minute the first time
        now = len(runner.decode_steps) if runner.speculative else 1  # the larger ones when first needed
        what = (f"compiling the CPU decode step{'s' if now > 1 else ''} (about a minute each the first time, then "
                f"cached; {len(runner.decode_steps) - now} larger context size(s) when a session first reaches them)")
        with tqdm(total=now, desc=what, unit="context", file=sys.stderr, disable=disable) as bar:
            if bar.disable and disable is not True:  # no terminal (a server's log): say it once, as a line
                print(what, file=sys.stderr, flush=True)
            compiled = runner.compile_cpu_step(lambda context: bar.update())
        if not compiled:
            print(f"ostinato: decoding with the eager CPU step: {runner.cpu_step_note}", file=sys.stderr, flush=True)
    if runner.use_graphs:  # seconds of capture
        with tqdm(total=len(runner.steps), desc="capturing CUDA graphs", unit="step", file=sys.stderr,
                  disable=disable) as bar:
            runner.capture_graphs(lambda T: bar.update())
    return runner


def _batcher(runner: StepRunner, parallel: int, disable: bool | None) -> BatchRunner | None:
    """The batched decode steps of 2..parallel sessions (none for 1), compiled now on a compiling engine."""
    if parallel < 2:
        return None
    batcher = BatchRunner(runner, parallel)
    if batcher.builds:
        what = (f"capturing the decode steps of 2..{parallel} sessions" if batcher.captured else
                f"compiling the CPU decode steps of 2..{parallel} sessions (about a minute each the first time)")
        with tqdm(total=parallel - 1, desc=what, unit="step", file=sys.stderr, disable=disable) as bar:
            if bar.disable and disable is not True:
                print(what, file=sys.stderr, flush=True)
            batcher.build(lambda B: bar.update())
    return batcher


def _cpu_step(plan: Plan, choice: str | None) -> tuple[str, str]:
    """(policy.cpu_step unless the caller or $OSTINATO_CPU_STEP says otherwise, who said it)."""
    if choice:
        mode, source = choice, f"cpu_step={choice!r} was asked for"
    elif os.environ.get("OSTINATO_CPU_STEP"):
        mode = os.environ["OSTINATO_CPU_STEP"]
        source = f"OSTINATO_CPU_STEP is {mode}"
    else:
        mode, source = plan.policy.cpu_step, f"the plan's policy.cpu_step is {plan.policy.cpu_step}"
    if mode not in ("compiled", "eager"):
        raise PlanError(f"{'cpu_step' if choice else 'OSTINATO_CPU_STEP'} is {mode!r}: one of compiled, eager")
    return mode, source


def _adapt_policy(plan: Plan, mode: str | None) -> AdaptPolicy:
    """The plan's policy.adapt, its mode replaced by `mode` ("off" / "idle") when given."""
    policy = plan.policy.adapt if mode is None else plan.policy.adapt.replace(mode=mode)
    if policy.mode not in ("off", "idle"):
        raise ValueError(f"adapt must be 'off' or 'idle', got {mode!r}")
    return policy


def _adapter(plan: Plan, executor: PlacementExecutor, policy: AdaptPolicy) -> Adapter | None:
    """An Adapter for `policy` (the engine's policy.adapt), or None when it is off."""
    if policy.mode == "off":
        return None
    E = plan.model.routed_experts
    planned = np.zeros((len(plan.layers), E), dtype=bool)
    for lp in plan.layers:
        planned[lp.layer, lp.hot_experts] = True
    return Adapter(executor, planned, policy, plan.model.expert_bytes)
