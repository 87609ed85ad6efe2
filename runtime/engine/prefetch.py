"""A CPU engine's mapped checkpoint pages read in at load (madvise MADV_POPULATE_READ), not on first touch.

On the CPU the routed experts' rows and the token embedding are views of the memory-mapped checkpoint (no copy:
the page cache is their host memory, held_memory.py). A page is read from disk the first time a route or
a token touches it: a major fault in the middle of a decode step or a tool output's prefill. Measured on a
V4-Flash slice (4 layers, 32 experts, 2.7 GB of mapped experts and embedding; 2-core AMD EPYC, virtual
disk): a new token's embedding row took 27-68 ms to read where a resident one takes 0.01 ms, 40 ms of a
250 ms decode step in the profile, and a first 64-token prefill took 188 major faults. llama.cpp reads
ahead its whole mapped model the same way by default.

The reads run on a thread of their own while the engine goes on loading (the first steps may still wait on
a page not read yet). They are skipped, with a line on stderr, when the mapped bytes exceed the memory the
kernel reports available: reading them all would evict what the engine is about to use. Linux only
(elsewhere a no-op).

Legend: ranges are (start, end) byte addresses, page-aligned.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

import torch

MADV_POPULATE_READ = 22  # <sys/mman.h>, Linux 5.14 (Python 3.11's mmap does not name it)
WILLNEED_BYTES = 128 * 1024  # the fallback's advice a call: a typical block device's window (read_ahead_kb 128)


def file_mappings(maps: str | Path = "/proc/self/maps") -> list[tuple[int, int]]:
    """The process's mappings of regular files (a path, not [heap] / [stack] / anonymous), as ranges."""
    out = []
    for line in Path(maps).read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/") and parts[4] != "0":
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi))
    return sorted(out)


def storage_ranges(tensors: Iterable[torch.Tensor]) -> list[tuple[int, int]]:
    """The page-aligned byte ranges of the CPU tensors' own bytes, merged where they touch or overlap."""
    page = mmap.PAGESIZE
    spans = []
    for t in tensors:
        if t.device.type != "cpu" or t.numel() == 0:
            continue
        start = t.data_ptr()  # the view's first element; it reaches as far as its strides do
        end = start + (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))) * t.element_size()
        spans.append((start - start % page, -(-end // page) * page))
    return merge(spans)


def merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def within(spans: list[tuple[int, int]], regions: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of `spans` inside `regions` (both sorted and merged)."""
    out, j = [], 0
    for lo, hi in spans:
        while j < len(regions) and regions[j][1] <= lo:
            j += 1
        k = j
        while k < len(regions) and regions[k][0] < hi:
            a, b = max(lo, regions[k][0]), min(hi, regions[k][1])
            if a < b:
                out.append((a, b))
            k += 1
    return out


def available_bytes(meminfo: str | Path = "/proc/meminfo") -> int | None:
    for line in Path(meminfo).read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def prefetch_mapped(tensors: Iterable[torch.Tensor]) -> int:
    """Start reading the file-mapped bytes of `tensors` in -> those bytes (0: none, or skipped: see the
    module docstring)."""
    if not sys.platform.startswith("linux"):
        return 0
    ranges = within(storage_ranges(tensors), merge(file_mappings()))
    total = sum(hi - lo for lo, hi in ranges)
    if total == 0:
        return 0
    available = available_bytes()
    if available is not None and total > available:
        print(f"ostinato: not reading ahead the {total / 2**30:.1f} GiB of mapped checkpoint the CPU computes "
              f"from: only {available / 2**30:.1f} GiB is available (their pages load on first use)",
              file=sys.stderr, flush=True)
        return 0
    threading.Thread(target=_populate, args=(ranges,), name="ostinato-prefetch", daemon=True).start()
    return total


def _populate(ranges: list[tuple[int, int]]) -> None:
    """Fault every page of `ranges` in (MADV_POPULATE_READ, Linux 5.14+: reads what is not cached, blocking
    this thread only); on older kernels, WILLNEED a readahead window at a time (the kernel caps one call's
    readahead at the device's window, so one call over the whole range reads only its first megabytes)."""
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    for lo, hi in ranges:
        if madvise(lo, hi - lo, MADV_POPULATE_READ) == 0:
            continue
        for start in range(lo, hi, WILLNEED_BYTES):  # advice: a failure only means no read-ahead
            madvise(start, min(WILLNEED_BYTES, hi - start), mmap.MADV_WILLNEED)
