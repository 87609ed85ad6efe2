"""The kernels of the FP8 decode step as a GPU runs them, counted on the CPU (engine/op_count.KernelCounter):
the same Python issues the same aten ops and Triton launches; here the FP8 products take the GPU's path
(fp8_matrix.on_gpu), their kernels stubbed (V4-Flash's shapes, the tiny model's decode step) or run in
Triton's interpreter (the tiny step against the CPU path's logits).

A decode token's FP8 product is one kernel that stores x's dtype (bf16) itself, or two when the tiling
splits K (the float32 partials, then one kernel that adds them and rounds); wo_a's 8 groups are one launch.
Before: each product added a cast (and a torch sum when split), and wo_a ran as 8 launches + 8 sums +
8 casts + a stack: 44 kernels for a V4-Flash CSA layer's FP8 products, 13 now.
Legend: T tokens, K inputs, N rows, G groups.
"""

from __future__ import annotations

import pytest
import torch

from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.tensor_specs import layer_specs
from ostinato.runtime.engine.op_count import KernelCounter
from ostinato.runtime.kernels import fp8_triton
from ostinato.runtime.kernels.scale_layout import word_aligned
from ostinato.runtime.model import fp8_matrix
from ostinato.runtime.model.fp8_matrix import Fp8Matrix, grouped_linear, linear
from ostinato.tiny.presets import official_flash_config

FP8_FILES = ("kernels/fp8_triton.py", "model/fp8_matrix.py")


class _Stub:
    """A Triton kernel that launches nothing: it zeroes its output argument (the products are only counted)."""

    OUTPUT = {"fp8_linear_kernel": 3, "fp8_split_sum_kernel": 1}  # the argument each kernel writes

    def __init__(self, name: str):
        self.__name__ = name

    def __getitem__(self, grid):
        return lambda *args, **meta: args[self.OUTPUT[self.__name__]].zero_()


@pytest.fixture
def gpu_path(monkeypatch):
    """FP8 products take the GPU's path on the CPU."""
    monkeypatch.setattr(fp8_matrix, "on_gpu", lambda w: True)


def stub_kernels(monkeypatch) -> None:
    for name in _Stub.OUTPUT:
        if hasattr(fp8_triton, name):
            monkeypatch.setattr(fp8_triton, name, _Stub(name))


def _matrix(n: int, k: int) -> Fp8Matrix:
    q = torch.empty(n, k, dtype=torch.uint8).view(torch.float8_e4m3fn)  # never read: the kernels are stubs
    return Fp8Matrix(q, word_aligned(torch.full((-(-n // 128), -(-k // 128)), 127, dtype=torch.uint8)))


def flash_fp8_products(layer: int) -> dict[str, tuple[str, int, int]]:
    """{product: (how the model calls it, N, K)} of V4-Flash layer `layer`'s FP8 matrices, as the loader holds
    them (shared w1 and w3 as one w13, model/loading.py) and attention calls wo_a (grouped_linear)."""
    cfg = ModelConfig.from_dict(official_flash_config())
    shapes = {spec.name.split(".", 2)[2].removesuffix(".weight"): spec.shape
              for spec in layer_specs(cfg, layer, with_experts=False) if spec.dtype == "F8_E4M3"}
    (n1, k), (n3, _) = shapes.pop("ffn.shared_experts.w1"), shapes.pop("ffn.shared_experts.w3")
    shapes["ffn.shared_experts.w13"] = (n1 + n3, k)
    return {name: ("grouped" if name == "attn.wo_a" else "linear", n, k) for name, (n, k) in shapes.items()}


def test_a_flash_csa_layers_fp8_products_launch_13_kernels_at_a_decode_token(gpu_path, monkeypatch):
    """Layer 2 of V4-Flash (CSA: with the indexer's wq_b), one bf16 token, at an H200's tiling."""
    stub_kernels(monkeypatch)
    cfg = ModelConfig.from_dict(official_flash_config())
    products = flash_fp8_products(2)
    assert cfg.attention_kind(2) == "csa" and len(products) == 8
    G, counts = cfg.o_groups, {}
    for name, (call, n, k) in products.items():
        w = _matrix(n, k)
        x = torch.zeros(1, G * k if call == "grouped" else k, dtype=torch.bfloat16)  # [T, K]
        with KernelCounter() as count:
            if call == "grouped":  # attention's heads [T, G*K] as attend_and_project hands them over: [G, T, K]
                y = grouped_linear(x.reshape(1, G, k).transpose(0, 1), w)
                y = y.transpose(0, 1).reshape(1, -1)  # attention's next line: a view now, no copy
            else:
                y = linear(x, w)
        assert y.dtype == torch.bfloat16 and y.shape == (1, n), name
        counts[name] = count.kernels
        assert count.from_files(*FP8_FILES) == count.kernels, (name, count.by_source)  # nothing else issued one
        assert not [kernel for kernel in count.by_kernel if kernel.startswith("aten.")], (name, count.by_kernel)
    # split K (tiling: 16-row tiles and still under 2 programs per SM): the product and the split sum
    assert counts == {"attn.wq_a": 2, "attn.wq_b": 1, "attn.wkv": 2, "attn.indexer.wq_b": 1, "attn.wo_a": 1,
                      "attn.wo_b": 2, "ffn.shared_experts.w13": 2, "ffn.shared_experts.w2": 2}, counts
    assert sum(counts.values()) == 13  # 44 before: a cast after each, a sum after each split, wo_a 8 x 3 + 1


def fp8_product_kernels(count: KernelCounter) -> int:
    """Kernels a step's FP8 products issued: the FP8 kernels' launcher's, and grouped_linear's own (wo_a's;
    fp8_matrix.linear's own are the plain float32 matrices' products, not counted)."""
    return sum(n for source, n in count.by_source.items()
               if source.startswith("kernels/fp8_triton.py:") or source == "model/fp8_matrix.py:grouped_linear")


def _fp8_launches_of(layers, groups: int) -> tuple[int, int]:
    """(products, split products) of these layers' FP8 matrices at a decode token, by fp8_triton's tiling."""
    products = splits = 0
    for lw in layers:
        mats = [lw.attn.wq_a, lw.attn.wq_b, lw.attn.wkv, lw.attn.wo_b, lw.moe.shared_w13, lw.moe.shared_w2]
        mats += [lw.attn.indexer.wq_b] if lw.attn.indexer is not None else []
        assert all(isinstance(m, Fp8Matrix) for m in [*mats, lw.attn.wo_a])
        tiles = [fp8_triton.tiling(1, m.shape[0], m.shape[1], fp8_triton.CPU_SMS) for m in mats]
        tiles.append(fp8_triton.tiling(1, lw.attn.wo_a.shape[0], lw.attn.wo_a.shape[1], fp8_triton.CPU_SMS, groups))
        products += len(tiles)
        splits += sum(t.SPLIT_K > 1 for t in tiles)
    return products, splits


def _decode_step(model, token: int, counted: bool = False):
    """One token through the fixed-shape step the engine captures (decode_graphs.SegmentGraphs.run: eagerly,
    as on the CPU) from an empty context -> (logits [V] float32, KernelCounter or None)."""
    from ostinato.runtime.engine.decode_graphs import SegmentGraphs
    from ostinato.runtime.model.static_decode import StaticStep

    step = StaticStep(model, 64)
    step.set_tokens([token])
    if not counted:
        return SegmentGraphs(step).run().clone(), None
    with KernelCounter() as count:
        logits = SegmentGraphs(step).run().clone()
    return logits, count


def test_the_fp8_decode_step_launches_one_kernel_a_product(tiny_ckpt, gpu_path, monkeypatch):
    """The tiny model (bf16, FP8 matrices as stored) decodes a token, its FP8 products on the GPU's path (the
    kernels stubbed): per layer, one Triton launch per product plus one per split product, wo_a's groups in
    one, and no torch op around them (a cast, a sum, a stack, a copy of x) at any call site of the step."""
    from ostinato.runtime import load_model

    stub_kernels(monkeypatch)
    model = load_model(tiny_ckpt, dtype=torch.bfloat16, fp8=True)
    layers = model.weights.layers
    _, count = _decode_step(model, 5, counted=True)
    products, splits = _fp8_launches_of(layers, model.config.o_groups)
    assert splits > 0  # the tiny shapes split K too at an H200's tiling: both kinds of launch are counted
    launches = {k: n for k, n in count.by_kernel.items() if k.startswith("triton.fp8_")}
    assert launches == {"triton.fp8_linear_kernel": products, "triton.fp8_split_sum_kernel": splits}
    assert fp8_product_kernels(count) == products + splits, count.by_source  # the launches alone
    assert (products, splits, len(layers)) == (30, 20, 4)  # tiny: 12.5 kernels a layer (24 before)


@pytest.mark.slow  # Triton's interpreter runs the FP8 kernels of a whole tiny step (~1 min)
def test_the_fp8_decode_step_on_the_gpu_path_computes_what_the_cpu_path_does(tiny_ckpt, monkeypatch):
    """The same step in float32, its FP8 products run by the GPU's kernels in the interpreter (tiled for a
    16-SM GPU, which splits K at these shapes, in an eighth of an H200's interpreted programs) and by the CPU
    path: the same logits up to float32 summation order, with the kernels' launches as counted above."""
    from conftest import assert_close_to_scale

    from ostinato.runtime import load_model

    model = load_model(tiny_ckpt, dtype=torch.float32, fp8=True)
    want, _ = _decode_step(model, 5)
    monkeypatch.setattr(fp8_matrix, "on_gpu", lambda w: True)
    monkeypatch.setattr(fp8_triton, "CPU_SMS", 16)
    got, count = _decode_step(model, 5, counted=True)
    assert_close_to_scale(got, want, 1e-5, "the FP8 step on the GPU's path")
    products, splits = _fp8_launches_of(model.weights.layers, model.config.o_groups)
    assert splits > 0
    assert fp8_product_kernels(count) == products + splits, count.by_source
