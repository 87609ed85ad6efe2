"""Host rows of experts in pinned memory: one arena per NUMA node, not one pinned allocation per tensor.

With GPUs the cold experts are DMA sources (upload mode, the cold bridges), so they are page-locked.
Pinning each tensor separately (what the loader did) is one cudaHostAlloc per tensor -- 6 per cold
expert: 35,892 for the checked-in 4x4090D V4-Flash plan, 66,048 with every expert cold -- each
rounded up to a power of two by torch's pinned allocator, and every page lands on the NUMA node of
the loading thread. Here each node gets one anonymous mapping, filled (first-touched, so placed) by a
thread bound to that node's CPUs, then page-locked in place once by `pin` (no copy, no rounding).
The runtime gets views with the dtypes and shapes the checkpoint's `PackedExpert`s have.

Layout: a node's arena holds its experts in (layer, expert) order, each expert's six tensors in
PackedExpert field order, each tensor at a multiple of ALIGN bytes from the page-aligned base.
MXFP4 tensors of real models (and the tiny ones) are multiples of 64 bytes, so there is no padding
and the arenas together hold exactly the plan's host rows of experts: `cold_experts`, plus
`hot_expert_rows` when the engine re-places between turns (the loader then pins the hot experts' rows
too: they are DMA sources once evicted or re-promoted, engine/adapter.py).

Split rule: the experts given (the cold ones, and the hot ones of re-placing layers), counted in
(layer, expert) order over all layers, go round-robin over the nodes (the i-th to node i mod n). Each
layer's cold experts thus alternate between the nodes, so
the CPU kernel computing one layer reads from every node's memory channels, and the arenas differ
by at most one expert.

Without a GPU the loader does not come here: the cold experts stay views of the checkpoint's mmap
(no copy), so a CPU run holds them once, in the page cache.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from ostinato.checkpoint.reader import PackedExpert

ALIGN = 64                                   # bytes: a cache line (the CPU kernel), and what DMA engines like
NODE_ROOT = Path("/sys/devices/system/node")  # Linux's NUMA nodes: node<N>/cpulist
_FIELDS = tuple(f.name for f in fields(PackedExpert))
_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every GPU's context, not only the registering thread's


@dataclass(frozen=True)
class NumaNode:
    id: int               # N of /sys/devices/system/node/node<N>
    cpus: frozenset[int]  # the CPUs of the node this process may run on


def parse_cpulist(text: str) -> list[int]:
    """The kernel's cpulist format: '0-3,8-11' -> [0, 1, 2, 3, 8, 9, 10, 11]; '' (no CPUs) -> []."""
    cpus = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi if dash else lo)
        except ValueError:
            raise ValueError(f"not a cpulist: {text!r} (want ranges like '0-3,8-11')") from None
        if first < 0 or last < first:
            raise ValueError(f"not a cpulist: {text!r} (range {part!r} is empty or negative)")
        cpus.extend(range(first, last + 1))
    return cpus


def numa_nodes(root: Path = NODE_ROOT) -> list[NumaNode]:
    """The NUMA nodes this process can place memory on, by id, each with its allowed CPUs. Nodes with none
    (memory-only nodes, or ones a taskset/cpuset excludes) are left out: no thread of ours can
    first-touch there. No `root` folder (no NUMA support): one node, all allowed CPUs."""
    allowed = frozenset(os.sched_getaffinity(0))
    nodes = []
    for path in sorted(root.glob("node[0-9]*/cpulist"), key=lambda p: int(p.parent.name[len("node"):])):
        cpus = frozenset(parse_cpulist(path.read_text())) & allowed
        if cpus:
            nodes.append(NumaNode(int(path.parent.name[len("node"):]), cpus))
    return nodes or [NumaNode(0, allowed)]


def pinning(devices: list[torch.device]) -> bool:
    """Whether cold experts go into pinned arenas: when a GPU runs layers (it DMAs from them). Tests
    replace it to run the pinned path on the CPU."""
    return any(d.type == "cuda" for d in devices)


def pin(buffer: torch.Tensor) -> torch.Tensor:
    """`buffer` (contiguous host memory) page-locked in place for DMA, returned. cudaHostRegister, not
    torch's pinned allocator, which copies into a new allocation rounded up to a power of two (a 40 GB
    arena would lock 64 GB). Unregistered when its storage is freed (every view gone), before the
    memory is unmapped. The one place arenas are pinned: tests replace it with an identity."""
    ptr = buffer.data_ptr()
    err = int(torch.cuda.cudart().cudaHostRegister(ptr, buffer.nbytes, _PORTABLE))
    if err != 0:
        raise RuntimeError(f"cudaHostRegister returned CUDA error {err} (2: out of memory; is the locked-memory "
                           f"limit, ulimit -l, or the host's free memory too small?)")
    weakref.finalize(buffer.untyped_storage(), _unpin, ptr)
    return buffer


def _unpin(ptr: int) -> None:
    try:
        torch.cuda.cudart().cudaHostUnregister(ptr)
    except Exception:  # at interpreter exit CUDA may be gone already; the pages go with the process
        pass


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _tensors(expert: PackedExpert) -> list[torch.Tensor]:
    return [getattr(expert, name) for name in _FIELDS]


def expert_span(expert: PackedExpert) -> int:
    """Bytes one expert takes in an arena: its six tensors, each rounded up to ALIGN."""
    return sum(_aligned(t.nbytes) for t in _tensors(expert))


def layout(layers: list[list[PackedExpert]], n_nodes: int) -> tuple[list[list[tuple[int, int]]], list[int]]:
    """(node index, byte offset) of each expert of each layer, by the split rule (module doc); each
    node's arena size in bytes."""
    sizes = [0] * n_nodes
    where = []
    i = 0
    for experts in layers:
        row = []
        for expert in experts:
            k = i % n_nodes
            row.append((k, sizes[k]))
            sizes[k] += expert_span(expert)
            i += 1
        where.append(row)
    return where, sizes


def _allocate(nbytes: int, node: NumaNode) -> torch.Tensor:
    """[nbytes] uint8 of fresh anonymous memory: page-aligned, and no page placed before it is first written."""
    try:
        mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    except OSError as e:
        raise RuntimeError(f"could not allocate NUMA node {node.id}'s cold-expert arena ({nbytes:,d} bytes, "
                           f"{nbytes / 2**30:.2f} GiB): {e}") from e
    try:  # 2 MiB pages: 512x fewer faults while filling, fewer TLB misses in the CPU kernel; optional
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):
        pass
    return torch.frombuffer(mapping, dtype=torch.uint8)  # the storage holds the mapping until its last view goes


def _fill(buffer: torch.Tensor, node: NumaNode, jobs: list[tuple[int, PackedExpert]],
          progress: Callable[[int], None]) -> None:
    """Copy `jobs` (offset, expert) into `buffer` from a thread on `node`'s CPUs, then pin it. Linux
    places a page on the node of the CPU that first writes it. memmove: one plain copy per tensor
    that releases the GIL (torch's copy_ would fan out to intra-op threads not bound to the node)."""
    os.sched_setaffinity(0, node.cpus)  # 0: this thread only
    base = buffer.data_ptr()
    for offset, expert in jobs:
        for t in _tensors(expert):
            src = t.contiguous()  # the checkpoint's tensors are contiguous: no copy
            ctypes.memmove(base + offset, src.data_ptr(), src.nbytes)
            offset += _aligned(src.nbytes)
        progress(expert.nbytes)
    try:
        pin(buffer)
    except Exception as e:
        raise RuntimeError(f"could not page-lock NUMA node {node.id}'s cold-expert arena ({buffer.nbytes:,d} bytes, "
                           f"{buffer.nbytes / 2**30:.2f} GiB) for DMA to the GPUs: {e}") from e


def _views(buffer: torch.Tensor, offset: int, expert: PackedExpert) -> PackedExpert:
    out = []
    for t in _tensors(expert):
        out.append(buffer[offset:offset + t.nbytes].view(t.dtype).view(t.shape))
        offset += _aligned(t.nbytes)
    return PackedExpert(*out)


def pinned_experts(layers: list[list[PackedExpert]], nodes: list[NumaNode] | None = None,
                   progress: Callable[[int], None] | None = None) -> list[list[PackedExpert]]:
    """The experts of each layer copied into one pinned arena per NUMA node (`nodes`, default this
    machine's), as views of the same dtypes and shapes, in the same order. `progress(bytes)` is called
    as experts are copied (from the nodes' threads, one call at a time)."""
    nodes = numa_nodes() if nodes is None else nodes
    where, sizes = layout(layers, len(nodes))
    buffers = [_allocate(n, node) if n else None for n, node in zip(sizes, nodes)]  # a node may get no expert
    jobs = [[] for _ in nodes]
    for row, experts in zip(where, layers):
        for (k, offset), expert in zip(row, experts):
            jobs[k].append((offset, expert))
    lock = threading.Lock()

    def report(nbytes: int) -> None:
        if progress is not None:
            with lock:
                progress(nbytes)

    active = [k for k, b in enumerate(buffers) if b is not None]
    with ThreadPoolExecutor(max_workers=max(1, len(active)), thread_name_prefix="ostinato-arena") as pool:
        futures = [pool.submit(_fill, buffers[k], nodes[k], jobs[k], report) for k in active]
        for f in futures:
            f.result()  # the first node's error, after every node is done
    return [[_views(buffers[k], offset, expert) for (k, offset), expert in zip(row, experts)]
            for row, experts in zip(where, layers)]
