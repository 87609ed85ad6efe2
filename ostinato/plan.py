"""plan.yaml: the one contract between the compiler and the runtime (schema version 7).

A plan is fully resolved: which GPU runs each layer, which expert ids are resident there, every
device's bytes by kind, the execution policy, the generated kernels and the cost model's
predictions, with the hashes of everything it was built from (config, index, each weight shard's
bytes, profile, hardware, templates) and the hardware spec it was planned for. The runtime reads
it and decides nothing the plan could have decided.

Paths in a plan (the model directory, each kernel artifact) are relative to the plan file's
folder, so a plan runs from any working directory; `Plan.resolve` turns them into real paths.
Reading validates every field (types, ranges, expert ids against the expert count, GPUs against
the spec) and refuses unknown ones; writing is deterministic (same plan, same bytes).
"""

from __future__ import annotations

import hashlib
import os
from enum import Enum
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, model_validator

from .adaptation import AdaptPolicy
from .buckets import bucket_rule_error
from .hardware import HardwareSpec
from .validation import Bytes, Count, Index, Name, Record, SchemaError, Sha256, Share, validate
from .yaml_files import dump_yaml, read_yaml

SCHEMA_VERSION = 9  # 4: provenance.weights_sha256 and shard_sha256 (the weights themselves);
                    # 5: predictions.speculative (does MTP speculative decoding pay on this hardware);
                    # 6: the MTP block's placement (`mtp`) and policy.speculative (the engine drafts with it);
                    # 7: policy.adapt (the hot set follows the session, ostinato/adaptation.py);
                    # 8: policy.cpu_step (a fixed-shape step on the CPU runs compiled, runtime/engine/cpu_step.py);
                    # 9: policy.chat_encoding (the release's chat encoder: ostinato/chat_encodings.py)

AttentionKind = Literal["sliding", "csa", "hca"]
Phase = Literal["decode", "short_prefill", "long_prefill"]
Milliseconds = float


class PlanError(SchemaError):
    """A plan file is malformed or does not match the checkpoint; the message names the field."""


class KernelName(str, Enum):
    """The generated kernels a plan names: codegen writes these entries, the loader looks them up."""
    COLD_EXPERTS_CPU = "cold_experts_cpu"          # routed experts on the host (C++, MXFP4)
    HOT_EXPERTS_PREFILL = "hot_experts_prefill"    # resident experts, routes grouped by expert (Triton)
    HOT_EXPERTS_DECODE = "hot_experts_decode"      # resident experts, top_k fixed masked slots (Triton)
    HC_MIX_CPU = "hc_mix_cpu"                      # mHC mixing weights + Sinkhorn on the host (C++)
    HC_MIX_TRITON = "hc_mix_triton"                # the same on the GPUs (Triton)
    DENSE_OPS_CPU = "dense_ops_cpu"                # norms, rope, head, FP8 products on the host (C++)
    DENSE_OPS_TRITON = "dense_ops_triton"          # the same on the GPUs (Triton)


class Provenance(Record):
    compiler_version: Name
    config_sha256: Sha256
    index_sha256: Sha256 | None          # None: planned from config.json alone
    weights_sha256: Sha256 | None        # over shard_sha256 (WeightFingerprint.combined); None: no weights there
    shard_sha256: dict[str, Sha256]      # shard file name -> sha256 of its bytes: a refusal names the shard
    profile_sha256: Sha256
    profile_source: str
    hardware_sha256: Sha256
    templates: dict[str, Sha256] = {}    # template or included header path -> sha256 of its text
    workloads: dict[str, Sha256] = {}    # workload CSV file name -> sha256 of its bytes: the workloads the plan's
                                         # threshold, buckets and re-placement budget were priced on (its notes
                                         # say which came from which: compiler/passes/least_wait.py)

    @model_validator(mode="after")
    def _weights_agree(self) -> Provenance:
        if (self.weights_sha256 is None) != (not self.shard_sha256):
            raise ValueError("fields 'provenance.weights_sha256' and 'provenance.shard_sha256' must be both "
                             "empty (no weights) or both set")
        return self


class ModelSummary(Record):
    path: Name                           # the checkpoint directory, relative to the plan file
    layers: Count
    routed_experts: Count
    top_k: Count
    hidden_size: Count
    expert_format: Literal["mxfp4"]
    expert_bytes: Bytes
    dense_format: Literal["fp8", "bf16", "float32"]  # fp8: FP8 matrices kept as stored, computed in bf16;
                                                     # else dequantized to that dtype; activations and KV rows
                                                     # in the compute dtype
    attention: list[AttentionKind]             # per layer
    hash_layers: Index


class DeviceMemory(Record):
    device: str = Field(pattern=r"^(gpu[0-9]+|host)$")
    usable_bytes: Bytes
    components: dict[str, Bytes]         # kind -> bytes
    total_bytes: Bytes
    free_bytes: int

    @model_validator(mode="after")
    def _adds_up(self) -> DeviceMemory:
        if sum(self.components.values()) != self.total_bytes:
            raise ValueError(f"{self.device}: total_bytes {self.total_bytes} is not the sum of its components "
                             f"({sum(self.components.values())})")
        if self.usable_bytes - self.total_bytes != self.free_bytes:
            raise ValueError(f"{self.device}: free_bytes {self.free_bytes} is not usable_bytes - total_bytes")
        return self


class LayerPlan(Record):
    layer: Index
    gpu: Index
    attention: AttentionKind
    hot_experts: list[Index]             # sorted expert ids resident on the layer's GPU
    hot_route_share: Share               # profiled share of this layer's routes the hot set covers


class Policy(Record):
    context: Count
    sessions: Count
    prefill_threshold: Index | None      # prefills of more tokens use upload-once (0: all do); None: none do
    shard_threshold: Index | None = None  # ...and of more tokens than this their uploads are sharded over every
                                          # GPU's link (runtime/engine/sharded_upload.py; at least
                                          # prefill_threshold); None (or absent: older plans): never sharded
    shard_major_copy: bool = False  # a plan that shards holds its pinned host rows' down matrices once more,
                                    # shard-major (runtime/engine/shard_rows.py; memory: host shard_major_down),
                                    # so each GPU's w2 slice is one contiguous copy: the compiler's choice where
                                    # the host has room (compiler/passes/shard_copy.py); False (or absent: older
                                    # plans): w2's slices are copied from the strided rows
    prefill_chunk: Count
    upload_group: Count
    snapshots: Count                     # turn-boundary snapshots a session keeps (memory: kv_snapshots)
    decode_graph_routes: Count           # fixed route slots per layer in the decode graph (= top_k)
    prefill_buckets: list[Count]         # token counts of the captured short-prefill steps (ascending powers of
                                         # two); prompts up to the largest run as those steps, exactly
    cpu_threads: Count
    decode_cpu_threads: Count | None = None  # the CPU expert pool's threads in decode-sized calls (decode, batched
                                             # decode, the MTP draft and verify), at most cpu_threads: the cost
                                             # model's choice (compiler/cost_model/pool_threads.py); None (or
                                             # absent: older plans): every call runs cpu_threads
    objective_phases: list[Phase]
    adapt: AdaptPolicy                   # re-placement between turns (mode off, or idle: its budget and blend)
    speculative: Literal["off", "mtp"]   # decode drafts with the MTP block and verifies 2 tokens per step
                                         # ("mtp": the block is placed, `mtp`, and its memory counted)
    cpu_step: Literal["compiled", "eager"]  # the decode step's CPU segments: one compiled call (the CPU's
                                            # analogue of a CUDA graph) or the eager step
    chat_encoding: Literal["dsv4", "dsv4-0731"]  # the release's chat encoder: its reasoning-effort levels
                                                 # (ostinato/chat_encodings.py)

    @model_validator(mode="after")
    def _buckets_rule(self) -> Policy:
        error = bucket_rule_error(self.prefill_buckets, self.context)
        if error:
            raise ValueError(f"field 'policy.prefill_buckets': {error}")
        return self

    @model_validator(mode="after")
    def _decode_pool_within_the_pool(self) -> Policy:
        d = self.decode_cpu_threads
        if d is not None and d > self.cpu_threads:
            raise ValueError(f"field 'policy.decode_cpu_threads' is {d}: the decode calls' share of the CPU expert "
                             f"pool, at most policy.cpu_threads ({self.cpu_threads})")
        return self

    @model_validator(mode="after")
    def _shards_upload(self) -> Policy:
        s, t = self.shard_threshold, self.prefill_threshold
        if s is not None and (t is None or s < t):
            raise ValueError(f"field 'policy.shard_threshold' is {s}: sharding applies to prefills that upload, so it "
                             f"must be at least policy.prefill_threshold ({t}), or null")
        if self.shard_major_copy and s is None:
            raise ValueError("field 'policy.shard_major_copy' is true: the copy serves sharded uploads, and "
                             "policy.shard_threshold is null (the plan never shards)")
        return self


class KernelEntry(Record):
    name: KernelName
    template: Name                       # path under templates/
    template_sha256: Sha256
    params: dict[str, int | float | str]
    flags: list[str]
    content_sha256: Sha256               # over template text, params and flags
    path: Name                           # the artifact, relative to the plan file


class PrefillPrediction(Record):
    tokens: Count
    mode: Literal["bucket", "split", "upload", "sharded"]
    bucket_ms: Milliseconds | None       # as bucket steps (None: more tokens than the largest bucket)
    split_ms: Milliseconds
    upload_ms: Milliseconds
    sharded_ms: Milliseconds | None = None  # upload-once sharded over every GPU's link (None: the plan never shards)
    wait_ms: Milliseconds                # prefill in its mode + the first decode step


class SpeculativePrediction(Record):
    """Whether speculative decoding with the checkpoint's MTP block pays on this hardware, by the cost
    model (cost_model.speculative_decode: depth 1, draft + 2-token verify + a re-run on rejection)."""
    pays: bool
    acceptance: Share                    # the draft acceptance priced: the profile's measured rate (enough
                                         # drafts) or the published cost_model.MTP_ACCEPTANCE; reason says which
    decode_tokens_per_s: float | None    # with speculation; None: no MTP block to draft with
    gain: float | None                   # over plain decoding (predictions.decode_tokens_per_s)
    reason: str


class Predictions(Record):
    hot_route_share: Share
    hot_route_share_by_phase: dict[Phase, Share | None]   # None: the profile has no routes of that phase
    decode_ms_per_token: Milliseconds
    decode_tokens_per_s: float
    wait_after_tool_output_120_tokens_ms: Milliseconds
    prefill: list[PrefillPrediction]
    speculative: SpeculativePrediction


class Plan(Record):
    schema_version: Literal[9]
    notes: list[str]                     # what a reader must know (synthetic profile, skipped steps, ...)
    provenance: Provenance
    model: ModelSummary
    hardware: HardwareSpec
    memory: list[DeviceMemory]           # gpu0.., then host
    layers: list[LayerPlan]
    mtp: LayerPlan | None                # the MTP block (layer index model.layers), placed like a layer; None:
                                         # the checkpoint has none, or the plan leaves it out
    policy: Policy
    kernels: list[KernelEntry]
    predictions: Predictions
    _folder: Path = PrivateAttr(default=Path("."))   # the plan file's folder: relative paths start there

    @model_validator(mode="after")
    def _consistent(self) -> Plan:
        m, gpus = self.model, self.hardware.gpus.count
        if len(m.attention) != m.layers:
            raise ValueError(f"field 'model.attention' has {len(m.attention)} entries, model.layers is {m.layers}")
        if len(self.layers) != m.layers:
            raise ValueError(f"field 'layers' has {len(self.layers)} entries, model.layers is {m.layers}")
        for i, lp in enumerate(self.layers):
            if lp.attention != m.attention[i]:
                raise ValueError(f"field 'layers[{i}].attention' is {lp.attention}, model.attention says "
                                 f"{m.attention[i]}")
            self._check_layer(f"field 'layers[{i}]", lp, i)
        if self.mtp is not None:
            self._check_layer("field 'mtp", self.mtp, m.layers)
            if self.layers and self.mtp.gpu != self.layers[-1].gpu:
                raise ValueError(f"field 'mtp.gpu' is {self.mtp.gpu}: the MTP block runs by the head, on the last "
                                 f"layer's GPU ({self.layers[-1].gpu})")
        if self.policy.speculative == "mtp" and self.mtp is None:
            raise ValueError("field 'policy.speculative' is mtp, but the plan places no MTP block (field 'mtp')")
        devices = [d.device for d in self.memory]
        if devices != [f"gpu{g}" for g in range(gpus)] + ["host"]:
            raise ValueError(f"field 'memory' lists devices {devices}, expected gpu0..gpu{gpus - 1} then host")
        names = [k.name for k in self.kernels]
        if len(set(names)) != len(names):
            raise ValueError(f"field 'kernels' names a kernel twice: {[n.value for n in names]}")
        return self

    def _check_layer(self, where: str, lp: LayerPlan, index: int) -> None:
        """One placed layer (`where`: "field 'layers[3]"): its index, GPU and hot expert ids."""
        m, gpus = self.model, self.hardware.gpus.count
        if lp.layer != index:
            raise ValueError(f"{where}.layer' is {lp.layer}, expected {index}")
        if lp.gpu >= gpus:
            raise ValueError(f"{where}.gpu' is {lp.gpu}, the hardware has {gpus} GPU(s) (hardware.gpus.count)")
        bad = [e for e in lp.hot_experts if e >= m.routed_experts]
        if bad:
            raise ValueError(f"{where}.hot_experts' holds expert id {bad[0]}, the model has "
                             f"{m.routed_experts} experts (ids 0..{m.routed_experts - 1})")
        if lp.hot_experts != sorted(set(lp.hot_experts)):
            raise ValueError(f"{where}.hot_experts' must be sorted ids without repeats")

    # ----- paths ---------------------------------------------------------------------------------
    @property
    def folder(self) -> Path:
        return self._folder

    def located_at(self, folder: str | Path) -> Plan:
        """This plan, its relative paths resolved against `folder` (where its file is or will be)."""
        new = self.model_copy()
        new._folder = Path(folder)
        return new

    def resolve(self, relative: str) -> Path:
        return self._folder / relative

    @property
    def model_dir(self) -> Path:
        return self.resolve(self.model.path)

    def kernel(self, name: KernelName) -> KernelEntry:
        for k in self.kernels:
            if k.name == name:
                return k
        raise PlanError(f"field 'kernels' has no '{name.value}' entry: compile the plan with kernels "
                        "(without --no-kernels)")

    # ----- writing -------------------------------------------------------------------------------
    def dumps(self) -> str:
        lines = [f"Ostinato placement plan for {self.model.path} on {self.hardware.name}, written by "
                 f"ostinato-compile {self.provenance.compiler_version}: do not edit, recompile.",
                 f"routing profile: {self.provenance.profile_source}",
                 "paths are relative to this file's folder"] + [f"note: {n}" for n in self.notes]
        header = "".join(f"# {line}\n" for line in lines)
        return header + dump_yaml(self.model_dump(mode="json"))

    def write(self, path: str | Path) -> Path:
        """Write atomically (a reader never sees half a plan)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(self.dumps())
        os.replace(tmp, path)
        return path

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.dumps().encode()).hexdigest()


def relative_to_plan(path: str | Path, plan_file: str | Path) -> str:
    """How a plan written to `plan_file` names `path` (relative to the plan file's folder)."""
    return os.path.relpath(Path(path).resolve(), Path(plan_file).resolve().parent)


def plan_from_dict(data: object, source: str = "plan") -> Plan:
    if isinstance(data, dict) and data.get("schema_version") != SCHEMA_VERSION:
        raise PlanError(f"{source}: field 'schema_version' is {data.get('schema_version')!r}; this Ostinato reads "
                        f"{SCHEMA_VERSION}: recompile the plan with ostinato-compile")
    try:
        return validate(Plan, data, source)
    except SchemaError as e:
        raise PlanError(str(e)) from None


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    return plan_from_dict(read_yaml(path, PlanError), str(path)).located_at(path.resolve().parent)


def check_fingerprint(plan: Plan, config_sha256: str, index_sha256: str | None) -> None:
    """Refuse a plan built for another checkpoint, naming the field that differs."""
    for name, mine, theirs in (("provenance.config_sha256", plan.provenance.config_sha256, config_sha256),
                               ("provenance.index_sha256", plan.provenance.index_sha256, index_sha256)):
        if mine != theirs:
            raise PlanError(f"plan does not match this checkpoint: field '{name}' is {mine} in the plan, "
                            f"{theirs} for the checkpoint (recompile the plan for this model)")


def check_weights(plan: Plan, shard_sha256: dict[str, str] | None) -> None:
    """Refuse a plan compiled for other weights (same config and index, other bytes: a re-quantization,
    an update, a fine-tune), naming the shard that differs. `shard_sha256`: the checkpoint's
    (weight_fingerprint.py), None when its weights are not there."""
    mine, theirs = dict(plan.provenance.shard_sha256), dict(shard_sha256 or {})
    if mine == theirs:
        return
    advice = "the weights changed after the plan was compiled: recompile the plan for these weights"
    if not mine:
        raise PlanError("plan does not match this checkpoint: field 'provenance.shard_sha256' is empty (planned "
                        f"without weights) and the checkpoint has {len(theirs)} weight shard(s): {advice}")
    if not theirs:
        raise PlanError("plan does not match this checkpoint: the plan was compiled with its weights "
                        "(field 'provenance.shard_sha256') and the checkpoint has none (or misses a shard)")
    for name in sorted(set(mine) | set(theirs)):
        if mine.get(name) != theirs.get(name):
            if name not in theirs:
                raise PlanError(f"plan does not match this checkpoint: shard '{name}' (field "
                                f"'provenance.shard_sha256') is not among the checkpoint's weight files: {advice}")
            if name not in mine:
                raise PlanError(f"plan does not match this checkpoint: shard '{name}' is not in the plan's "
                                f"field 'provenance.shard_sha256': {advice}")
            raise PlanError(f"plan does not match this checkpoint: shard '{name}' has sha256 {theirs[name]}, the "
                            f"plan was compiled for {mine[name]} (field 'provenance.shard_sha256'): {advice}")
