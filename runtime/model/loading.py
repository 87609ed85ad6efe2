"""Model weights from an official checkpoint, dequantized to the compute dtype, every tensor claimed.

Matmul weights (FP8 decoded bit-exactly; exact in bfloat16 too) take the compute dtype, or, with
`fp8`, stay FP8 with their block scales as stored (fp8_matrix.py). Norms, mHC,
sinks, compressor projections and ape, router and LM head stay float32, as the reference keeps them.
Routed experts are left to the expert executor. Loading fails, naming the tensors, if any
checkpoint tensor was not claimed by some weight here (or by the executor).

Legend: V vocab, D hidden.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ostinato.checkpoint.errors import CheckpointError
from ostinato.checkpoint.reader import Checkpoint
from ostinato.checkpoint.tensor_specs import layer_prefix

from .attention import AttentionWeights
from .compressor import CompressorWeights
from .fp8_matrix import Fp8Matrix, Matrix
from .huge_pages import in_huge_pages
from .hyper_connection import HcHeadWeights, HcWeights
from .indexer import IndexerWeights
from .moe import MoeWeights
from .router import RouterWeights

F32 = torch.float32


@dataclass(frozen=True)
class LayerWeights:
    index: int
    kind: str  # "sliding" | "csa" | "hca"
    attn_norm: torch.Tensor  # [D] float32
    ffn_norm: torch.Tensor   # [D] float32
    hc_attn: HcWeights
    hc_ffn: HcWeights
    attn: AttentionWeights
    moe: MoeWeights


@dataclass(frozen=True)
class MtpWeights:
    """One multi-token-prediction block (mtp.K): a decoder block and what feeds and reads it."""
    block: LayerWeights      # its layer index is num_hidden_layers + K
    e_proj: Matrix           # [D, D]: the next token's normed embedding -> block input
    h_proj: Matrix           # [D, D]: the main model's normed residual streams -> block input
    enorm: torch.Tensor      # [D] float32
    hnorm: torch.Tensor      # [D] float32
    norm: torch.Tensor       # [D] float32: before the shared LM head
    hc_head: HcHeadWeights   # its own collapse of the streams


@dataclass(frozen=True)
class ModelWeights:
    embed: torch.Tensor  # [V, D] as stored (bf16): rows are upcast to seed the float32 residual streams
    head: torch.Tensor   # [V, D] as stored (bf16); the logits are computed in float32 a block of rows at a time
    norm: torch.Tensor   # [D] float32
    hc_head: HcHeadWeights
    layers: tuple[LayerWeights, ...]
    mtp: tuple[MtpWeights, ...] = ()  # the checkpoint's MTP blocks, when it has them and they were loaded


class Claims:
    """Reads tensors for the loader and remembers which ones were used (scales with their weights).
    `device` is where the next tensors go (the loader moves it from layer to layer in a pipeline)."""

    def __init__(self, ckpt: Checkpoint, device: torch.device | str):
        self.ckpt, self.device = ckpt, device
        self.claimed: set[str] = set()

    def claim(self, *names: str) -> None:
        for name in names:
            self.claimed.add(name)
            if name.endswith(".weight"):
                self.claimed.add(name[: -len("weight")] + "scale")

    def get(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        self.claim(name)
        return self.ckpt.dequantized(name, dtype).to(self.device)

    def matrix(self, name: str, dtype: torch.dtype, fp8: bool) -> Matrix:
        """An FP8 matmul weight: dequantized to dtype, or (fp8) as stored with its scales."""
        if not fp8:
            return self.get(name, dtype)
        self.claim(name)
        scale = self.ckpt.raw(name[: -len("weight")] + "scale").view(torch.uint8)
        return Fp8Matrix.of_bytes(self.ckpt.raw(name).to(self.device, copy=True), scale.to(self.device, copy=True))

    def check(self, skip_roles: tuple[str, ...] = ()) -> None:
        missed = sorted(n for n, s in self.ckpt.specs.items() if n not in self.claimed and s.role not in skip_roles)
        if missed:
            raise CheckpointError(self.ckpt.root, f"{len(missed)} tensors were not claimed by the model loader "
                                  f"(first: {missed[:5]})", tensor=missed[0])


def _compressor(c: Claims, prefix: str, ratio: int) -> CompressorWeights:
    # [2C, D] as stored (bf16), computed in float32 (model/stored_bf16.py): no float32 copy to read every token
    wkv_gate = torch.cat((c.get(f"{prefix}.wkv.weight", None), c.get(f"{prefix}.wgate.weight", None)))
    return CompressorWeights(wkv_gate, c.get(f"{prefix}.ape", F32), c.get(f"{prefix}.norm.weight", F32), ratio,
                             overlap=ratio == 4)


def _hc(c: Claims, prefix: str) -> HcWeights:
    return HcWeights(c.get(f"{prefix}_fn", F32), c.get(f"{prefix}_base", F32), c.get(f"{prefix}_scale", F32))


def _layer(c: Claims, layer: int, dtype: torch.dtype, fp8: bool) -> LayerWeights:
    """A decoder block's weights: main layer `layer`, or an MTP block's (num_hidden_layers + K)."""
    cfg = c.ckpt.config
    p = layer_prefix(cfg, layer)
    a, f = f"{p}.attn", f"{p}.ffn"
    ratio = cfg.compress_ratio(layer)
    compressor = _compressor(c, f"{a}.compressor", ratio) if ratio else None
    indexer = None
    if ratio == 4:
        indexer = IndexerWeights(c.matrix(f"{a}.indexer.wq_b.weight", dtype, fp8),
                                 c.get(f"{a}.indexer.weights_proj.weight", F32),
                                 _compressor(c, f"{a}.indexer.compressor", ratio), cfg.index_n_heads,
                                 cfg.index_head_dim, cfg.index_topk)
    attn = AttentionWeights(
        wq_a=c.matrix(f"{a}.wq_a.weight", dtype, fp8), q_norm=c.get(f"{a}.q_norm.weight", F32),
        wq_b=c.matrix(f"{a}.wq_b.weight", dtype, fp8), wkv=c.matrix(f"{a}.wkv.weight", dtype, fp8),
        kv_norm=c.get(f"{a}.kv_norm.weight", F32), wo_a=c.matrix(f"{a}.wo_a.weight", dtype, fp8),
        wo_b=c.matrix(f"{a}.wo_b.weight", dtype, fp8), sink=c.get(f"{a}.attn_sink", F32), compressor=compressor,
        indexer=indexer, n_heads=cfg.num_attention_heads, head_dim=cfg.head_dim, o_groups=cfg.o_groups,
        window=cfg.sliding_window)
    hashed = cfg.is_hash_layer(layer)
    router = RouterWeights(c.get(f"{f}.gate.weight", F32), None if hashed else c.get(f"{f}.gate.bias", F32),
                           c.get(f"{f}.gate.tid2eid", torch.int64) if hashed else None, cfg.num_experts_per_tok,
                           cfg.routed_scaling_factor)
    s = f"{f}.shared_experts"
    w1, w3 = c.matrix(f"{s}.w1.weight", dtype, fp8), c.matrix(f"{s}.w3.weight", dtype, fp8)
    shared_w13 = Fp8Matrix.cat([w1, w3]) if fp8 else torch.cat((w1, w3))  # [2I, D]
    moe = MoeWeights(router, shared_w13, c.matrix(f"{s}.w2.weight", dtype, fp8), cfg.swiglu_limit)
    return LayerWeights(layer, cfg.attention_kind(layer), c.get(f"{p}.attn_norm.weight", F32),
                        c.get(f"{p}.ffn_norm.weight", F32), _hc(c, f"{p}.hc_attn"), _hc(c, f"{p}.hc_ffn"), attn, moe)


def load_weights(c: Claims, dtype: torch.dtype, layer_devices: list | None = None,
                 on_layer: Callable[[int], None] | None = None, fp8: bool = False, mtp: bool = False) -> ModelWeights:
    """Every non-expert weight of the model (the caller checks the claims once the executor has loaded).
    Layer i's weights go to layer_devices[i] (default: the claims' device), the head to the last one's.
    `on_layer(i)` is called after layer i's weights are loaded (progress). `mtp`: the MTP blocks' too
    (beside the head), when the checkpoint has them."""
    n = c.ckpt.config.num_hidden_layers
    first = c.device
    devices = list(layer_devices or [first] * n)
    embed = c.get("embed.weight", None)  # as stored: float32 would double V4-Flash's 1 GB table
    layers = []
    for layer in range(n):
        c.device = devices[layer]
        layers.append(_layer(c, layer, dtype, fp8))
        if on_layer is not None:
            on_layer(layer)
    head_rows = c.get("head.weight", None)  # [V, D] as stored
    if head_rows.device.type == "cpu":  # read whole every token: out of the memory map, into 2 MB pages
        head_rows = in_huge_pages(head_rows)
    head = (head_rows, c.get("norm.weight", F32),
            HcHeadWeights(c.get("hc_head_fn", F32), c.get("hc_head_base", F32), c.get("hc_head_scale", F32)))
    mtp = tuple(_mtp(c, n + k, dtype, fp8) for k in range(c.ckpt.config.mtp_blocks)) \
        if mtp and c.ckpt.has_mtp else ()  # beside the head, on the last layer's device
    c.device = first
    return ModelWeights(embed, *head, tuple(layers), mtp)


def _mtp(c: Claims, layer: int, dtype: torch.dtype, fp8: bool) -> MtpWeights:
    p = layer_prefix(c.ckpt.config, layer)
    return MtpWeights(_layer(c, layer, dtype, fp8), c.matrix(f"{p}.e_proj.weight", dtype, fp8),
                      c.matrix(f"{p}.h_proj.weight", dtype, fp8), c.get(f"{p}.enorm.weight", F32),
                      c.get(f"{p}.hnorm.weight", F32), c.get(f"{p}.norm.weight", F32),
                      HcHeadWeights(c.get(f"{p}.hc_head_fn", F32), c.get(f"{p}.hc_head_base", F32),
                                    c.get(f"{p}.hc_head_scale", F32)))
