"""The compile pass's kernel step: render and build the expert kernels a plan needs.

A plan needs, for the model's expert shape (D, I): the CPU kernel for its cold routes, built for
the hardware spec's host ISA with the plan's thread count, and the two Triton variants for its hot
routes (prefill: routes grouped by expert; decode: top_k fixed route slots per token, masked). The
records go into the plan's `kernels` section, their paths relative to the plan file.
"""

from __future__ import annotations

from ostinato.plan import KernelEntry, KernelName, relative_to_plan

from .kernels import (
    CpuExpertParams,
    TritonExpertParams,
    build_cpu_experts,
    render_triton_experts,
)
from .render import KernelRecord, sha256, template_text


def _entry(name: KernelName, record: KernelRecord, plan_file) -> KernelEntry:
    return KernelEntry(name=name, template=record.template, template_sha256=record.template_hash,
                       params=dict(sorted(record.params.items())), flags=list(record.flags),
                       content_sha256=record.content_hash, path=relative_to_plan(record.path, plan_file))


def triton_expert_params(D: int, I: int, top_k: int, swiglu_limit: float) -> tuple[TritonExpertParams, ...]:
    """(prefill, decode) parameters of a model's hot expert kernels; decode has top_k route slots."""
    return (TritonExpertParams(D=D, I=I, variant="prefill", swiglu_limit=swiglu_limit),
            TritonExpertParams(D=D, I=I, variant="decode", max_routes=top_k, swiglu_limit=swiglu_limit))


def build_plan_kernels(b) -> tuple[list[KernelEntry], dict]:
    """(kernels section, {template: sha256}) for the Build `b` of ostinato-compile."""
    cfg, hw = b.config, b.hardware
    D, I, limit = cfg.hidden_size, cfg.moe_intermediate_size, float(cfg.swiglu_limit)
    root = b.options.kernel_dir
    cpu = build_cpu_experts(CpuExpertParams(D=D, I=I, isa=hw.host.isa, max_experts=cfg.n_routed_experts,
                                            swiglu_limit=limit), root)
    prefill, decode = (render_triton_experts(p, root)
                       for p in triton_expert_params(D, I, cfg.num_experts_per_tok, limit))
    records = [(KernelName.COLD_EXPERTS_CPU, cpu), (KernelName.HOT_EXPERTS_PREFILL, prefill),
               (KernelName.HOT_EXPERTS_DECODE, decode)]
    templates = {r.template: r.template_hash for _, r in records}
    assert all(sha256(template_text(t)) == h for t, h in templates.items())
    return [_entry(n, r, b.options.output) for n, r in records], templates
