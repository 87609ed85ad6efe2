"""CostModel: the cost model of one plan on one hardware spec, its pricing composed from one class per concern.

Each base class is a module of this package and reads the attributes set here; none keeps state of its own, so
the `with_*` variants (a baseline's kernels, attention or dispatch: copy.copy of the model with one attribute
changed) carry every part along.
"""

from __future__ import annotations

import numpy as np

from ostinato.checkpoint.config import ModelConfig
from ostinato.hardware import HardwareSpec

from ..host_kernel import KernelRates, rates_of_spec
from ..memory_model import DENSE_FORMATS
from .attention import CSA_DENSE_MAX_RATIO, KV_ELEMENT_BYTES, AttentionPricing
from .buckets import BucketSteps
from .chunks import PromptChunks
from .decode import DecodePricing
from .devices import EXPERT_FLOPS_PER_TOKEN_FACTOR, DevicePricing, is_calibrated
from .forward import EAGER_OPS_PER_LAYER, ForwardPricing
from .inputs import LayerCostInputs, MtpCostInputs, held_format, shared_expert_part
from .layers import LayerComposition
from .plan_policy import PlanPolicy
from .pool_threads import PoolThreads
from .sharded import ShardedUpload
from .speculation import SpeculationPricing


class CostModel(DevicePricing, AttentionPricing, ForwardPricing, LayerComposition, ShardedUpload, PromptChunks,
                DecodePricing, BucketSteps, PlanPolicy, SpeculationPricing, PoolThreads):
    """Predicted seconds of the plan's forwards (prefill in every mode, decode, speculation) on `hw`, from each
    layer's placement and route shares (`layers`), the checkpoint's shapes (`cfg`) and the plan's context."""

    def __init__(self, cfg: ModelConfig, hw: HardwareSpec, layers: list[LayerCostInputs], expert_bytes: int,
                 head_bytes: int, context: int, prefill_chunk: int = 4096, mtp: MtpCostInputs | None = None,
                 cpu_step: str = "compiled", dense_format: str | None = None):
        """`mtp`: the MTP block's dense part (None: priced as the last layer's dense part, see mtp_draft);
        `cpu_step`: the plan's policy.cpu_step (how a cpu-only spec runs its decode step); `dense_format`: how the
        plan holds dense weights and KV rows (None: the format whose held bytes are the layers' dense_bytes,
        held_format; when none is, the shared expert is priced inside the dense part before the experts, and KV
        rows at KV_ELEMENT_BYTES)."""
        self.cfg, self.hw, self.layers, self.mtp = cfg, hw, layers, mtp
        self.expert_bytes, self.head_bytes, self.context = expert_bytes, head_bytes, context
        self.prefill_chunk, self.cpu_step = prefill_chunk, cpu_step
        if dense_format is not None and dense_format not in DENSE_FORMATS:
            raise ValueError(f"dense_format {dense_format!r}: one of {list(DENSE_FORMATS)}")
        self.dense_format = dense_format or held_format(cfg, layers)
        self.kv_element_bytes = DENSE_FORMATS[self.dense_format] if self.dense_format else KV_ELEMENT_BYTES
        # per layer (and the MTP block, an MTP index): the shared expert's (bytes, multiply-adds per token)
        self._shared = ([shared_expert_part(cfg, i, self.dense_format) for i in range(len(layers) + 1)]
                        if self.dense_format else [(0, 0)] * (len(layers) + 1))
        # the CPU expert kernel's per-core rates (host_kernel.py); None: the max() of bytes and FLOPs at the
        # host's rates (a calibrated host measured them itself; a spec without expert_kernel estimates them)
        self.host_kernel: KernelRates | None = None if is_calibrated(hw.host) else rates_of_spec(hw.host)
        self.eager_ops_per_layer = EAGER_OPS_PER_LAYER
        self.csa_dense_max_ratio = CSA_DENSE_MAX_RATIO   # the runtime's rule (attention_work)
        self.indexer_materializes = True   # the runtime's indexer writes its score tensors (indexer_bytes)
        self.indexer_fuses_on_gpu = True   # ...on a GPU only its [T, n] scores: one kernel (fused_indexer_bytes)
        k = cfg.num_experts_per_tok
        self.expert_flops = EXPERT_FLOPS_PER_TOKEN_FACTOR * cfg.hidden_size * cfg.moe_intermediate_size
        self._q = [np.minimum(1.0, k * l.share) for l in layers]

    def hot_share(self) -> float:
        """Profiled share of all routes that land on hot experts (mean over layers)."""
        return float(np.mean([l.share[l.hot].sum() for l in self.layers]))
