"""plan: the plan itself: notes, provenance (every input's sha256), the model summary, each device's memory
rows, each layer's GPU and hot experts, the MTP block's row, the policy, the kernels and the predictions."""

from __future__ import annotations

from pathlib import Path

from ostinato import __version__
from ostinato.checkpoint import model_sizes
from ostinato.plan import SCHEMA_VERSION, LayerPlan, ModelSummary, Plan, Provenance, relative_to_plan

from .build import Build, mtp_counts
from .footprint import device_components, device_memory, host_components
from .predictions import predictions, rounded


def plan(b: Build) -> None:
    cfg, hw, o, pl = b.config, b.hardware, b.options, b.placement
    expert = model_sizes(cfg).expert_bytes
    memory_rows = [device_memory(f"gpu{g}", hw.gpus.usable_bytes, device_components(b, g, expert))
                   for g in range(hw.gpus.count)]
    memory_rows.append(device_memory("host", hw.host.usable_bytes, host_components(b, expert)))
    counts = b.profile.phase_counts(o.objective_phases)
    layer_rows = []
    for l in range(cfg.n_layers):
        total = int(counts[l].sum())
        covered = int(counts[l][list(pl.hot[l])].sum()) if pl.hot[l] else 0
        layer_rows.append(LayerPlan(layer=l, gpu=pl.layer_gpu[l], attention=cfg.attention_kind(l),
                                    hot_experts=list(pl.hot[l]),
                                    hot_route_share=rounded(covered / total if total else 0.0)))
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
        predictions=predictions(b),
    ).located_at(Path(o.output).resolve().parent)


def _mtp_plan(b: Build) -> LayerPlan:
    """The MTP block's row: layer index model.layers, beside the head; its share of its own routes (0 without
    a profile row)."""
    cfg, pl, row = b.config, b.placement, mtp_counts(b)
    total = int(row.sum()) if row is not None else 0
    covered = int(row[list(pl.mtp_hot)].sum()) if total and pl.mtp_hot else 0
    return LayerPlan(layer=cfg.n_layers, gpu=pl.layer_gpu[-1], attention=cfg.attention_kind(cfg.n_layers),
                     hot_experts=list(pl.mtp_hot), hot_route_share=rounded(covered / total if total else 0.0))
