"""ostinato-calibrate: measure this host's CPU expert rates and write them into a hardware spec.

The cost model prices cold experts with the host's `expert_read_bandwidth` (packed MXFP4 bytes/s at
1 token per expert: decode and short prefills) and `expert_flops` (FLOP/s at 64 tokens per expert:
long prefills); without them it falls back to the spec's DRAM bandwidth and matmul rate, which the
kernel does not reach. This builds the project's CPU kernel for this CPU at DeepSeek-V4-Flash's expert
shape, has the runtime time it (python -m ostinato.runtime.kernel_rates, a separate process) and
writes BASE with the host's fields replaced by what was measured and what this host is (its cores, ISA
and memory: host.usable_bytes is USABLE_FRACTION of it). A CPU-only spec's "device" is the CPU itself:
its memory is the host's (the device may use all of host.usable_bytes; the compiler checks the device's
bytes and the host's together), and its dense products are priced at its `gpus.matmul_flops` and
`gpus.bandwidth`: those become the measured dense GEMM rate (torch's, in the dtype the runtime computes a
prefill's products in here) and read bandwidth.

    ostinato-calibrate rtx4090d-x4 build/my-box.yaml      # a preset, or a spec file
    ostinato-compile MODEL plan.yaml --hardware build/my-box.yaml
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

from ostinato.cli.common import InputError, check_output_file, refuse
from ostinato.hardware import HardwareError, HardwareSpec, load_hardware
from ostinato.host import cpu_model, usable_cores
from ostinato.yaml_files import dump_yaml

from ..codegen.kernels import build_cpu_experts, host_cpu_params

D, I = 4096, 2048   # DeepSeek-V4-Flash's expert: hidden 4096, width 2048
ROUTED = 6          # experts per timed call at 1 token (runtime/kernel_rates.py)
MEMINFO = Path("/proc/meminfo")
CGROUP_MEMORY = Path("/sys/fs/cgroup/memory.max")  # a container's limit (cgroup v2): "max" when unlimited
# Of this host's memory, what a spec lets Ostinato use: the presets keep 1/8 for the OS, page tables and
# other processes (rtx4090d-x4: 448 of 512 GiB).
USABLE_FRACTION = 7 / 8
MIB = 2**20


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="ostinato-calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("base", help="hardware spec to start from: a preset name or a YAML file")
    ap.add_argument("out", type=Path, help="the calibrated spec to write")
    ap.add_argument("--threads", type=int, default=usable_cores(),
                    help="kernel threads (default: this process's cores)")
    ap.add_argument("--experts", type=int, default=48, help="distinct experts cycled through (48: 640 MB)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="activations (bfloat16)")
    ap.add_argument("--rounds", type=int, default=3, help="best of this many rounds (3)")
    ap.add_argument("--kernel-dir", type=Path, help="where the kernel is built, content-addressed (default: "
                                                    "build/kernels here, as ostinato-compile)")
    a = ap.parse_args(argv)
    if a.experts < 2 * ROUTED:
        ap.error(f"--experts must be at least {2 * ROUTED}, got {a.experts}")
    for name in ("threads", "rounds"):
        if getattr(a, name) <= 0:
            ap.error(f"--{name} must be positive, got {getattr(a, name)}")
    return a


def rate(x: float) -> float:
    """3 significant digits: the rounds' noise is larger than that."""
    return float(f"{x:.3g}")


def host_memory_bytes(meminfo: Path = MEMINFO, cgroup: Path = CGROUP_MEMORY) -> int | None:
    """This host's memory in bytes: MemTotal, or a container's memory limit where that is lower; None where
    /proc/meminfo is not there (not Linux)."""
    try:
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        number, unit = fields["MemTotal"].split()
    except (OSError, KeyError, ValueError):
        return None
    total = int(number) * {"kB": 1024}.get(unit, 1)
    try:
        limit = cgroup.read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def with_host_memory(spec: HardwareSpec, total: int) -> HardwareSpec:
    """`spec` for a host of `total` bytes: host.usable_bytes USABLE_FRACTION of it (whole MiB); on a cpu-only
    spec the device is the host itself, so it may use all of that (split over gpus.count), and the compiler
    counts what the device holds and what the host holds against host.usable_bytes together."""
    usable = int(total * USABLE_FRACTION) // MIB * MIB
    host = spec.host.replace(usable_bytes=usable)
    gpus = spec.gpus.replace(usable_bytes=usable // spec.gpus.count // MIB * MIB) if spec.cpu_only else spec.gpus
    return spec.replace(host=host, gpus=gpus)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        base = load_hardware(a.base)
        check_output_file(a.out, "OUT")
    except (HardwareError, InputError) as e:
        return refuse("ostinato-calibrate", e)
    kernel = build_cpu_experts(host_cpu_params(D, I), root=a.kernel_dir).path
    cmd = [sys.executable, "-m", "ostinato.runtime.kernel_rates", str(kernel), "--d", str(D), "--i", str(I),
           "--threads", str(a.threads), "--experts", str(a.experts), "--dtype", a.dtype, "--rounds", str(a.rounds)]
    print(f"ostinato-calibrate: timing the CPU expert kernel ({a.experts} experts, {a.threads} threads, "
          f"{a.rounds} rounds)...", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr)
        print(f"ostinato-calibrate: timing the kernel failed (exit {done.returncode})", file=sys.stderr)
        return 1
    m = json.loads(done.stdout.strip().splitlines()[-1])
    note = (f"ostinato-calibrate on {cpu_model()} ({m['isa']}), {m['threads']} threads, {a.dtype} activations, "
            f"{datetime.date.today().isoformat()}: read {m['read_bandwidth'] / 1e9:.1f} GB/s; kernel "
            f"{m['expert_read_bandwidth'] / 1e9:.1f} GB/s at 1 token "
            f"({m['expert_read_bandwidth'] / m['read_bandwidth']:.2f} "
            f"of read), {m['expert_flops'] / 1e9:.0f} GFLOP/s at {m['batch']} tokens"
            + (f"; dense GEMM {m['dense_flops'] / 1e9:.0f} GFLOP/s ({m['dense_dtype']}, {m['dense_tokens']} tokens)"
               if base.cpu_only else ""))
    memory = host_memory_bytes()
    note += (f"; memory {memory / 2**30:.1f} GiB, {USABLE_FRACTION:.3g} of it usable" if memory is not None
             else "; memory not read (no /proc/meminfo): the base spec's kept")
    host = base.host.replace(cores=m["threads"], isa=m["isa"], bandwidth=rate(m["read_bandwidth"]),
                             expert_read_bandwidth=rate(m["expert_read_bandwidth"]),
                             expert_flops=rate(m["expert_flops"]), calibration=note)
    gpus = (base.gpus.replace(bandwidth=rate(m["read_bandwidth"]), matmul_flops=rate(m["dense_flops"]))
            if base.cpu_only else base.gpus)
    spec = base.replace(name=f"{base.name}-calibrated", host=host, gpus=gpus)
    if memory is not None:
        spec = with_host_memory(spec, memory)
    if base.cpu_only:
        size = f", {memory / 2**30:.1f} GiB" if memory is not None else ""
        spec = spec.replace(description=f"this host: {cpu_model()} ({m['isa']}), {m['threads']} threads{size}; "
                                        f"the CPU itself is the planned device, its memory the host's")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(f"# {base.name} with this host's CPU expert rates, measured by {note}\n"
                     + dump_yaml(spec.model_dump(mode="json", exclude_none=True)))
    print(note)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
