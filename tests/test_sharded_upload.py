"""Sharded upload-once (runtime/engine/sharded_upload.py): each planned GPU uploads and computes a 1/G slice
of every distinct cold expert of a layer, along the intermediate axis; the partials are added in GPU order.

Every planned GPU is the CPU here (the CPU twin), each with a copy stream of its own:
- the slices: w1/w3 rows and w2 columns at MXFP4 block boundaries, dequantizing to exactly the expert's
  own rows and columns, tiling it; a width that cuts a block, a bad $OSTINATO_UPLOAD, one GPU: refused;
- on random experts at G = 2 and 4, several groups per layer (each staging buffer reused): the output
  equals the single-link upload's (float32, 1e-4 of its scale; bf16 within bf16's rounding);
- every shard is copied once, on its own GPU's copy stream (the twin's log: the reads of each expert's
  host row by stream; the staging holds GPU g's slice g), the copies and computes ordered per buffer;
- the partials come back and are added in GPU order 0, 1, .. (partials that cancel only in that order);
- whole engines on 2- and 4-GPU plans loaded with OSTINATO_UPLOAD=sharded: prefill logits equal the
  single-link upload's (float32), greedy tokens of a multi-turn bf16 session are identical;
- the plan's Triton prefill kernels (Triton's interpreter) compute pools of slices I/G wide: each slice as the
  float32 reference over its own rows and columns, a sharded upload on them as the single-link upload, and a
  triton-backend engine computes its slices with them;
- where the host rows are pinned (with GPUs; forced here) and the plan holds the shard-major copy
  (policy.shard_major_copy), every tensor a GPU copies is one contiguous run of pinned bytes (w2's slices from
  the copy, shard_rows.py); without it no copy is made and w2's slices are strided views of the pinned rows;
  the same results either way;
- the bench (bench/sharded_upload.py) measures the exchange the cost model prices: the same bytes.
"""

from __future__ import annotations

import os

import pytest
import torch
from engine_helpers import IDS, _close, _variant, on_gpus
from graph_safety import storage_of
from stream_order import StreamWork, races
from test_pinned_arena import force_pinning

from ostinato.checkpoint.reader import PackedExpert
from ostinato.compiler.codegen.kernels import TritonExpertParams, render_triton_experts
from ostinato.hardware import load_hardware
from ostinato.plan import PlanError
from ostinato.runtime.engine import pinned_arena
from ostinato.runtime.engine.counters import Counters
from ostinato.runtime.engine.hot_compute import CpuPoolCompute, TorchPoolCompute, TritonPoolCompute
from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.engine.pinned_arena import NumaNode, pinned_experts
from ostinato.runtime.engine.shard_rows import held_bytes, shard_major_down
from ostinato.runtime.engine.sharded_upload import (
    ENV,
    FIELDS,
    ShardedUpload,
    expert_slice,
    slice_compute,
    slice_width,
    upload_shards,
)
from ostinato.runtime.engine.span_timer import SpanTimer
from ostinato.runtime.engine.streams import CPU_STREAMS, TwinStream
from ostinato.runtime.kernels.mxfp4 import Mxfp4Table, dequantize
from ostinato.runtime.kernels.reference import moe_experts_reference
from ostinato.runtime.kernels.routes import group_flat_routes
from ostinato.runtime.kernels.testing import random_packed_expert
from ostinato.runtime.kernels.triton_experts import HotPool, load_triton_module, prefill_experts

D, I, E, LIMIT, GROUP = 64, 128, 12, 7.0, 2  # GROUP slices per staging buffer: several groups per layer


def _experts(seed: int = 0) -> list[PackedExpert]:
    """E random experts as the loader holds them: int8 weights, uint8 scale bytes, separate storages."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(E):
        p = random_packed_expert(D, I, gen)
        tensors = (t.view(torch.uint8) if t.dtype == torch.float8_e8m0fnu else t for t in vars(p).values())
        out.append(PackedExpert(*tensors))
    return out


def _staging(n: int, width: int) -> HotPool:
    return HotPool(*(torch.zeros(n, r, c, dtype=torch.uint8) for r, c in (
        (width, D // 2), (width, D // 32), (width, D // 2), (width, D // 32), (D, width // 2), (D, width // 32))))


def _sharded(G: int, home_gpus=(0,), compute=None) -> ShardedUpload:
    width = slice_width(I, G)
    return ShardedUpload([torch.device("cpu")] * G, [[_staging(GROUP, width) for _ in range(2)] for _ in range(G)],
                         compute or TorchPoolCompute(LIMIT), list(home_gpus))


def _routes(T: int, k: int, seed: int, experts: list[int]):
    """T tokens' k routes each over `experts`: token, expert [T * k] int64, weight float32."""
    gen = torch.Generator().manual_seed(seed)
    pick = torch.tensor(experts)[torch.stack([torch.randperm(len(experts), generator=gen)[:k] for _ in range(T)])]
    return (torch.arange(T).repeat_interleave(k), pick.reshape(-1),
            torch.rand(T * k, generator=gen, dtype=torch.float32))


def _single_link(rows, x, token, expert, weight) -> torch.Tensor:
    """The unsharded upload's arithmetic: the touched experts whole, in one pool, over the hot-pool compute."""
    distinct = expert.unique()
    pool = HotPool.stack([rows[e] for e in distinct.tolist()])
    local = torch.full((E,), -1, dtype=torch.int64)
    local[distinct] = torch.arange(distinct.numel())
    out = torch.zeros(x.shape[0], D)
    TorchPoolCompute(LIMIT).prefill(pool, x, token, local[expert], weight, out)
    return out


def _run(sharded: ShardedUpload, rows, x, token, expert, weight, layer: int = 0) -> torch.Tensor:
    out = torch.zeros(x.shape[0], D)
    sharded.run(layer, rows, torch.arange(E), x, token, expert, weight, out, SpanTimer(Counters()))
    return out


# ----- the slices -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("G", [1, 2, 4])
def test_slices_are_the_experts_rows_and_columns_at_block_boundaries_and_tile_it(G):
    table = Mxfp4Table.make("cpu", torch.float32)
    expert = _experts()[0]
    gate, down = dequantize(expert.w1, expert.w1_scale, table), dequantize(expert.w2, expert.w2_scale, table)
    W = slice_width(I, G)
    gates, downs = [], []
    for g in range(G):
        s = expert_slice(expert, g, W)
        assert s.w1.shape == (W, D // 2) and s.w2.shape == (D, W // 2) and s.w2_scale.shape == (D, W // 32)
        gates.append(dequantize(s.w1, s.w1_scale, table))
        downs.append(dequantize(s.w2.contiguous(), s.w2_scale.contiguous(), table))
        assert torch.equal(gates[-1], gate[g * W:(g + 1) * W]) and torch.equal(downs[-1], down[:, g * W:(g + 1) * W])
    assert torch.equal(torch.cat(gates), gate) and torch.equal(torch.cat(downs, dim=1), down)  # no gap, no overlap


def test_widths_that_cut_a_block_and_bad_settings_are_refused(monkeypatch):
    assert slice_width(2048, 4) == 512 and slice_width(128, 4) == 32
    for intermediate, shards in ((128, 3), (96, 2), (128, 8)):  # 42.7, 48 and 16 values: not whole blocks of 32
        with pytest.raises(ValueError, match=f"moe_intermediate_size {intermediate} .* {shards} slices"):
            slice_width(intermediate, shards)
    monkeypatch.delenv(ENV, raising=False)
    assert upload_shards(4) == 1
    monkeypatch.setenv(ENV, "sharded")
    assert upload_shards(4) == 4
    with pytest.raises(PlanError, match="hardware.gpus.count"):
        upload_shards(1)
    monkeypatch.setenv(ENV, "every-link")
    with pytest.raises(PlanError, match=f"{ENV} is 'every-link'"):
        upload_shards(2)


# ----- one layer on random experts --------------------------------------------------------------------------
@pytest.mark.parametrize("G", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_sharded_output_equals_the_single_link_upload(G, dtype):
    rows = _experts(G)
    token, expert, weight = _routes(T=9, k=3, seed=G, experts=[0, 2, 3, 5, 7, 8, 11])  # 7 distinct: 4 groups
    x = torch.randn(9, D, generator=torch.Generator().manual_seed(1)).to(dtype)
    ours, ref = _run(_sharded(G), rows, x, token, expert, weight), _single_link(rows, x, token, expert, weight)
    # float32: only the order of the sums over the intermediate axis differs; bf16: the hot-pool compute
    # rounds each expert's output to bf16, whole or per slice
    tol = 1e-4 if dtype == torch.float32 else 2 ** -7
    scale = ref.abs().max()
    assert scale > 0 and (ours - ref).abs().max() <= tol * scale, f"max diff {(ours - ref).abs().max()} at {scale}"


@pytest.mark.parametrize("G", [2, 4])
def test_every_shard_is_uploaded_once_on_its_own_gpus_copy_stream(G):
    rows = _experts(10 + G)
    token, expert, weight = _routes(T=12, k=3, seed=G, experts=[1, 2, 4, 6, 9])
    used = expert.unique().tolist()
    assert used == [1, 2, 4, 6, 9]  # groups of 2, 2, 1 through both buffers of each GPU
    x = torch.randn(12, D, generator=torch.Generator().manual_seed(2))
    sharded = _sharded(G)
    links = sharded.links
    assert len(set(links)) == G and TwinStream(0) not in links and links[0] == CPU_STREAMS.named("cpu", "copy")
    staging = {storage_of(t): g for g in range(G) for pool in sharded.staging[g] for t in vars(pool).values()}
    source = {storage_of(getattr(rows[e], n)): e for e in range(E) for n in FIELDS}
    with CPU_STREAMS.recording() as log, StreamWork(CPU_STREAMS, set(staging) | set(source)):
        out = _run(sharded, rows, x, token, expert, weight)
    _close(out, _single_link(rows, x, token, expert, weight))
    reads = {}  # (expert, stream) -> reads of its host row's tensors
    for e in log:
        if e.op == "read" and e.what in source:
            reads[(source[e.what], e.stream)] = reads.get((source[e.what], e.stream), 0) + 1
        if e.op == "write" and e.what in staging:
            assert e.stream == links[staging[e.what]], f"GPU {staging[e.what]}'s staging written on {e.stream}"
    assert reads == {(e, links[g]): len(FIELDS) for e in used for g in range(G)}, reads  # each shard once, its link
    assert {e.stream for e in log if e.op == "read" and e.what in staging} == {TwinStream(0)}  # computes on main
    found = races(log)
    assert not found, f"{len(found)} unordered pairs, first: {found[0]}"
    slice_bytes = sum(getattr(sharded.staging[0][0], n)[0].numel() for n in FIELDS)
    assert sharded.bytes_uploaded == [len(used) * slice_bytes] * G and slice_bytes * G == rows[0].nbytes
    # the last group (expert 9) sits in buffer 0 of every GPU as that GPU's own slice
    for g in range(G):
        want = expert_slice(rows[9], g, sharded.width)
        for n in FIELDS:
            assert torch.equal(getattr(sharded.staging[g][0], n)[0], getattr(want, n).view(torch.uint8)), (g, n)


class _PinRecorder:
    """Stands in for pinned_arena.pin: an identity that keeps the byte ranges it page-locked."""

    def __init__(self, monkeypatch):
        self.ranges = []
        monkeypatch.setattr(pinned_arena, "pin", self)

    def __call__(self, buffer):
        self.ranges.append((buffer.data_ptr(), buffer.data_ptr() + buffer.nbytes))
        return buffer

    def holds(self, t: torch.Tensor) -> bool:
        """t's bytes lie in one pinned buffer."""
        lo = t.data_ptr()
        return any(a <= lo and lo + t.nbytes <= b for a, b in self.ranges)


def _copied(monkeypatch, sharded: ShardedUpload) -> list[tuple[int, PackedExpert]]:
    """Records (GPU, source slice) of every copy ShardedUpload queues."""
    copies, real = [], sharded._copy_group

    def recorded(g, slices, pool, timer):
        copies.extend((g, src) for src in slices)
        return real(g, slices, pool, timer)

    monkeypatch.setattr(sharded, "_copy_group", recorded)
    return copies


@pytest.mark.parametrize("G", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_shard_copy_is_one_contiguous_run_of_pinned_bytes(G, dtype, monkeypatch):
    """Host rows in a pinned arena (the loader's, with GPUs) and their down matrices shard-major
    (shard_rows.py): every tensor each GPU copies is contiguous in a pinned buffer, GPU g's w2 slice holds
    exactly the row's columns g*W.., and the output is the single-link upload's. Without the shard-major
    copy, w2's slices are strided views (what torch stages through pageable memory)."""
    pins = _PinRecorder(monkeypatch)
    source = _experts(40 + G)
    rows = pinned_experts([source], [NumaNode(0, frozenset(os.sched_getaffinity(0)))])[0]
    down = shard_major_down([rows], [list(range(E))], G)
    assert held_bytes([rows], [list(range(E))]) == E * (rows[0].w2.nbytes + rows[0].w2_scale.nbytes)
    sharded = ShardedUpload([torch.device("cpu")] * G, [[_staging(GROUP, slice_width(I, G)) for _ in range(2)]
                                                         for _ in range(G)], TorchPoolCompute(LIMIT), [0], down=down)
    copies = _copied(monkeypatch, sharded)
    token, expert, weight = _routes(T=8, k=3, seed=G, experts=[1, 3, 5, 8, 11])
    x = torch.randn(8, D, generator=torch.Generator().manual_seed(5)).to(dtype)
    ours, ref = _run(sharded, rows, x, token, expert, weight), _single_link(rows, x, token, expert, weight)
    tol = 1e-4 if dtype == torch.float32 else 2 ** -7
    assert (ours - ref).abs().max() <= tol * ref.abs().max()
    assert sorted(g for g, _ in copies) == sorted(list(range(G)) * 5)  # each GPU copied each of the 5 experts once
    for g, src in copies:
        for name in FIELDS:
            t = getattr(src, name)
            assert t.is_contiguous() and pins.holds(t), f"GPU {g}'s {name}: strided or not pinned"
    W = sharded.width
    for e in (1, 11):  # the shard-major bytes are the row's own columns
        for g in range(G):
            want = expert_slice(rows[e], g, W)
            held = sharded.source(0, rows, e, g)
            assert torch.equal(held.w2, want.w2) and torch.equal(held.w2_scale, want.w2_scale)
    sharded.down = None  # a CPU run's sources: the rows' strided views
    assert not expert_slice(rows[1], 0, W).w2.is_contiguous() and not sharded.source(0, rows, 1, 0).w2.is_contiguous()


class _Constant:
    """A pool compute that adds one number per GPU (by staging buffer) to every element of its partial."""

    def __init__(self, value_of: dict[int, float]):
        self.value_of = value_of

    def prefill(self, pool, x, token, slot, weight, out):
        out += self.value_of[id(pool)]


@pytest.mark.parametrize("G", [2, 4])
def test_partials_come_back_and_are_added_in_gpu_order(G):
    """Partials 2^24 and -2^24 on GPUs 0 and 1 added to an output of 1.0 in float32: in order 0, 1, ..
    the 1.0 is lost to rounding ((1 + 2^24) - 2^24 = 0); in any other order, or summed before being
    added, it survives. The home GPU (1) keeps its partial; the others' cross over."""
    rows = _experts()
    value = [2.0 ** 24, -2.0 ** 24] + [0.0] * (G - 2)
    sharded = _sharded(G, home_gpus=[1])
    sharded.compute = _Constant({id(pool): value[g] for g in range(G) for pool in sharded.staging[g]})
    token, expert, weight = _routes(T=3, k=1, seed=0, experts=[4])  # one expert, one group: one partial each
    x = torch.randn(3, D)
    out = torch.ones(3, D)
    assert sharded.run(0, rows, torch.arange(E), x, token, expert, weight, out, SpanTimer(Counters())) == 1
    assert torch.equal(out, torch.zeros(3, D)), out[0, :4]
    # x out to the G - 1 other GPUs and their float32 partials back
    assert sharded.bytes_exchanged == (G - 1) * (x.numel() * 4 + out.numel() * 4)


# ----- the plan's Triton kernels on slices (Triton's interpreter) ------------------------------------------
@pytest.fixture(scope="module")
def triton_prefill(kernel_dir):
    """The prefill module as the compiler renders it for experts I wide (the interpreter: conftest)."""
    params = TritonExpertParams(D, I, "prefill", block_m=16, block_n=32, block_k=32, swiglu_limit=LIMIT)
    return load_triton_module(render_triton_experts(params, kernel_dir).path)


@pytest.mark.slow  # Triton's interpreter
@pytest.mark.parametrize("G", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_triton_kernels_compute_each_slice_as_the_float32_reference(triton_prefill, G, dtype):
    """Pools of slices W = I/G wide (what a GPU's staging holds) through the module rendered for I: each
    slice's output equals the float32 reference over that slice's own rows and columns (float32 x: to
    float32 rounding; fp16 x holds h in fp16, rounded once: 2^-10 of the scale), and the slices add up to
    the whole experts'."""
    rows = _experts(20 + G)
    token, expert, weight = _routes(T=9, k=3, seed=G, experts=list(range(5)))
    routes = group_flat_routes(token, expert, weight, 5)
    x = torch.randn(9, D, generator=torch.Generator().manual_seed(3)).to(dtype)
    W, parts = slice_width(I, G), []
    for g in range(G):
        pieces = [PackedExpert(*(t.contiguous() for t in vars(expert_slice(rows[e], g, W)).values())) for e in range(5)]
        ours = prefill_experts(triton_prefill, x, routes, HotPool.stack(pieces), torch.zeros(9, D))
        ref = moe_experts_reference(x.float(), routes, pieces, torch.zeros(9, D), limit=LIMIT)
        tol = 1e-5 if dtype == torch.float32 else 2 ** -10
        assert (ours - ref).abs().max() <= tol * ref.abs().max(), f"slice {g}: {(ours - ref).abs().max()}"
        parts.append(ours)
    whole = moe_experts_reference(x.float(), routes, rows[:5], torch.zeros(9, D), limit=LIMIT)
    tol = 1e-5 if dtype == torch.float32 else 2 ** -9
    assert (sum(parts) - whole).abs().max() <= tol * whole.abs().max()


@pytest.mark.slow  # Triton's interpreter
@pytest.mark.parametrize("G", [2, 4])
def test_a_sharded_upload_on_the_triton_kernels_equals_the_single_link_upload(triton_prefill, G):
    rows = _experts(30 + G)
    token, expert, weight = _routes(T=7, k=3, seed=G, experts=[0, 3, 4, 6, 10])
    x = torch.randn(7, D, generator=torch.Generator().manual_seed(4))
    compute = TritonPoolCompute(triton_prefill, None)
    assert slice_compute(compute, LIMIT) is compute
    ours = _run(_sharded(G, compute=compute), rows, x, token, expert, weight)
    _close(ours, _single_link(rows, x, token, expert, weight))


def test_the_slices_are_computed_by_the_hot_backend_where_it_takes_their_width():
    """Triton and torch take any width; the cpu backend's kernel is compiled for the plan's I: torch there."""
    torch_compute = TorchPoolCompute(LIMIT)
    assert slice_compute(torch_compute, LIMIT) is torch_compute
    cpu = CpuPoolCompute.__new__(CpuPoolCompute)  # no kernel needed to ask
    chosen = slice_compute(cpu, LIMIT)
    assert isinstance(chosen, TorchPoolCompute) and chosen.limit == LIMIT


# ----- whole engines ----------------------------------------------------------------------------------------
def _sharded_engine(compiled, tiny_ckpt, gpus: int, monkeypatch, dtype=None, shard_major_copy: bool = False):
    """The tiny mixed plan on `gpus` planned GPUs (all the CPU), prefills above 16 tokens upload, loaded
    with sharded upload; `shard_major_copy`: the plan shards (past the test prompts' lengths, so the session's
    prefills run as its `upload` and the executor's upload_as picks the link) and holds the down matrices'
    shard-major copy (policy.shard_major_copy)."""
    plan = on_gpus(_variant(compiled[0], "mixed", 16), gpus)
    if shard_major_copy:
        plan = plan.replace(policy=plan.policy.replace(shard_threshold=len(IDS), shard_major_copy=True))
    monkeypatch.setenv(ENV, "sharded")
    engine = load_engine(plan, tiny_ckpt, device="cpu", dtype=dtype)
    monkeypatch.delenv(ENV)
    assert engine.executor.upload_shards == gpus and engine.executor.upload_as == "sharded"
    return engine


@pytest.mark.slow  # the compiled plan's engine (C++ kernels)
@pytest.mark.parametrize("gpus", [2, 4])
def test_a_sharded_engine_prefills_as_the_single_link_upload(compiled, tiny_ckpt, reference, gpus, monkeypatch):
    engine = _sharded_engine(compiled, tiny_ckpt, gpus, monkeypatch)
    ex, sharded = engine.executor, engine.executor.sharded
    links = sharded.links
    assert len(set(links)) == gpus and TwinStream(0) not in links
    named = CPU_STREAMS.named_streams("cpu")  # the engine's roles (capture, cold, copy): GPU 0's link is "copy"
    assert links[0] == named["copy"] and set(links[1:]).isdisjoint(named.values())
    staging = {storage_of(t): g for g in range(gpus) for pool in sharded.staging[g] for t in vars(pool).values()}
    rows = {storage_of(t) for le in ex.layers for row in le.cold for t in vars(row).values()}
    before = ex.counters.copy()
    with CPU_STREAMS.recording() as log, StreamWork(CPU_STREAMS, set(staging) | rows):
        logits = engine.new_session().prefill(IDS[:100])
    c = ex.counters.minus(before)
    assert ex.mode == "sharded" and c.experts_uploaded > 0 and sum(sharded.bytes_uploaded) == c.bytes_uploaded
    assert len(set(sharded.bytes_uploaded)) == 1  # every GPU took its equal share of every expert
    for g, link in enumerate(links):  # each GPU read each uploaded expert's 6 tensors once, on its own link
        assert sum(e.op == "read" and e.what in rows and e.stream == link for e in log) == 6 * c.experts_uploaded, g
    assert all(e.stream == links[staging[e.what]] for e in log if e.op == "write" and e.what in staging)
    found = races(log)
    assert not found, f"{len(found)} unordered pairs, first: {found[0]}"
    ex.upload_as = "upload"
    single = engine.new_session().prefill(IDS[:100])
    assert ex.mode == "upload" and ex.counters.minus(before).experts_uploaded == 2 * c.experts_uploaded
    _close(logits, single)
    _close(logits, reference.new_session().prefill(IDS[:100]))
    engine.close()
    plain = load_engine(on_gpus(_variant(compiled[0], "mixed", 16), gpus), tiny_ckpt, device="cpu")
    assert plain.executor.upload_shards == 1
    with pytest.raises(ValueError, match="no shard staging"):
        plain.executor.set_mode("sharded")
    plain.close()


@pytest.mark.slow  # the compiled plan's engine (C++ kernels)
def test_a_pinned_sharded_engine_copies_each_slice_from_contiguous_pinned_bytes(compiled, tiny_ckpt, monkeypatch):
    """Loaded as on GPUs (the pinned arenas forced, test_pinned_arena.force_pinning), 2 planned GPUs: the
    rows' down matrices are held shard-major in one more pinned buffer of a third of the pinned rows'
    bytes (what the memory model must count); every tensor each GPU copies is contiguous in a pinned buffer,
    and the prefill equals the single-link upload's."""
    pins = force_pinning(monkeypatch)
    engine = _sharded_engine(compiled, tiny_ckpt, 2, monkeypatch, shard_major_copy=True)
    ex, sharded = engine.executor, engine.executor.sharded
    E_plan = engine.plan.model.routed_experts
    dma = [sorted(set(range(E_plan)) - set(lp.hot_experts)) for lp in engine.plan.layers]  # no re-placing layers
    rows = [le.cold for le in ex.layers]
    assert [sorted(held) for held in sharded.down] == dma
    extra = held_bytes(rows, dma)
    assert extra * 3 == sum(len(d) for d in dma) * engine.plan.model.expert_bytes  # a third of each pinned row
    assert extra in [n for _, n in pins.arenas] and sum(n for _, n in pins.arenas) == extra * 4

    def pinned(t):
        return any(p <= t.data_ptr() and t.data_ptr() + t.nbytes <= p + n for p, n in pins.arenas)

    copies = _copied(monkeypatch, sharded)
    logits = engine.new_session().prefill(IDS[:100])
    assert ex.mode == "sharded" and {g for g, _ in copies} == {0, 1}
    bad = [(g, n) for g, src in copies for n in FIELDS
           if not getattr(src, n).is_contiguous() or not pinned(getattr(src, n))]
    assert not bad, f"{len(bad)} strided or unpinned sources, first {bad[0]}"
    ex.upload_as = "upload"
    _close(logits, engine.new_session().prefill(IDS[:100]))
    engine.close()


@pytest.mark.slow  # the compiled plan's engine (C++ kernels)
def test_a_pinned_sharded_engine_without_the_copy_slices_w2_from_the_strided_rows(compiled, tiny_ckpt, monkeypatch):
    """Loaded as on GPUs, 2 planned GPUs, a plan without policy.shard_major_copy (the host had no room for it):
    no page-locked buffer beyond the rows; w1/w3 slices are contiguous runs of the pinned rows and w2's strided
    views of them; the prefill equals the single-link upload's."""
    pins = force_pinning(monkeypatch)
    engine = _sharded_engine(compiled, tiny_ckpt, 2, monkeypatch)
    ex, sharded = engine.executor, engine.executor.sharded
    assert not engine.plan.policy.shard_major_copy and sharded.down is None
    E_plan = engine.plan.model.routed_experts
    dma = [sorted(set(range(E_plan)) - set(lp.hot_experts)) for lp in engine.plan.layers]
    down = held_bytes([le.cold for le in ex.layers], dma)  # what the copy would hold: a third of the rows
    assert sum(n for _, n in pins.arenas) == down * 3  # the pinned rows alone

    def pinned(t):
        return any(p <= t.data_ptr() and t.data_ptr() + t.nbytes <= p + n for p, n in pins.arenas)

    copies = _copied(monkeypatch, sharded)
    logits = engine.new_session().prefill(IDS[:100])
    assert ex.mode == "sharded" and {g for g, _ in copies} == {0, 1}
    assert all(getattr(src, n).is_contiguous() and pinned(getattr(src, n)) for _, src in copies
               for n in ("w1", "w1_scale", "w3", "w3_scale"))
    assert all(not src.w2.is_contiguous() and pinned(src.w2) for _, src in copies)  # views of the pinned rows
    ex.upload_as = "upload"
    _close(logits, engine.new_session().prefill(IDS[:100]))
    engine.close()


@pytest.mark.slow  # the compiled plan
def test_a_width_that_does_not_split_into_whole_blocks_is_refused_at_load(compiled, tiny_ckpt, monkeypatch):
    monkeypatch.setenv(ENV, "sharded")  # tiny's 128 over 3 GPUs: 42.7 values each
    with pytest.raises(ValueError, match="moe_intermediate_size 128 does not split into 3 slices"):
        load_engine(on_gpus(_variant(compiled[0], "mixed", 16), 3), tiny_ckpt, device="cpu")


@pytest.mark.slow  # the compiled plan's engine in bf16
@pytest.mark.parametrize(("gpus", "pinned"), [(2, False), (4, False), (2, True)], ids=["2", "4", "2-pinned"])
def test_greedy_tokens_of_a_sharded_bf16_engine_are_the_single_link_ones(compiled, tiny_ckpt, gpus, pinned,
                                                                         monkeypatch):
    """pinned: loaded as on GPUs, w2's slices copied from the shard-major pinned copy."""
    if pinned:
        force_pinning(monkeypatch)
    engine = _sharded_engine(compiled, tiny_ckpt, gpus, monkeypatch, dtype=torch.bfloat16, shard_major_copy=pinned)
    assert (engine.executor.sharded.down is not None) == pinned
    turns = [IDS[:40], IDS[40:100]]  # two prefills that upload, with replies between

    def greedy(upload_as: str) -> list[int]:
        engine.executor.upload_as = upload_as
        session, tokens = engine.new_session(), []
        for turn in turns:
            logits = session.prefill(turn)[-1]
            for _ in range(6):
                tokens.append(int(logits.argmax()))
                logits = session.decode(tokens[-1])
        return tokens

    before = engine.executor.sharded.bytes_uploaded[0]
    sharded = greedy("sharded")
    assert engine.executor.sharded.bytes_uploaded[0] > before
    assert sharded == greedy("upload")
    engine.close()


@pytest.mark.slow  # the compiled plan's engine, its Triton kernels in the interpreter
def test_a_sharded_engine_on_the_triton_backend_computes_its_slices_with_the_plans_kernels(compiled, tiny_ckpt,
                                                                                           reference, monkeypatch):
    """The 2-GPU plan, hot backend triton: the slices go through the plan's prefill kernels (the engine's own
    compute, launched at I/2), and the prefill stays exact."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(ENV, "sharded")
    engine = load_engine(on_gpus(_variant(compiled[0], "mixed", 4), 2), tiny_ckpt, device="cpu", hot_backend="triton")
    monkeypatch.delenv(ENV)
    ex, sharded = engine.executor, engine.executor.sharded
    assert isinstance(ex.compute, TritonPoolCompute) and sharded.compute is ex.compute
    widths, real = [], ex.compute.prefill

    def recorded(pool, *args):
        widths.append(pool.w1.shape[1])
        return real(pool, *args)

    monkeypatch.setattr(ex.compute, "prefill", recorded)
    # 5 tokens: over the plan's prefill threshold (4), so the prefill runs as sharded uploads (asserted below); 9 took
    # a third longer in the interpreter and ran no other path
    _close(engine.new_session().prefill(IDS[:5]), reference.new_session().prefill(IDS[:5]))
    assert ex.mode == "sharded" and sharded.width * 2 == ex.layers[0].staging[0].w1.shape[1]  # I/2
    assert sharded.width in widths and sum(sharded.bytes_uploaded) > 0
    engine.close()


# ----- the bench ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("G", [2, 4])
def test_the_bench_sets_the_exchange_it_measures_beside_the_cost_models_price_of_the_same_bytes(G):
    """bench/sharded_upload.py: the bytes the runtime's exchange moved (ShardedUpload.bytes_exchanged) are what
    the cost model's exchange_bytes prices, and the modeled times are its exchange_time and upload_time on a
    spec of G GPUs."""
    from ostinato.bench.sharded_upload import _experts as bench_experts
    from ostinato.bench.sharded_upload import cost_model, measure

    hw = load_hardware("rtx4090d-x4")
    experts = bench_experts(2, 64, 128)
    row = measure(G, 7, experts, hw, rounds=1)
    assert row["exchange_bytes"] == row["model_exchange_bytes"] == (G - 1) * 7 * 64 * (2 + 4)  # x bf16, partial f32
    model = cost_model(hw, G, 64, 128)
    assert model.shards == G and model.expert_bytes == experts[0].nbytes
    assert row["model_exchange_s"] == sum(model.exchange_time(7)) > 0
    assert row["model_upload_s"] == model.upload_time(2, links=G)
