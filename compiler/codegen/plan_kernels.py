"""The compile pass's kernel step: render and build the expert kernels a plan needs.

A plan needs, for the model's expert shape (D, I): the CPU kernel for its cold routes, built for
the hardware spec's host ISA with the plan's thread count, and the two Triton variants for its hot
routes (prefill: routes grouped by expert; decode: top_k fixed route slots per token, masked). The
records go into the plan's `kernels` section; paths are relative to the directory compile ran in.
"""

from __future__ import annotations

import os
from pathlib import Path

from .kernels import CpuExpertParams, TritonExpertParams, build_cpu_experts, render_triton_experts
from .render import KernelRecord, template_text, sha256


def _entry(name: str, record: KernelRecord) -> dict:
    path = os.path.relpath(record.path) if Path(record.path).is_absolute() else record.path
    return {"name": name, "template": record.template, "template_sha256": record.template_hash,
            "params": dict(sorted(record.params.items())), "flags": list(record.flags),
            "content_sha256": record.content_hash, "path": path}


def build_plan_kernels(b) -> tuple[list[dict], dict]:
    """(kernels section, {template: sha256}) for the Build `b` of ostinato-compile."""
    cfg, hw = b.config, b.hardware
    D, I, limit = cfg.hidden_size, cfg.moe_intermediate_size, float(cfg.swiglu_limit)
    cpu = build_cpu_experts(CpuExpertParams(D=D, I=I, isa=hw.host.isa, max_experts=cfg.n_routed_experts, swiglu_limit=limit))
    prefill = render_triton_experts(TritonExpertParams(D=D, I=I, variant="prefill", swiglu_limit=limit))
    decode = render_triton_experts(TritonExpertParams(D=D, I=I, variant="decode", max_routes=cfg.num_experts_per_tok,
                                                      swiglu_limit=limit))
    records = [("cold_experts_cpu", cpu), ("hot_experts_prefill", prefill), ("hot_experts_decode", decode)]
    templates = {r.template: r.template_hash for _, r in records}
    assert all(sha256(template_text(t)) == h for t, h in templates.items())
    return [_entry(n, r) for n, r in records], templates
