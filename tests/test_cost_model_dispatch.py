"""The cost model's host-dispatch term: EAGER_OPS_PER_LAYER matches what the runtime really dispatches,
and the term lands where execution is eager (prefills; decode only on a cpu-only spec)."""

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ostinato.compiler.cost_model import EAGER_OPS_PER_LAYER
from ostinato.runtime.engine.loader import load_engine

from conftest import compile_tiny_plan


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_eager_ops_per_layer_matches_the_runtime(preset, tiny_ckpt, small_ckpt, tmp_path):
    ckpt = tiny_ckpt if preset == "tiny" else small_ckpt
    plan = compile_tiny_plan(ckpt, tmp_path, context=4096, max_hot_per_layer=4)
    engine = load_engine(plan, ckpt, device="cpu")
    session = engine.new_session()
    session.prefill(torch.randint(0, 1000, (300,), generator=torch.Generator().manual_seed(0)))
    per_layer = []
    for n in (1, 16, 128):  # split-route prefills of a tool output, on top of a context
        with OpCounter() as count:
            session.prefill(torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(n)))
        per_layer.append(count.ops / engine.plan.model.layers)
    engine.close()
    # observed: tiny 566-695, small 558-662 per layer
    assert all(0.7 * EAGER_OPS_PER_LAYER <= p <= 1.3 * EAGER_OPS_PER_LAYER for p in per_layer), per_layer


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
