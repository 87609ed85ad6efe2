"""The fused indexer score kernel (runtime/kernels/triton_indexer.py) against the torch path of
runtime/model/indexer.py `index_scores` (float32), in Triton's interpreter (conftest sets TRITON_INTERPRET=1
without a GPU): fresh random inputs in float32 and float16, odd shapes (one query, queries not a whole
block, fewer rows than a block, no rows, one head and V4-Flash's 64, dI 64 and 128), the visibility mask,
and the picks top-k then makes; the wiring (the prefill's `select` and the static decode step's
`select_fixed` score through the kernel where it runs); and real compiles for sm_90 and sm_89 at
V4-Flash's shapes (HI = 64, dI = 128) with the argument types the launcher passes.
Legend: T queries, HI indexer heads, dI index head dim, n rows of K, k picks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ostinato.runtime.kernels import triton_indexer
from ostinato.runtime.kernels.triton_indexer import BLOCK_T, block_d, fused_index_scores
from ostinato.runtime.model import indexer
from ostinato.runtime.model.indexer import SCORE_BLOCK_ELEMENTS, index_scores, score_block, select, top_k_earliest
from ostinato.runtime.model.static_decode.indexer import select_fixed

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "tools" / "triton_compile_check.py"
KERNEL = ROOT / "runtime" / "kernels" / "triton_indexer_kernel.py"
PINNED_PYTHON = ROOT / "build" / "triton-3.6" / "bin" / "python"  # the GPU machine's Triton (tools/setup_triton_pin.sh)
ARCHS = (90, 89)  # H200 / H100, RTX 4090
WARP_SIZE = 32
FLASH_HI, FLASH_DI = 64, 128  # V4-Flash's index_n_heads, index_head_dim
TOLERANCE = 1e-5  # of the scores' scale: float32 sums over dI and HI in another order


def _inputs(T: int, HI: int, dI: int, n: int, dtype: torch.dtype, seed: int):
    """Queries and keys in `dtype`, head weights float32 of both signs (the model's are), visible [T] from 0
    (nothing complete) to past n."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, HI, dI, generator=g).to(dtype)
    keys = torch.randn(n, dI, generator=g).to(dtype)
    weights = torch.randn(T, HI, generator=g) * HI ** -0.5
    visible = torch.randint(0, n + 2, (T,), generator=g)
    return q, weights, keys, visible


def _torch_scores(q, weights, keys, visible=None) -> torch.Tensor:
    s = index_scores(q, weights, keys)  # the CPU's torch path: [T, n] float32
    return s if visible is None else s.masked_fill(torch.arange(keys.shape[0]) >= visible[:, None], float("-inf"))


def _assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(torch.isinf(got), torch.isinf(want)), "the -inf mask differs"
    finite = torch.isfinite(want)
    if finite.any():
        diff = (got[finite] - want[finite]).abs().max()
        assert diff <= TOLERANCE * max(want[finite].abs().max(), 1.0), f"max abs diff {diff}"


# (T, HI, dI, n): one query and one row; T past a 16-query block, fewer rows than a block; T past a 64-query
# block and rows past a block, at dI 64 (a real-vocab preset's); one head
SHAPES = [(1, 3, 128, 1), (17, 4, 128, 5), (70, 2, 64, 130), (5, 1, 128, 70)]


@pytest.mark.parametrize("masked", [False, True], ids=["scores", "masked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}-HI{}-dI{}-n{}".format(*s))
def test_fused_scores_match_the_torch_path(shape, dtype, masked):
    q, weights, keys, visible = _inputs(*shape, dtype, seed=sum(shape))
    vis = visible if masked else None
    want = _torch_scores(q, weights, keys, vis)
    assert (want[torch.isfinite(want)] != 0).any()  # a relu'd-away or all-masked case would prove nothing
    _assert_close(fused_index_scores(q, weights, keys, vis), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("T", [1, 33])
@pytest.mark.slow  # Triton's interpreter: 64 heads' dots per program
def test_flash_heads_match_the_torch_path(T, dtype):
    """V4-Flash's 64 heads of dI 128, a decode token and a prefill's queries (not a whole block)."""
    q, weights, keys, visible = _inputs(T, FLASH_HI, FLASH_DI, 70, dtype, seed=T)
    _assert_close(fused_index_scores(q, weights, keys, visible), _torch_scores(q, weights, keys, visible))


def test_no_rows_or_no_queries_give_empty_scores():
    for T, n in ((3, 0), (0, 4)):
        q, weights, keys, visible = _inputs(T, 2, 128, n, torch.float32, seed=0)
        got = fused_index_scores(q, weights, keys, visible)
        assert got.shape == (T, n) and got.dtype == torch.float32


def test_bad_inputs_are_refused():
    q, weights, keys, visible = _inputs(3, 2, 128, 4, torch.float32, seed=0)
    with pytest.raises(ValueError, match=r"keys \(4, 64\) .* do not match"):
        fused_index_scores(q, weights, keys[:, :64])
    with pytest.raises(ValueError, match=r"weights \(3, 1\)"):
        fused_index_scores(q, weights[:, :1], keys)
    with pytest.raises(ValueError, match="q is torch.float64"):
        fused_index_scores(q.double(), weights, keys)
    with pytest.raises(ValueError, match=r"visible must be \[T\] = \[3\] integers"):
        fused_index_scores(q, weights, keys, visible.float())


def _rows_without_near_ties(scores: torch.Tensor, k: int) -> torch.Tensor:
    """[T] bool: the k + 1 best finite scores of the row are apart by more than the tolerance (the -inf of
    masked rows tie exactly in both paths, broken by index in both)."""
    best = scores.sort(dim=-1, descending=True).values[:, :k + 1]  # [T, k+1]
    gaps = best[:, :-1] - best[:, 1:]  # [T, k]
    finite = torch.isfinite(best[:, 1:])
    return ((gaps > 4 * TOLERANCE * scores[torch.isfinite(scores)].abs().max()) | ~finite).all(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_top_k_picks_the_same_entries(dtype):
    """top_k_earliest on the fused scores picks what it picks on torch's, in the same order, wherever the
    scores have no near-tie at the top; most rows have none (the check is not vacuous)."""
    q, weights, keys, visible = _inputs(40, 8, 128, 90, dtype, seed=11)
    want = _torch_scores(q, weights, keys, visible)
    got = fused_index_scores(q, weights, keys, visible)
    k = 16
    clear = _rows_without_near_ties(want, k)
    assert clear.float().mean() > 0.9
    assert torch.equal(top_k_earliest(got, k)[clear], top_k_earliest(want, k)[clear])


@pytest.fixture
def fused_on_cpu(monkeypatch):
    """The model's indexer takes its GPU path on the CPU: scores come from the kernel, in the interpreter."""
    monkeypatch.setattr(indexer, "FUSED_SCORE_DEVICES", ("cpu",))
    calls = []
    kernel = triton_indexer.index_scores_kernel

    class Counting:
        def __getitem__(self, grid):
            calls.append(grid)
            return kernel[grid]

    monkeypatch.setattr(triton_indexer, "index_scores_kernel", Counting())
    return calls


def test_the_selections_score_through_the_kernel(fused_on_cpu):
    """select (prefill) and select_fixed (the static decode step) pick the torch path's entries with the
    kernel's scores, one launch per block of queries; the fused path blocks [Tb, n] only (HI times as
    many queries a block as the torch path's [Tb, HI, n])."""
    T, HI, n, ratio, topk = 24, 4, 40, 4, 8
    q, weights, keys, _ = _inputs(T, HI, 128, n, torch.float32, seed=5)
    positions = torch.arange(100, 100 + T) * 2  # visible from 50 (all 40 rows) down: some rows masked
    positions[:6] = torch.tensor([0, 3, 7, 20, 40, 60])  # none, 1, 2, 5, 10, 15 complete entries
    visible = (positions + 1) // ratio
    with pytest.MonkeyPatch.context() as m:  # the reference: the torch path
        m.setattr(indexer, "FUSED_SCORE_DEVICES", ())
        clear = _rows_without_near_ties(_torch_scores(q, weights, keys, visible), topk)
        want = select(q, weights, keys, positions, ratio, topk)
        want_fixed = select_fixed(q, weights, keys, torch.arange(n), visible, topk)
    assert not fused_on_cpu
    got = select(q, weights, keys, positions, ratio, topk)
    assert len(fused_on_cpu) == 1
    got_fixed = select_fixed(q, weights, keys, torch.arange(n), visible, topk)
    assert len(fused_on_cpu) == 2
    assert clear.float().mean() > 0.9
    assert torch.equal(got[clear], want[clear])
    assert torch.equal(got_fixed[0][clear], want_fixed[0][clear]) and torch.equal(got_fixed[1], want_fixed[1])
    assert score_block(64, 1000, torch.device("cpu")) == SCORE_BLOCK_ELEMENTS // 1000


def test_the_cpu_keeps_the_torch_path():
    assert score_block(64, 1000, torch.device("cpu")) == indexer.CPU_SCORE_BLOCK_ELEMENTS // (64 * 1000)
    assert not indexer.fuses_scores(torch.device("cpu")) and indexer.fuses_scores(torch.device("cuda"))


# --- real compiles for the GPUs (tools/triton_compile_check.py, in a subprocess without TRITON_INTERPRET)

class _Recorder:
    """Stands in for the kernel: keeps the argument types and launch options fused_index_scores passes."""

    def __getitem__(self, grid):
        return self

    def __call__(self, *args, num_warps, **constexprs):
        types = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int64: "i64"}
        self.signature = [f"*{types[a.dtype]}" if isinstance(a, torch.Tensor) else "fp32" if isinstance(a, float)
                          else "i32" for a in args] + ["constexpr"] * len(constexprs)
        # integers the V4-Flash shapes make multiples of 16, which Triton's launcher specializes as such
        self.divisible = [i for i, a in enumerate(args) if type(a) is int and a % 16 == 0]
        self.constexprs, self.num_warps = constexprs, num_warps


def flash_jobs(monkeypatch) -> list[dict]:
    """One job per (activation dtype, query block, arch): V4-Flash's indexer at a decode token and a prefill
    over 4,096 rows, as the launcher passes it (tensors on the meta device standing in for CUDA)."""
    jobs = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for T in (1, 512):
            rec = _Recorder()
            monkeypatch.setattr(triton_indexer, "index_scores_kernel", rec)
            q = torch.empty(T, FLASH_HI, FLASH_DI, dtype=dtype, device="meta")
            keys = torch.empty(4096, FLASH_DI, dtype=dtype, device="meta")
            fused_index_scores(q, torch.empty(T, FLASH_HI, device="meta"), keys,
                               torch.empty(T, dtype=torch.int64, device="meta"))
            jobs += [{"label": f"indexer {dtype} T={T}", "path": str(KERNEL), "kernel": "index_scores_kernel",
                      "signature": rec.signature, "divisible": rec.divisible, "constexprs": rec.constexprs,
                      "options": {"num_warps": rec.num_warps}, "arch": arch, "dtype": dtype} for arch in ARCHS]
    return jobs


def test_launcher_passes_the_flash_shapes(monkeypatch):
    jobs = flash_jobs(monkeypatch)
    assert {j["constexprs"]["BT"] for j in jobs} == set(BLOCK_T) and {j["constexprs"]["BD"] for j in jobs} == {128}
    assert all(j["constexprs"]["MASKED"] for j in jobs) and block_d(64) == 64 and block_d(8) == 16


@pytest.fixture(scope="module", params=["venv", "pinned"])
def compiled(request, tmp_path_factory):
    """(jobs, results) of one Triton: the .venv's or the pinned one of the GPU machine."""
    python = sys.executable if request.param == "venv" else PINNED_PYTHON
    if not Path(python).exists():
        pytest.skip(f"no pinned Triton at {PINNED_PYTHON}: run bash tools/setup_triton_pin.sh")
    with pytest.MonkeyPatch.context() as m:
        jobs = flash_jobs(m)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")}
    env["TRITON_HOME"] = str(tmp_path_factory.mktemp(request.param))
    sent = [{k: v for k, v in j.items() if k != "dtype"} for j in jobs]
    run = subprocess.run([str(python), str(CHECK)], input=json.dumps(sent), capture_output=True, text=True, env=env,
                         timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    return jobs, json.loads(run.stdout)


@pytest.mark.slow  # Triton compiles the kernel for two GPU targets, in a subprocess
def test_compiles_for_the_gpus(compiled):
    """PTX for the target and a cubin for every job; fp16 / bf16 dots on tensor cores in their dtype, float32
    dots not on tf32 ones (IEEE: the torch path's products); no register spills; each program stores its
    BT x BN float32 scores once (32 bits a score over its threads) and nothing else: no [T, HI, n] tensor."""
    bad = []
    for job, res in zip(*compiled, strict=True):
        name = f"{job['label']} sm_{job['arch']} (triton {res['triton']})"
        if res["error"] or not res["ptx_entry"] or not str(res["ptx_target"]).startswith(f"sm_{job['arch']}") \
                or not res["cubin_bytes"]:
            bad.append(f"{name}: {res['error'] or res}")
            continue
        operand = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: None}[job["dtype"]]
        mma_ok = all(op.endswith((f".{operand}.{operand}", f".{operand}.{operand}.f32")) for op in res["mma"]) \
            if operand else not res["mma"]
        if not mma_ok or (operand and not res["mma"]):
            bad.append(f"{name}: tensor-core ops {res['mma']}")
        if res["spill_bytes"] != 0:
            bad.append(f"{name}: {res['spill_bytes']} bytes spilled")
        c = job["constexprs"]
        want_bits = c["BT"] * c["BN"] * 32 // (WARP_SIZE * job["options"]["num_warps"])
        if _stored_bits(res["stores"]) != want_bits:
            bad.append(f"{name}: stores {res['stores']}, want {want_bits} bits a thread")
    assert not bad, "\n".join(bad)


def _stored_bits(stores: dict[str, int]) -> int:
    """Bits one thread stores, from {PTX store opcode: count}: st.global.v4.b32 stores 4 x 32."""
    bits = 0
    for op, count in stores.items():
        vector = re.search(r"\.v(\d)\.", op)
        bits += count * (int(vector.group(1)) if vector else 1) * int(re.search(r"(\d+)$", op).group(1))
    return bits
