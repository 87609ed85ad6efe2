"""Shared fixtures, each built once per test session: the tiny checkpoints, one kernel build folder,
the engine tests' compiled plan and plain reference model, the static-step tests' models.

Without a GPU, Triton kernels run in its interpreter. Triton reads TRITON_INTERPRET when it is
first imported (transformers imports it too), so it is set here, before any test imports anything;
so is OSTINATO_CPU_STEP=eager (see below).

Tiers (markers registered in pyproject.toml): `pytest -m "not slow"` is the fast tier (no compiled
kernel, no Triton interpreter, no transformers, nothing that takes more than a second or two); the full
suite runs everything. `gpu` tests are skipped where torch.cuda.is_available() is false.

Session-scoped objects are shared by every test that asks for them, so no test may change them: plans
are frozen records (tests change copies with .replace), models get an observer only inside try/finally.
"""

from __future__ import annotations

import os

# OpenMP threads that wait for work sleep instead of spinning: the machines tests run on are shared (CI runners,
# a 2-core box with several engineers' runs), and a spinning thread holds a core its sibling needs, so each
# parallel op waits for the scheduler. Measured on a 2-core machine at load 2-5, the same five test files: 25-37 s
# with PASSIVE against 141-162 s spinning (22 against 96-130 s of CPU). It changes no result, only how an idle
# thread waits; libgomp reads it once, when torch loads it, hence before the import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Engines run the eager CPU decode step unless a test asks for the compiled one (tests/test_cpu_step.py):
# compiling it takes seconds to minutes per engine, and hundreds of tests load one (their subprocesses too).
os.environ.setdefault("OSTINATO_CPU_STEP", "eager")

import pytest  # noqa: E402
import triton_interpreter  # noqa: E402

from ostinato.compiler.codegen.dense_ops import CODE_PATHS  # noqa: E402
from ostinato.isa import detect_isa, supports  # noqa: E402
from ostinato.tiny import write_tiny_checkpoint  # noqa: E402

# Triton's interpreter without the set-up it repeats inside a kernel (tests/triton_interpreter.py): the same results
triton_interpreter.install()


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need CUDA: skipped, with the reason, where there is none."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu: needs CUDA (torch.cuda.is_available() is false here)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def kernel_dir(tmp_path_factory):
    """The run's one kernel build folder. Builds are content-addressed (<root>/<content hash>/,
    compiler/codegen/render.py), so each distinct kernel compiles once per run, whichever test asks
    first. Tests that check building into a given folder, or the build cache itself, use their own."""
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(scope="module", params=CODE_PATHS)
def host_isa(request):
    """Each code path of the plan's dense-op host library (amx builds avx512_bf16's) that this CPU can run;
    the others are skipped with the reason, never run on a path the CPU lacks."""
    if not supports(request.param):
        pytest.skip(f"{request.param}: this CPU runs at most {detect_isa()} code")
    return request.param


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """The default tiny preset (seed 0), written once."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", "tiny", seed=0, progress=False)


@pytest.fixture(scope="session")
def small_ckpt(tmp_path_factory):
    """The larger preset with planted popularity, written once."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "small", "small", seed=1, popularity=1.0,
                                 progress=False)


def compile_tiny_plan(ckpt, work, kernel_dir=None, hardware="cpu-only", **options):
    """Compile a plan (cpu-only unless `hardware` names another spec) with kernels for `ckpt` into work/plan.yaml;
    kernels go to `kernel_dir` (pass the session's `kernel_dir` fixture), else to work/build/kernels beside it."""
    from ostinato.compiler.compile import CompileOptions, compile_plan

    kernel_dir = kernel_dir if kernel_dir is not None else work / "build" / "kernels"
    plan = compile_plan(CompileOptions(ckpt, work / "plan.yaml", hardware, kernel_dir=kernel_dir, **options)).plan
    plan.write(work / "plan.yaml")
    return plan


@pytest.fixture(scope="session")
def compiled(tiny_ckpt, tmp_path_factory, kernel_dir):
    """(plan, work): a mixed plan for the tiny model on cpu-only, written to work/plan.yaml, its kernels
    in the session's kernel folder. Shared by the engine tests: they load engines from it and change only
    copies of the plan (Plan.replace); files they write go beside it under names of their own."""
    work = tmp_path_factory.mktemp("engine")
    return compile_tiny_plan(tiny_ckpt, work, kernel_dir, context=4096, max_hot_per_layer=6), work


@pytest.fixture(scope="session")
def reference(tiny_ckpt):
    """The plain tiny model (float32), the engine tests' reference: tests open sessions of their own and
    set a routing observer only inside try/finally."""
    from ostinato.runtime import load_model

    return load_model(tiny_ckpt)


@pytest.fixture(scope="session", params=["tiny", pytest.param("small", marks=pytest.mark.slow)])
def model(request, tiny_ckpt, small_ckpt):
    """The plain model of each preset in float32, `preset` set: the static-step tests' reference (they open
    sessions of their own; observers only inside try/finally). Modules with a `model` fixture of their own
    (test_model_session, test_model_executor) use theirs. The small preset's cases are slow (its
    dimensions make each step several times the tiny one's)."""
    from ostinato.runtime import load_model

    m = load_model(tiny_ckpt if request.param == "tiny" else small_ckpt, dtype=torch.float32)
    m.preset = request.param
    return m


def assert_close_to_scale(ours: torch.Tensor, ref: torch.Tensor, tol: float, what: str) -> None:
    """max |ours - ref| <= tol x max |ref| (logits: relative to the logit scale)."""
    scale = ref.abs().max().item()
    diff = (ours - ref).abs().max().item()
    assert diff <= tol * scale, f"{what}: max |diff| {diff:.3g} > {tol} x logit scale {scale:.3g}"


def teacher_forced_picks(reference, other, prompt, steps: int) -> tuple[list[int], list[int], list[float]]:
    """Prefill `prompt` into both sessions, then decode `steps` tokens, both fed the reference's greedy
    tokens -> per step (the reference's pick, the other's pick, the reference's top-2 margin over its
    logit scale): where the margin is tiny a lower-precision run may pick the other token."""
    lr, lo = reference.prefill(prompt)[-1], other.prefill(prompt)[-1]
    assert lo.dtype == torch.float32
    tokens, picks, margins = [], [], []
    for _ in range(steps):
        top = lr.topk(2).values
        margins.append(((top[0] - top[1]) / lr.abs().max()).item())
        tokens.append(int(lr.argmax()))
        picks.append(int(lo.argmax()))
        lr, lo = reference.decode(tokens[-1]), other.decode(tokens[-1])
    return tokens, picks, margins
