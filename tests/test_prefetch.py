"""Reading a CPU engine's mapped checkpoint pages ahead at load (runtime/engine/prefetch.py)."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import time

import pytest
import torch
from safetensors.torch import save_file

from ostinato.runtime.engine import prefetch

PAGE = mmap.PAGESIZE
MADV_PAGEOUT = 21  # <sys/mman.h>, Linux 5.4
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc are Linux's")


def test_merge_and_within():
    assert prefetch.merge([(30, 40), (0, 10), (10, 20), (35, 50)]) == [(0, 20), (30, 50)]
    regions = [(5, 15), (18, 40)]
    assert prefetch.within([(0, 20), (30, 50)], regions) == [(5, 15), (18, 20), (30, 40)]
    assert prefetch.within([(100, 200)], regions) == []


def test_file_mappings_keep_regular_files_only(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f0000000000-7f0000100000 r--p 00000000 fe:00 1234 /models/m/model-00001-of-00002.safetensors\n"
        "7f0000200000-7f0000300000 rw-p 00000000 00:00 0 \n"
        "7f0000400000-7f0000401000 rw-p 00000000 00:00 0 [heap]\n"
        "7f0000500000-7f0000600000 r-xp 00000000 fe:00 99 /usr/lib/libc.so.6\n")
    assert prefetch.file_mappings(maps) == [(0x7f0000000000, 0x7f0000100000), (0x7f0000500000, 0x7f0000600000)]


def test_storage_ranges_cover_a_views_own_bytes_page_aligned():
    base = torch.zeros(8 * PAGE, dtype=torch.uint8)
    view = base[PAGE + 10:3 * PAGE + 5]
    [(lo, hi)] = prefetch.storage_ranges([view])
    assert lo <= view.data_ptr() and hi >= view.data_ptr() + view.numel() and lo % PAGE == 0 and hi % PAGE == 0
    assert hi - lo <= view.numel() + 2 * PAGE  # the view's pages, not its whole storage
    strided = base.view(8, PAGE)[:, :16]  # 8 rows of 16 bytes, a page apart: spans 7 pages and 16 bytes
    [(lo, hi)] = prefetch.storage_ranges([strided])
    assert hi - lo >= 7 * PAGE + 16 and hi - lo <= 9 * PAGE


def _mapped_tensor(tmp_path, n_bytes: int) -> torch.Tensor:
    """A tensor of arange values mapped from a safetensors file, its pages then dropped from the page cache
    (written back, MADV_PAGEOUT on the mapping, POSIX_FADV_DONTNEED on the file: safetensors reads them in
    when it maps), so that reading them in again is the prefetch's doing."""
    from safetensors import safe_open
    path = tmp_path / "t.safetensors"
    save_file({"w": torch.arange(n_bytes // 4, dtype=torch.float32)}, str(path))
    handle = safe_open(str(path), framework="pt", device="cpu")
    t = handle.get_tensor("w")
    t._handle = handle  # keep the mapping for the test's life
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
        for lo, hi in prefetch.storage_ranges([t]):
            _libc().madvise(lo, hi - lo, MADV_PAGEOUT)  # advice: where refused, the test skips
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return t


def _libc():
    libc = ctypes.CDLL(None)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    return libc


@linux_only
def test_prefetch_reads_the_mapped_bytes_only_and_leaves_values(tmp_path):
    mapped = _mapped_tensor(tmp_path, 64 * PAGE)
    if not prefetch.within(prefetch.storage_ranges([mapped]), prefetch.merge(prefetch.file_mappings())):
        pytest.skip("this safetensors copies tensors out of its file instead of mapping them")
    if _resident_share(mapped) > 0.5:
        pytest.skip("the kernel kept the file's pages cached (no MADV_PAGEOUT?): nothing for the prefetch to read")
    anonymous = torch.ones(64 * PAGE // 4)
    advised = prefetch.prefetch_mapped([mapped, anonymous])
    assert 64 * PAGE <= advised <= 66 * PAGE  # the mapped tensor's pages; the anonymous one is not advised
    assert prefetch.prefetch_mapped([anonymous]) == 0
    deadline = time.time() + 10
    while _resident_share(mapped) < 1.0 and time.time() < deadline:  # the reads run on a thread of their own
        time.sleep(0.05)
    assert _resident_share(mapped) == 1.0
    assert torch.equal(mapped, torch.arange(mapped.numel(), dtype=torch.float32))


@linux_only
def test_prefetch_is_skipped_and_says_so_when_memory_is_short(tmp_path, monkeypatch, capsys):
    mapped = _mapped_tensor(tmp_path, 16 * PAGE)
    if not prefetch.within(prefetch.storage_ranges([mapped]), prefetch.merge(prefetch.file_mappings())):
        pytest.skip("this safetensors copies tensors out of its file instead of mapping them")
    monkeypatch.setattr(prefetch, "available_bytes", lambda: PAGE)
    assert prefetch.prefetch_mapped([mapped]) == 0
    assert "not reading ahead" in capsys.readouterr().err


def _resident_share(t: torch.Tensor) -> float:
    [(lo, hi)] = prefetch.storage_ranges([t])
    pages = (hi - lo) // PAGE
    vec = ctypes.create_string_buffer(pages)
    assert _libc().mincore(lo, hi - lo, vec) == 0
    return sum(b & 1 for b in vec.raw) / pages


@linux_only
def test_a_cpu_engine_reads_ahead_its_embedding_and_cold_experts(compiled, tiny_ckpt, monkeypatch):
    from engine_helpers import _engine

    from ostinato.runtime.engine import loader
    seen = []
    monkeypatch.setattr(loader, "prefetch_mapped", lambda tensors: seen.extend(tensors) or 0)
    engine = _engine(compiled, tiny_ckpt, "mixed")
    pointers = {t.data_ptr() for t in seen}
    assert engine.model.weights.embed.data_ptr() in pointers
    cold = [lx.cold[e] for lx in engine.executor.layers for e in range(len(lx.cold)) if lx.cold_of[e] >= 0]
    assert cold and all(any(getattr(c, f).data_ptr() in pointers for f in ("w1", "w2", "w3")) for c in cold)
