"""Cost model: predicted times of prefill (split-route and upload-once) and decode from the hardware spec.

The one model of the hardware in the project (the session simulator uses it too). One concern a module, each
module's docstring saying how it prices its part:

    inputs.py       what it is fed: each layer's placement and dense weights, the MTP block's
    devices.py      device pricing: experts on a GPU or on the host, uploads, GPU-boundary hops, the head
    attention.py    a layer's dense part by position: attention, the CSA indexer, the shared expert
    indexer.py      the CSA indexer's materialized score tensors, in bytes
    forward.py      a forward around its layers: hops, head, graph launches, the host's op dispatch
    layers.py       the order of work in a layer; split-route and upload-once prefill
    sharded.py      upload-once sharded over every GPU's link
    chunks.py       a prompt as the runtime prefills it: one forward a prefill chunk, in the prompt's mode
    decode.py       the decode step, alone and batched over several sessions
    buckets.py      short prefills as fixed-shape bucket steps
    speculation.py  speculative decoding with the MTP block
    plan_policy.py  Ostinato's policy: the mode each prompt runs in, the crossovers, the buckets
    pool_threads.py the CPU expert pool's threads for decode-sized calls
    model.py        CostModel, composed of the pricing classes above

The baselines (bench/simulator/) price their systems with the same CostModel and their own policies.
This module is the package's public face: import from it, not from the modules.
"""

from .attention import CSA_DENSE_MAX_RATIO, KV_ELEMENT_BYTES
from .devices import EXPERT_FLOPS_PER_TOKEN_FACTOR, host_expert_rates, is_calibrated
from .forward import (
    COMPILED_STEP_OPS_PER_LAYER,
    EAGER_OPS_PER_LAYER,
    EAGER_STEP_OPS_PER_LAYER,
    UNFUSED_EAGER_OPS_PER_LAYER,
)
from .indexer import INDEXER_BYTES_PER_QUERY_ROW, INDEXER_BYTES_PER_QUERY_ROW_HEAD, indexer_bytes, indexer_time
from .inputs import LayerCostInputs, MtpCostInputs, held_format, shared_expert_part
from .model import CostModel
from .plan_policy import MAX_BUCKET
from .speculation import MTP_ACCEPTANCE, SpeculativeStep, speculative_step

__all__ = [
    "COMPILED_STEP_OPS_PER_LAYER", "CSA_DENSE_MAX_RATIO", "EAGER_OPS_PER_LAYER", "EAGER_STEP_OPS_PER_LAYER",
    "EXPERT_FLOPS_PER_TOKEN_FACTOR", "INDEXER_BYTES_PER_QUERY_ROW", "INDEXER_BYTES_PER_QUERY_ROW_HEAD",
    "KV_ELEMENT_BYTES", "MAX_BUCKET", "MTP_ACCEPTANCE", "UNFUSED_EAGER_OPS_PER_LAYER",
    "CostModel", "LayerCostInputs", "MtpCostInputs", "SpeculativeStep",
    "held_format", "host_expert_rates", "indexer_bytes", "indexer_time", "is_calibrated", "shared_expert_part",
    "speculative_step",
]
