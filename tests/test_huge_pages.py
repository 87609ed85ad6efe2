"""The CPU head's copy in 2 MB pages (runtime/model/huge_pages.py): the same values, aligned, its storage
exactly its bytes, backed by huge pages where the kernel gives them; a CPU engine's head is such a copy."""

from pathlib import Path

import pytest
import torch
from engine_helpers import _engine

from ostinato.checkpoint.reader import Checkpoint
from ostinato.runtime.model.huge_pages import HUGE_PAGE, in_huge_pages


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "unknown"
    return text.split("[")[1].split("]")[0] if "[" in text else "unknown"


def _anon_huge_kb(address: int) -> int:
    """AnonHugePages of the mapping holding `address` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.uint8])
def test_copy_is_equal_aligned_and_exact_in_size(dtype):
    g = torch.Generator().manual_seed(3)
    src = (torch.randn(3001, 40, generator=g) * 50).to(dtype)
    out = in_huge_pages(src)
    assert out.dtype == src.dtype and out.shape == src.shape and out.is_contiguous()
    assert torch.equal(out, src)
    assert out.data_ptr() % HUGE_PAGE == 0
    assert out.untyped_storage().nbytes() == src.numel() * src.element_size()  # held memory counts its bytes
    assert out.data_ptr() != src.data_ptr()
    src.zero_()
    assert out.abs().sum() > 0  # a copy, not a view


def test_strided_input_and_refusals():
    src = torch.arange(600, dtype=torch.float32).view(20, 30).t()  # not contiguous
    assert torch.equal(in_huge_pages(src), src)
    assert in_huge_pages(torch.empty(0, 8)).shape == (0, 8)
    with pytest.raises(ValueError, match="CPU tensor"):
        in_huge_pages(torch.empty(4, device="meta"))


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off here")
def test_backed_by_huge_pages_where_the_kernel_gives_them():
    out = in_huge_pages(torch.ones(3 * HUGE_PAGE // 4))  # 6 MB of float32: three whole huge pages
    assert _anon_huge_kb(out.data_ptr()) >= HUGE_PAGE // 1024


def test_cpu_engine_head_is_in_huge_pages(compiled, tiny_ckpt):
    engine = _engine(compiled, tiny_ckpt, "mixed")
    try:
        head = engine.model.weights.head
        assert head.data_ptr() % HUGE_PAGE == 0
        assert torch.equal(head, Checkpoint.open(tiny_ckpt).raw("head.weight"))  # as stored
    finally:
        engine.close()
