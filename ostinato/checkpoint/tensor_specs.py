"""The name map of a DeepSeek-V4 checkpoint: every native tensor name, its shape, dtype and role.

One table, derived from the config alone, serves three users: the reader validates shard headers
against it, the planner sizes the model from it (no weights needed), and the tiny-checkpoint writer
generates exactly these tensors. Names are the official ones (no `model.` prefix).

Legend: V vocab, D hidden, H heads, hd head_dim, ql q_lora_rank, I moe_intermediate_size,
E routed experts, hc mHC streams, c compressor overlap (2 for CSA, 1 for HCA).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import ModelConfig
from .formats import FP8_BLOCK, MXFP4_GROUP

# safetensors dtype name -> bytes per element
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1,
               "I8": 1, "I16": 2, "I32": 4, "I64": 8, "U8": 1}

# Roles: what a tensor is for. Placement and loading work on roles, never on name patterns.
GLOBAL_ROLES = ("embed", "head", "final_norm", "hc_head")
LAYER_ROLES = ("norm", "hc", "attention", "compressor", "indexer", "gate", "hash_table", "shared_expert",
               "routed_expert")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str                      # safetensors dtype name
    role: str
    layer: int | None = None        # None for global tensors
    expert: int | None = None       # routed expert id, for role "routed_expert"
    allowed_dtypes: tuple[str, ...] = ()  # other dtypes accepted on read (tid2eid: any int width)
    # a bf16 matrix the runtime holds as stored and multiplies in float32 (the compressors' projections:
    # runtime/model/stored_bf16.py), where other BF16 tensors are held in float32
    held_as_stored: bool = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]

    @property
    def is_scale(self) -> bool:
        return self.name.endswith(".scale")

    def accepts(self, dtype: str) -> bool:
        return dtype == self.dtype or dtype in self.allowed_dtypes


def _fp8_linear(prefix: str, rows: int, cols: int, role: str, layer: int | None) -> list[TensorSpec]:
    scale = (math.ceil(rows / FP8_BLOCK), math.ceil(cols / FP8_BLOCK))
    return [TensorSpec(f"{prefix}.weight", (rows, cols), "F8_E4M3", role, layer),
            TensorSpec(f"{prefix}.scale", scale, "F8_E8M0", role, layer)]


def _mxfp4_linear(prefix: str, rows: int, cols: int, layer: int, expert: int) -> list[TensorSpec]:
    return [TensorSpec(f"{prefix}.weight", (rows, cols // 2), "I8", "routed_expert", layer, expert),
            TensorSpec(f"{prefix}.scale", (rows, cols // MXFP4_GROUP), "F8_E8M0", "routed_expert", layer, expert)]


def _compressor(prefix: str, cfg: ModelConfig, ratio: int, width: int, norm_dim: int, role: str,
                layer: int) -> list[TensorSpec]:
    D = cfg.hidden_size
    return [TensorSpec(f"{prefix}.wkv.weight", (width, D), "BF16", role, layer, held_as_stored=True),
            TensorSpec(f"{prefix}.wgate.weight", (width, D), "BF16", role, layer, held_as_stored=True),
            TensorSpec(f"{prefix}.ape", (ratio, width), "F32", role, layer),
            TensorSpec(f"{prefix}.norm.weight", (norm_dim,), "BF16", role, layer)]


def layer_prefix(cfg: ModelConfig, layer: int) -> str:
    """The name prefix of a block's tensors: `layers.L` for the main model's layers, `mtp.K` for the
    multi-token-prediction blocks, which take the layer indices after them (num_hidden_layers + K, the
    index their compress_ratios entry has)."""
    return f"layers.{layer}" if layer < cfg.num_hidden_layers else f"mtp.{layer - cfg.num_hidden_layers}"


def expert_specs(cfg: ModelConfig, layer: int, expert: int) -> list[TensorSpec]:
    """The six tensors of one routed expert: w1 (gate), w3 (up) [I, D]; w2 (down) [D, I]; each + scale."""
    D, I = cfg.hidden_size, cfg.moe_intermediate_size
    p = f"{layer_prefix(cfg, layer)}.ffn.experts.{expert}"
    return (_mxfp4_linear(f"{p}.w1", I, D, layer, expert) + _mxfp4_linear(f"{p}.w2", D, I, layer, expert)
            + _mxfp4_linear(f"{p}.w3", I, D, layer, expert))


def layer_specs(cfg: ModelConfig, layer: int, with_experts: bool = True) -> list[TensorSpec]:
    """Every tensor of decoder layer `layer` (an MTP block's for num_hidden_layers + K), in a stable order."""
    D, H, hd, ql, I = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.q_lora_rank, cfg.moe_intermediate_size
    L, p = layer, layer_prefix(cfg, layer)
    ratio = cfg.compress_ratio(layer)
    specs = [TensorSpec(f"{p}.attn_norm.weight", (D,), "BF16", "norm", L),
             TensorSpec(f"{p}.ffn_norm.weight", (D,), "BF16", "norm", L)]
    for sub in ("attn", "ffn"):
        specs += [TensorSpec(f"{p}.hc_{sub}_fn", (cfg.hc_mix_dim, cfg.hc_dim), "F32", "hc", L),
                  TensorSpec(f"{p}.hc_{sub}_base", (cfg.hc_mix_dim,), "F32", "hc", L),
                  TensorSpec(f"{p}.hc_{sub}_scale", (3,), "F32", "hc", L)]
    a = f"{p}.attn"
    group_in = (H // cfg.o_groups) * hd  # each output group reads its heads' concatenated outputs
    specs += [TensorSpec(f"{a}.attn_sink", (H,), "F32", "attention", L)]
    specs += _fp8_linear(f"{a}.wq_a", ql, D, "attention", L)
    specs += [TensorSpec(f"{a}.q_norm.weight", (ql,), "BF16", "attention", L)]
    specs += _fp8_linear(f"{a}.wq_b", H * hd, ql, "attention", L)
    specs += _fp8_linear(f"{a}.wkv", hd, D, "attention", L)
    specs += [TensorSpec(f"{a}.kv_norm.weight", (hd,), "BF16", "attention", L)]
    specs += _fp8_linear(f"{a}.wo_a", cfg.o_groups * cfg.o_lora_rank, group_in, "attention", L)
    specs += _fp8_linear(f"{a}.wo_b", D, cfg.o_groups * cfg.o_lora_rank, "attention", L)
    if ratio:
        specs += _compressor(f"{a}.compressor", cfg, ratio, cfg.compressor_width(layer), hd, "compressor", L)
    if ratio == 4:
        ihd = cfg.index_head_dim
        specs += _fp8_linear(f"{a}.indexer.wq_b", cfg.index_n_heads * ihd, ql, "indexer", L)
        specs += [TensorSpec(f"{a}.indexer.weights_proj.weight", (cfg.index_n_heads, D), "BF16", "indexer", L)]
        specs += _compressor(f"{a}.indexer.compressor", cfg, ratio, 2 * ihd, ihd, "indexer", L)
    f = f"{p}.ffn"
    specs += [TensorSpec(f"{f}.gate.weight", (cfg.n_routed_experts, D), "BF16", "gate", L)]
    if cfg.is_hash_layer(layer):
        specs += [TensorSpec(f"{f}.gate.tid2eid", (cfg.vocab_size, cfg.num_experts_per_tok), "I64", "hash_table", L,
                             allowed_dtypes=("I32", "I16"))]
    else:
        specs += [TensorSpec(f"{f}.gate.bias", (cfg.n_routed_experts,), "F32", "gate", L)]
    specs += _fp8_linear(f"{f}.shared_experts.w1", I, D, "shared_expert", L)
    specs += _fp8_linear(f"{f}.shared_experts.w2", D, I, "shared_expert", L)
    specs += _fp8_linear(f"{f}.shared_experts.w3", I, D, "shared_expert", L)
    if with_experts:
        for e in range(cfg.n_routed_experts):
            specs += expert_specs(cfg, layer, e)
    return specs


def global_specs(cfg: ModelConfig) -> list[TensorSpec]:
    V, D, hc = cfg.vocab_size, cfg.hidden_size, cfg.hc_mult
    return [TensorSpec("embed.weight", (V, D), "BF16", "embed"),
            TensorSpec("head.weight", (V, D), "BF16", "head"),
            TensorSpec("norm.weight", (D,), "BF16", "final_norm"),
            TensorSpec("hc_head_fn", (hc, cfg.hc_dim), "F32", "hc_head"),
            TensorSpec("hc_head_base", (hc,), "F32", "hc_head"),
            TensorSpec("hc_head_scale", (1,), "F32", "hc_head")]


def model_specs(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """All main-model tensors (MTP excluded), keyed by native name."""
    specs = global_specs(cfg)
    for layer in range(cfg.num_hidden_layers):
        specs += layer_specs(cfg, layer)
    return {s.name: s for s in specs}


MTP_ROLES = ("mtp_proj", "mtp_norm", "mtp_hc_head")  # an MTP block's own tensors, besides its layer's


def mtp_block_specs(cfg: ModelConfig, k: int, with_experts: bool = True) -> list[TensorSpec]:
    """MTP block K (`mtp.K.*`): a whole decoder block (layer index num_hidden_layers + K: attention of its
    compress_ratios entry, score routing, its own routed and shared experts), then what turns the main
    model's hidden state and the next token's embedding into its input, and its own mHC head and final
    norm. The embedding and the LM head are the main model's."""
    D, hc, L = cfg.hidden_size, cfg.hc_mult, cfg.num_hidden_layers + k
    p = f"mtp.{k}"
    return (layer_specs(cfg, L, with_experts)
            + _fp8_linear(f"{p}.e_proj", D, D, "mtp_proj", L) + _fp8_linear(f"{p}.h_proj", D, D, "mtp_proj", L)
            + [TensorSpec(f"{p}.{n}.weight", (D,), "BF16", "mtp_norm", L) for n in ("enorm", "hnorm", "norm")]
            + [TensorSpec(f"{p}.hc_head_fn", (hc, cfg.hc_dim), "F32", "mtp_hc_head", L),
               TensorSpec(f"{p}.hc_head_base", (hc,), "F32", "mtp_hc_head", L),
               TensorSpec(f"{p}.hc_head_scale", (1,), "F32", "mtp_hc_head", L)])


def mtp_specs(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """Every MTP block's tensors (cfg.mtp_blocks of them: none where `mtp.*` is a DSpark drafter), keyed by
    native name."""
    return {s.name: s for k in range(cfg.mtp_blocks) for s in mtp_block_specs(cfg, k)}


DSPARK_ROLES = ("dspark_proj", "dspark_norm", "dspark_hc_head", "dspark_markov", "dspark_confidence")


def dspark_stage_specs(cfg: ModelConfig, stage: int) -> list[TensorSpec]:
    """Stage `stage` of the 0731 release's DSpark drafter (`mtp.{stage}.*`): a whole V4 block (layer index
    num_hidden_layers + stage, sliding attention, score routing, its own experts); the first stage adds
    `main_proj`, which maps the target layers' hidden states [D x stages] to D, and `main_norm`; the last
    adds the drafter's final norm, its mHC head, the Markov head (a bigram embedding and head of rank r)
    and the confidence head over [hidden, Markov embedding]. Names, dtypes and shapes as public engines
    read the release (vLLM's dspark.py, llama.cpp's dflash)."""
    D, hc, V, L = cfg.hidden_size, cfg.hc_mult, cfg.vocab_size, cfg.num_hidden_layers + stage
    r, p = cfg.dspark_markov_rank, f"mtp.{stage}"
    specs = layer_specs(cfg, L)
    if stage == 0:
        specs += _fp8_linear(f"{p}.main_proj", D, cfg.dspark_stages * D, "dspark_proj", L)
        specs += [TensorSpec(f"{p}.main_norm.weight", (D,), "BF16", "dspark_norm", L)]
    if stage == cfg.dspark_stages - 1:
        specs += [TensorSpec(f"{p}.norm.weight", (D,), "BF16", "dspark_norm", L),
                  TensorSpec(f"{p}.hc_head_fn", (hc, cfg.hc_dim), "F32", "dspark_hc_head", L),
                  TensorSpec(f"{p}.hc_head_base", (hc,), "F32", "dspark_hc_head", L),
                  TensorSpec(f"{p}.hc_head_scale", (1,), "F32", "dspark_hc_head", L),
                  TensorSpec(f"{p}.markov_head.markov_w1.weight", (V, r), "BF16", "dspark_markov", L),
                  TensorSpec(f"{p}.markov_head.markov_w2.weight", (V, r), "BF16", "dspark_markov", L),
                  TensorSpec(f"{p}.confidence_head.proj.weight", (1, D + r), "BF16", "dspark_confidence", L)]
    return specs


def dspark_specs(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """Every tensor of the DSpark drafter the config describes (empty without `dspark_*` keys)."""
    return {s.name: s for stage in range(cfg.dspark_stages) for s in dspark_stage_specs(cfg, stage)}
