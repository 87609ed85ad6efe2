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
  single-link upload's (float32), greedy tokens of a multi-turn bf16 session are identical.
"""

from __future__ import annotations

import pytest
import torch
from engine_helpers import IDS, _close, _variant, on_gpus
from graph_safety import storage_of
from stream_order import StreamWork, races

from ostinato.checkpoint.reader import PackedExpert
from ostinato.plan import PlanError
from ostinato.runtime.engine.counters import Counters
from ostinato.runtime.engine.hot_compute import TorchPoolCompute
from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.engine.sharded_upload import (
    ENV,
    FIELDS,
    ShardedUpload,
    expert_slice,
    slice_width,
    upload_shards,
)
from ostinato.runtime.engine.span_timer import SpanTimer
from ostinato.runtime.engine.streams import CPU_STREAMS, TwinStream
from ostinato.runtime.kernels.mxfp4 import Mxfp4Table, dequantize
from ostinato.runtime.kernels.testing import random_packed_expert
from ostinato.runtime.kernels.triton_experts import HotPool

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


# ----- whole engines ----------------------------------------------------------------------------------------
def _sharded_engine(compiled, tiny_ckpt, gpus: int, monkeypatch, dtype=None):
    """The tiny mixed plan on `gpus` planned GPUs (all the CPU), prefills above 16 tokens upload, loaded
    with sharded upload."""
    plan, _ = compiled
    monkeypatch.setenv(ENV, "sharded")
    engine = load_engine(on_gpus(_variant(plan, "mixed", 16), gpus), tiny_ckpt, device="cpu", dtype=dtype)
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


@pytest.mark.slow  # the compiled plan
def test_a_width_that_does_not_split_into_whole_blocks_is_refused_at_load(compiled, tiny_ckpt, monkeypatch):
    monkeypatch.setenv(ENV, "sharded")  # tiny's 128 over 3 GPUs: 42.7 values each
    with pytest.raises(ValueError, match="moe_intermediate_size 128 does not split into 3 slices"):
        load_engine(on_gpus(_variant(compiled[0], "mixed", 16), 3), tiny_ckpt, device="cpu")


@pytest.mark.slow  # the compiled plan's engine in bf16
@pytest.mark.parametrize("gpus", [2, 4])
def test_greedy_tokens_of_a_sharded_bf16_engine_are_the_single_link_ones(compiled, tiny_ckpt, gpus, monkeypatch):
    engine = _sharded_engine(compiled, tiny_ckpt, gpus, monkeypatch, dtype=torch.bfloat16)
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
