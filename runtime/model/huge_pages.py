"""A weight the CPU streams every step, copied once into memory the kernel backs with 2 MB pages.

The LM head is the largest thing a decode step reads (66 MB at the real-vocab preset, 1 GB at V4-Flash's
hidden size), all of it, every token. Read through 4 KB pages, each 2 MB of it costs 512 TLB misses and
page-table walks; in one 2 MB page, one. Measured (2-core AMD EPYC, transparent huge pages on 'madvise'),
the plan's head kernel over the same 66 MB alternately in 4 KB and in 2 MB pages, 200 calls each, two
runs: 12.75 against 14.49 GB/s and 14.04 against 15.90 (1.13-1.14x). The checkpoint's memory map cannot
have them (file pages), so a CPU engine copies its head at load into an anonymous mapping aligned to
2 MB with madvise(MADV_HUGEPAGE). Where the kernel gives none (THP 'never', a non-Linux mmap) the copy is
still correct, in small pages; nothing else changes.
"""

from __future__ import annotations

import ctypes
import mmap

import torch

HUGE_PAGE = 2 << 20


def in_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of CPU tensor `t` (same dtype and shape) in anonymous memory aligned to HUGE_PAGE and
    advised for huge pages. The tensor keeps its mapping alive; its storage is exactly its bytes."""
    if t.device.type != "cpu":
        raise ValueError(f"in_huge_pages: a CPU tensor, not one on {t.device}")
    nbytes = t.numel() * t.element_size()
    if nbytes == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):
        return t.clone(memory_format=torch.contiguous_format)
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    region = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    first = ctypes.c_char.from_buffer(region)
    offset = -ctypes.addressof(first) % HUGE_PAGE  # a multiple of the small page: madvise's start may be it
    del first  # a live export would pin the mapping's buffer
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE, offset, size)
    out = torch.frombuffer(region, dtype=t.dtype, count=t.numel(), offset=offset).view(t.shape)
    out.copy_(t)  # the first touch: the kernel backs the pages now
    return out
