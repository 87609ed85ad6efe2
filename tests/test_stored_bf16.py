"""Products with a bf16 matrix held as stored (runtime/model/stored_bf16.py: the LM head, the compressors'
projections): every path against the float64 product of the same widened values, on fresh random inputs."""

from __future__ import annotations

import pytest
import torch

from ostinato.compiler.codegen.dense_ops import build_cpu_dense_ops
from ostinato.runtime.engine.op_count import OpCounter
from ostinato.runtime.kernels.dense_ops import DenseOpsKernel
from ostinato.runtime.model import bf16_widening
from ostinato.runtime.model.fused import using
from ostinato.runtime.model.stored_bf16 import stored_product

REL = 1e-5  # float32 sums of the same values in another order, against the product's scale


def _inputs(T: int, N: int, K: int, x_dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(T, K, generator=g) * 3).to(x_dtype)
    w = (torch.randn(N, K, generator=g) * torch.logspace(-3, 1, N)[:, None]).bfloat16()  # rows far apart in size
    return x, w


def _check(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    want = x.double() @ w.double().T
    assert got.dtype == torch.float32 and got.shape == want.shape
    err = float((got.double() - want).abs().max() / want.abs().max())
    assert err <= REL, f"{err:.2e} of the product's scale"


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 3, 20])
def test_without_kernels_the_rows_are_widened_a_slab_at_a_time(T, x_dtype, monkeypatch):
    """No plan's kernels: float32 slabs of rows (a slab smaller than the matrix here, so several are used)."""
    monkeypatch.setattr(bf16_widening, "SLAB_ELEMENTS", 64 * 264)
    x, w = _inputs(T, 300, 264, x_dtype, seed=T)
    _check(stored_product(x, w), x, w)


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_without_kernels_a_matrix_within_one_slab_is_widened_whole(x_dtype, monkeypatch):
    monkeypatch.setattr(bf16_widening, "SLAB_ELEMENTS", 300 * 264)
    monkeypatch.setattr(bf16_widening, "slab_product", None)  # not called
    x, w = _inputs(20, 300, 264, x_dtype, seed=3)
    with OpCounter() as ops:
        got = stored_product(x, w)
    assert ops.ops <= 4  # x widened (bf16 only), W widened, its transpose, the product
    _check(got, x, w)


def test_a_float32_matrix_is_a_plain_product():
    x, w = _inputs(2, 40, 64, torch.float32, seed=4)
    _check(stored_product(x, w.float()), x, w)


@pytest.mark.slow  # compiles the host library (C++)
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 4])
def test_with_a_plans_kernels_a_few_tokens_are_one_head_kernel_op(kernel_dir, host_isa, T, x_dtype):
    kernels = DenseOpsKernel(build_cpu_dense_ops(kernel_dir, isa=host_isa).path, None)
    x, w = _inputs(T, 520, 264, x_dtype, seed=10 + T)
    with using(kernels), OpCounter() as ops:
        got = stored_product(x, w)
    assert ops.ops == 1  # ostinato::head_logits, nothing else
    _check(got, x, w)


def test_in_a_compiled_step_a_small_matrix_is_read_as_row_dots():
    """While torch.compile traces (here with its eager backend: the branch and its arithmetic, no C++ build), one
    token's product with a small matrix is row dots; the head keeps its kernel path (row_dots=False)."""
    x, w = _inputs(1, 96, 128, torch.float32, seed=7)
    traced = []

    def backend(gm, example_inputs):
        traced.append({getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes
                       if n.op in ("call_function", "call_method")})
        return gm

    got = torch.compile(lambda x, w: stored_product(x, w), backend=backend, fullgraph=True)(x, w)
    _check(got, x, w)
    assert "sum" in traced[0] and not traced[0] & {"matmul", "mm", "head_logits"}, traced[0]
