"""Dense FP8 matmul from the checkpoint's bytes (runtime/kernels/fp8_triton.py), in Triton's interpreter
(conftest sets TRITON_INTERPRET=1 without a GPU), against the float32 reference on the dequantized
weights; its tiling, which must fill an H200 for a decode token through each of V4-Flash's dense FP8
matrices; the grouped product (wo_a: every group in one launch, x read through the attention's strided
view) and the launches each product makes (one, or two with K split: no torch op after the kernel); and
the FP8 matrix type's CPU twin, which must compute what a bf16 plan computes.
Legend: T tokens, N output rows, K inputs, KB = K / 128, G groups, M rows a group."""

from __future__ import annotations

import pytest
import torch

from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.formats import dequantize_fp8, quantize_fp8
from ostinato.checkpoint.tensor_specs import layer_specs
from ostinato.runtime.kernels import fp8_triton
from ostinato.runtime.kernels.fp8_triton import (
    TILES,
    Tiling,
    fp8_grouped_linear,
    fp8_grouped_linear_tiled,
    fp8_linear,
    fp8_linear_tiled,
    sm_count,
    tiling,
)
from ostinato.runtime.kernels.scale_layout import is_word_aligned, word_aligned
from ostinato.runtime.model import fp8_matrix
from ostinato.runtime.model.fp8_matrix import Fp8Matrix, grouped_linear, linear
from ostinato.tiny.presets import official_flash_config

H200_SMS = 132


def _random_fp8(n: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(n, k, generator=gen) * torch.logspace(-3, 1, n)[:, None]  # rows of very different sizes
    return quantize_fp8(w)


@pytest.mark.parametrize("T", [1, 5, 33])
@pytest.mark.slow  # Triton's interpreter
def test_float32_activations_match_the_reference(T):
    g = torch.Generator().manual_seed(T)
    q, s = _random_fp8(256, 384, g)
    x = torch.randn(T, 384, generator=g)
    ref = x @ dequantize_fp8(q, s).T
    got = fp8_linear(x, q, word_aligned(s.view(torch.uint8)))
    assert got.dtype == torch.float32 and got.shape == (T, 256)
    assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.slow  # Triton's interpreter
def test_every_code_and_scale_decodes_exactly():
    """Row r of W holds all 254 finite e4m3 codes (plus two zeros) at block scale byte r x 2; x = identity."""
    finite = [c for c in range(256) if c & 0x7F != 0x7F]  # 0x7F / 0xFF are NaN
    codes = torch.tensor(finite + [0, 0], dtype=torch.uint8).repeat(128, 1)  # [128, 256]
    q = codes.view(torch.float8_e4m3fn)
    scale = torch.tensor([[60, 190]], dtype=torch.uint8)  # 2^-67 and 2^63: K blocks at both extremes
    got = fp8_linear(torch.eye(256), q, word_aligned(scale))  # [256 tokens, 128 rows]: token j reads column j
    assert torch.equal(got.T, dequantize_fp8(q, scale.view(torch.float8_e8m0fnu)))


@pytest.mark.slow  # Triton's interpreter
def test_float16_activations_use_a_half_precision_dot():
    g = torch.Generator().manual_seed(7)
    q, s = _random_fp8(128, 256, g)
    x = torch.randn(3, 256, generator=g).half()
    ref = x.float() @ dequantize_fp8(q, s).T
    got = fp8_linear(x, q, word_aligned(s.view(torch.uint8)))
    assert got.dtype == torch.float16 and (got.float() - ref).abs().max() <= 2e-3 * ref.abs().max()


def test_shapes_are_checked():
    q, s = _random_fp8(128, 256, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="do not match"):
        fp8_linear(torch.zeros(2, 128), q, word_aligned(s.view(torch.uint8)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_twin_equals_the_dequantized_matrix(dtype):
    """Without a plan's kernels (tests/test_fp8_host_kernel.py has them): W dequantized a slab of rows at a
    time, the float32 product rounded once to x's dtype."""
    g = torch.Generator().manual_seed(1)
    q, s = _random_fp8(512, 256, g)
    w = Fp8Matrix(q, s.view(torch.uint8))
    dense = dequantize_fp8(q, s)
    rel = 2e-6 if dtype == torch.float32 else 2 ** -8
    x = torch.randn(4, 256, generator=g).to(dtype)
    want = x.double() @ dense.double().T
    assert linear(x, w).dtype == dtype
    assert (linear(x, w).double() - want).abs().max() <= rel * want.abs().max()
    grouped = torch.randn(4, 3, 256, generator=g).to(dtype)  # 4 groups of 128 rows
    want = torch.bmm(grouped.double(), dense.double().view(4, 128, 256).transpose(1, 2))
    assert (grouped_linear(grouped, w).double() - want).abs().max() <= rel * want.abs().max()
    halves = Fp8Matrix.cat([w.rows(0, 256), w.rows(256, 512)])
    assert torch.equal(halves.q.view(torch.uint8), q.view(torch.uint8)) and torch.equal(halves.scale, w.scale)
    with pytest.raises(ValueError, match="scale block"):
        w.rows(0, 100)


@pytest.mark.slow  # compiled plans (C++ kernels)
def test_an_fp8_plan_computes_what_a_bf16_plan_computes(tiny_ckpt, tmp_path, kernel_dir):
    """Same checkpoint, same placement, dense weights held as stored FP8 or dequantized to bf16: on the CPU
    the same logits to bf16 rounding (prefill and decode steps; the FP8 kernel sums the same exact products
    in another order) and the same greedy tokens, with half the bytes of those matrices."""
    from conftest import compile_tiny_plan

    from ostinato.runtime.engine.loader import load_engine

    logits, picks, dense = {}, {}, {}
    ids = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(3))
    for fmt in ("fp8", "bf16"):
        compile_tiny_plan(tiny_ckpt, tmp_path / fmt, kernel_dir, context=1024, max_hot_per_layer=4, dense_format=fmt)
        engine = load_engine(tmp_path / fmt / "plan.yaml", device="cpu")
        session = engine.new_session()
        steps = [session.prefill(ids[:30])[-1]] + [session.decode(int(t)) for t in ids[30:]]
        logits[fmt] = torch.stack(steps).float()
        session = engine.new_session()
        tok, picks[fmt] = int(session.prefill(ids[:30])[-1].argmax()), []
        for _ in range(16):
            tok = int(session.decode(tok).argmax())
            picks[fmt].append(tok)
        dense[fmt] = next(m for m in engine.plan.memory if m.device == "gpu0").components["dense_weights"]
        attn = engine.model.weights.layers[1].attn
        assert isinstance(attn.wq_a, Fp8Matrix) == (fmt == "fp8")
        engine.close()
    err = ((logits["fp8"] - logits["bf16"]).abs().amax(dim=1) / logits["bf16"].abs().amax(dim=1)).max()
    assert err <= 0.05, f"fp8 vs bf16 plan: {err:.2e} of the logits' scale"  # bf16 rounding through 4 layers
    assert picks["fp8"] == picks["bf16"]
    assert dense["fp8"] < 0.8 * dense["bf16"]  # the FP8 matrices halve; norms, mHC, compressors stay float32


def test_scales_that_are_not_on_words_are_refused_before_the_launch():
    """Rows 128.. of a contiguous [2, 2] scale start at byte 2: a GPU's word read would fault there
    (misaligned address); the interpreter would not notice, so the launcher checks, on the CPU too."""
    q, s = _random_fp8(256, 256, torch.Generator().manual_seed(3))
    plain = s.view(torch.uint8)                      # [2, 2] contiguous: row 1 at byte 2
    assert not is_word_aligned(plain[1:])
    with pytest.raises(ValueError, match="not laid out on 4-byte words"):
        fp8_linear(torch.zeros(1, 256), q[128:], plain[1:])


@pytest.mark.parametrize("k", [256, 384, 512, 4096])
def test_held_scales_stay_on_words_through_rows_cat_and_to(k):
    """The tiny and small presets' K (256: 2 scale bytes a row) and V4-Flash's (4096: 32)."""
    q, s = _random_fp8(384, k, torch.Generator().manual_seed(k))
    m = Fp8Matrix.of_bytes(q, s.view(torch.uint8))
    assert torch.equal(m.scale, s.view(torch.uint8))    # the same bytes, in the word layout
    for part in (m, m.rows(0, 128), m.rows(128, 256), m.rows(256, 384), m.to("cpu"),
                 Fp8Matrix.cat([m.rows(128, 256), m.rows(0, 128)])):
        assert is_word_aligned(part.scale), tuple(part.scale.shape)
    if k % 512 == 0:                                   # whole words already: nothing padded, nothing copied
        assert m.scale.data_ptr() == s.data_ptr()


@pytest.mark.slow  # Triton's interpreter
def test_a_row_view_computes_what_the_whole_matrix_does():
    """A block-aligned row view (Fp8Matrix.rows, as a pipeline or a cut takes one): scale rows at offsets."""
    g = torch.Generator().manual_seed(11)
    q, s = _random_fp8(384, 256, g)
    m = Fp8Matrix.of_bytes(q, s.view(torch.uint8))
    x = torch.randn(2, 256, generator=g)
    whole = x @ dequantize_fp8(q, s).T
    for a in (0, 128, 256):
        part = m.rows(a, a + 128)
        got = fp8_linear(x, part.q, part.scale)
        assert (got - whole[:, a:a + 128]).abs().max() <= 1e-5 * whole.abs().max()


def flash_dense_shapes() -> dict[str, tuple[int, int, int]]:
    """{matrix: (N, K, groups)} of every FP8 matrix of V4-Flash's layers as the GPU's kernel sees it: wo_a
    whole, its o_groups groups in one launch (grouped_linear), the others one group."""
    cfg = ModelConfig.from_dict(official_flash_config())
    shapes = {}
    for layer in range(cfg.num_hidden_layers):
        for spec in layer_specs(cfg, layer, with_experts=False):
            if spec.dtype == "F8_E4M3":
                name, (n, k) = spec.name.split(".", 2)[2].removesuffix(".weight"), spec.shape
                shapes[name] = (n, k, cfg.o_groups if name == "attn.wo_a" else 1)
    return shapes


def test_a_decode_token_fills_an_h200_at_every_flash_dense_shape():
    """At least 2 programs per SM, or every program the shape has (16-row tiles, one K block each); the
    old fixed 64-row unsplit tiling gave wq_a, wo_a (a group) and wkv 16, 16 and 8 programs."""
    shapes = flash_dense_shapes()
    assert len(shapes) == 9 and shapes["attn.wkv"] == (512, 4096, 1) and shapes["attn.wo_a"] == (8192, 4096, 8)
    for name, (n, k, groups) in shapes.items():
        tile = tiling(1, n, k, H200_SMS, groups)
        most = groups * -(-n // groups // 16) * (k // 128)
        assert tile.programs(1, n, groups) >= min(2 * H200_SMS, most), (name, tile, tile.programs(1, n, groups))
        assert Tiling(tile.BT, tile.BN) in TILES and 1 <= tile.SPLIT_K <= k // 128, (name, tile)
        if tile.BN > 16:  # narrower rows come first: a split only once rows are at their narrowest
            assert tile.SPLIT_K == 1, (name, tile)


def test_wide_rows_stay_where_they_already_fill_the_gpu_and_prefill_keeps_its_tiling():
    assert tiling(1, 32768, 1024, H200_SMS) == Tiling(16, 64)  # wq_b: 512 programs of 64 rows
    assert tiling(16, 8192, 1024, H200_SMS) == Tiling(16, 16)  # indexer wq_b: 128 -> 256 -> 512, no split
    assert tiling(1, 512, 4096, H200_SMS) == Tiling(16, 16, 9)  # wkv: 32 row tiles x 9 runs of 3-4 blocks
    assert tiling(1, 8192, 4096, H200_SMS, groups=8) == Tiling(16, 16)  # wo_a: 8 groups x 64 tiles, no split
    assert tiling(1, 8 * 100, 256, H200_SMS, groups=8) == Tiling(16, 16, 2)  # 8 x 7 row tiles (not 800 / 16 = 50)
    for n, k, groups in flash_dense_shapes().values():
        for T in (17, 4096):
            assert tiling(T, n, k, H200_SMS, groups) == Tiling(64, 64), (T, n, k)


class _Recorder:
    """Stands in for fp8_triton's launch(): keeps (kernel name, grid, args, meta) of each call."""

    def __init__(self):
        self.launched = []

    def __call__(self, kernel, grid, *args, **meta):
        self.launched.append((kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__, grid, args, meta))


def test_fp8_linear_launches_the_chosen_tiling(monkeypatch):
    """The launch fp8_linear makes on the CPU is what tiling() picks for an H200 (the interpreter runs the
    split path an H200 decode token takes): the grid, the tile and the [SPLIT_K, T, N] float32 partials, then
    the one kernel that adds them and rounds them into the result, in x's dtype: nothing after it."""
    record = _Recorder()
    monkeypatch.setattr(fp8_triton, "launch", record)
    q, s = _random_fp8(256, 384, torch.Generator().manual_seed(0))
    y = fp8_linear(torch.zeros(1, 384, dtype=torch.bfloat16), q, word_aligned(s.view(torch.uint8)))
    assert sm_count(torch.device("cpu")) == H200_SMS
    tile = tiling(1, 256, 384, H200_SMS)
    assert tile == Tiling(16, 16, 3)  # 16 row tiles of 16, K's 3 blocks one to a split
    (name, grid, args, meta), (sum_name, sum_grid, sum_args, _) = record.launched
    assert name == "fp8_linear_kernel" and grid == (1, 16, 3) and (meta["BT"], meta["BN"]) == (16, 16)
    partial = args[3]
    assert partial.shape == (3, 1, 256) and partial.dtype == torch.float32
    assert sum_name == "fp8_split_sum_kernel" and sum_args[:4] == (partial, y, 256, 3) and sum_grid == (1,)
    assert y.dtype == torch.bfloat16 and y.shape == (1, 256)


def test_an_unsplit_product_stores_its_result_in_the_kernel(monkeypatch):
    """One launch, whose output argument is the [T, N] result in x's dtype (the kernel rounds and stores it)."""
    record = _Recorder()
    monkeypatch.setattr(fp8_triton, "launch", record)
    q, s = _random_fp8(512, 1024, torch.Generator().manual_seed(0))
    x = torch.zeros(1, 1024, dtype=torch.bfloat16)
    y = fp8_linear_tiled(x, q, word_aligned(s.view(torch.uint8)), Tiling(16, 64))
    (name, grid, args, _), = record.launched
    assert name == "fp8_linear_kernel" and args[3] is y and y.dtype == torch.bfloat16 and y.shape == (1, 512)


def test_grouped_wo_a_is_one_launch_reading_its_strided_view(monkeypatch):
    """V4-Flash's wo_a at a decode token, as attention calls it (grouped_linear on the heads' transposed view):
    one launch over all 8 groups, x passed without a copy (its strides as arguments), the result a view of
    [T, G*M] so attention's reshape back copies nothing."""
    record = _Recorder()
    monkeypatch.setattr(fp8_triton, "launch", record)
    G, M, K, T = 8, 1024, 4096, 1
    q = torch.zeros(G * M, K, dtype=torch.float8_e4m3fn)
    scale = word_aligned(torch.full((G * M // 128, K // 128), 127, dtype=torch.uint8))
    o = torch.zeros(T, G * K, dtype=torch.bfloat16)  # attention's heads [T, H*hd]
    grouped = o.reshape(T, G, K).transpose(0, 1)  # [G, T, K], as attend_and_project hands it over
    monkeypatch.setattr(fp8_matrix, "on_gpu", lambda w: True)
    z = grouped_linear(grouped, Fp8Matrix(q, scale))
    (name, grid, args, meta), = record.launched
    assert name == "fp8_linear_kernel" and grid == (1, G * M // 16, 1) and meta["BN"] == 16
    assert args[0].data_ptr() == o.data_ptr() and args[8:11] == (M, K, G * K)  # M, x's group and token strides
    assert z.shape == (G, T, M) and z.dtype == torch.bfloat16
    assert z.transpose(0, 1).reshape(T, -1).data_ptr() == args[3].data_ptr()  # a view of what the kernel wrote


def _bound(x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[T, N] bounds on |kernel - x @ W^T| with x [T, K] and W [N, K] exact (float32): sums of K products in
    float32 (the kernel's, in any tiling, and the reference's) err by K u32 of the sum of |products| each;
    float16 adds its rounding of y (u16 |y|) and of weights below its normal range (2^-25 absolute each)."""
    total = x.double().abs() @ w.double().abs().T  # [T, N]
    bound = 2 * x.shape[1] * torch.finfo(torch.float32).eps / 2 * total
    if dtype == torch.float16:
        bound += torch.finfo(torch.float16).eps / 2 * total + x.double().abs().sum(1, keepdim=True) * 2.0 ** -25
    return bound


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("tile", [Tiling(16, 64), Tiling(16, 32), Tiling(16, 16), Tiling(16, 32, 2), Tiling(16, 16, 3)],
                         ids=lambda t: f"BN={t.BN},SPLIT_K={t.SPLIT_K}")
@pytest.mark.slow  # Triton's interpreter
def test_every_decode_tiling_matches_the_reference(tile, dtype):
    """300 rows (no row tile divides them: masked rows), K = 3 blocks: 2 splits of 1 and 2 blocks, or 3 of
    one; float32 splits equal the unsplit result up to float32 rounding."""
    g = torch.Generator().manual_seed(tile.BN + tile.SPLIT_K)
    q, s = _random_fp8(384, 384, g)
    q = q[:300]
    x = torch.randn(3, 384, generator=g).to(dtype)
    w = dequantize_fp8(q, s)  # [300, 384]
    ref = x.float() @ w.T
    got = fp8_linear_tiled(x, q, word_aligned(s.view(torch.uint8)), tile)
    assert got.dtype == dtype and got.shape == (3, 300)
    assert ((got.double() - ref.double()).abs() <= _bound(x, w, dtype)).all()
    if dtype == torch.float32 and tile.SPLIT_K > 1:
        unsplit = fp8_linear_tiled(x, q, word_aligned(s.view(torch.uint8)), Tiling(tile.BT, tile.BN))
        total = x.double().abs() @ w.double().abs().T  # [T, N]: each of the 3 block sums is at most this
        assert ((got - unsplit).abs() <= 2 * 3 * torch.finfo(torch.float32).eps / 2 * total).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.slow  # Triton's interpreter
def test_a_small_gpu_splits_a_small_matrix(dtype):
    """16 SMs want 32 programs of 256 rows: 16-row tiles and K's 4 blocks in 2 runs."""
    g = torch.Generator().manual_seed(5)
    q, s = _random_fp8(256, 512, g)
    tile = tiling(1, 256, 512, sms=16)
    assert tile == Tiling(16, 16, 2)
    x = torch.randn(1, 512, generator=g).to(dtype)
    w = dequantize_fp8(q, s)
    got = fp8_linear_tiled(x, q, word_aligned(s.view(torch.uint8)), tile)
    assert ((got.double() - (x.float() @ w.T).double()).abs() <= _bound(x, w, dtype)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("tile", [Tiling(16, 32), Tiling(16, 16, 2), Tiling(16, 16, 3), Tiling(64, 64)],
                         ids=lambda t: f"BT={t.BT},BN={t.BN},SPLIT_K={t.SPLIT_K}")
@pytest.mark.slow  # Triton's interpreter
def test_every_grouped_tiling_matches_the_reference(tile, dtype):
    """3 groups of 100 rows (no row tile divides them, and scale blocks straddle groups: rows 100..227 share
    one) over K = 3 blocks, x the transposed view attention hands over; each group against x_g @ W_g^T."""
    g = torch.Generator().manual_seed(tile.BN + tile.SPLIT_K + tile.BT)
    G, M, K, T = 3, 100, 384, 5
    q, s = _random_fp8(384, K, g)
    q = q[:G * M]  # [300, K]; scale [3, 3]: its last block row holds 44 rows
    w = dequantize_fp8(q, s)  # [G*M, K]
    x = torch.randn(T, G * K, generator=g).to(dtype).reshape(T, G, K).transpose(0, 1)  # [G, T, K], strided
    got = fp8_grouped_linear_tiled(x, q, word_aligned(s.view(torch.uint8)), tile)
    assert got.dtype == dtype and got.shape == (G, T, M)
    for i in range(G):
        wg = w[i * M:(i + 1) * M]
        ref = x[i].float() @ wg.T
        assert ((got[i].double() - ref.double()).abs() <= _bound(x[i], wg, dtype)).all(), (i, tile)


@pytest.mark.slow  # Triton's interpreter
def test_grouped_linear_on_the_gpu_path_equals_the_cpu_twin(monkeypatch):
    """attention's wo_a call (grouped_linear) through the GPU's kernel, run here in the interpreter, against
    the CPU path's result on the same FP8 matrix: float32 x, within float32 summation order."""
    g = torch.Generator().manual_seed(21)
    q, s = _random_fp8(4 * 128, 256, g)
    w = Fp8Matrix.of_bytes(q, s.view(torch.uint8))
    x = torch.randn(3, 4 * 256, generator=g).reshape(3, 4, 256).transpose(0, 1)  # [4, 3, 256]
    want = grouped_linear(x, w)
    monkeypatch.setattr(fp8_matrix, "on_gpu", lambda m: True)
    got = grouped_linear(x, w)
    assert got.shape == want.shape == (4, 3, 128)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_grouped_shapes_are_checked():
    q, s = _random_fp8(384, 256, torch.Generator().manual_seed(0))
    q = q[:300]
    with pytest.raises(ValueError, match="do not match"):  # 300 rows do not make 8 groups
        fp8_grouped_linear(torch.zeros(8, 1, 256), q, word_aligned(s.view(torch.uint8)))
    with pytest.raises(ValueError, match=r"must be \[G, T, K\]"):
        fp8_grouped_linear_tiled(torch.zeros(1, 256), q, word_aligned(s.view(torch.uint8)), Tiling(16, 16))
    with pytest.raises(ValueError, match="the kernel takes"):
        fp8_linear(torch.zeros(1, 256, dtype=torch.float64), q, word_aligned(s.view(torch.uint8)))
