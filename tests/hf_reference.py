"""Test-only bridge to the reference implementation (transformers' DeepseekV4ForCausalLM).

Maps each native checkpoint name to the transformers parameter that holds it after loading
(transformers renames modules and merges routed experts into [E, 2I, D] / [E, D, I] tensors).
"""

from __future__ import annotations

import re
from functools import lru_cache

import torch

# (native suffix pattern, transformers suffix); applied to the part after "layers.{L}."
_LAYER_RENAMES = [
    (r"attn_norm\.weight", "input_layernorm.weight"),
    (r"ffn_norm\.weight", "post_attention_layernorm.weight"),
    (r"hc_(attn|ffn)_(fn|base|scale)", r"\1_hc.\2"),
    (r"attn\.attn_sink", "self_attn.sinks"),
    (r"attn\.wq_a\.weight", "self_attn.q_a_proj.weight"),
    (r"attn\.q_norm\.weight", "self_attn.q_a_norm.weight"),
    (r"attn\.wq_b\.weight", "self_attn.q_b_proj.weight"),
    (r"attn\.wkv\.weight", "self_attn.kv_proj.weight"),
    (r"attn\.kv_norm\.weight", "self_attn.kv_norm.weight"),
    (r"attn\.wo_a\.weight", "self_attn.o_a_proj.weight"),
    (r"attn\.wo_b\.weight", "self_attn.o_b_proj.weight"),
    (r"attn\.compressor\.wkv\.weight", "self_attn.compressor.kv_proj.weight"),
    (r"attn\.compressor\.wgate\.weight", "self_attn.compressor.gate_proj.weight"),
    (r"attn\.compressor\.ape", "self_attn.compressor.position_bias"),
    (r"attn\.compressor\.norm\.weight", "self_attn.compressor.kv_norm.weight"),
    (r"attn\.indexer\.wq_b\.weight", "self_attn.compressor.indexer.q_b_proj.weight"),
    (r"attn\.indexer\.weights_proj\.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight"),
    (r"attn\.indexer\.compressor\.wkv\.weight", "self_attn.compressor.indexer.kv_proj.weight"),
    (r"attn\.indexer\.compressor\.wgate\.weight", "self_attn.compressor.indexer.gate_proj.weight"),
    (r"attn\.indexer\.compressor\.ape", "self_attn.compressor.indexer.position_bias"),
    (r"attn\.indexer\.compressor\.norm\.weight", "self_attn.compressor.indexer.kv_norm.weight"),
    (r"ffn\.gate\.weight", "mlp.gate.weight"),
    (r"ffn\.gate\.bias", "mlp.gate.e_score_correction_bias"),
    (r"ffn\.gate\.tid2eid", "mlp.gate.tid2eid"),
    (r"ffn\.shared_experts\.w1\.weight", "mlp.shared_experts.gate_proj.weight"),
    (r"ffn\.shared_experts\.w3\.weight", "mlp.shared_experts.up_proj.weight"),
    (r"ffn\.shared_experts\.w2\.weight", "mlp.shared_experts.down_proj.weight"),
]
_GLOBAL = {"embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight",
           "norm.weight": "model.norm.weight", "hc_head_fn": "model.hc_head.hc_fn",
           "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale"}
_EXPERT = re.compile(r"^layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight$")
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


def hf_parameter(state: dict[str, torch.Tensor], native: str, intermediate: int) -> torch.Tensor:
    """The transformers tensor holding native weight `native` (scales have none: they are folded in)."""
    if native in _GLOBAL:
        return state[_GLOBAL[native]]
    m = _EXPERT.match(native)
    if m:
        layer, expert, w = int(m[1]), int(m[2]), m[3]
        base = f"model.layers.{layer}.mlp.experts."
        if w == "w2":
            return state[base + "down_proj"][expert]
        gate_up = state[base + "gate_up_proj"][expert]  # [2I, D] = cat(w1, w3)
        return gate_up[:intermediate] if w == "w1" else gate_up[intermediate:]
    m = _LAYER.match(native)
    if m:
        for pattern, target in _LAYER_RENAMES:
            if re.fullmatch(pattern, m[2]):
                return state[f"model.layers.{m[1]}." + re.sub(pattern, target, m[2])]
    raise KeyError(f"no transformers parameter known for native tensor '{native}'")


@lru_cache(maxsize=4)
def load_reference(checkpoint_dir: str) -> torch.nn.Module:
    """transformers' model in float32 from our checkpoint (cached: loading takes seconds)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype=torch.float32).eval()
