"""plan.yaml: the one contract between the compiler and the runtime.

A plan is fully resolved: which GPU runs each layer, which expert ids are resident there, every
device's bytes by kind, the execution policy, the generated kernels and the cost model's
predictions, with the hashes of everything it was built from. The runtime reads it and decides
nothing the plan could have decided. Writing is deterministic (same plan, same bytes).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

SCHEMA_VERSION = 1


class PlanError(ValueError):
    """A plan file is malformed or does not match the checkpoint; the message names the field."""


@dataclass(frozen=True)
class Provenance:
    compiler_version: str
    config_sha256: str
    index_sha256: str | None
    profile_sha256: str
    profile_source: str
    hardware_sha256: str
    templates: dict = field(default_factory=dict)   # template name -> sha256


@dataclass(frozen=True)
class ModelSummary:
    path: str
    layers: int
    routed_experts: int
    top_k: int
    hidden_size: int
    expert_format: str        # "mxfp4"
    expert_bytes: int
    dense_format: str         # "stored" (FP8 + scales) or "bf16"
    attention: list           # per layer: sliding / csa / hca
    hash_layers: int


@dataclass(frozen=True)
class DeviceMemory:
    device: str               # "gpu0".. or "host"
    usable_bytes: int
    components: dict          # kind -> bytes
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class LayerPlan:
    layer: int
    gpu: int
    attention: str
    hot_experts: list         # sorted expert ids resident on the layer's GPU
    hot_route_share: float    # profiled share of this layer's routes the hot set covers


@dataclass(frozen=True)
class Policy:
    context: int
    sessions: int
    prefill_threshold: int | None    # prefills of more tokens use upload-once; None: never
    prefill_chunk: int
    upload_group: int
    decode_graph_routes: int         # fixed route slots per layer in the decode graph (= top_k)
    cpu_threads: int
    objective_phases: list


@dataclass(frozen=True)
class Plan:
    schema_version: int
    notes: list                      # what a reader must know (synthetic profile, skipped steps, ...)
    provenance: Provenance
    model: ModelSummary
    hardware: dict                   # the resolved hardware spec
    memory: list                     # [DeviceMemory]
    layers: list                     # [LayerPlan]
    policy: Policy
    kernels: list                    # [{name, template, template_sha256, params, content_sha256, path}]
    predictions: dict

    def to_dict(self) -> dict:
        return asdict(self)

    def dumps(self) -> str:
        lines = [f"Ostinato placement plan for {self.model.path} on {self.hardware['name']}, written by "
                 f"ostinato-compile {self.provenance.compiler_version}: do not edit, recompile.",
                 f"routing profile: {self.provenance.profile_source}"] + [f"note: {n}" for n in self.notes]
        header = "".join(f"# {line}\n" for line in lines)
        return header + yaml.dump(self.to_dict(), Dumper=_PlanDumper, sort_keys=False, width=120,
                                  default_flow_style=False, allow_unicode=True)

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.dumps())
        return path

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.dumps().encode()).hexdigest()


class _PlanDumper(yaml.SafeDumper):
    pass


def _represent_list(dumper: yaml.SafeDumper, data: list) -> Any:
    # Lists of scalars (expert ids, layer kinds) read best on one line; lists of records don't.
    flow = all(isinstance(x, (int, float, str)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_PlanDumper.add_representer(list, _represent_list)
_PlanDumper.add_representer(tuple, _represent_list)


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise PlanError(f"field '{where}' must be a mapping")
    names = {f.name for f in fields(cls)}
    missing = [n for n in names if n not in data]
    if missing:
        raise PlanError(f"field '{where}.{sorted(missing)[0]}' is missing")
    unknown = sorted(set(data) - names)
    if unknown:
        raise PlanError(f"field '{where}.{unknown[0]}' is not part of schema version {SCHEMA_VERSION}")
    return cls(**data)


def plan_from_dict(d: Any, source: str = "plan") -> Plan:
    try:
        if not isinstance(d, dict):
            raise PlanError("top level must be a mapping")
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise PlanError(f"field 'schema_version' is {version!r}; this Ostinato reads {SCHEMA_VERSION}")
        d = dict(d)
        d["provenance"] = _build(Provenance, d.get("provenance"), "provenance")
        d["model"] = _build(ModelSummary, d.get("model"), "model")
        d["policy"] = _build(Policy, d.get("policy"), "policy")
        d["memory"] = [_build(DeviceMemory, m, f"memory[{i}]") for i, m in enumerate(d.get("memory") or [])]
        d["layers"] = [_build(LayerPlan, l, f"layers[{i}]") for i, l in enumerate(d.get("layers") or [])]
        plan = _build(Plan, d, "plan")
    except PlanError as e:
        raise PlanError(f"{source}: {e}") from None
    if len(plan.layers) != plan.model.layers:
        raise PlanError(f"{source}: field 'layers' has {len(plan.layers)} entries, model.layers says {plan.model.layers}")
    return plan


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    if not path.exists():
        raise PlanError(f"{path}: plan file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise PlanError(f"{path}: not valid YAML ({e})") from None
    return plan_from_dict(data, str(path))


def check_fingerprint(plan: Plan, config_sha256: str, index_sha256: str | None) -> None:
    """Refuse a plan built for another checkpoint, naming the field that differs."""
    for name, mine, theirs in (("provenance.config_sha256", plan.provenance.config_sha256, config_sha256),
                               ("provenance.index_sha256", plan.provenance.index_sha256, index_sha256)):
        if mine != theirs:
            raise PlanError(f"plan does not match this checkpoint: field '{name}' is {mine} in the plan, "
                            f"{theirs} for the checkpoint (recompile the plan for this model)")
