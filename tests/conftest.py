"""Shared fixtures: tiny checkpoints are written once per test session.

Without a GPU, Triton kernels run in its interpreter. Triton reads TRITON_INTERPRET when it is
first imported (transformers imports it too), so it is set here, before any test imports anything.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from ostinato.tiny import write_tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """The default tiny preset (seed 0), written once."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", "tiny", seed=0, progress=False)


@pytest.fixture(scope="session")
def small_ckpt(tmp_path_factory):
    """The larger preset with planted popularity, written once."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "small", "small", seed=1, popularity=1.0,
                                 progress=False)


def compile_tiny_plan(ckpt, work, **options):
    """Compile a cpu-only plan with kernels for `ckpt` into work/plan.yaml (kernels: work/build/kernels)."""
    from ostinato.compiler.compile import CompileOptions, compile_plan

    plan = compile_plan(CompileOptions(ckpt, work / "plan.yaml", "cpu-only", kernel_dir=work / "build" / "kernels",
                                       **options)).plan
    plan.write(work / "plan.yaml")
    return plan


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
