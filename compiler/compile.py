"""ostinato-compile as one visible, ordered list of named passes: (model, profile, hardware) -> plan.

  read_model -> read_profile -> read_hardware -> read_workloads -> memory -> placement -> cost_model -> buckets
  -> replan -> speculation -> policy -> kernels -> plan

Each pass reads what earlier passes put in the `Build` and adds its own result; each is logged.
Planning reads only config.json, the index and safetensors headers, never weights.

The MTP block (speculative decoding's draft, `--speculative`): unless off, the memory and placement
passes place it beside the head (its dense part, cache and hot experts on the last GPU, chosen from the
profile's MTP row like any layer's; its cold experts on the host), so the cost model prices its draft as
placed. The speculation pass then keeps it where the cost model says speculation pays (auto) or where it
is forced (mtp); where it does not pay it plans again without it, the memory going back to the layers.

Workloads (`--workload`, by default both shipped ones: plans/workloads/agent_turns.csv, benchmark agents on
20k-token contexts, and agent_scale.csv, coding agents at TraceLab's scale, 120k-token contexts with recorded
tool and human waits). The compiler prices three choices on them, each workload weighing the same whatever
its number of calls (a workload's mean over its calls after each session's first, summed over workloads):
- the split-route/upload-once threshold: the cost model's crossover, priced at each workload's median cached
  prefix (its calls' attention reads that many positions); where those differ, the one of least predicted
  prefill time over both workloads' appends;
- the prefill buckets: the cost model's choice (CostModel.choose_buckets) at each workload's median cached
  prefix, the same way;
- the re-placement budget (policy.adapt.max_bytes): the link's bytes in the median idle period the workloads
  record (ostinato/adaptation.py idle_budget_s; agent_turns.csv records none, so agent_scale.csv's).
Ties go to the workload given first, so a plan is a function of its inputs. The plan names each workload with
the sha256 of its file (provenance.workloads) and says in its notes which choice came from which workload
and what each workload's typical call is predicted to wait. `--workload none`: the choices at the plan's
context alone, the budget at adaptation.IDLE_S.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ostinato import __version__
from ostinato.adaptation import AdaptPolicy, default_policy, idle_budget_s
from ostinato.buckets import largest_bucket_for
from ostinato.chat_encodings import ENCODINGS, choose_encoding
from ostinato.checkpoint import model_sizes
from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.fingerprint import ModelFingerprint, model_fingerprint
from ostinato.checkpoint.reader import INDEX_NAME, SINGLE_NAME, Checkpoint
from ostinato.checkpoint.tensor_specs import dspark_specs, layer_specs, mtp_block_specs
from ostinato.checkpoint.weight_fingerprint import WeightFingerprint, weight_fingerprint
from ostinato.hardware import HardwareSpec, load_hardware
from ostinato.plan import (
    SCHEMA_VERSION,
    DeviceMemory,
    LayerPlan,
    ModelSummary,
    Plan,
    Policy,
    Predictions,
    PrefillPrediction,
    Provenance,
    SpeculativePrediction,
    relative_to_plan,
)
from ostinato.plans import plans_dir
from ostinato.validation import SchemaError, validate
from ostinato.workload import WorkloadSummary, summarize_workload

from .codegen.plan_kernels import build_plan_kernels
from .cost_model import MAX_BUCKET, MTP_ACCEPTANCE, CostModel, LayerCostInputs, MtpCostInputs
from .memory_model import (
    MemoryPolicy,
    gpu_fixed_bytes,
    held_bytes,
    host_expert_bytes,
    layer_resident_bytes,
    mtp_resident_bytes,
    workspace_bytes,
)
from .placement import DoesNotFit, Placement, PlacementProblem, place
from .profile import PHASES, RoutingProfile, load_profile, synthetic_profile, uniform_profile

log = logging.getLogger("ostinato.compile")

PREDICTED_TURNS = (8, 16, 64, 120, 512, 1500, 4096, 16384)
ADAPT = ("off", "idle")  # --adapt (ostinato/adaptation.py)
CPU_STEP = ("compiled", "eager")  # --cpu-step (runtime/engine/cpu_step.py)
SPECULATIVE = ("auto", "off", "mtp")  # --speculative: the cost model decides, never, always (the block must exist)
# The fewest measured drafts (a recorded profile's mtp_drafts) whose acceptance replaces the published one
# (MTP_ACCEPTANCE). A rate measured on n drafts has a standard error of at most 0.5 / sqrt(n): 5 points at
# 100, well inside the gap between the published 90% and where speculation stops paying (about 68% in
# docs/benchmarks.md), while a handful of drafts (a short test recording) could land anywhere by chance.
MIN_MEASURED_DRAFTS = 100


class CompileError(ValueError):
    """The inputs cannot give a plan; the message says what is short and what to change."""


# Tokens a session may hold by default: coding agents' sessions run past 100k tokens (TraceLab's median cached
# prefix is 118,656, shared/PUBLISHED.md), so a plan reserves agent scale unless told less (--context).
DEFAULT_CONTEXT = 262_144
# The workloads a plan's choices are priced on unless told otherwise (--workload): the shipped ones (module
# docstring), in this order (the order breaks ties).
DEFAULT_WORKLOADS = tuple(plans_dir() / "workloads" / name for name in ("agent_turns.csv", "agent_scale.csv"))


@dataclass(frozen=True)
class CompileOptions:
    model: Path
    output: Path                             # where the plan will be written: its paths are relative to it
    hardware: str
    profile: str | None = None               # a profile file, "synthetic:ALPHA", or None (uniform)
    context: int = DEFAULT_CONTEXT          # tokens per session the plan reserves KV (and the steps' state) for
    sessions: int = 1
    prefill_chunk: int = 4096
    upload_group: int = 16
    snapshots: int = 64                      # turn-boundary snapshots a session keeps
    dense_format: str | None = None          # fp8 | bf16 | float32; None: float32 on cpu-only hardware, else fp8
    max_hot_per_layer: int | None = None
    objective_phases: tuple[str, ...] = ("decode", "short_prefill")
    prefill_buckets: tuple[int, ...] | None = None  # None: the cost model chooses (CostModel.choose_buckets)
    speculative: str = "auto"                # SPECULATIVE: decode with the MTP block where it pays / never / always
    adapt: str | None = None                 # ADAPT: re-place hot experts between turns (None: idle with GPUs, else
                                             # off: on a cpu-only spec the hot pools are host memory too)
    cpu_step: str = "compiled"               # CPU_STEP: the decode step's CPU segments compiled into one call, or eager
    chat_encoding: str = "auto"              # CHAT_ENCODINGS: the release's chat encoder; auto: from the checkpoint's
                                             # files (ostinato/chat_encodings.py choose_encoding)
    build_kernels: bool = True
    kernel_dir: Path | None = None           # content-addressed build folder (default: build/kernels here)
    workloads: tuple[Path, ...] = DEFAULT_WORKLOADS  # workload CSVs the choices are priced on (module docstring);
                                                     # (): none, the choices at the plan's context alone


@dataclass
class Build:
    """What the passes produce, in order."""
    options: CompileOptions
    config: ModelConfig | None = None
    fingerprint: ModelFingerprint | None = None
    weights: WeightFingerprint | None = None     # None: no weights in the folder (planning only)
    has_weights: bool = False
    has_mtp: bool = False       # the checkpoint's MTP block (from its index; from the config without one)
    chat_encoding: str = "dsv4"  # the release's chat encoder (read_model: the option, else the checkpoint's files)
    mtp_placed: bool = False    # the passes place the MTP block (memory, placement, cost model): the plan's `mtp`
    mtp_bytes: dict = field(default_factory=dict)          # {kind: bytes} of the MTP block on the last GPU
    profile: RoutingProfile | None = None
    hardware: HardwareSpec | None = None
    policy: MemoryPolicy | None = None
    layer_bytes: list = field(default_factory=list)        # [L] {kind: bytes}
    gpu_fixed: list = field(default_factory=list)          # [G] {kind: bytes}
    placement: Placement | None = None
    cost: CostModel | None = None
    threshold: int | None = None
    workloads: list[WorkloadSummary] = field(default_factory=list)  # read_workloads: the options' workloads
    threshold_from: str = ""    # which workloads' crossover the threshold is (cost_model pass; said in the notes)
    buckets_from: str = ""      # which workloads' choice the buckets are (buckets pass)
    idle_s: float = 0.0         # the idle period the re-placement budget is sized for (read_workloads)
    idle_from: str = ""         # ...and where it comes from
    bucket_reserve: int | None = None  # the largest bucket whose graph pool the memory pass reserves
    buckets: list[int] = field(default_factory=list)       # the plan's prefill buckets, ascending
    execution: Policy | None = None                        # the plan's policy (validated by the schema)
    speculative: SpeculativePrediction | None = None       # the speculation pass's decision, and why
    kernels: list = field(default_factory=list)
    templates: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    plan: Plan | None = None


# ----- passes -----------------------------------------------------------------------------------
def read_model(b: Build) -> None:
    root = b.options.model
    if (root / INDEX_NAME).exists() or (root / SINGLE_NAME).exists():
        ckpt = Checkpoint.open(root, weights=False)
        b.config, b.has_weights, b.has_mtp = ckpt.config, ckpt.has_weights, ckpt.has_mtp
        drafter = dspark_specs(b.config) if ckpt.has_dspark else {}
    else:
        b.config = ModelConfig.from_json(root)
        b.has_mtp = b.config.mtp_blocks > 0
        drafter = dspark_specs(b.config)
        b.notes.append("no weight index: sizes computed from config.json alone")
    if drafter:
        b.notes.append(dspark_note(b.config, drafter))
    o = b.options
    if o.context > b.config.max_position_embeddings:  # the model was trained (its rope scaled) for no more
        raise CompileError(f"--context {o.context:,d} is past the model's max_position_embeddings "
                           f"{b.config.max_position_embeddings:,d} ({root / 'config.json'}): plan at most "
                           f"--context {b.config.max_position_embeddings}")
    if o.chat_encoding not in CHAT_ENCODINGS:
        raise CompileError(f"--chat-encoding is {o.chat_encoding!r}: one of {', '.join(CHAT_ENCODINGS)}")
    if o.chat_encoding == "auto":
        b.chat_encoding, why = choose_encoding(root, b.config.has_dspark)
        b.notes.append(f"chat encoding {b.chat_encoding}: {why}")
    else:
        b.chat_encoding = o.chat_encoding
    if o.speculative not in SPECULATIVE:
        raise CompileError(f"--speculative is {o.speculative!r}: one of {', '.join(SPECULATIVE)}")
    if o.speculative == "mtp" and not b.has_mtp:
        if b.config.has_dspark:
            raise CompileError(f"--speculative mtp: {root} is the 0731 release, whose mtp.* tensors are a DSpark "
                               "drafter, not an MTP block (its config's dspark_* keys say so; "
                               "num_nextn_predict_layers 1 notwithstanding): Ostinato does not draft with it; "
                               "use --speculative auto or off")
        raise CompileError(f"--speculative mtp: {root} has no MTP block to draft with (no mtp.0.* tensors; its "
                           f"config's num_nextn_predict_layers is {b.config.num_nextn_predict_layers}): use "
                           "--speculative auto or off")
    b.mtp_placed = b.has_mtp and o.speculative != "off"
    b.fingerprint = model_fingerprint(root)
    b.weights = weight_fingerprint(root)  # the shards' bytes: a plan runs on exactly these weights
    if not b.has_weights:
        b.notes.append("no weights present: kernel build and weight checks skipped (planning only)")


CHAT_ENCODINGS = ("auto", *ENCODINGS)


def dspark_note(cfg: ModelConfig, drafter: dict) -> str:
    """What the plan says of a DSpark drafter: there, sized, and not loaded."""
    routed = sum(s.nbytes for s in drafter.values() if s.role == "routed_expert")
    total = sum(s.nbytes for s in drafter.values())
    return (f"the checkpoint carries a DSpark drafter (the 0731 release: mtp.0-mtp.{cfg.dspark_stages - 1}, "
            f"{len(drafter)} tensors, {total / 2**30:.2f} GiB of which {routed / 2**30:.2f} GiB routed experts; "
            f"block size {cfg.dspark_block_size}, target layers {list(cfg.dspark_target_layer_ids)}): present "
            "and unused: the plan does not load it and decodes without drafting")


def read_profile(b: Build) -> None:
    cfg, spec = b.config, b.options.profile
    if spec is None:
        b.profile = uniform_profile(cfg)
        b.notes.append("no routing profile given: planned from UNIFORM routing (every expert equally likely); "
                       "record one with ostinato-record for a useful hot set")
    elif spec.startswith("synthetic"):
        b.profile = synthetic_profile(cfg, alpha=synthetic_alpha(spec))
        b.notes.append(f"SYNTHETIC routing profile ({b.profile.source}); real routing was not measured")
    else:
        b.profile = load_profile(spec)
    b.profile.check_fits(cfg.n_layers, cfg.n_routed_experts, cfg.num_experts_per_tok, where=str(spec))


def read_hardware(b: Build) -> None:
    b.hardware = load_hardware(b.options.hardware)
    host = b.hardware.host
    if host.expert_read_bandwidth is None or host.expert_flops is None:
        how = (f"the per-core rates of its expert_kernel ({host.expert_kernel.source}) times its {host.cores} cores"
               if host.expert_kernel is not None else "its host bandwidth and matmul_flops")
        b.notes.append(f"the hardware spec's CPU expert rates are not calibrated: the cost model uses {how} "
                       f"(measure them on the host with ostinato-calibrate)")


def read_workloads(b: Build) -> None:
    """The workloads the choices are priced on (module docstring), and the idle period of the re-placement
    budget from the idle times they record."""
    names: dict[str, Path] = {}
    for path in b.options.workloads:
        w = summarize_workload(path)
        if w.name in names:  # the plan names workloads by file name (machine-independent)
            raise CompileError(f"--workload {path}: another workload has the same file name ({names[w.name]}); the "
                               f"plan names each by its file name, so give them different ones")
        names[w.name] = Path(path)
        b.workloads.append(w)
    b.idle_s, b.idle_from = idle_budget_s({w.name: w.idle_s for w in b.workloads})


def dense_format(o: CompileOptions, hw: HardwareSpec) -> str:
    """How the plan holds dense weights. A CPU computes the exact float32 path (it has no bf16 matmul
    worth the rounding on most hosts); GPUs keep FP8 as stored: a decode token reads half the dense
    bytes of bf16."""
    if o.dense_format is not None:
        return o.dense_format
    return "float32" if hw.cpu_only else "fp8"


def max_bucket(o: CompileOptions, hw: HardwareSpec) -> int:
    """The largest prefill bucket the plan may get: the given buckets', else the largest the cost model may
    choose (powers of two up to MAX_BUCKET and context / 3; none on a cpu-only spec, where steps and
    eager forwards both run eagerly)."""
    if o.prefill_buckets is not None:
        return max(o.prefill_buckets, default=0)
    if hw.cpu_only:
        return 0
    limit = min(MAX_BUCKET, largest_bucket_for(o.context))
    return 1 << (limit.bit_length() - 1) if limit >= 2 else 0


def memory(b: Build) -> None:
    o, cfg, hw = b.options, b.config, b.hardware
    if b.bucket_reserve is None:  # first time: room for the largest bucket the plan may get
        b.bucket_reserve = max_bucket(o, hw)
    b.policy = MemoryPolicy(context=o.context, sessions=o.sessions, prefill_chunk=o.prefill_chunk,
                            upload_group=o.upload_group, snapshots=o.snapshots, dense_format=dense_format(o, hw),
                            max_bucket=b.bucket_reserve)
    expert = model_sizes(cfg).expert_bytes
    b.layer_bytes = [layer_resident_bytes(cfg, l, b.policy) for l in range(cfg.n_layers)]
    b.mtp_bytes = mtp_resident_bytes(cfg, b.policy) if b.mtp_placed else {}
    G = hw.gpus.count
    b.gpu_fixed = [gpu_fixed_bytes(cfg, b.policy, hw.gpus.usable_bytes, expert, first=g == 0, last=g == G - 1,
                                   cuda=not hw.cpu_only) for g in range(G)]


def placement(b: Build) -> None:
    """The hot sets and the layer split. When the MTP block that --speculative auto placed keeps the plan
    from fitting, the plan goes without it (as where speculation does not pay); when only the buckets'
    graph pool does, without bucket steps (user-given buckets are never dropped): memory again, reserve 0."""
    try:
        _place(b)
        return
    except CompileError:
        if b.mtp_placed and b.options.speculative == "auto":
            b.notes.append("no room for the MTP block beside the head: planned without it (policy.speculative: off)")
            log.info("pass placement: no room for the MTP block, planning without it")
            b.mtp_placed = False
        elif not b.bucket_reserve or b.options.prefill_buckets is not None:
            raise
        else:
            b.notes.append(f"no room for the prefill buckets' graph pool ({b.bucket_reserve} tokens): "
                           f"planned without bucket steps")
            log.info("pass placement: no room for a %d-token bucket pool, planning without buckets", b.bucket_reserve)
            b.bucket_reserve = 0
    memory(b)
    placement(b)


def _place(b: Build) -> None:
    cfg, hw = b.config, b.hardware
    expert = model_sizes(cfg).expert_bytes
    counts = b.profile.phase_counts(b.options.objective_phases).numpy()
    budgets = tuple(hw.gpus.usable_bytes - sum(f.values()) for f in b.gpu_fixed)
    mtp_counts = _mtp_counts(b)
    problem = PlacementProblem(counts=counts, layer_bytes=tuple(sum(l.values()) for l in b.layer_bytes),
                               gpu_budget=budgets, expert_bytes=expert, max_hot_per_layer=b.options.max_hot_per_layer,
                               mtp_bytes=sum(b.mtp_bytes.values()),
                               mtp_counts=None if mtp_counts is None else mtp_counts.numpy())
    if cfg.n_layers < hw.gpus.count:
        raise CompileError(f"{hw.gpus.count} GPUs for {cfg.n_layers} layers: plan with at most {cfg.n_layers} GPUs")
    try:
        b.placement = place(problem)
    except DoesNotFit as e:
        raise CompileError(f"does not fit: {_device_short(b, e.device)} is short by {e.short_by:,d} bytes for its "
                           f"layers' dense weights, KV cache (context {b.options.context:,d} x {b.options.sessions} "
                           f"session(s)) and buffers. Use a shorter --context, fewer --sessions, a smaller "
                           f"--prefill-chunk, {_smaller_or_more(b)}.") from None
    if sum(len(h) for h in b.placement.hot) + len(b.placement.mtp_hot) == 0 and b.options.max_hot_per_layer != 0:
        G = hw.gpus.count
        short = expert - max(budgets[g] - (problem.mtp_bytes if g == G - 1 else 0)
                             - sum(problem.layer_bytes[l] for l in range(cfg.n_layers) if b.placement.layer_gpu[l] == g)
                             for g in range(G))
        raise CompileError(f"no hot expert fits: every GPU is short by at least {short:,d} bytes of one expert "
                           f"({expert:,d} B). Use a shorter --context, fewer --sessions or more GPUs.")
    _check_host(b, expert)


def _check_host(b: Build, expert: int) -> None:
    host, hw = _host_components(b, expert), b.hardware
    need = sum(host.values())
    if hw.cpu_only:  # the device is the host itself: what it holds is host memory too
        device = sum(sum(_device_components(b, g, expert).values()) for g in range(hw.gpus.count))
        if need + device > hw.host.usable_bytes:
            raise CompileError(
                f"does not fit: host memory ({hw.host.usable_bytes:,d} usable bytes) is short by "
                f"{need + device - hw.host.usable_bytes:,d} bytes: on a cpu-only spec it holds the device's "
                f"{device:,d} B (dense weights, KV cache, buffers, hot experts), the cold experts' "
                f"{host['cold_experts']:,d} B and the CPU workspace. Use a shorter --context, fewer --sessions, "
                f"{_smaller_or_more(b)}.")
    elif need > hw.host.usable_bytes:
        raise CompileError(f"does not fit: host memory is short by {need - hw.host.usable_bytes:,d} bytes "
                           f"(cold experts {host['cold_experts']:,d} B + workspace). "
                           "Use a machine with more memory or more GPUs (more hot experts).")


def _device_short(b: Build, g: int) -> str:
    """The device that does not fit, as people know it."""
    hw = b.hardware
    if hw.cpu_only:
        return (f"{hw.device_name(g)} (the CPU as a device: {hw.gpus.usable_bytes:,d} bytes of host memory, the spec's "
                f"gpus.usable_bytes)")
    return f"gpu{g} ({hw.gpus.name}, {hw.gpus.usable_bytes:,d} usable bytes)"


def _smaller_or_more(b: Build) -> str:
    """The last ways out of a plan that does not fit: FP8 matrices held as stored where the plan dequantizes them;
    more GPUs; on a cpu-only spec, all of the host's memory for the CPU device, or a host with more."""
    hw = b.hardware
    fp8 = "--dense-format fp8 (FP8 matrices held as stored), " if b.policy.dense_format != "fp8" else ""
    if not hw.cpu_only:
        return f"{fp8}or more GPUs"
    if hw.gpus.count * hw.gpus.usable_bytes < hw.host.usable_bytes:
        return (f"{fp8}or a spec that gives the CPU device the host's memory (ostinato-calibrate cpu-only OUT writes "
                f"one for this host)")
    return f"{fp8}or a host with more memory"


def _device_components(b: Build, g: int, expert: int) -> dict[str, int]:
    """What GPU g holds under the placement, by kind (its plan.memory row)."""
    cfg, pl = b.config, b.placement
    comps = {"dense_weights": 0, "kv_cache": 0, "kv_snapshots": 0, "decode_state": 0, "decode_graph": 0}
    for l in range(cfg.n_layers):
        if pl.layer_gpu[l] == g:
            for k, v in b.layer_bytes[l].items():
                comps[k] += v
    hot = sum(len(pl.hot[l]) for l in range(cfg.n_layers) if pl.layer_gpu[l] == g)
    if b.mtp_placed and g == pl.layer_gpu[-1]:  # the MTP block, beside the head: a layer's components
        for k, v in b.mtp_bytes.items():
            comps[k] = comps.get(k, 0) + v
        hot += len(pl.mtp_hot)
    comps["hot_experts"] = hot * expert
    comps.update(b.gpu_fixed[g])
    return comps


def _host_components(b: Build, expert: int) -> dict[str, int]:
    cfg = b.config
    n_cold = sum(cfg.n_routed_experts - len(h) for h in b.placement.hot)
    if b.mtp_placed:  # the MTP block's cold experts, like a layer's
        n_cold += cfg.n_routed_experts - len(b.placement.mtp_hot)
    n_hot = sum(len(h) for h in b.placement.hot)  # the model's layers: the MTP block's experts never move
    # Host rows of experts (memory_model.host_expert_bytes): the checkpoint's mapped pages on a CPU run,
    # pinned copies with GPUs; with re-placement the hot ones' rows too.
    return {**host_expert_bytes(n_cold, n_hot, expert, _adapt(b).mode),
            "cpu_workspace": workspace_bytes(cfg, b.policy.prefill_chunk)}


def _mtp_counts(b: Build):
    """[E] the MTP block's route counts in the objective phases, when the plan places it and the profile has
    its row (ostinato-record with the block; synthetic and uniform profiles); else None."""
    return b.profile.mtp_counts(b.options.objective_phases) if b.mtp_placed else None


def _matmul_params(dense) -> int:
    """Multiply-adds per token of a layer's dense matmuls (its 2-D weights but hash tables, scales, mHC fns)."""
    return sum(int(np.prod(s.shape)) for s in dense if len(s.shape) == 2 and s.role != "hash_table"
               and not s.is_scale and not s.name.endswith("_fn"))


def cost_model(b: Build) -> None:
    """The cost model of the placement, and the threshold (module docstring: the crossover at each workload's
    median cached prefix)."""
    cfg, pl = b.config, b.placement
    counts = b.profile.phase_counts(b.options.objective_phases).double().numpy()
    layers = []
    for l in range(cfg.n_layers):
        row = counts[l]
        share = row / row.sum() if row.sum() > 0 else np.full(row.size, 1.0 / row.size)
        hot = np.zeros(cfg.n_routed_experts, dtype=bool)
        hot[list(pl.hot[l])] = True
        layers.append(LayerCostInputs(pl.layer_gpu[l], b.layer_bytes[l]["dense_weights"],
                                      _matmul_params(layer_specs(cfg, l, with_experts=False)), hot, share))
    head = b.gpu_fixed[-1]["head"]
    mtp = None
    if cfg.mtp_blocks:  # the first MTP block (speculative decoding drafts with it), by the head
        dense = mtp_block_specs(cfg, 0, with_experts=False)
        row = _mtp_counts(b)  # its experts as placed: none hot when the plan leaves it out or has no row for it
        row = row.double().numpy() if row is not None and row.sum() > 0 else np.ones(cfg.n_routed_experts)
        hot = np.zeros(cfg.n_routed_experts, dtype=bool)
        hot[list(pl.mtp_hot)] = True
        mtp = MtpCostInputs(pl.layer_gpu[-1], sum(held_bytes(s, dense_format(b.options, b.hardware)) for s in dense),
                            _matmul_params(dense), hot, row / row.sum())
    b.cost = CostModel(cfg, b.hardware, layers, model_sizes(cfg).expert_bytes, head, b.options.context,
                       b.options.prefill_chunk, mtp, _cpu_step(b.options))
    c = b.cost
    b.threshold, b.threshold_from = _least_wait(
        b, [(w.name, c.crossover(position=w.median_cached)) for w in b.workloads],
        lambda w, t, n: c.eager_prefill(n, t, w.median_cached), lambda t, n: t is None or n > t, c.crossover)


PRICED_GROUPS = 8  # _least_wait prices a workload's appends in this many groups of equal count


def _least_wait(b: Build, candidates: list[tuple[str, object]], prefill, differs, alone):
    """One choice priced on the workloads -> (value, which workloads it comes from). `candidates`: (workload
    name, the value the cost model chooses at its median cached prefix); where they differ, the value of least
    predicted prefill time `prefill(workload, value, n)` summed over the workloads, each a mean over its calls'
    appends n (at its median cached prefix). Only the n that some value runs differently from another
    (`differs(value, n)`: upload-once, or as bucket steps) are priced, the others adding the same to every value;
    in PRICED_GROUPS groups of equal count, each priced at its middle append (a prefill's price is smooth in n:
    a few points rank the values, where every distinct n would cost a compile seconds). Ties: the earlier
    candidate. No workload: `alone()`, at the plan's context."""
    if not candidates:
        return alone(), "the plan's context (no workload)"
    values = []
    for _, v in candidates:
        if v not in values:
            values.append(v)
    if len(values) == 1:
        return values[0], " and ".join(name for name, _ in candidates)
    score = {i: 0.0 for i in range(len(values))}
    for w in b.workloads:
        sizes = [n for n in np.sort(w.appended).tolist() if n and any(differs(v, n) != differs(values[0], n)
                                                                      for v in values[1:])]
        for group in np.array_split(np.array(sizes, dtype=np.int64), min(PRICED_GROUPS, len(sizes))) if sizes else []:
            n = int(group[(len(group) - 1) // 2])
            for i, v in enumerate(values):
                score[i] += len(group) * prefill(w, v, n) / len(w.appended)
    best = min(score, key=lambda i: (score[i], i))
    return values[best], " and ".join(name for name, v in candidates if v == values[best]) + \
        f" (least predicted prefill of {', '.join(f'{name} {_said(v)}' for name, v in candidates)})"


def _said(value) -> str:
    """A candidate as the notes write it: a threshold's tokens, buckets' sizes."""
    return "split-route at any size" if value is None else f"{value:,d}" if isinstance(value, int) else \
        f"buckets {list(value)}"


def buckets(b: Build) -> None:
    """The prefill buckets: the given ones, else the cost model's choice within the memory reserve. The
    rule they follow is the plan schema's (checked by the policy pass)."""
    o = b.options
    if o.prefill_buckets is not None:
        b.buckets, b.buckets_from = sorted(set(o.prefill_buckets)), "--prefill-buckets"
        return
    c = b.cost
    choices = [(w.name, tuple(c.choose_buckets(b.threshold, o.context, b.bucket_reserve, position=w.median_cached)))
               for w in b.workloads]
    chosen, b.buckets_from = _least_wait(
        b, choices, lambda w, v, n: c.prefill(n, b.threshold, list(v), w.median_cached),
        lambda v, n: n <= max(v, default=0), lambda: c.choose_buckets(b.threshold, o.context, b.bucket_reserve))
    b.buckets = list(chosen)


def replan(b: Build) -> None:
    """The memory pass reserved the graph pool for the largest bucket the cost model might keep; when it
    kept smaller ones, plan again with that reserve (more room for hot experts) and buckets at most as
    large. Once: the new placement only lowers the prefill times."""
    chosen = max(b.buckets, default=0)
    if chosen >= b.bucket_reserve:
        return
    b.bucket_reserve = chosen
    for again in (memory, placement, cost_model, buckets):
        log.info("pass replan: %s (bucket reserve %d tokens)", again.__name__, b.bucket_reserve)
        again(b)


def speculation(b: Build) -> None:
    """Whether the plan decodes with the MTP block (policy.speculative), from the cost model's price of a
    speculative step with the block as placed (--speculative auto), or as forced (mtp, off). Where it does
    not pay, the plan is made again without it: its memory goes back to the layers' hot experts."""
    o, pl = b.options, b.placement
    if not b.has_mtp:
        b.speculative = _speculative(b, "")
        return
    p = b.profile
    if p.mtp_drafts >= MIN_MEASURED_DRAFTS:
        b.notes.append(f"speculation is priced at the MTP block's draft acceptance measured on the routing profile: "
                       f"{_percent(p.mtp_acceptance)} ({p.mtp_agreed} of {p.mtp_drafts} depth-1 greedy drafts kept), "
                       f"not the published {MTP_ACCEPTANCE:.0%}")
    elif p.mtp_drafts:
        b.notes.append(f"the routing profile measured the MTP block's draft acceptance on only {p.mtp_drafts} drafts "
                       f"(fewer than {MIN_MEASURED_DRAFTS}): speculation is priced at the published "
                       f"{MTP_ACCEPTANCE:.0%}")
    if o.speculative == "off":
        b.speculative = _speculative(b, "; --speculative off: the plan leaves the MTP block out")
        return
    if not b.mtp_placed:  # auto, and placement found no room for it
        b.speculative = _speculative(b, "; no room for the MTP block beside the head: the plan leaves it out "
                                        "(policy.speculative: off)")
        return
    on = (f"the plan places the MTP block on {b.hardware.device_name(pl.layer_gpu[-1])} and decodes with it "
          f"(policy.speculative: mtp)")
    if o.speculative == "mtp":
        b.speculative = _speculative(b, f"; --speculative mtp: {on}")
    elif _speculative(b, "").pays:
        b.speculative = _speculative(b, f"; {on}")
    else:
        b.speculative = _speculative(b, "; the plan leaves the MTP block out (policy.speculative: off; "
                                        "--speculative mtp forces it)")
        b.mtp_placed = False
        for again in (memory, placement, cost_model, buckets):
            log.info("pass speculation: %s without the MTP block", again.__name__)
            again(b)
        return
    if _mtp_counts(b) is None:
        b.notes.append("the routing profile has no row for the MTP block: its experts are all cold (record a "
                       "profile with ostinato-record to place the MTP block's experts)")


def policy(b: Build) -> None:
    """The plan's execution policy, validated by the plan schema before any kernel is built; the notes say
    which workload each choice came from (module docstring) and what each workload's typical call waits."""
    cfg, hw, o = b.config, b.hardware, b.options
    b.notes += _workload_notes(b)
    try:
        b.execution = validate(Policy, dict(
            context=o.context, sessions=o.sessions, prefill_threshold=b.threshold, prefill_chunk=o.prefill_chunk,
            upload_group=o.upload_group, snapshots=o.snapshots, decode_graph_routes=cfg.num_experts_per_tok,
            prefill_buckets=list(b.buckets), cpu_threads=hw.host.cores, objective_phases=list(o.objective_phases),
            speculative="mtp" if b.mtp_placed else "off", adapt=_adapt(b).model_dump(), cpu_step=_cpu_step(o),
            chat_encoding=b.chat_encoding),
            "the plan's policy")
    except SchemaError as e:
        raise CompileError(str(e)) from None


def _workload_notes(b: Build) -> list[str]:
    t = b.threshold
    split = "split-route at any size" if t is None else f"split-route up to {t:,d} tokens, upload-once above"
    buckets = f"bucket steps up to {b.buckets[-1]}" if b.buckets else "no bucket steps"
    notes = [f"prefill: {split} (priced on {b.threshold_from}); {buckets} (priced on {b.buckets_from})",
             f"re-placement budget (policy.adapt.max_bytes): the link's bytes in {b.idle_from}",
             f"predictions: priced at session position {predictions_position(b):,d}"
             + (f" ({b.workloads[0].name}'s median cached prefix)" if b.workloads else "")]
    for w in b.workloads:
        n, at = int(np.sort(w.appended)[(len(w.appended) - 1) // 2]), w.median_cached
        wait = (b.cost.prefill(n, t, b.buckets, at) + b.cost.decode_step(at + n)) * 1e3
        top = b.buckets[-1] if b.buckets else 0
        bucket = float(np.mean(w.appended <= top))
        upload = 0.0 if t is None else float(np.mean(w.appended > max(t, top)))
        notes.append(f"workload {w.name} ({w.sessions} sessions, {len(w.appended):,d} calls after a session's first): "
                     f"median append {n:,d} tokens on a median cached prefix of {w.median_cached:,d}, predicted "
                     f"wait {wait:,.0f} ms; {bucket:.0%} of its calls as bucket steps, {1 - bucket - upload:.0%} "
                     f"split-route, {upload:.0%} upload-once")
    return notes


def _cpu_step(o: CompileOptions) -> str:
    if o.cpu_step not in CPU_STEP:
        raise CompileError(f"--cpu-step is {o.cpu_step!r}: one of {', '.join(CPU_STEP)}")
    return o.cpu_step


def _adapt(b: Build) -> AdaptPolicy:
    """policy.adapt: --adapt, by default idle where there are GPUs to promote experts onto."""
    o, hw, pl = b.options, b.hardware, b.placement
    mode = o.adapt if o.adapt is not None else "off" if hw.cpu_only else "idle"
    if mode not in ADAPT:
        raise CompileError(f"--adapt is {mode!r}: one of {', '.join(ADAPT)}")
    return default_policy(mode, sum(len(h) for h in pl.hot), model_sizes(b.config).expert_bytes,
                          hw.link.h2d_bandwidth, b.idle_s)


def kernels(b: Build) -> None:
    if not b.has_weights:
        b.notes.append("kernels: skipped (no weights present)")
        return
    if not b.options.build_kernels:
        b.notes.append("kernels: skipped (--no-kernels)")
        return
    b.kernels, b.templates = build_plan_kernels(b)


def plan(b: Build) -> None:
    cfg, hw, o, pl = b.config, b.hardware, b.options, b.placement
    expert = model_sizes(cfg).expert_bytes
    memory_rows = [_device_memory(f"gpu{g}", hw.gpus.usable_bytes, _device_components(b, g, expert))
                   for g in range(hw.gpus.count)]
    memory_rows.append(_device_memory("host", hw.host.usable_bytes, _host_components(b, expert)))
    counts = b.profile.phase_counts(o.objective_phases)
    layer_rows = []
    for l in range(cfg.n_layers):
        total = int(counts[l].sum())
        covered = int(counts[l][list(pl.hot[l])].sum()) if pl.hot[l] else 0
        layer_rows.append(LayerPlan(layer=l, gpu=pl.layer_gpu[l], attention=cfg.attention_kind(l),
                                    hot_experts=list(pl.hot[l]),
                                    hot_route_share=_round(covered / total if total else 0.0)))
    b.plan = Plan(
        schema_version=SCHEMA_VERSION,
        notes=list(b.notes),
        provenance=Provenance(compiler_version=__version__, config_sha256=b.fingerprint.config_sha256,
                              index_sha256=b.fingerprint.index_sha256,
                              weights_sha256=b.weights.combined if b.weights else None,
                              shard_sha256=dict(b.weights.shards) if b.weights else {},
                              profile_sha256=b.profile.sha256(),
                              profile_source=b.profile.source, hardware_sha256=hw.sha256,
                              workloads={w.name: w.sha256 for w in b.workloads},
                              templates=dict(sorted(b.templates.items()))),
        model=ModelSummary(path=relative_to_plan(o.model, o.output), layers=cfg.n_layers,
                           routed_experts=cfg.n_routed_experts, top_k=cfg.num_experts_per_tok,
                           hidden_size=cfg.hidden_size, expert_format="mxfp4", expert_bytes=expert,
                           dense_format=b.policy.dense_format,
                           attention=[cfg.attention_kind(l) for l in range(cfg.n_layers)],
                           hash_layers=cfg.num_hash_layers),
        hardware=hw,
        memory=memory_rows,
        layers=layer_rows,
        mtp=_mtp_plan(b) if b.mtp_placed else None,
        policy=b.execution,
        kernels=b.kernels,
        predictions=_predictions(b),
    ).located_at(Path(o.output).resolve().parent)


PASSES = (read_model, read_profile, read_hardware, read_workloads, memory, placement, cost_model, buckets, replan,
          speculation, policy, kernels, plan)


def compile_plan(options: CompileOptions, on_pass=lambda name: None) -> Build:
    """The passes in order, each logged; `on_pass(name)`: told as each starts (the CLI's progress bar)."""
    b = Build(options)
    for p in PASSES:
        log.info("pass %s", p.__name__)
        on_pass(p.__name__)
        p(b)
    return b


# ----- helpers ----------------------------------------------------------------------------------
def _mtp_plan(b: Build) -> LayerPlan:
    """The MTP block's row: layer index model.layers, beside the head; its share of its own routes (0 without
    a profile row)."""
    cfg, pl, row = b.config, b.placement, _mtp_counts(b)
    total = int(row.sum()) if row is not None else 0
    covered = int(row[list(pl.mtp_hot)].sum()) if total and pl.mtp_hot else 0
    return LayerPlan(layer=cfg.n_layers, gpu=pl.layer_gpu[-1], attention=cfg.attention_kind(cfg.n_layers),
                     hot_experts=list(pl.mtp_hot), hot_route_share=_round(covered / total if total else 0.0))


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def _device_memory(device: str, usable: int, components: dict[str, int]) -> DeviceMemory:
    total = sum(components.values())
    return DeviceMemory(device=device, usable_bytes=usable, components=components, total_bytes=total,
                        free_bytes=usable - total)


def synthetic_alpha(spec: str) -> float:
    """ALPHA of a `synthetic[:ALPHA]` profile spec (1.0 when omitted)."""
    text = spec.split(":", 1)[1] if ":" in spec else "1.0"
    try:
        alpha = float(text)
    except ValueError:
        alpha = float("nan")
    if not alpha >= 0 or alpha == float("inf"):
        raise CompileError(f"--profile {spec}: ALPHA must be a number >= 0 (the Zipf exponent), got {text!r}")
    return alpha


def predictions_position(b: Build) -> int:
    """The session position the plan's headline predictions are priced at: the first workload's median cached
    prefix (a tool output arrives on a conversation that long; the cost model prices attention there), 0 when the
    plan is priced on no workload."""
    return b.workloads[0].median_cached if b.workloads else 0


def _predictions(b: Build) -> Predictions:
    c, t, at = b.cost, b.threshold, predictions_position(b)
    decode = c.decode_step(at)
    turns = []
    for n in PREDICTED_TURNS:
        split, upload = c.split_prefill(n, at), c.upload_prefill(n, at)
        bucket = c.bucket_prefill(n, b.buckets, at) if b.buckets and n <= b.buckets[-1] else None
        mode = "bucket" if bucket is not None else "upload" if t is not None and n > t else "split"
        turns.append(PrefillPrediction(tokens=n, mode=mode, bucket_ms=None if bucket is None else _round(bucket * 1e3),
                                       split_ms=_round(split * 1e3), upload_ms=_round(upload * 1e3),
                                       wait_ms=_round((c.prefill(n, t, b.buckets, at) + c.decode_step(at + n)) * 1e3)))
    shares = {}
    for phase in PHASES:
        counts = b.profile.phase_counts((phase,))
        total = int(counts.sum())
        covered = sum(int(counts[l][list(h)].sum()) for l, h in enumerate(b.placement.hot) if h)
        shares[phase] = _round(covered / total) if total else None
    return Predictions(hot_route_share=_round(c.hot_share()), hot_route_share_by_phase=shares,
                       decode_ms_per_token=_round(decode * 1e3), decode_tokens_per_s=_round(1.0 / decode),
                       wait_after_tool_output_120_tokens_ms=next(x.wait_ms for x in turns if x.tokens == 120),
                       prefill=turns, speculative=b.speculative)


def _acceptance(b: Build) -> tuple[float, str]:
    """The draft acceptance speculation is priced at, and where it comes from: the profile's measured rate
    (ostinato-record: depth-1 greedy drafts kept) on at least MIN_MEASURED_DRAFTS drafts, else the
    published MTP_ACCEPTANCE ("90% until real weights say otherwise")."""
    p = b.profile
    if p is not None and p.mtp_drafts >= MIN_MEASURED_DRAFTS:
        return p.mtp_acceptance, f"measured on the profile's {p.mtp_drafts} drafts"
    if p is not None and p.mtp_drafts:
        return MTP_ACCEPTANCE, (f"the published figure; the profile's {p.mtp_drafts} measured drafts are fewer "
                                f"than {MIN_MEASURED_DRAFTS}")
    return MTP_ACCEPTANCE, "the published figure; the profile measured none"


def _percent(x: float) -> str:
    """90% as 90%, 0.5859% as 0.6%."""
    return f"{x:.0%}" if round(x * 100, 1) == round(x * 100) else f"{x:.1%}"


def _speculative(b: Build, then: str) -> SpeculativePrediction:
    """Does depth-1 MTP speculation pay here (cost_model.speculative_decode at the acceptance _acceptance
    gives: measured on the profile or published) with the MTP block as now placed, and why; `then`: what
    the plan does about it (appended to the reason)."""
    a, source = _acceptance(b)
    if not b.has_mtp:
        return SpeculativePrediction(pays=False, acceptance=_round(a), decode_tokens_per_s=None, gain=None,
                                     reason="the checkpoint has no MTP block (mtp.0.*) to draft with")
    plain, step = b.cost.speculative_decode(a)
    gain = step.tokens_per_s / plain
    parts = (f"a step of {step.tokens:.2f} tokens: draft {step.draft_s * 1e3:.3g} ms + 2-token verify "
             f"{step.verify_s * 1e3:.3g} ms + re-run on rejection {step.rerun_s * 1e3:.3g} ms, against "
             f"{1e3 / plain:.3g} ms a token decoding plainly")
    verdict = "pays" if gain > 1 else "does not pay"
    hot = len(b.placement.mtp_hot)
    experts = (f"{hot} of the MTP block's experts hot" if b.mtp_placed else "none of the MTP block's experts hot")
    return SpeculativePrediction(
        pays=gain > 1, acceptance=_round(a), decode_tokens_per_s=_round(step.tokens_per_s), gain=_round(gain),
        reason=f"speculation {verdict} here: {gain:.2f}x decode at {_percent(a)} acceptance ({source}) with "
               f"{experts} ({parts})"
               + then)
