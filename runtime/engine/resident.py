"""What this process holds in memory, from /proc/self/status (Linux), beside what the plan counts.

    mem = resident()              # Resident(rss, peak, anon, file) in bytes, or None off Linux
    print(resident_line(mem, engine.plan, engine.devices))

`rss` is VmRSS (resident now), `peak` VmHWM (the high-water mark of rss since the process started),
`anon` RssAnon (memory the process allocated: copies, caches, buffers) and `file` RssFile (pages of
mapped files that are resident: the memory-mapped checkpoint's pages read so far, which the kernel
can drop and read again, plus the libraries). The process's peak covers everything it did before,
so call it right after loading for the load's peak.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

STATUS = Path("/proc/self/status")
_FIELDS = {"VmRSS": "rss", "VmHWM": "peak", "RssAnon": "anon", "RssFile": "file"}


class Resident(NamedTuple):
    rss: int    # bytes resident now
    peak: int   # the high-water mark of rss
    anon: int   # resident anonymous memory
    file: int   # resident file-backed pages (mmap'd checkpoint shards, libraries)


def parse_status(text: str) -> Resident:
    """The fields of a /proc/<pid>/status text ("VmRSS:  1234 kB" lines) -> bytes."""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in _FIELDS:
            number, unit = rest.split()
            if unit != "kB":
                raise ValueError(f"{key}: unexpected unit {unit!r} in /proc status")
            values[_FIELDS[key]] = int(number) * 1024
    missing = [k for k, v in _FIELDS.items() if v not in values]
    if missing:
        raise ValueError(f"/proc status has no {', '.join(missing)}")
    return Resident(**values)


def resident(status: Path = STATUS) -> Resident | None:
    """This process's resident memory now (None where /proc is not there: not Linux)."""
    try:
        return parse_status(status.read_text())
    except OSError:
        return None


def size(n: int) -> str:
    """Bytes for people: GiB from 1 GiB up, else MiB."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def plan_line(plan) -> str:
    """The plan's memory totals: 'host X + gpu0 Y = Z' (its usable bytes are not counted)."""
    rows = sorted(plan.memory, key=lambda m: m.device != "host")  # host first, then gpu0..
    total = sum(m.total_bytes for m in rows)
    return " + ".join(f"{m.device} {size(m.total_bytes)}" for m in rows) + f" = {size(total)}"


def resident_line(mem: Resident | None, plan, devices) -> str:
    """One line: RSS now and its peak, beside the plan's host + GPU totals when every planned GPU is
    the CPU (then the process holds all of the plan's rows)."""
    if mem is None:
        return "resident memory: not available (no /proc/self/status on this system)"
    line = (f"resident memory: RSS {size(mem.rss)} (anonymous {size(mem.anon)}, mapped files {size(mem.file)}), "
            f"peak {size(mem.peak)}")
    if all(d.type == "cpu" for d in devices):
        line += f"; plan: {plan_line(plan)}"
    else:  # the GPU rows are on the GPUs, not in this process's RSS
        line += f"; plan: host {size(next(m.total_bytes for m in plan.memory if m.device == 'host'))}"
    return line
