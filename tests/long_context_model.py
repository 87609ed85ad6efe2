"""A small DeepSeek-V4 model built in memory, with V4-Flash's own rope and YaRN settings: for tests that run
contexts past 65,536 positions (YaRN's original length) under V4-Flash's own YaRN settings: the checked-in
presets reach 262,144 positions but keep their own original lengths (256 / 512) and factor.

Every key not given comes from V4-Flash's shipped config.json (plans/models/deepseek-v4-flash), so rope_theta
10000, compress_rope_theta 160000, rope_scaling {yarn, factor 16, original 65,536, beta 32/1},
max_position_embeddings 1,048,576 and qk_rope_head_dim 64 are V4-Flash's. Weights are random float32 tensors
held directly (no checkpoint file: nothing here is quantized), scaled so activations stay O(1).
"""

from __future__ import annotations

import json
import math

import torch

from ostinato.checkpoint.config import ModelConfig
from ostinato.plans import plans_dir
from ostinato.runtime.model.attention import AttentionWeights
from ostinato.runtime.model.compressor import CompressorWeights
from ostinato.runtime.model.experts import DenseExpertExecutor
from ostinato.runtime.model.hyper_connection import HcHeadWeights, HcWeights
from ostinato.runtime.model.indexer import IndexerWeights
from ostinato.runtime.model.loading import LayerWeights, ModelWeights
from ostinato.runtime.model.model import Model
from ostinato.runtime.model.moe import MoeWeights
from ostinato.runtime.model.router import RouterWeights

# Small dimensions; head_dim 96 keeps 32 channels without rope beside V4's 64 rope channels.
SMALL = dict(vocab_size=64, hidden_size=64, num_attention_heads=2, head_dim=96, q_lora_rank=32, o_groups=2,
             o_lora_rank=32, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
             index_n_heads=2, index_head_dim=64, index_topk=8, sliding_window=8, num_nextn_predict_layers=0)


def flash_config() -> dict:
    return json.loads((plans_dir() / "models" / "deepseek-v4-flash" / "config.json").read_text())


def long_context_config(compress_ratios: list[int], num_hash_layers: int = 1, **overrides) -> ModelConfig:
    """V4-Flash's config with SMALL's dimensions, one layer per `compress_ratios` entry (0 sliding, 4 CSA,
    128 HCA)."""
    raw = dict(flash_config(), **dict(SMALL, num_hidden_layers=len(compress_ratios),
                                      compress_ratios=list(compress_ratios), num_hash_layers=num_hash_layers,
                                      **overrides))
    return ModelConfig.from_dict(raw, source="tests/long_context_model.py")


class _Draw:
    def __init__(self, seed: int):
        self.g = torch.Generator().manual_seed(seed)

    def linear(self, out: int, inp: int) -> torch.Tensor:
        return torch.randn(out, inp, generator=self.g) / math.sqrt(inp)

    def norm(self, n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=self.g)

    def normal(self, *shape: int, std: float = 1.0) -> torch.Tensor:
        return std * torch.randn(*shape, generator=self.g)


def _compressor(d: _Draw, cfg: ModelConfig, width: int, ratio: int) -> CompressorWeights:
    c = (2 if ratio == 4 else 1) * width
    return CompressorWeights(torch.cat((d.linear(c, cfg.hidden_size), d.linear(c, cfg.hidden_size))),
                             d.normal(ratio, c, std=0.5), d.norm(width), ratio, overlap=ratio == 4)


def _hc(d: _Draw, cfg: ModelConfig) -> HcWeights:
    return HcWeights(d.linear(cfg.hc_mix_dim, cfg.hc_dim), d.normal(cfg.hc_mix_dim, std=0.5),
                     0.5 + 0.5 * torch.rand(3, generator=d.g))


def _layer(d: _Draw, cfg: ModelConfig, layer: int) -> LayerWeights:
    D, H, hd, ratio = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.compress_ratio(layer)
    compressor = _compressor(d, cfg, hd, ratio) if ratio else None
    indexer = None
    if ratio == 4:
        indexer = IndexerWeights(d.linear(cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank),
                                 d.linear(cfg.index_n_heads, D), _compressor(d, cfg, cfg.index_head_dim, 4),
                                 cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk)
    attn = AttentionWeights(
        wq_a=d.linear(cfg.q_lora_rank, D), q_norm=d.norm(cfg.q_lora_rank), wq_b=d.linear(H * hd, cfg.q_lora_rank),
        wkv=d.linear(hd, D), kv_norm=d.norm(hd), wo_a=d.linear(cfg.o_groups * cfg.o_lora_rank, H * hd // cfg.o_groups),
        wo_b=d.linear(D, cfg.o_groups * cfg.o_lora_rank), sink=d.normal(H), compressor=compressor, indexer=indexer,
        n_heads=H, head_dim=hd, o_groups=cfg.o_groups, window=cfg.sliding_window)
    E, k, inter = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size
    hashed = cfg.is_hash_layer(layer)
    tid2eid = torch.stack([torch.randperm(E, generator=d.g)[:k] for _ in range(cfg.vocab_size)]) if hashed else None
    router = RouterWeights(d.linear(E, D), None if hashed else d.normal(E, std=0.01), tid2eid, k,
                           cfg.routed_scaling_factor)
    moe = MoeWeights(router, torch.cat((d.linear(inter, D), d.linear(inter, D))), d.linear(D, inter), cfg.swiglu_limit)
    return LayerWeights(layer, cfg.attention_kind(layer), d.norm(D), d.norm(D), _hc(d, cfg), _hc(d, cfg), attn, moe)


def build_model(cfg: ModelConfig, seed: int = 0, prefill_chunk: int = 4096) -> Model:
    """A float32 CPU model of `cfg` with random weights (the same for the same seed)."""
    d = _Draw(seed)
    D, V, N = cfg.hidden_size, cfg.vocab_size, cfg.hc_mult
    layers = tuple(_layer(d, cfg, i) for i in range(cfg.num_hidden_layers))
    weights = ModelWeights(embed=d.normal(V, D), head=d.linear(V, D), norm=d.norm(D),
                           hc_head=HcHeadWeights(d.linear(N, cfg.hc_dim), d.normal(N, std=0.5),
                                                 0.5 + 0.5 * torch.rand(1, generator=d.g)),
                           layers=layers)
    E, inter = cfg.n_routed_experts, cfg.moe_intermediate_size
    w13 = [torch.stack([torch.cat((d.linear(inter, D), d.linear(inter, D))) for _ in range(E)]) for _ in layers]
    w2 = [torch.stack([d.linear(D, inter) for _ in range(E)]) for _ in layers]
    executor = DenseExpertExecutor(w13, w2, cfg.swiglu_limit)
    return Model(cfg, weights, executor, torch.float32, "cpu", prefill_chunk)
