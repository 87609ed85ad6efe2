"""Build: the state the passes share. Each pass reads what earlier ones put here and adds its own result."""

from __future__ import annotations

from dataclasses import dataclass, field

from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.fingerprint import ModelFingerprint
from ostinato.checkpoint.weight_fingerprint import WeightFingerprint
from ostinato.hardware import HardwareSpec
from ostinato.plan import Plan, Policy, SpeculativePrediction
from ostinato.workload import WorkloadSummary

from ..cost_model import CostModel
from ..memory_model import MemoryPolicy
from ..placement import Placement
from ..profile import RoutingProfile
from .options import CompileOptions


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
    shard_threshold: int | None = None  # uploads of longer prefills are sharded over every GPU's link (cost_model)
    shard_from: str = ""        # which workloads' crossover it is (said in the notes)
    shard_major_copy: bool = False  # the host holds the down matrices shard-major for the slices (shard_copy)
    shard_copy_why: str = ""    # ...and why, or why not (said in the notes; "" where the plan does not shard)
    slice_reserve: bool | None = None  # the memory pass counts the slices' staging (None: not decided yet)
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


def mtp_counts(b: Build):
    """[E] the MTP block's route counts in the objective phases, when the plan places it and the profile has
    its row (ostinato-record with the block; synthetic and uniform profiles); else None."""
    return b.profile.mtp_counts(b.options.objective_phases) if b.mtp_placed else None
