"""The DeepSeek-V4 model: embedding, decoder blocks (mHC around attention and MoE), hc head, LM head.

`Model.forward(token_ids, cache)` runs new tokens on top of what a KvCache holds and returns their
logits; sessions (session.py) own caches. The expert executor and the routing observer are
pluggable: `load_model(..., executor=...)`, `model.set_executor(...)`, `model.set_observer(...)`.

Legend: T tokens, N hc_mult streams, D hidden, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.errors import CheckpointError
from ostinato.checkpoint.reader import Checkpoint

from .attention import attention
from .compressor import CompressorState
from .experts import DenseExpertExecutor, ExpertExecutor
from .fused import using
from .hyper_connection import HcHeadWeights, hc_head, hc_post, hc_pre
from .kv_cache import GrowingRows, KvCache, LayerCache, rows_capacity
from .loading import Claims, LayerWeights, ModelWeights, load_weights
from .moe import RoutingObserver, moe
from .norms import rms_norm
from .rope import rope_tables
from .stored_bf16 import stored_product

if TYPE_CHECKING:  # a late import at run time: session.py imports this module
    from .session import Session

# Tokens per forward when prefilling: bounds activation memory (window logits grow with T^2).
DEFAULT_PREFILL_CHUNK = 512
DEFAULT_MAX_SNAPSHOTS = 256  # turn-boundary snapshots per session when no plan says (session.py)


class Model:
    def __init__(self, config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype,
                 device: torch.device | str, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 layer_devices: list | None = None, *, max_context: int | None = None,
                 max_snapshots: int = DEFAULT_MAX_SNAPSHOTS, hc_mix: Callable | None = None, dense_ops=None):
        self.config, self.weights, self.executor = config, weights, executor
        self.dtype, self.device = dtype, torch.device(device)  # embedding; layer_devices[-1] runs the head
        # Pipeline over devices: layer i runs on layer_devices[i]; the residual moves at each boundary.
        self.layer_devices = [torch.device(d) for d in (layer_devices or [device] * config.n_layers)]
        self.prefill_chunk = prefill_chunk
        self.max_context = max_context  # the planned context: caches grow in steps up to it (kv_cache.py)
        self.max_snapshots = max_snapshots  # per session (session.py); a plan sets its own
        self.observer: RoutingObserver | None = None
        self.hc_mix = hc_mix  # the plan's mHC mixing kernel (kernels/hc_mix.py); None: reference
        self.dense_ops = dense_ops  # the plan's norm and rope kernels (kernels/dense_ops.py), active in its forwards
        tables = rope_tables(config)
        self.ropes = {d: {k: r.to(d) for k, r in tables.items()} for d in set(self.layer_devices)}

    def set_executor(self, executor: ExpertExecutor) -> None:
        self.executor = executor

    def set_observer(self, observer: RoutingObserver | None) -> None:
        """observer(layer, token_ids [T], expert_ids [T, k]) is called in every forward of every layer."""
        self.observer = observer

    def new_cache(self) -> KvCache:
        return KvCache([self._layer_cache(lw, dev) for lw, dev in zip(self.weights.layers, self.layer_devices)])

    def new_mtp_cache(self, k: int = 0) -> LayerCache:
        """An empty cache for MTP block k (on the head's device): its attention keeps its own."""
        return self._layer_cache(self.weights.mtp[k].block, self.layer_devices[-1])

    def _layer_cache(self, lw: LayerWeights, dev: torch.device) -> LayerCache:
        cfg = self.config
        window = torch.zeros(0, cfg.head_dim, dtype=self.dtype, device=dev)
        c, ix = lw.attn.compressor, lw.attn.indexer
        limit = None if self.max_context is None or c is None else rows_capacity(self.max_context, c.ratio)
        return LayerCache(
            window,
            CompressorState.empty(c, dev) if c else None,
            GrowingRows(cfg.head_dim, self.dtype, dev, limit=limit) if c else None,
            CompressorState.empty(ix.compressor, dev) if ix else None,
            GrowingRows(cfg.index_head_dim, self.dtype, dev, limit=limit) if ix else None)

    def new_session(self) -> Session:
        from .session import Session

        return Session(self, max_snapshots=self.max_snapshots)

    @torch.no_grad()
    def forward(self, token_ids: torch.Tensor, cache: KvCache, last_only: bool = False,
                with_streams: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """token_ids [T] following cache.position -> logits [T, V] float32 ([1, V]: the last position's,
        with last_only: a long prompt's logits at V4-Flash's vocabulary are 0.5 MB per token); advances
        the cache. with_streams: (logits, the last layer's residual streams [T, N, D] float32 before the
        mHC head, on the head's device), what the MTP block drafts from (mtp.py)."""
        with using(self.dense_ops):
            streams = self._forward(token_ids, cache)
            logits = self.head(streams[-1:] if last_only else streams)
        return (logits, streams) if with_streams else logits

    def _forward(self, token_ids: torch.Tensor, cache: KvCache) -> torch.Tensor:
        cfg, w = self.config, self.weights
        eps, t = cfg.rms_norm_eps, token_ids.shape[0]
        positions = torch.arange(t, device=self.device) + cache.position  # [T]
        x = w.embed[token_ids].float()  # [T, D]: stored bf16 rows, exact in float32
        streams = x.unsqueeze(1).expand(t, cfg.hc_mult, -1).contiguous()  # [T, N, D] float32 residual
        hc = self.hc_settings()
        for lw, lc, dev in zip(w.layers, cache.layers, self.layer_devices):
            if streams.device != dev:  # a pipeline boundary: the residual and the token ids move on
                streams, positions, token_ids = streams.to(dev), positions.to(dev), token_ids.to(dev)
            rope = self.ropes[dev]["main" if lw.kind == "sliding" else "compress"]
            # The sublayers close over this iteration's variables: decoder_block calls them right away.
            streams = decoder_block(lw, streams, hc,
                                    lambda x: attention(lw.attn, x, positions, lc, rope, eps),
                                    lambda x: moe(lw.moe, lw.index, x, token_ids, self.executor, self.observer))
        cache.position += t
        return streams.to(self.layer_devices[-1])  # [T, N, D]

    def hc_settings(self) -> tuple:
        """What decoder_block passes to hc_pre after the streams and weights."""
        cfg = self.config
        return (cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps, self.dtype, self.hc_mix)

    def head(self, streams: torch.Tensor, hc: HcHeadWeights | None = None, norm: torch.Tensor | None = None
             ) -> torch.Tensor:
        """Residual streams [T, N, D] on the last layer's device -> logits [T, V] float32, through the main
        model's mHC head and final norm, or an MTP block's (`hc`, `norm`: the LM head is shared)."""
        cfg, w = self.config, self.weights
        hc, norm = (w.hc_head, w.norm) if hc is None else (hc, norm)
        h = rms_norm(hc_head(streams, hc, cfg.hc_eps, cfg.rms_norm_eps), norm, cfg.rms_norm_eps)  # [T, D] float32
        if self.dtype == torch.bfloat16:
            # A bf16 plan multiplies the head in bf16, as transformers' bf16 model does: h rounded once, the
            # products of two bf16 values exact, their sums float32 on every path. The host kernel then takes
            # both operands as stored (vdpbf16ps where the CPU has it: the head is a decode token's largest read).
            h = h.to(torch.bfloat16)
        return stored_product(h, w.head, row_dots=False)  # [T, V]: the plan's kernel at a few tokens, else blocks


def decoder_block(lw: LayerWeights, streams: torch.Tensor, hc: tuple, attn: Callable[[torch.Tensor], torch.Tensor],
                  ffn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """One layer around its two sublayers: streams [T, N, D] -> [T, N, D] (float32). Each sublayer
    gets its mHC-collapsed, rms-normed input [T, D]; `hc`: Model.hc_settings()."""
    eps = hc[2]
    for hc_w, norm_w, sublayer in ((lw.hc_attn, lw.attn_norm, attn), (lw.hc_ffn, lw.ffn_norm, ffn)):
        h, post, comb = hc_pre(streams, hc_w, *hc)  # [T, D], [T, N], [T, N, N]
        streams = hc_post(streams, sublayer(rms_norm(h, norm_w, eps)), post, comb)  # [T, N, D]
    return streams


def load_model(ckpt_dir: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
               executor: ExpertExecutor | None = None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
               layer_devices: list | None = None, on_layer: Callable[[int], None] | None = None,
               fp8: bool = False, mtp: bool = False, **planned) -> Model:
    """The model of an official-format checkpoint. Without `executor`, every routed expert is
    dequantized into a DenseExpertExecutor; with one, routed experts are left to it.
    `layer_devices` places each layer's dense weights and cache on its device (a plan's pipeline);
    the embedding stays on `device`, the head goes with the last layer. `on_layer(i)` is called as each
    layer's weights are loaded (progress). `fp8`: FP8 matmul weights stay as stored (fp8_matrix.py).
    `mtp`: the checkpoint's MTP block too (mtp.py; with the dense executor, its experts too), for
    speculative decoding (speculative.py); an error when the checkpoint has none. `planned`: what a plan
    adds (Model's max_context, max_snapshots, hc_mix, dense_ops), given here: nothing edits a built model."""
    with Checkpoint.open(ckpt_dir) as ckpt:
        if mtp and not ckpt.has_mtp:
            why = ("its mtp.* tensors are the 0731 release's DSpark drafter, which Ostinato does not run"
                   if ckpt.config.has_dspark else
                   f"its config's num_nextn_predict_layers is {ckpt.config.num_nextn_predict_layers}")
            raise CheckpointError(ckpt.root, f"the MTP block (mtp.0.*) was asked for, but this checkpoint has none "
                                  f"({why})")
        claims = Claims(ckpt, device)
        weights = load_weights(claims, dtype, layer_devices, on_layer, fp8, mtp)
        if executor is None:
            executor = DenseExpertExecutor.from_checkpoint(ckpt, dtype, device, claims, mtp)
            claims.check()
        else:
            claims.check(skip_roles=("routed_expert",))
        return Model(ckpt.config, weights, executor, dtype, device, prefill_chunk, layer_devices, **planned)
