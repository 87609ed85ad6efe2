"""The engine's fixed-shape decode step (the body of the per-GPU CUDA graph), run eagerly on the CPU.

It must equal the plain model under every placement, be graph-safe with the placement executor
(hot pool launch plus cold routes through the host task), count its routes, and stay exact when
sessions take turns with it (bind / release around prefills, truncation and forks).
"""

import ctypes

import pytest
import torch
from engine_helpers import IDS, _close, _engine, pipeline_engine
from graph_safety import first_difference, segment_owners, traced_step

from ostinato import buckets
from ostinato.runtime.cli.run import main as run_main

pytestmark = pytest.mark.slow  # the compiled plan and the reference model (tests/conftest.py)


@pytest.mark.parametrize("placement", ["all-hot", "all-cold", "mixed", "random"])
def test_static_decode_equals_the_plain_model_and_counts_routes(compiled, tiny_ckpt, reference, placement):
    engine = _engine(compiled, tiny_ckpt, placement)
    assert engine.step_runner is not None
    seen = []
    reference.set_observer(lambda layer, tokens, ids: seen.append((layer, ids.clone())))
    ours, ref = engine.new_session(), reference.new_session()
    try:
        _close(ours.prefill(IDS[:126]), ref.prefill(IDS[:126]))
        seen.clear()
        before = engine.executor.counters.copy()
        token = int(IDS[126])
        for _ in range(5):  # positions 126..130: the HCA window (128) and two CSA windows complete
            a, b = ours.decode(token), ref.decode(token)
            _close(a, b)
            token = int(b.argmax())
    finally:
        reference.set_observer(None)
    c = engine.executor.counters.minus(before)
    hot = {lp.layer: set(lp.hot_experts) for lp in engine.plan.layers}
    routes_cold = sum(sum(e not in hot[layer] for e in ids.reshape(-1).tolist()) for layer, ids in seen)
    distinct = sum(len(set(ids.reshape(-1).tolist()) - hot[layer]) for layer, ids in seen)
    k, L = engine.plan.model.top_k, engine.plan.model.layers
    assert c.forwards == 5 * L and c.routes_hot + c.routes_cold == 5 * k * L
    assert (c.routes_cold, c.distinct_cold) == (routes_cold, distinct)
    assert c.decode_step_s > 0 and c.hot_s == 0  # the step's parts are not timed separately
    engine.close()


def test_decode_moves_on_to_the_step_of_the_next_context(compiled, tiny_ckpt, reference, monkeypatch):
    """A CPU engine decodes each position with the step of the smallest context that holds it (ostinato/buckets.py
    decode_contexts): across two of them, the plain model's logits."""
    monkeypatch.setattr(buckets, "DECODE_CONTEXT_SMALLEST", 32)
    engine = _engine(compiled, tiny_ckpt, "mixed")
    runner = engine.step_runner
    assert [c for c, _ in runner.decode_steps] == [64, 256, 1024, engine.plan.policy.context]
    ours, ref = engine.new_session(), reference.new_session()
    _close(ours.prefill(IDS[:60]), ref.prefill(IDS[:60]))
    used = []
    for t in IDS[60:70]:  # positions 60..69: the 64-token step, then the 256-token one
        used.append(runner._decode_graphs().step.context)
        _close(ours.decode(int(t)), ref.decode(int(t)))
    assert used == [64] * 4 + [256] * 6
    engine.close()


def test_dynamic_decode_is_still_available(compiled, tiny_ckpt, reference):
    engine = _engine(compiled, tiny_ckpt, "mixed", static_decode=False)
    assert engine.step_runner is None
    ours, ref = engine.new_session(), reference.new_session()
    ours.prefill(IDS[:20]), ref.prefill(IDS[:20])
    _close(ours.decode(int(IDS[20])), ref.decode(int(IDS[20])))
    engine.close()


@pytest.mark.parametrize("gpus", [1, 2])
def test_the_step_is_graph_safe_with_the_placement_executor(compiled, tiny_ckpt, reference, gpus):
    """Hot launch + cold host task + attention at two positions: no host reads, equal op traces; with
    two planned GPUs (both the CPU) two segments, each touching only its own buffers, still exact."""
    engine = pipeline_engine(compiled, tiny_ckpt, "random", gpus)
    session, ref = engine.new_session(), reference.new_session()
    session.prefill(IDS[:127]), ref.prefill(IDS[:127])
    runner = engine.step_runner
    runner.bind(session.session)
    step, traces, owners = runner.step, [], segment_owners(runner.step)
    assert [(s.first_layer, s.end_layer) for s in step.segments] == {1: [(0, 4)], 2: [(0, 2), (2, 4)]}[gpus]
    for t in IDS[127:129]:
        traces.append(traced_step(step, [int(t)], owners))
        _close(step.logits, ref.decode(t))
    for a, b in zip(*traces):
        assert a and first_difference(a, b) is None, first_difference(a, b)
    engine.close()


def test_sessions_take_turns_with_the_decode_step(compiled, tiny_ckpt, reference):
    """Two sessions interleave decodes, a prefill, a fork and a truncation: each stays exact."""
    engine = _engine(compiled, tiny_ckpt, "mixed")
    a, b = engine.new_session(), engine.new_session()
    ra, rb = reference.new_session(), reference.new_session()
    for s, r, ids in ((a, ra, IDS[:30]), (b, rb, IDS[30:70])):
        s.prefill(ids), r.prefill(ids)
    ta, tb = 5, 9
    for _ in range(3):
        ta_ref, tb_ref = ra.decode(ta), rb.decode(tb)
        _close(a.decode(ta), ta_ref)
        _close(b.decode(tb), tb_ref)
        ta, tb = int(ta_ref.argmax()), int(tb_ref.argmax())
    fork = a.fork()                       # a's decoded tokens are in its cache before the copy
    _close(a.prefill(IDS[70:80]), ra.prefill(IDS[70:80]))
    rf = reference.new_session()
    rf.prefill(torch.tensor(fork.session.tokens))
    _close(fork.decode(ta), rf.decode(ta))
    b.truncate(41)                        # keeps b's prompt and its first decoded token
    rt = reference.new_session()
    rt.prefill(torch.cat((IDS[30:70], torch.tensor([9]))))
    _close(b.decode(3), rt.decode(3))
    assert len(a) == 43 and len(fork) == 34 and len(b) == 42
    engine.close()


def test_a_failed_cold_task_is_reported(compiled, tiny_ckpt):
    engine = _engine(compiled, tiny_ckpt, "all-cold")
    bridge = engine.executor.bridges[0]
    D, k = bridge.staging.x.shape[1], bridge.staging.ids.shape[1]
    ids = torch.full((1, k), 10_000)  # not an expert of the model
    bridge.start(torch.randn(1, D), ids, torch.ones(1, k))
    with pytest.raises(ValueError, match="expert id is out of range"):
        bridge.check()
    bridge.start(torch.randn(1, D), torch.zeros(1, k, dtype=torch.long), torch.ones(1, k))
    bridge.check()
    assert bridge.task(1).status == 0 and ctypes.sizeof(bridge.task(1)) == 13 * 8
    engine.close()


def test_ostinato_run_decode_modes_give_the_same_reply(compiled, tiny_ckpt, capsys, monkeypatch):
    _, work = compiled
    monkeypatch.chdir(work)
    replies = []
    for mode in ("graph", "eager", "dynamic"):
        assert run_main(["plan.yaml", "--model", str(tiny_ckpt), "--device", "cpu", "--prompt", "Hello",
                         "--max-new", "6", "--decode", mode]) == 0
        out = capsys.readouterr().out
        assert {"graph": "fixed-shape step, eager (OSTINATO_CPU_STEP is eager)",  # tests/conftest.py
                "eager": "fixed-shape step, eager",
                "dynamic": "dynamic forward"}[mode] in out
        replies.append(out.splitlines()[-1])
    assert replies[0] == replies[1] == replies[2] and replies[0].strip()


@pytest.mark.parametrize("library", ["cold_experts_cpu", "dense_ops_cpu"])
def test_a_cpu_kernel_for_an_isa_this_cpu_lacks_is_refused(compiled, tiny_ckpt, monkeypatch, library):
    """Loading it would die with SIGILL; the loader names the ISA and what to do instead (the expert kernel
    and the dense ops' library alike)."""
    from ostinato.plan import KernelName, PlanError
    from ostinato.runtime.engine import loader

    plan, work = compiled
    monkeypatch.setattr(loader, "supports", lambda isa: isa == "avx2")
    kernels = [k.replace(params=dict(k.params, isa="avx512_bf16")) if k.name == KernelName(library) else k
               for k in plan.kernels]
    with pytest.raises(PlanError, match="built for avx512_bf16 .* compile the plan with a hardware spec"):
        loader.load_engine(plan.replace(kernels=kernels), tiny_ckpt, device="cpu")
