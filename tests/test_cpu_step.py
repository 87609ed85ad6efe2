"""The decode step on the CPU as one compiled call (runtime/engine/cpu_step.py): exact against the eager step
under every placement, a handful of Python torch calls per step, one thread pool, and a fallback to the
eager step, with the reason, whenever the compiled one cannot be built or is not exact.

The compiled engines need Inductor and a C++ compiler (about two minutes the first time in a fresh cache,
seconds after): slow tier. The rest runs without compiling anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_helpers import _variant

from ostinato import buckets
from ostinato.runtime.engine import cpu_step
from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.engine.op_count import OpCounter, PythonTorchCalls
from ostinato.runtime.kernels.torch_ops import loaded, register
from ostinato.runtime.model import fp8_matrix
from ostinato.runtime.model.rope import _rope_real, apply_rope

PROMPT = torch.randint(0, 1024, (100,), generator=torch.Generator().manual_seed(3))


@pytest.fixture(autouse=True)
def one_decode_context(monkeypatch):
    """Engines here decode with the plan context's step only: each context's step is a build of its own
    (about a minute in a fresh cache), and one is enough to check a build. The test that crosses from one
    context's step to the next sets its own."""
    monkeypatch.setattr(buckets, "DECODE_CONTEXT_SMALLEST", 1 << 30)
STEPS = 40  # positions 100..140: the tiny model's sliding window (16), CSA (4) and HCA (128) boundaries


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("shape", [(3, 64), (2, 4, 128), (1, 1, 2, 96)])
def test_the_compiled_steps_rope_equals_the_reference(shape, inverse):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g)
    angles = torch.randn(shape[0], 16, generator=g)
    want = apply_rope(x, angles.cos(), angles.sin(), inverse)  # no plan kernels active: the complex reference
    got = _rope_real(x, angles.cos(), angles.sin(), inverse)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert torch.equal(got[..., :-32], x[..., :-32])  # only the last R channels turn


@pytest.mark.parametrize("tokens", [1, 3])
def test_a_traced_step_reads_small_float32_matrices_as_row_dots(monkeypatch, tokens):
    g = torch.Generator().manual_seed(tokens)
    x, w = torch.randn(tokens, 256, generator=g), torch.randn(96, 256, generator=g)
    xg, wg = torch.randn(2, tokens, 256, generator=g), torch.randn(2 * 48, 256, generator=g)
    eager = fp8_matrix.linear(x, w), fp8_matrix.grouped_linear(xg, wg)
    assert torch.equal(eager[0], x @ w.T)  # outside a trace: the matmul itself
    monkeypatch.setattr(fp8_matrix, "inductor_generates", lambda: True)
    assert fp8_matrix._as_row_dots(x, w) == (tokens == 1)
    assert not fp8_matrix._as_row_dots(x[:1].bfloat16(), w.bfloat16())  # bf16 keeps torch's matmul rounding
    assert not fp8_matrix._as_row_dots(x[:1], torch.empty(1, fp8_matrix.ROW_DOT_MAX_ELEMENTS + 1))
    traced = fp8_matrix.linear(x, w), fp8_matrix.grouped_linear(xg, wg)  # [T, 96], [2, T, 48]
    for got, want in zip(traced, eager):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))
    monkeypatch.setattr(fp8_matrix, "inductor_generates", lambda: False)
    assert not fp8_matrix._as_row_dots(x[:1], w)


def test_the_compiled_graph_runs_on_one_thread_when_every_dense_matrix_is_row_dots():
    from dataclasses import dataclass

    @dataclass
    class Attn:
        wq: torch.Tensor
        norm: torch.Tensor

    @dataclass
    class Layer:
        attn: Attn
        groups: list

    small = [Layer(Attn(torch.empty(512, 256), torch.empty(256)), [torch.empty(64, 64)]) for _ in range(2)]
    assert cpu_step.graph_threads(small, 8) == 1
    big = small + [Layer(Attn(torch.empty(16, 16), torch.empty(16)),
                         [torch.empty(fp8_matrix.ROW_DOT_MAX_ELEMENTS // 1024 + 1, 1024)])]  # one matrix too big
    assert cpu_step.graph_threads(big, 8) == 8
    assert cpu_step.graph_threads([], 4) == 1
    before = torch.get_num_threads()
    with cpu_step.intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_an_expert_task_gets_a_thread_per_megabyte_it_may_read():
    from types import SimpleNamespace

    from ostinato.runtime.engine.executor import MIN_TASK_BYTES_PER_THREAD, PlacementExecutor

    def threads(cpu_threads, expert_bytes, routes):
        executor = SimpleNamespace(cpu_threads=cpu_threads, expert_bytes=expert_bytes)
        return PlacementExecutor.task_threads(executor, routes)

    assert threads(2, 52_224, 4) == 1  # the tiny presets' decode token: 200 KB, one thread
    assert threads(8, 13 << 20, 6) == 8  # V4-Flash's six MXFP4 experts: ~80 MB, every thread
    assert threads(8, MIN_TASK_BYTES_PER_THREAD, 3) == 3
    assert threads(8, 1, 0) == 1  # never none


def test_an_op_handle_does_not_keep_its_kernel_alive():
    class Kernel:
        pass

    k = Kernel()
    handle = register(k)
    assert loaded(torch.tensor(handle)) is k and loaded(handle) is k
    del k
    with pytest.raises(RuntimeError, match=f"handle {handle}: its kernel object was freed"):
        loaded(handle)


def _decode_all(engine, feed=None):
    """Greedy decode STEPS tokens after PROMPT -> (picks, logits [STEPS, V]); `feed`: tokens to feed instead
    of the picks (teacher forcing, so two engines see the same inputs)."""
    s = engine.new_session()
    tok = int(s.prefill(PROMPT)[-1].argmax())
    picks, logits = [], []
    for i in range(STEPS):
        out = s.decode(tok if feed is None else feed[i])
        logits.append(out.clone())
        picks.append(int(out.argmax()))
        tok = picks[-1]
    return picks, torch.stack(logits)


def _first_pick(engine) -> int:
    return int(engine.new_session().prefill(PROMPT)[-1].argmax())


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["mixed", "all-hot", "all-cold"])
def test_the_compiled_step_equals_the_eager_step(compiled, tiny_ckpt, placement):
    plan = _variant(compiled[0], placement, None)
    eager = load_engine(plan, tiny_ckpt, device="cpu", cpu_step="eager")
    fast = load_engine(plan, tiny_ckpt, device="cpu", cpu_step="compiled")
    assert fast.step_runner.cpu_step == "compiled", fast.step_runner.cpu_step_note
    assert eager.step_runner.graphs[1].compiled == {} and set(fast.step_runner.graphs[1].compiled) == {0}
    want, want_logits = _decode_all(eager)
    got, got_logits = _decode_all(fast)
    assert got == want  # greedy tokens over window and compressor boundaries
    feed = [_first_pick(eager)] + want[:-1]
    _, forced = _decode_all(fast, feed)  # the same inputs step by step: logits within 1e-5 of their scale
    scale = want_logits.abs().amax(dim=1)
    err = ((forced - want_logits).abs().amax(dim=1) / scale).max()
    assert err <= 1e-5, f"compiled vs eager: {err:.2e} of the logits' scale"


@pytest.mark.slow
def test_an_fp8_plans_compiled_step_reads_its_matrices_as_stored_and_equals_the_eager_step(tiny_ckpt, tmp_path,
                                                                                            kernel_dir):
    """Dense matrices held as the checkpoint's FP8 bytes: the compiled step calls the plan's FP8 kernel (one op
    a matrix, in the generated code) and, run in float32, equals the eager step to 1e-5 of the logits' scale."""
    from conftest import compile_tiny_plan

    compile_tiny_plan(tiny_ckpt, tmp_path, kernel_dir, context=1024, max_hot_per_layer=4, dense_format="fp8")
    plan = _variant(load_engine(tmp_path / "plan.yaml", tiny_ckpt, device="cpu", cpu_step="eager").plan, "mixed", None)
    eager = load_engine(plan, tiny_ckpt, device="cpu", dtype=torch.float32, cpu_step="eager")
    fast = load_engine(plan, tiny_ckpt, device="cpu", dtype=torch.float32, cpu_step="compiled")
    assert fast.step_runner.cpu_step == "compiled", fast.step_runner.cpu_step_note
    assert isinstance(fast.model.weights.layers[1].attn.wq_a, fp8_matrix.Fp8Matrix)
    want, want_logits = _decode_all(eager)
    got, _ = _decode_all(fast)
    assert got == want
    _, forced = _decode_all(fast, [_first_pick(eager)] + want[:-1])
    err = ((forced - want_logits).abs().amax(dim=1) / want_logits.abs().amax(dim=1)).max()
    assert err <= 1e-5, f"compiled vs eager, fp8 plan: {err:.2e} of the logits' scale"
    s = fast.new_session()
    s.prefill(PROMPT[:20])
    s.decode(5)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        s.decode(6)
    fp8_calls = sum(ev.count for ev in prof.key_averages() if "fp8_linear" in ev.key)
    assert fp8_calls >= len(plan.layers), fp8_calls  # the attention's FP8 matrices at least, every layer


@pytest.mark.slow
def test_a_bf16_fp8_plan_on_bf16_dot_products_stays_within_bf16_of_float32(tiny_ckpt, tmp_path, kernel_dir):
    """An avx512_bf16 plan run in bf16: the compiled step hands each FP8 product its bf16 x (exact in bf16) and
    the head its bf16 h, and the plan's library multiplies them with vdpbf16ps (ost_fp8_linear_bf16,
    ost_head_logits_bf16); teacher-forced, its logits stay within
    bf16's rounding of the float32 eager step's. bf16 drifts from float32 at this random model's near-ties (the
    eager bf16 step too: single positions 0.2-0.4 of the logits' scale, measured), so the bounds are on the typical
    position: the median error within LOW_PRECISION_CHECK of the scale, the same top-1 at 80% of positions or more
    (a wrong product, e.g. a misread weight, misses both at every position)."""
    import yaml
    from conftest import compile_tiny_plan

    from ostinato.isa import supports
    from ostinato.plans import plans_dir

    if not supports("avx512_bf16"):
        pytest.skip("avx512_bf16: this CPU has no AVX512_BF16 + AVX512_VBMI (the path is not built for it)")
    spec = yaml.safe_load((plans_dir() / "hardware" / "cpu-only.yaml").read_text())
    spec["host"]["isa"] = "avx512_bf16"
    (tmp_path / "hw.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    compile_tiny_plan(tiny_ckpt, tmp_path, kernel_dir, context=1024, max_hot_per_layer=4, dense_format="fp8",
                      hardware=str(tmp_path / "hw.yaml"))
    reference = load_engine(tmp_path / "plan.yaml", tiny_ckpt, device="cpu", dtype=torch.float32, cpu_step="eager")
    fast = load_engine(tmp_path / "plan.yaml", tiny_ckpt, device="cpu", dtype=torch.bfloat16, cpu_step="compiled")
    assert fast.step_runner.cpu_step == "compiled", fast.step_runner.cpu_step_note
    kernels = fast.model.dense_ops
    assert kernels.fp8_bf16_dot and kernels.head_bf16_dot
    calls = {name: [] for name in ("ost_fp8_linear_bf16", "ost_head_logits_bf16")}
    products = {name: getattr(kernels.lib, name) for name in calls}
    for name, product in products.items():
        setattr(kernels.lib, name, lambda *args, n=name, f=product: calls[n].append(1) or f(*args))
    try:
        want, want_logits = _decode_all(reference)
        _, got = _decode_all(fast, [_first_pick(reference)] + want[:-1])
    finally:
        for name, product in products.items():
            setattr(kernels.lib, name, product)
    # the attention's FP8 matrices at least, and the head (its h rounded to bf16: docs/model.md 3.7), every step
    assert len(calls["ost_fp8_linear_bf16"]) >= STEPS * len(fast.plan.layers)
    assert len(calls["ost_head_logits_bf16"]) >= STEPS
    err = (got.float() - want_logits).abs().amax(dim=1) / want_logits.abs().amax(dim=1)  # [STEPS]
    assert err.median() <= cpu_step.LOW_PRECISION_CHECK, f"bf16 fp8 plan vs float32: median {err.median():.2e}"
    agree = float((got.argmax(dim=1) == want_logits.argmax(dim=1)).float().mean())
    assert agree >= 0.8, f"bf16 fp8 plan vs float32: top-1 at {agree:.0%} of the positions"


@pytest.mark.slow
def test_the_compiled_steps_of_two_contexts_equal_the_eager_step(compiled, tiny_ckpt, monkeypatch):
    """Positions 100..140 cross from the 128-token context's compiled step to the plan context's."""
    monkeypatch.setattr(buckets, "DECODE_CONTEXT_SMALLEST", 128)
    monkeypatch.setattr(buckets, "DECODE_CONTEXT_FACTOR", 32)  # 4096 -> [128, 4096]
    plan = _variant(compiled[0], "mixed", None)
    eager = load_engine(plan, tiny_ckpt, device="cpu", cpu_step="eager")
    fast = load_engine(plan, tiny_ckpt, device="cpu", cpu_step="compiled")
    runner = fast.step_runner
    assert [c for c, _ in runner.decode_steps] == [128, plan.policy.context]
    # the smallest context's step is built at load, the plan context's when a position first needs it
    assert [set(graphs.compiled) for _, graphs in runner.decode_steps] == [{0}, set()]
    assert runner.unbuilt == {plan.policy.context}
    want, want_logits = _decode_all(eager)
    got, got_logits = _decode_all(fast)
    assert all(set(graphs.compiled) == {0} for _, graphs in runner.decode_steps) and not runner.unbuilt
    assert got == want
    err = ((got_logits - want_logits).abs().amax(dim=1) / want_logits.abs().amax(dim=1)).max()
    assert err <= 1e-5, f"compiled vs eager across two contexts: {err:.2e} of the logits' scale"


def _profiled_names(engine) -> set[str]:
    """The profiler's event names over one decode step of a fresh session."""
    from torch.profiler import ProfilerActivity, profile
    s = engine.new_session()
    s.prefill(PROMPT[:20])
    s.decode(5)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        s.decode(6)
    return {ev.key for ev in prof.key_averages()}


@pytest.mark.slow
@pytest.mark.parametrize("exposed", [True, False])
def test_a_compiled_step_is_called_past_dynamos_guards_where_torch_allows(compiled, tiny_ckpt, monkeypatch, exposed):
    """Where this torch exposes its compiled entries the step calls its generated graph without Dynamo's
    per-call guard check; where it does not, it keeps Dynamo's call. Either way exact."""
    import torch._dynamo.eval_frame as eval_frame
    if not exposed:
        def hidden(code):
            raise AttributeError("not in this torch")
        monkeypatch.setattr(eval_frame, "_debug_get_cache_entry_list", hidden)
    plan = _variant(compiled[0], "mixed", None)
    fast = load_engine(plan, tiny_ckpt, device="cpu", cpu_step="compiled")
    assert fast.step_runner.cpu_step == "compiled", fast.step_runner.cpu_step_note
    names = _profiled_names(fast)
    assert any("CompiledFxGraph" in n for n in names)  # the generated graph ran
    assert ("TorchDynamo Cache Lookup" in names) == (not exposed)
    eager = load_engine(plan, tiny_ckpt, device="cpu", cpu_step="eager")
    assert _decode_all(fast)[0][:10] == _decode_all(eager)[0][:10]


@pytest.mark.slow
def test_a_compiled_step_issues_a_handful_of_python_torch_calls(compiled, tiny_ckpt):
    plan = _variant(compiled[0], "mixed", None)
    counts = {}
    for mode in ("eager", "compiled"):
        e = load_engine(plan, tiny_ckpt, device="cpu", cpu_step=mode)
        s = e.new_session()
        s.prefill(PROMPT)
        s.decode(5)
        with PythonTorchCalls() as calls:
            s.decode(6)
        counts[mode] = calls.calls
    layers = len(plan.layers)
    assert counts["eager"] >= 100 * layers  # ~137 a layer, ~195 aten ops
    assert counts["compiled"] <= 2 * layers + 16, counts  # the experts' op per layer, the runner's bookkeeping


@pytest.mark.slow
def test_the_counter_agrees_with_the_dispatch_mode_on_an_eager_step(compiled, tiny_ckpt):
    """Both counters see the eager step; composite calls expand, so the aten count is the larger."""
    e = load_engine(_variant(compiled[0], "mixed", None), tiny_ckpt, device="cpu", cpu_step="eager")
    s = e.new_session()
    s.prefill(PROMPT)
    s.decode(5)
    with PythonTorchCalls() as calls, OpCounter() as ops:
        s.decode(6)
    assert 0.5 * ops.ops <= calls.calls <= ops.ops


def _fake_compile(outcome, off_by=1e-3):
    """torch.compile's stand-in: the function itself, or one that fails / moves the logits by `off_by` of
    their scale."""
    def compile(fn, **kw):
        def run(i):
            if outcome == "fail":
                raise RuntimeError("no C++ compiler here")
            fn(i)
            step = fn.__self__
            step.all_logits.add_(off_by * step.all_logits.abs().max())
        return run
    return compile


@pytest.mark.slow  # the compiled plan's kernels (no Inductor)
@pytest.mark.parametrize("off_by,kept", [(1e-2, True), (1e-1, False)])
def test_in_bf16_the_check_allows_rounding_not_a_wrong_build(compiled, tiny_ckpt, monkeypatch, off_by, kept):
    monkeypatch.setattr(cpu_step.torch, "compile", _fake_compile("inexact", off_by))
    e = load_engine(_variant(compiled[0], "mixed", None), tiny_ckpt, device="cpu", dtype=torch.bfloat16,
                    cpu_step="compiled")
    assert (e.step_runner.cpu_step == "compiled") == kept, e.step_runner.cpu_step_note
    if not kept:
        assert "(allowed 0.05 in torch.bfloat16)" in e.step_runner.cpu_step_note


@pytest.mark.slow  # the compiled plan's kernels (no Inductor)
@pytest.mark.parametrize("outcome,reason", [("fail", "RuntimeError: no C++ compiler here"),
                                            ("inexact", "differs from the eager one by 1.00e-03")])
def test_a_step_that_cannot_be_compiled_exactly_runs_eagerly_and_says_why(compiled, tiny_ckpt, monkeypatch, capfd,
                                                                       outcome, reason):
    monkeypatch.setattr(cpu_step.torch, "compile", _fake_compile(outcome))
    plan = _variant(compiled[0], "mixed", None)
    e = load_engine(plan, tiny_ckpt, device="cpu", cpu_step="compiled", progress=True)
    runner = e.step_runner
    assert runner.cpu_step == "eager" and reason in runner.cpu_step_note
    assert runner.graphs[1].compiled == {}
    assert f"decoding with the eager CPU step: {runner.cpu_step_note}" in capfd.readouterr().err
    reference = load_engine(plan, tiny_ckpt, device="cpu", cpu_step="eager")
    assert _decode_all(e)[0][:8] == _decode_all(reference)[0][:8]


@pytest.mark.slow
def test_the_plan_the_environment_and_the_caller_choose_the_step(compiled, tiny_ckpt, monkeypatch):
    monkeypatch.setattr(cpu_step.torch, "compile", _fake_compile("fail"))  # nothing is really compiled here
    plan = _variant(compiled[0], "mixed", None)
    monkeypatch.delenv("OSTINATO_CPU_STEP", raising=False)
    eager_plan = plan.replace(policy=plan.policy.replace(cpu_step="eager"))
    assert load_engine(eager_plan, tiny_ckpt, device="cpu").step_runner.cpu_step_note == \
        "the plan's policy.cpu_step is eager"
    monkeypatch.setenv("OSTINATO_CPU_STEP", "compiled")
    tried = load_engine(eager_plan, tiny_ckpt, device="cpu").step_runner  # the environment over the plan
    assert "no C++ compiler here" in tried.cpu_step_note
    asked = load_engine(eager_plan, tiny_ckpt, device="cpu", cpu_step="eager").step_runner  # the caller over both
    assert asked.cpu_step_note == "cpu_step='eager' was asked for"
    monkeypatch.setenv("OSTINATO_CPU_STEP", "eager")
    assert load_engine(plan, tiny_ckpt, device="cpu").step_runner.cpu_step_note == "OSTINATO_CPU_STEP is eager"
    assert load_engine(plan, tiny_ckpt, device="cpu", decode_graphs=False).step_runner.cpu_step_note == \
        "the step runs without graphs (--decode eager)"
    monkeypatch.setenv("OSTINATO_CPU_STEP", "fast")
    with pytest.raises(Exception, match="OSTINATO_CPU_STEP is 'fast': one of compiled, eager"):
        load_engine(plan, tiny_ckpt, device="cpu")


@pytest.mark.slow
def test_the_dense_path_and_the_kernels_share_one_thread_pool(compiled, tiny_ckpt):
    e = load_engine(_variant(compiled[0], "mixed", None), tiny_ckpt, device="cpu", cpu_step="eager")
    assert torch.get_num_threads() == e.cpu_threads.threads  # the plan's threads, clamped to this machine
    assert e.model.dense_ops.threads == e.cpu_threads.threads  # the head's, whatever a compiled step sets torch's to
    s = e.new_session()
    s.prefill(PROMPT[:20])
    s.decode(3)  # every kernel library loaded and run
    if not Path("/proc/self/maps").is_file():
        pytest.skip("no /proc/self/maps on this system")
    runtimes = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                if any(name in line for name in ("libgomp", "libiomp", "libomp"))}
    assert len(runtimes) == 1, f"more than one OpenMP runtime (each with its own threads): {sorted(runtimes)}"


def test_the_compile_refuses_gpu_segments():
    class Seg:
        device = torch.device("cuda", 0)

    class Step:
        segments = [Seg()]

    with pytest.raises(cpu_step.CompileFailed, match="GPU segments are captured"):
        cpu_step.compile_segment(Step(), 0)


def test_inductor_cache_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert cpu_step.inductor_cache() == tmp_path / "mine"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setenv("OSTINATO_CACHE_DIR", str(tmp_path / "ost"))
    assert cpu_step.inductor_cache() == tmp_path / "ost" / "inductor"
    assert (tmp_path / "ost" / "inductor").is_dir()

