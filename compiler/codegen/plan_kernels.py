"""The compile pass's kernel step: render and build the expert kernels a plan needs.

A plan needs, for the model's expert shape (D, I): the CPU kernel for its cold routes, built for
the hardware spec's host ISA with the plan's thread count, and the two Triton variants for its hot
routes (prefill: routes grouped by expert; decode: top_k fixed route slots per token, masked); and
for the mHC mixing of every sublayer, a host and a Triton kernel (hc_mix.py); for the RMS norms,
rotary embeddings, head and FP8 products of the dense path, a host kernel (for the host ISA too) and a
Triton one (dense_ops.py). The records go into the plan's `kernels` section, their paths relative to the
plan file.
"""

from __future__ import annotations

from ostinato.plan import KernelEntry, KernelName, relative_to_plan

from .dense_ops import build_cpu_dense_ops, render_triton_dense_ops
from .hc_mix import HcMixParams, build_cpu_hc_mix, render_triton_hc_mix
from .kernels import (
    CpuExpertParams,
    TritonExpertParams,
    build_cpu_experts,
    render_triton_experts,
)
from .render import KernelRecord, included_headers, sha256, template_text


def _entry(name: KernelName, record: KernelRecord, plan_file) -> KernelEntry:
    return KernelEntry(name=name, template=record.template, template_sha256=record.template_hash,
                       params=dict(sorted(record.params.items())), flags=list(record.flags),
                       content_sha256=record.content_hash, path=relative_to_plan(record.path, plan_file))


def triton_expert_params(D: int, I: int, top_k: int, swiglu_limit: float) -> tuple[TritonExpertParams, ...]:
    """(prefill, decode) parameters of a model's hot expert kernels, for H200 (132 SMs) and RTX 4090 (128).

    Prefill: [64 routes, 32 rows] output tiles, BK 32 (one scale group a step): 64 is wgmma's M on
    sm_90 (a warpgroup's). Both dots run in the activations' dtype (bf16 in the engine; the launcher
    holds h in it too); float32 activations use tf32x3: tensor cores at about 22 bits, where "ieee"
    would leave them on the CUDA cores. tf32x3 holds both operands split in two, which sized the tile:
    its down kernel at 64 x 64 x 64 took 255 registers and spilled on sm_89; at this size its kernels
    take at most 245 (Triton 3.9's float32 gate/up on sm_89), the bf16 ones at most 128 (ptxas).
    Decode (top_k route slots): BN 32 rows per program, so one token makes top_k x I/32 gate/up and
    top_k x D/32 down programs (V4-Flash: 384 and 768, ~3 and ~6 per SM: enough to fill the GPU and keep
    ~48 KB of weights in flight per SM); BK the largest power of two <= 512 dividing D and I: with 512, a thread
    loads 16 B of one row per matrix and step (ld.global.v4), 4 rows, and each x value it loads
    serves those 4 rows.
    """
    block_k = min(512, D & -D, I & -I)  # x & -x: the largest power of two dividing x
    return (TritonExpertParams(D=D, I=I, variant="prefill", block_m=64, block_n=32, block_k=32,
                               swiglu_limit=swiglu_limit, dot_precision="tf32x3"),
            TritonExpertParams(D=D, I=I, variant="decode", block_n=32, block_k=block_k, max_routes=top_k,
                               swiglu_limit=swiglu_limit))


def build_plan_kernels(b) -> tuple[list[KernelEntry], dict]:
    """(kernels section, {template or header: sha256}) for the Build `b` of ostinato-compile; the map
    becomes the plan's provenance `templates`, paths under templates/ (headers: cpu/include/...)."""
    cfg, hw = b.config, b.hardware
    D, I, limit = cfg.hidden_size, cfg.moe_intermediate_size, float(cfg.swiglu_limit)
    root = b.options.kernel_dir
    cpu = build_cpu_experts(CpuExpertParams(D=D, I=I, isa=hw.host.isa, max_experts=cfg.n_routed_experts,
                                            swiglu_limit=limit), root)
    prefill, decode = (render_triton_experts(p, root)
                       for p in triton_expert_params(D, I, cfg.num_experts_per_tok, limit))
    mix = HcMixParams(n=cfg.hc_mult, iters=cfg.hc_sinkhorn_iters, eps=float(cfg.hc_eps))
    records = [(KernelName.COLD_EXPERTS_CPU, cpu), (KernelName.HOT_EXPERTS_PREFILL, prefill),
               (KernelName.HOT_EXPERTS_DECODE, decode), (KernelName.HC_MIX_CPU, build_cpu_hc_mix(mix, root)),
               (KernelName.HC_MIX_TRITON, render_triton_hc_mix(mix, root)),
               (KernelName.DENSE_OPS_CPU, build_cpu_dense_ops(root, isa=hw.host.isa)),
               (KernelName.DENSE_OPS_TRITON, render_triton_dense_ops(root))]
    templates = {r.template: r.template_hash for _, r in records}
    for _, r in records:  # the headers a template includes are inputs as much as its text (render.py)
        templates |= included_headers(r.template)
    assert all(sha256(template_text(t)) == h for t, h in templates.items())
    return [_entry(n, r, b.options.output) for n, r in records], templates
