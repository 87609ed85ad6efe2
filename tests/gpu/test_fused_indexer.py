"""The CSA indexer's fused score kernel (runtime/kernels/triton_indexer.py) on the GPU against torch's path, at
V4-Flash's indexer dims (64 heads of 128) on CUDA, and the static decode step's selection through it captured in a
CUDA graph against the same call run eagerly. On the CPU twin: the interpreter at small shapes, no capture."""

from __future__ import annotations

import pytest
import torch

from ostinato.runtime.model import indexer
from ostinato.runtime.model.static_decode.indexer import select_fixed

pytestmark = pytest.mark.gpu
CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
HEADS, HEAD_DIM = (64, 128) if CUDA else (4, 32)
SHAPES = ((1, 4096), (512, 4096)) if CUDA else ((1, 70), (17, 70))  # (queries T, index keys n)
DTYPES = (torch.float32, torch.bfloat16) if CUDA else (torch.float32,)  # bf16 is wrong in the interpreter


@pytest.fixture(autouse=True)
def fused_here(monkeypatch):
    """On the CPU twin the kernel runs in Triton's interpreter through the same calls."""
    if not CUDA:
        monkeypatch.setattr(indexer, "FUSED_SCORE_DEVICES", ("cuda", "cpu"))
    assert indexer.fuses_scores(DEVICE)


def _inputs(T: int, n: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, HEADS, HEAD_DIM, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(T, HEADS, generator=g) * HEADS ** -0.5).to(DEVICE)
    keys = torch.randn(n, HEAD_DIM, generator=g).to(dtype).to(DEVICE)
    return q, w, keys


def _torch_scores(q, w, keys):
    """The torch path of index_scores, in float32 on the same device (the kernel's products are exact in float32)."""
    s = torch.relu(torch.matmul(q.float(), keys.float().T)) * q.shape[-1] ** -0.5  # [T, HI, n]
    return (s * w.unsqueeze(-1)).sum(dim=1)  # [T, n]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T,n", SHAPES)
def test_fused_scores_match_torchs_path(T, n, dtype):
    from ostinato.runtime.kernels.triton_indexer import fused_index_scores

    q, w, keys = _inputs(T, n, dtype, seed=T + n)
    ref = _torch_scores(q, w, keys)
    visible = torch.randint(0, n + 1, (T,), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    got = fused_index_scores(q, w, keys, visible)
    hidden = torch.arange(n, device=DEVICE) >= visible[:, None]
    assert bool(torch.isneginf(got[hidden]).all()) and bool(torch.isfinite(got[~hidden]).all())
    scale = ref.abs().max().item()
    assert scale > 0
    # float32 sums over HI heads of exact products, in another order: a few ulps of the largest score
    assert (got[~hidden] - ref[~hidden]).abs().max().item() <= 1e-5 * scale


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_static_steps_selection_captured_picks_what_it_picks_eagerly(dtype):
    T, n = SHAPES[0]
    q, w, keys = _inputs(T, n, dtype, seed=7)
    row_ids = torch.arange(n, device=DEVICE)
    visible = torch.full((T,), n - 3, device=DEVICE)
    eager = select_fixed(q, w, keys, row_ids, visible, topk=64)
    if not CUDA:  # the CPU twin has no graphs: the eager call against the torch path's picks
        indexer.FUSED_SCORE_DEVICES = ("cuda",)
        try:
            torch_path = select_fixed(q, w, keys, row_ids, visible, topk=64)
        finally:
            indexer.FUSED_SCORE_DEVICES = ("cuda", "cpu")
        assert torch.equal(eager[0], torch_path[0]) and torch.equal(eager[1], torch_path[1])
        return
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the capture: Triton compiles and autotunes here
        select_fixed(q, w, keys, row_ids, visible, topk=64)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        picks, keep = select_fixed(q, w, keys, row_ids, visible, topk=64)
    q.copy_(_inputs(T, n, dtype, seed=8)[0])  # new queries in the captured buffers
    graph.replay()
    torch.cuda.synchronize()
    again = select_fixed(q, w, keys, row_ids, visible, topk=64)
    assert torch.equal(picks, again[0]) and torch.equal(keep, again[1])
    assert not torch.equal(picks, eager[0])  # the replay read the new queries
