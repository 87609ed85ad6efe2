"""The cost model's host-dispatch term: EAGER_OPS_PER_LAYER matches what the runtime really dispatches,
and the term lands where execution is eager (prefills; decode only on a cpu-only spec)."""

import copy

import pytest
from conftest import compile_tiny_plan

from ostinato.compiler.cost_model import EAGER_OPS_PER_LAYER, EAGER_STEP_OPS_PER_LAYER
from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.engine.op_count import ops_per_layer


@pytest.mark.parametrize("preset", ["tiny", "small"])
@pytest.mark.slow  # compiled plans' engines (C++ kernels)
def test_eager_ops_per_layer_matches_the_runtime(preset, tiny_ckpt, small_ckpt, tmp_path, kernel_dir):
    ckpt = tiny_ckpt if preset == "tiny" else small_ckpt
    plan = compile_tiny_plan(ckpt, tmp_path, kernel_dir, context=4096, max_hot_per_layer=4)
    plan = plan.replace(policy=plan.policy.replace(prefill_buckets=[2]))  # a 2-token fixed-shape step to count
    engine = load_engine(plan, ckpt, device="cpu", speculative="off")
    counts = ops_per_layer(engine)  # split-route prefills of 1, 16, 128 tokens on top of a context, a decode step
    engine.close()
    per_layer = [v for k, (v, _) in counts.items() if k.startswith("prefill")]
    # observed: tiny 191-229, small 182-228 per layer (decode 195, 194)
    assert all(0.7 * EAGER_OPS_PER_LAYER <= p <= 1.3 * EAGER_OPS_PER_LAYER for p in per_layer), per_layer
    step = counts["step2"][0]  # observed: tiny 272
    assert 0.85 * EAGER_STEP_OPS_PER_LAYER <= step <= 1.15 * EAGER_STEP_OPS_PER_LAYER, step
    assert step > 1.2 * counts["decode"][0]  # the fixed-shape step's general path: more ops than decode's


def test_dispatch_is_added_to_eager_forwards_only(tiny_ckpt, tmp_path):
    from ostinato.compiler.compile import CompileOptions, compile_plan

    build = compile_plan(CompileOptions(tiny_ckpt, tmp_path / "p.yaml", "h200-x1", context=4096,
                                        build_kernels=False))
    cost = build.cost
    free = copy.copy(cost)  # the same model with free dispatch
    free.hw = cost.hw.replace(host=cost.hw.host.replace(op_dispatch_s=0.0))
    per_forward = len(cost.layers) * EAGER_OPS_PER_LAYER * cost.hw.host.op_dispatch_s
    assert per_forward > 0
    assert cost.dispatch_time(100) == pytest.approx(per_forward)
    assert cost.dispatch_time(cost.prefill_chunk + 1) == pytest.approx(2 * per_forward)  # two chunks
    # a GPU: the host runs ahead, the forward takes the longer of dispatch and device work
    assert cost.split_prefill(100) == pytest.approx(max(free.split_prefill(100), per_forward))
    assert cost.decode_step() == pytest.approx(free.decode_step())  # decode replays its graph


def test_a_cpu_only_decode_step_is_priced_as_its_plan_runs_it(tiny_ckpt, tmp_path):
    """policy.cpu_step: compiled prices the decode step at COMPILED_STEP_OPS_PER_LAYER, eager at the dynamic
    forward's ops; the other steps and the prefills are eager either way, and the plan records the choice."""
    from ostinato.compiler.compile import CompileError, CompileOptions, compile_plan
    from ostinato.compiler.cost_model import COMPILED_STEP_OPS_PER_LAYER

    builds = {mode: compile_plan(CompileOptions(tiny_ckpt, tmp_path / f"{mode}.yaml", "cpu-only", context=4096,
                                                build_kernels=False, cpu_step=mode)) for mode in ("compiled", "eager")}
    compiled, eager = builds["compiled"].cost, builds["eager"].cost
    layers, per_op = len(compiled.layers), compiled.hw.host.op_dispatch_s
    saved = layers * (EAGER_OPS_PER_LAYER - COMPILED_STEP_OPS_PER_LAYER) * per_op
    assert eager.decode_step() - compiled.decode_step() == pytest.approx(saved)
    assert compiled.bucket_step(1) == pytest.approx(compiled.decode_step())
    assert compiled.bucket_step(2) == pytest.approx(eager.bucket_step(2))  # the 2-token step stays eager
    assert compiled.split_prefill(16) == pytest.approx(eager.split_prefill(16))
    plans = {mode: b.plan for mode, b in builds.items()}
    assert plans["compiled"].policy.cpu_step == "compiled" and plans["eager"].policy.cpu_step == "eager"
    assert plans["compiled"].predictions.decode_ms_per_token < plans["eager"].predictions.decode_ms_per_token
    with pytest.raises(CompileError, match="--cpu-step is 'jit': one of compiled, eager"):
        compile_plan(CompileOptions(tiny_ckpt, tmp_path / "x.yaml", "cpu-only", build_kernels=False, cpu_step="jit"))


@pytest.mark.parametrize("mode", ["compiled", "eager"])
def test_the_simulator_prices_a_cpu_only_step_as_the_cost_model_does(tiny_ckpt, tmp_path, mode):
    """bench/simulator's decode and bucket passes on a cpu-only spec dispatch the plan's step (its ops per
    layer), as CostModel.decode_step and bucket_step do, not the dynamic forward's."""
    import numpy as np

    from ostinato.bench.simulator.policy import bucket_pass, static_decode
    from ostinato.compiler.compile import CompileOptions, compile_plan

    build = compile_plan(CompileOptions(tiny_ckpt, tmp_path / "p.yaml", "cpu-only", context=4096,
                                        build_kernels=False, cpu_step=mode))
    cost, L, k, E = build.cost, len(build.cost.layers), build.config.num_experts_per_tok, build.config.n_routed_experts
    # no cold routes here, the plan's few in the cost model's expectation: within 1%, where the dispatch
    # of the dynamic forward's ops instead of the step's would be off by 1.5x (compiled) or 10% (eager)
    every_hot = np.ones((L, E), dtype=bool)
    ids = np.tile(np.arange(k), (3, L, 1))  # [T=3 decode tokens, L, k]
    steps, _ = static_decode(cost, every_hot, ids, fixed_shape=True)   # the plan's own step, from position 0
    assert steps == pytest.approx([cost.decode_step(p) for p in range(3)], rel=0.01)
    counts = np.zeros((L, E))
    counts[:, :k] = 2  # 2 tokens' routes, the first k experts
    assert bucket_pass(cost, counts, 2, every_hot, [2]).seconds == pytest.approx(cost.bucket_step(2), rel=0.01)
