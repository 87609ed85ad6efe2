"""DeepSeek-V4's multi-token-prediction block (`mtp.K.*`): from the main model's residual streams at
position t and the embedding of token t+1, the logits of token t+2.

Its definition (the reference inference code that ships with the model, MTPBlock): with x the main
model's last-layer residual streams before its mHC head [T, N, D] and e the embedding of the next tokens,

    e = enorm(embed(next_ids))                  [T, D]
    x = hnorm(x)                                [T, N, D]  (per stream, over D)
    x = e_proj(e)[:, None, :] + h_proj(x)       [T, N, D]  (the embedding goes into every stream)
    x = block(x)                                a whole decoder block: mHC, attention with its own cache
                                                (its compress_ratios entry: sliding for V4-Flash), MoE
                                                with its own routed and shared experts
    logits = head(norm(hc_head_K(x)))           its own mHC head and norm, the main model's LM head

Pair t (streams of position t, token t+1) runs at position t: its rope and its cache slot are t's.
The block's layer index is num_hidden_layers + K: the expert executor and the routing observer see
it as one more layer. Its cache is the caller's (speculative.py keeps one per session).

Legend: T pairs, N hc_mult streams, D hidden, V vocab.
"""

from __future__ import annotations

import torch

from .attention import attention
from .fp8_matrix import linear
from .fused import using
from .kv_cache import LayerCache
from .model import decoder_block
from .moe import moe
from .norms import rms_norm


@torch.no_grad()
def mtp_logits(model, streams: torch.Tensor, next_ids: torch.Tensor, start: int, cache: LayerCache, k: int = 0,
               last_only: bool = True) -> torch.Tensor:
    """MTP block k over T pairs at positions start..start+T-1: streams [T, N, D] float32 (the main model's,
    Model.forward(with_streams=True)), next_ids [T] -> draft logits [T, V] float32 ([1, V] with last_only)
    for the tokens after next_ids; advances `cache` by T."""
    cfg, mw = model.config, model.weights.mtp[k]
    eps, dev, t = cfg.rms_norm_eps, model.layer_devices[-1], streams.shape[0]
    lw = mw.block
    with using(model.dense_ops):
        ids = next_ids.to(dev)
        e = rms_norm(model.weights.embed[next_ids.to(model.device)].float().to(dev), mw.enorm, eps)  # [T, D]
        h = rms_norm(streams.to(dev), mw.hnorm, eps)  # [T, N, D], each stream normed over D
        hp = linear(h.reshape(-1, h.shape[-1]).to(model.dtype), mw.h_proj).float().view(h.shape)  # [T, N, D]
        x = linear(e.to(model.dtype), mw.e_proj).float().unsqueeze(1) + hp  # [T, N, D] float32 residual
        positions = torch.arange(t, device=dev) + start  # [T]
        rope = model.ropes[dev]["main" if lw.kind == "sliding" else "compress"]
        x = decoder_block(lw, x, model.hc_settings(),
                          lambda y: attention(lw.attn, y, positions, cache, rope, eps),
                          lambda y: moe(lw.moe, lw.index, y, ids, model.executor, model.observer))
        return model.head(x[-1:] if last_only else x, mw.hc_head, mw.norm)
