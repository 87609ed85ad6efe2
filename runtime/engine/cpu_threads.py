"""How many threads the cold-expert CPU kernel gets on this machine: the plan's, clamped to what is here.

A plan's `policy.cpu_threads` is its hardware spec's core count (96 for an H200 box), but the plan may
run on a smaller machine, and with a GPU two threads must stay free: the one launching the device
work (or replaying graphs) and the CUDA driver's host-function thread that runs the decode graph's
cold-expert nodes. An oversubscribed kernel stalls both, so each waits for a time slice.
On the CPU-only path the launching thread computes the "device" half itself, but it only waits
for the cold half after its own part is done, so no core is held back there.

Decode-sized calls (a decode step's, a batched decode step's, the MTP draft's and the verify step's) run on
fewer: the plan's `policy.decode_cpu_threads`, what its cost model found enough to read a step's few cold
experts at the memory's rate without paying every core's hand-off (compiler/cost_model/pool_threads.py),
within the clamped pool. A plan without it runs them on the whole pool.
"""

from __future__ import annotations

from typing import NamedTuple

from ostinato.host import usable_cores

GPU_RESERVED = 2  # the launching thread + the CUDA host-function thread


class CpuThreads(NamedTuple):
    threads: int   # what the kernel gets
    planned: int   # the plan's policy.cpu_threads
    cores: int     # cores this process may run on
    reserved: int  # cores kept free for the launching and host-function threads
    decode: int    # what the kernel gets in decode-sized calls: the plan's decode threads, within `threads`

    def describe(self) -> str:
        decode = f", {self.decode} in decode steps" if self.decode != self.threads else ""
        if self.threads == self.planned:
            return f"cpu threads {self.threads}{decode}"
        kept = f" less {self.reserved} for the launching and CUDA host-function threads" if self.reserved else ""
        return (f"cpu threads {self.threads}{decode} (plan: {self.planned}; clamped to this machine's {self.cores} "
                f"cores{kept})")


def cpu_threads(planned: int, cuda: bool, cores: int | None = None, decode: int | None = None) -> CpuThreads:
    """`planned`: the plan's policy.cpu_threads; `decode`: its policy.decode_cpu_threads (None: the whole pool)."""
    cores = usable_cores() if cores is None else cores
    reserved = GPU_RESERVED if cuda else 0
    threads = max(1, min(planned, cores - reserved))
    return CpuThreads(threads, planned, cores, reserved, threads if decode is None else min(decode, threads))
