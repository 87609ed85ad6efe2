"""tests/triton_interpreter.py: under Triton's interpreter a launch patches the language once, however many program
instances call a @triton.jit helper, and the kernel computes what it computes unpatched."""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl
import triton_interpreter
from triton.runtime import interpreter

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")


@triton.jit
def _twice_plus_one(x):
    return x * 2 + 1


@triton.jit
def _helper_per_block_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    tl.store(y_ptr + offs, _twice_plus_one(tl.load(x_ptr + offs, mask=mask)), mask=mask)


def _builtin_patches(monkeypatch, blocks: int) -> tuple[int, torch.Tensor]:
    """(the interpreter's _patch_builtin calls, y) of one launch over `blocks` program instances of 8 elements."""
    calls, patch_builtin = [], interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin", lambda *a: calls.append(1) or patch_builtin(*a))
    x = torch.randn(8 * blocks - 3, generator=torch.Generator().manual_seed(blocks))
    y = torch.full_like(x, float("nan"))
    _helper_per_block_kernel[(blocks,)](x, y, x.numel(), BLOCK=8)
    monkeypatch.setattr(interpreter, "_patch_builtin", patch_builtin)
    assert torch.equal(y, x * 2 + 1)  # exact: one rounding each, as torch's
    return len(calls), y


def test_a_launch_patches_the_language_once_whatever_its_program_count(monkeypatch):
    assert triton_interpreter.install()  # tests/conftest.py installed it; a second install changes nothing
    one, _ = _builtin_patches(monkeypatch, 1)
    many, _ = _builtin_patches(monkeypatch, 6)
    assert one > 0 and many == one  # unwrapped: one patch for the launch and one per helper call (7x here)


def test_a_launch_leaves_the_language_as_it_found_it(monkeypatch):
    before = {name: getattr(tl, name) for name in ("load", "store", "arange", "program_id")}
    _builtin_patches(monkeypatch, 3)
    assert {name: getattr(tl, name) for name in before} == before
