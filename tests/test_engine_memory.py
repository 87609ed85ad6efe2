"""The engine holds what the plan counts: packed experts only, cold experts as views of the checkpoint.

- the torch hot backend computes from the packed pool: it keeps no dequantized copy, dequantizes
  only the experts a call uses, one matrix at a time (each freed before the next), bit-exactly;
- the hot pools and the upload staging add up to the plan's gpu0 rows (staging is one pair per device);
- cold experts are the checkpoint's memory-mapped bytes, not copies;
- ostinato-run shows load progress and the resident memory beside the plan's totals.
"""

from __future__ import annotations

import re
import weakref
from pathlib import Path

import pytest
import torch
from engine_helpers import IDS, _engine

from ostinato.checkpoint.formats import dequantize_mxfp4
from ostinato.checkpoint.reader import Checkpoint, PackedExpert
from ostinato.runtime.cli.run import main as run_main
from ostinato.runtime.engine import hot_compute
from ostinato.runtime.engine.held_memory import tensors_in
from ostinato.runtime.engine.hot_compute import TorchPoolCompute
from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.engine.resident import Resident, parse_status, resident, resident_line
from ostinato.runtime.kernels.mxfp4 import Mxfp4Table, dequantize
from ostinato.runtime.kernels.triton_experts import HotPool
from ostinato.runtime.model.experts import swiglu


# ----- item 1: no dequantized copies of experts ---------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mxfp4_tables_dequantize_bit_exactly(dtype):
    """Every packed byte under every e8m0 scale byte (255 = NaN included) equals the checkpoint decoder's."""
    packed = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.int8).repeat(256, 1)  # [256, 256]
    scale = torch.arange(256, dtype=torch.int32).to(torch.uint8)[:, None].repeat(1, 16)  # [256, 16]
    ref = dequantize_mxfp4(packed, scale.view(torch.float8_e8m0fnu), dtype)  # [256, 512]
    got = dequantize(packed, scale, Mxfp4Table.make("cpu", dtype))
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert got.dtype == dtype and torch.equal(got.view(bits), ref.view(bits))


def _pool(tiny_ckpt, experts: list[int]) -> tuple[HotPool, int, int, float]:
    with Checkpoint.open(tiny_ckpt) as ckpt:
        cfg = ckpt.config
        return (HotPool.stack([ckpt.expert_packed(1, e) for e in experts]), cfg.hidden_size,
                cfg.moe_intermediate_size, cfg.swiglu_limit)


def _dense_reference(pool: HotPool, x, token, slot, weight, limit) -> torch.Tensor:
    """The removed DensePool computation: every slot dequantized up front, one route at a time."""
    w1, w3, w2 = (dequantize_mxfp4(getattr(pool, n), getattr(pool, n + "_scale"), x.dtype) for n in ("w1", "w3", "w2"))
    out = torch.zeros(x.shape[0], x.shape[1])
    for t, s, w in zip(token.tolist(), slot.tolist(), weight.tolist()):
        if s >= 0:
            h = swiglu(x[t:t + 1] @ torch.cat((w1[s], w3[s])).T, limit)
            out[t] += (h @ w2[s].T).float()[0] * w
    return out


class DequantizeRecorder:
    """Wraps hot_compute.dequantize: the shape of each matrix it makes, and whether any earlier one
    was still alive (referenced) when the next was made."""

    def __init__(self):
        self.shapes, self.refs, self.overlaps = [], [], 0

    def __call__(self, packed, scale, table):
        self.overlaps += sum(r() is not None for r in self.refs)
        w = dequantize(packed, scale, table)
        self.shapes.append(tuple(w.shape))
        self.refs.append(weakref.ref(w))
        return w

    def alive(self) -> int:
        return sum(r() is not None for r in self.refs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_pool_compute_dequantizes_only_the_used_experts_one_matrix_at_a_time(tiny_ckpt, monkeypatch, dtype):
    pool, D, I, limit = _pool(tiny_ckpt, [3, 0, 7, 9, 12, 5])  # 6 slots
    compute = TorchPoolCompute(limit)
    compute.prepare("cpu", dtype)
    rec = DequantizeRecorder()
    monkeypatch.setattr(hot_compute, "dequantize", rec)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, D, generator=g).to(dtype)
    token = torch.tensor([0, 1, 2, 3, 4, 0, 2, 4])
    slot = torch.tensor([4, 1, 4, 1, 2, 2, 1, 4])  # slots 1, 2, 4 used; 0, 3, 5 not
    weight = torch.rand(8, generator=g)
    out = torch.zeros(5, D)
    with torch.no_grad():
        compute.prefill(pool, x, token, slot, weight, out)
    assert rec.shapes == [(2 * I, D), (D, I)] * 3  # one expert's gate|up, then its down; three experts
    assert rec.overlaps == 0 and rec.alive() == 0  # each freed before the next is made, none kept
    ref = _dense_reference(pool, x, token, slot, weight, limit)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert (out - ref).abs().max() <= tol * ref.abs().max()

    # decode: K fixed route slots, -1 = padding; every slot runs (fixed shapes), padding adds nothing
    rec.__init__()
    k_slot = torch.tensor([5, -1, 0, -1])
    k_token, k_weight = torch.zeros(4, dtype=torch.long), torch.rand(4, generator=g)
    out = torch.zeros(1, D)
    with torch.no_grad():
        compute.decode(pool, x[:1], k_slot, k_token, k_weight, out)
    assert rec.shapes == [(2 * I, D), (D, I)] * 4 and rec.overlaps == 0 and rec.alive() == 0
    ref = _dense_reference(pool, x[:1], k_token, k_slot, k_weight, limit)
    assert (out - ref).abs().max() <= tol * ref.abs().max()


def _storage_bytes(tensors) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.slow  # the compiled plan (C++ kernels)
def test_the_engine_holds_packed_experts_only_as_the_plan_counts(compiled, tiny_ckpt, dtype):
    plan, _ = compiled
    engine = load_engine(plan, tiny_ckpt, device="cpu", dtype=dtype)  # the plan as compiled: its memory rows hold
    cfg, ex = engine.model.config, engine.executor
    session = engine.new_session()
    session.prefill(IDS[:40])
    session.decode(int(IDS[40]))
    held = [t for _, t in tensors_in(ex)]
    I, D = cfg.moe_intermediate_size, cfg.hidden_size
    expert_sized = [tuple(t.shape) for t in held if t.is_floating_point() and t.dim() >= 2
                    and tuple(t.shape[-2:]) in ((I, D), (2 * I, D), (D, I), (D, 2 * I))]
    assert not expert_sized, f"the executor holds dequantized expert weights: {expert_sized}"
    gpu0 = next(m for m in plan.memory if m.device == "gpu0").components
    hot = [t for le in ex.layers for t in vars(le.hot_pool).values()]
    assert _storage_bytes(hot) == gpu0["hot_experts"]
    staging = {id(p) for le in ex.layers for p in le.staging}
    assert len(staging) == 2  # one pair for the device, shared by its layers
    assert _storage_bytes([t for p in ex.layers[0].staging for t in vars(p).values()]) == gpu0["upload_staging"]
    engine.close()


# ----- item 2: cold experts are the checkpoint's mmap ----------------------------------------------
def _file_mappings(files: list[Path]) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of `files` (from /proc/self/maps)."""
    names = {str(f.resolve()) for f in files}
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5] in names:
            lo, hi = (int(a, 16) for a in parts[0].split("-"))
            ranges.append((lo, hi))
    return ranges


def _inside(t: torch.Tensor, ranges) -> bool:
    lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    return any(a <= lo and hi <= b for a, b in ranges)


@pytest.mark.slow  # the compiled plan (C++ kernels)
def test_cold_experts_are_views_of_the_memory_mapped_checkpoint(compiled, tiny_ckpt):
    """Each cold expert's bytes (and the CPU kernel's pointers) lie inside the mapped shard files:
    a copy (clone, contiguous of a strided view, a pinned copy) would live in anonymous memory."""
    engine = _engine(compiled, tiny_ckpt, "mixed")
    ranges = _file_mappings(sorted(Path(tiny_ckpt).glob("*.safetensors")))
    assert ranges, "the checkpoint's shards are not memory-mapped"
    fields = ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")
    n = 0
    for le in engine.executor.layers:
        assert len(le.cold) == le.cold_table.n_experts > 0
        for e, expert in enumerate(le.cold):
            assert isinstance(expert, PackedExpert)
            for j, name in enumerate(fields):
                t = getattr(expert, name)
                assert _inside(t, ranges), f"layer cold expert {e} {name} is a copy, not the checkpoint's bytes"
                assert le.cold_table.ptrs[6 * e + j] == t.data_ptr()  # the kernel reads those same bytes
                n += 1
        assert not any(_inside(t, ranges) for t in vars(le.hot_pool).values())  # the check tells a copy apart
    assert n == 6 * sum(len(le.cold) for le in engine.executor.layers)
    engine.close()


# ----- item 3: progress and resident memory ------------------------------------------------------
STATUS = """Name:\tpython
VmPeak:\t 9000 kB
VmHWM:\t    3000 kB
VmRSS:\t    2048 kB
RssAnon:\t    1024 kB
RssFile:\t     1000 kB
RssShmem:\t       24 kB
"""


def test_resident_memory_from_proc_status():
    assert parse_status(STATUS) == Resident(rss=2048 * 1024, peak=3000 * 1024, anon=1024 * 1024, file=1000 * 1024)
    with pytest.raises(ValueError, match="VmHWM"):
        parse_status(STATUS.replace("VmHWM", "VmXXX"))
    before = resident()
    assert before.rss > 0 and before.peak >= before.rss and before.anon + before.file <= before.rss
    block = torch.ones(64 * 2**20, dtype=torch.uint8)  # 64 MiB, touched
    after = resident()
    assert after.anon - before.anon >= 48 * 2**20 and after.peak >= before.rss + 48 * 2**20
    del block


@pytest.mark.slow  # the compiled plan (C++ kernels)
def test_load_progress_bars_on_stderr(compiled, tiny_ckpt, capsys):
    plan, _ = compiled
    L = len(plan.layers)
    placed = L + (plan.policy.speculative == "mtp")  # the MTP block's experts are placed like a layer's
    load_engine(plan, tiny_ckpt, device="cpu", progress=True).close()
    err = capsys.readouterr().err
    assert re.search(rf"placing experts: 100%.*{placed}/{placed}", err)
    assert re.search(rf"loading layers: 100%.*{L}/{L}", err)
    load_engine(plan, tiny_ckpt, device="cpu", progress=None).close()  # auto: stderr here is not a terminal
    assert "placing experts" not in capsys.readouterr().err


@pytest.mark.slow  # the compiled plan (C++ kernels)
def test_ostinato_run_prints_resident_memory_beside_the_plan(compiled, tiny_ckpt, capsys, monkeypatch):
    plan, work = compiled
    monkeypatch.chdir(work)
    assert run_main(["plan.yaml", "--model", str(tiny_ckpt), "--device", "cpu", "--prompt", "Hello",
                     "--max-new", "2"]) == 0
    out, err = capsys.readouterr()
    size = r"[0-9.]+ (?:MiB|GiB)"
    line = next(l for l in out.splitlines() if l.startswith("resident memory:"))
    assert re.fullmatch(rf"resident memory: RSS {size} \(anonymous {size}, mapped files {size}\), peak {size}; "
                        rf"plan: host {size} \+ gpu0 {size} = {size}", line), line
    assert "placing experts" not in err  # no bar when stderr is not a terminal
    mem = Resident(3 * 2**30, 4 * 2**30, 2 * 2**30, 2**30)
    assert resident_line(mem, plan, [torch.device("cpu")]).startswith(
        "resident memory: RSS 3.00 GiB (anonymous 2.00 GiB, mapped files 1.00 GiB), peak 4.00 GiB; plan: host ")
    assert resident_line(None, plan, [torch.device("cpu")]).startswith("resident memory: not available")
