"""Each baseline is priced with the weight formats its own docs publish (bench/simulator/formats.py), not with the
plan's: a cpu-only plan holds dense matrices in float32 (~0.55 GB a V4-Flash layer), llama.cpp's GGUF in Q8_0."""

import numpy as np
import pytest

from ostinato.bench.simulator.formats import (
    CHECKPOINT,
    GGUF_MXFP4_MOE,
    KV_ELEMENT_BYTES,
    head_bytes,
    layer_dense_bytes,
    shared_expert_bytes,
    with_weights,
)
from ostinato.bench.simulator.ktransformers import KTransformers, best_threshold
from ostinato.bench.simulator.llamacpp import CpuExperts, LayerPlacement, LruCache
from ostinato.bench.simulator.world import V4_FLASH
from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.tensor_specs import layer_specs
from ostinato.compiler.cost_model import CostModel, LayerCostInputs
from ostinato.compiler.memory_model import global_bytes
from ostinato.compiler.memory_model import layer_dense_bytes as plan_dense_bytes
from ostinato.hardware import load_hardware

CFG = ModelConfig.from_json(V4_FLASH)
EXPERT = 13_369_344          # one V4-Flash expert in MXFP4: 3 x 2048 x 4096 weights x 17 / 32 bytes


def plan_cost(preset: str, dense_format: str) -> CostModel:
    """V4-Flash's cost model with the plan's dense bytes in `dense_format` (every layer on GPU 0, 32 hot)."""
    E = CFG.n_routed_experts
    hot = np.zeros(E, dtype=bool)
    hot[:32] = True
    share = np.full(E, 1.0 / E)
    params = [sum(int(np.prod(s.shape)) for s in layer_specs(CFG, l, with_experts=False)
                  if len(s.shape) == 2 and not s.is_scale) for l in range(CFG.num_hidden_layers)]
    layers = [LayerCostInputs(0, plan_dense_bytes(CFG, l, dense_format), params[l], hot, share)
              for l in range(CFG.num_hidden_layers)]
    return CostModel(CFG, load_hardware(preset), layers, EXPERT, global_bytes(CFG, "head", dense_format), 65536)


def test_the_gguf_prices_matrices_at_q8_0_and_the_head_too():
    """Hand-computed: block_q8_0 is 34 bytes per 32 weights; the head [129280, 4096] is Q8_0 in MXFP4_MOE, and a
    layer's shared expert (w1, w3 [2048, 4096], w2 [4096, 2048], FP8 in the checkpoint) too."""
    assert head_bytes(GGUF_MXFP4_MOE, CFG) == 129280 * 4096 * 34 // 32 == 562_626_560
    assert shared_expert_bytes(GGUF_MXFP4_MOE, CFG, 0) == 3 * 2048 * 4096 * 34 // 32
    # the checkpoint as stored: FP8 weights (1 byte) and their E8M0 scales, one per 128 x 128 block
    assert shared_expert_bytes(CHECKPOINT, CFG, 0) == 3 * (2048 * 4096 + 16 * 32)
    assert head_bytes(CHECKPOINT, CFG) == 129280 * 4096 * 2   # BF16, as stored
    for l in (0, 2, 3):   # a sliding, a CSA and an HCA layer
        stored = layer_dense_bytes(CHECKPOINT, CFG, l)
        assert stored == sum(s.nbytes for s in layer_specs(CFG, l, with_experts=False))
        # Q8_0's 6% over FP8 against the stored scales and the BF16 / F32 tensors it requantizes
        assert 0.9 * stored < layer_dense_bytes(GGUF_MXFP4_MOE, CFG, l) < 1.1 * stored


def test_llama_cpp_on_a_cpu_only_plan_reads_its_gguf_not_the_plans_float32():
    plan = plan_cost("cpu-only", "float32")
    assert plan.layers[0].dense_bytes > 500e6          # the plan's float32 dense matrices (the 567 MB)
    for policy in (LayerPlacement(plan, 0), CpuExperts(plan), LruCache(plan, np.stack([l.hot for l in plan.layers]))):
        c = policy.cost
        for l in range(CFG.num_hidden_layers):
            assert c.layers[l].dense_bytes == layer_dense_bytes(GGUF_MXFP4_MOE, CFG, l), (policy.name, l)
        assert c.head_bytes == 562_626_560
        if hasattr(c, "_shared"):   # the cost model's split of the dense part, in the same format
            assert c._shared[0][0] == 3 * 2048 * 4096 * 34 // 32 and c._shared[0][1] == plan._shared[0][1]
        if hasattr(c, "kv_element_bytes"):
            assert c.kv_element_bytes == KV_ELEMENT_BYTES
        assert policy.weights == GGUF_MXFP4_MOE.name
    # what it changes: llama.cpp's host layers read about a quarter of the bytes they were priced with
    host = LayerPlacement(plan, 0)
    assert host.cost.attention_time(0, 1, on_host=True) < 0.4 * plan.attention_time(0, 1, on_host=True)
    assert plan.layers[0].dense_bytes == plan_dense_bytes(CFG, 0, "float32")   # the plan's own model untouched


def test_ktransformers_reads_the_checkpoint_as_its_recipe_loads_it():
    plan = plan_cost("rtx4090d-x4", "float32")
    kt = KTransformers(plan, 4096)
    assert [l.dense_bytes for l in kt.cost.layers] == [layer_dense_bytes(CHECKPOINT, CFG, l)
                                                        for l in range(CFG.num_hidden_layers)]
    assert kt.cost.head_bytes == 129280 * 4096 * 2 and kt.weights == CHECKPOINT.name
    # its tuned threshold is found on the same weights it runs with
    assert best_threshold(plan, kt.gpu) == best_threshold(with_weights(plan, CHECKPOINT), kt.gpu)


def test_a_hand_made_cost_model_has_no_tensors_to_reprice():
    from types import SimpleNamespace
    fake = SimpleNamespace(cfg=SimpleNamespace(hidden_size=1), layers=[], head_bytes=7)
    assert with_weights(fake, GGUF_MXFP4_MOE) is fake


@pytest.mark.parametrize("fmt", [GGUF_MXFP4_MOE, CHECKPOINT])
def test_the_mtp_block_is_priced_in_the_same_format(fmt):
    from dataclasses import replace

    from ostinato.compiler.cost_model import MtpCostInputs
    plan = plan_cost("rtx4090d-x4", "float32")
    plan.mtp = MtpCostInputs(0, 10**9, 1)
    priced = with_weights(plan, fmt)
    assert 100e6 < priced.mtp.dense_bytes < 250e6 and plan.mtp.dense_bytes == 10**9
    assert priced.mtp == replace(plan.mtp, dense_bytes=priced.mtp.dense_bytes)
