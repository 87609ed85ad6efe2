"""The weight formats each baseline runs DeepSeek-V4-Flash in, as its own docs publish them, for pricing its reads.

The plan's cost model holds Ostinato's formats (compiler/memory_model.py: the dense matrices as the plan's
dense_format says; float32 on a cpu-only spec). A baseline reads its own weights: with_weights() gives a copy
of the cost model whose dense parts (each layer's, the head's, the MTP block's) are priced in the baseline's
format. The routed experts are MXFP4 in every system (17 bytes per 32 weights: ggml's block_mxfp4, kt-kernel's
--kt-method MXFP4 and the checkpoint alike), so CostModel.expert_bytes stands for all of them.

- llama.cpp (GGUF_MXFP4_MOE): the DeepSeek-V4-Flash GGUF that ggml-org publishes is llama-quantize's
  MXFP4_MOE of a BF16 conversion (ggml-org/convert PR #11, "Main (MXFP4_MOE)"). llama-quantize's rule for that
  type (src/llama-quant.cpp, llama_tensor_get_type): 3-D (expert) tensors MXFP4, every other quantized tensor
  Q8_0, the output (head) Q8_0; is_quantizable leaves norms, the router (ffn_gate_inp) and positional tensors as
  converted (1-D tensors F32, 2-D ones BF16). The hash layers' token-to-expert table is priced as I32, KV
  rows at 2 bytes (KV_ELEMENT_BYTES).
- KTransformers (CHECKPOINT): its DeepSeek-V4-Flash recipe points SGLang's --model at the official checkpoint
  (FP8 dense matrices with their E8M0 block scales, BF16 and F32 tensors as stored) and kt-kernel at the same
  files with --kt-method MXFP4 (kvcache-ai/ktransformers doc/en/DeepSeek-V4-Flash.md): every tensor as stored.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.tensor_specs import TensorSpec, global_specs, layer_specs, mtp_block_specs
from ostinato.compiler.cost_model import CostModel

Q8_0_BYTES_PER_WEIGHT = 34 / 32   # ggml's block_q8_0: 32 int8 weights and one fp16 scale
# the hash layers' token -> experts table as int32: how GGUF tools write it (antirez/ds4 PR #474 converts the
# checkpoint's I64 to I32) and how transformers' DeepSeek-V4 code holds it (tid2eid, torch.int32)
I32_BYTES = 4
# KV rows' element in both baselines: llama.cpp's default cache type is f16 (--cache-type-k / -v f16); SGLang's
# default --kv-cache-dtype "auto" is the model's dtype, bf16
KV_ELEMENT_BYTES = 2


def _gguf_mxfp4_moe(spec: TensorSpec) -> int:
    """Bytes of one checkpoint tensor in the MXFP4_MOE GGUF (the module docstring's rule)."""
    elements = math.prod(spec.shape)
    if spec.role == "routed_expert":
        return spec.nbytes                       # MXFP4 as shipped: the same bytes
    if spec.dtype == "F8_E8M0":
        return 0                                 # FP8 block scales: folded into the Q8_0 blocks
    if spec.dtype.startswith(("I", "U")):
        return elements * I32_BYTES              # the hash layers' token -> experts table
    if len(spec.shape) == 1:
        return elements * 4                      # norms, biases, sinks: F32
    if spec.role == "gate" or spec.name.endswith(".ape"):
        return elements * 2                      # router and positional tensors are not quantized: BF16
    return round(elements * Q8_0_BYTES_PER_WEIGHT)   # every other matrix, the head included: Q8_0


def _as_stored(spec: TensorSpec) -> int:
    return spec.nbytes


@dataclass(frozen=True)
class WeightFormat:
    name: str                                   # as the tables show it
    tensor_bytes: Callable[[TensorSpec], int]   # bytes a device holds of one checkpoint tensor


GGUF_MXFP4_MOE = WeightFormat("GGUF MXFP4_MOE (experts MXFP4, other matrices and head Q8_0)", _gguf_mxfp4_moe)
CHECKPOINT = WeightFormat("checkpoint as stored (dense FP8 + block scales, experts MXFP4)", _as_stored)


def layer_dense_bytes(fmt: WeightFormat, cfg, layer: int) -> int:
    return sum(fmt.tensor_bytes(s) for s in layer_specs(cfg, layer, with_experts=False))


def shared_expert_bytes(fmt: WeightFormat, cfg, layer: int) -> int:
    return sum(fmt.tensor_bytes(s) for s in layer_specs(cfg, layer, with_experts=False) if s.role == "shared_expert")


def head_bytes(fmt: WeightFormat, cfg) -> int:
    return sum(fmt.tensor_bytes(s) for s in global_specs(cfg) if s.role == "head")


def mtp_dense_bytes(fmt: WeightFormat, cfg) -> int:
    return sum(fmt.tensor_bytes(s) for s in mtp_block_specs(cfg, 0, with_experts=False))


def with_weights(cost: CostModel, fmt: WeightFormat) -> CostModel:
    """The cost model with its dense reads (layers, their shared experts, head, MTP block) priced in `fmt` and KV
    rows at KV_ELEMENT_BYTES; placement, shares and every rate unchanged. A cost model made by hand (a test's,
    whose config is not a checkpoint's ModelConfig) has no tensors to price: it comes back unchanged."""
    cfg = cost.cfg
    if not isinstance(cfg, ModelConfig):
        return cost
    other = copy.copy(cost)
    other.layers = [replace(l, dense_bytes=layer_dense_bytes(fmt, cfg, i)) for i, l in enumerate(cost.layers)]
    other.head_bytes = head_bytes(fmt, cfg)
    if cost.mtp is not None:
        other.mtp = replace(cost.mtp, dense_bytes=mtp_dense_bytes(fmt, cfg))
    # the cost model's own split of each dense part (the shared expert runs beside the experts), in this format;
    # index len(layers) is the MTP block's
    if getattr(cost, "_shared", None) is not None:
        other._shared = [(shared_expert_bytes(fmt, cfg, i), params) for i, (_, params) in enumerate(cost._shared)]
    if hasattr(cost, "kv_element_bytes"):
        other.kv_element_bytes = KV_ELEMENT_BYTES
    return other
