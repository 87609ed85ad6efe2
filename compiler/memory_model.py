"""Exact memory model: the bytes every device holds under a placement, by kind.

Every formula is written out here so that a plan's numbers can be re-derived by hand:
- dense weights as the kernels hold them (`stored`: FP8 + scales as in the checkpoint; `bf16`:
  FP8 matrices dequantized to 2 B per element, scales dropped); BF16/F32/int tensors as stored;
- routed experts at MXFP4 bytes including scales (13,369,344 B each for V4-Flash);
- KV cache per session (docs/model.md section 4), bf16 rows: every layer a sliding ring of
  `sliding_window` rows of head_dim; compressed layers one row per `ratio` tokens; CSA also
  indexer keys (index_head_dim per 4 tokens); plus the compressors' fp32 partial-window state;
- decode-graph buffers (1-token workspace plus one context of static KV state), upload staging,
  prefill workspace and allocator headroom (formulas below).
Legend: C prefill chunk tokens, N context tokens, S sessions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.tensor_specs import TensorSpec, global_specs, layer_specs

KV_BYTES = 2          # bf16 cache rows
STATE_BYTES = 4       # fp32 compressor state (kv and gate logits of the incomplete windows)
ACT_BYTES = 4         # fp32 activations in the workspace bound (conservative)
ATTENTION_QUERY_BLOCK = 512   # prefill attention is computed in query blocks of this many tokens


def held_bytes(spec: TensorSpec, dense_format: str) -> int:
    """Bytes a device holds for one tensor (routed experts are always packed MXFP4)."""
    if spec.role == "routed_expert" or dense_format == "stored":
        return spec.nbytes
    if spec.dtype == "F8_E4M3":
        return math.prod(spec.shape) * 2
    if spec.dtype == "F8_E8M0":
        return 0  # folded into the dequantized bf16 matrix
    return spec.nbytes


def layer_dense_bytes(cfg: ModelConfig, layer: int, dense_format: str) -> int:
    return sum(held_bytes(s, dense_format) for s in layer_specs(cfg, layer, with_experts=False))


def global_bytes(cfg: ModelConfig, role: str, dense_format: str) -> int:
    return sum(held_bytes(s, dense_format) for s in global_specs(cfg) if s.role == role)


def kv_cache_bytes(cfg: ModelConfig, layer: int, context: int) -> int:
    """One session's cache for `layer` at `context` tokens."""
    hd = cfg.head_dim
    total = cfg.sliding_window * hd * KV_BYTES                         # constant ring
    ratio = cfg.compress_ratio(layer)
    if ratio:
        total += math.ceil(context / ratio) * hd * KV_BYTES            # compressed rows
        width = cfg.compressor_width(layer)
        buffered = 2 * ratio if ratio == 4 else ratio                  # CSA overlaps the previous window
        total += buffered * width * STATE_BYTES * 2                    # kv + gate logits
    if ratio == 4:
        ihd = cfg.index_head_dim
        total += math.ceil(context / 4) * ihd * KV_BYTES               # indexer keys
        total += 2 * 4 * (2 * ihd) * STATE_BYTES * 2                   # indexer compressor state
    return total


def workspace_bytes(cfg: ModelConfig, tokens: int) -> int:
    """Upper bound of the activations alive during one layer's forward over `tokens` tokens.

    Sum of: the mHC residual in and out (2 x C x hc x D), q and the attention output (2 x C x H x hd),
    attention logits for one query block against window + selected/compressed keys
    (min(C, 512) x H x (window + index_topk)), the grouped output intermediate (C x groups x o_lora),
    and the experts' gate/up activations (C x k x 2I) plus the shared expert's (C x 2I); all fp32.
    """
    C, D, H, hd = tokens, cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    keys = cfg.sliding_window + cfg.index_topk
    elements = (2 * C * cfg.hc_mult * D + 2 * C * H * hd + min(C, ATTENTION_QUERY_BLOCK) * H * keys
                + C * cfg.o_groups * cfg.o_lora_rank + C * (cfg.num_experts_per_tok + 1) * 2 * cfg.moe_intermediate_size)
    return elements * ACT_BYTES


@dataclass(frozen=True)
class MemoryPolicy:
    """The knobs of the memory model; all recorded in the plan."""
    context: int                 # planned context per session (tokens)
    sessions: int = 1            # sessions whose KV cache stays resident
    prefill_chunk: int = 4096    # largest prefill chunk (tokens) the workspace is sized for
    upload_group: int = 16       # experts per upload staging buffer (two buffers: double buffering)
    headroom_fraction: float = 0.05  # allocator fragmentation reserve, of usable bytes
    dense_format: str = "stored"

    def __post_init__(self) -> None:
        for name in ("context", "sessions", "prefill_chunk", "upload_group"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.dense_format not in ("stored", "bf16"):
            raise ValueError(f"dense_format must be 'stored' or 'bf16', got {self.dense_format!r}")
        if not 0 <= self.headroom_fraction < 0.5:
            raise ValueError(f"headroom_fraction must be in [0, 0.5), got {self.headroom_fraction}")


def layer_resident_bytes(cfg: ModelConfig, layer: int, policy: MemoryPolicy) -> dict[str, int]:
    """Bytes a GPU holds for one of its layers, before hot experts."""
    return {"dense_weights": layer_dense_bytes(cfg, layer, policy.dense_format),
            "kv_cache": policy.sessions * kv_cache_bytes(cfg, layer, policy.context),
            # the decode step's own 1-token buffers and its static copy of one context's KV state
            # (runtime/model/static_decode: loaded from the decoding session, stored back after)
            "decode_graph": workspace_bytes(cfg, 1) + kv_cache_bytes(cfg, layer, policy.context)}


def gpu_fixed_bytes(cfg: ModelConfig, policy: MemoryPolicy, usable: int, expert_bytes: int, last: bool) -> dict[str, int]:
    """Per-GPU bytes independent of which layers it runs."""
    fixed = {"upload_staging": 2 * policy.upload_group * expert_bytes,
             "workspace": workspace_bytes(cfg, policy.prefill_chunk),
             "headroom": int(usable * policy.headroom_fraction)}
    if last:  # the LM head, final norm and hc head run after the last layer
        fixed["head"] = sum(global_bytes(cfg, r, policy.dense_format) for r in ("head", "final_norm", "hc_head"))
    return fixed
