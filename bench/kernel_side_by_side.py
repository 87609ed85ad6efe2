"""Each system's CPU MXFP4 expert kernel on whole-layer calls of DeepSeek-V4-Flash's routed experts, side by side.

One layer: 256 experts (D=4096, I=2048; 13,369,344 B each in MXFP4), top-6 routing. Every system is driven
the way its own benchmark drives it, on the same call shapes, with the same expert ids in a round:
  ostinato   the generated CPU kernel (ostinato.runtime.kernels.cpu_experts, built for this host), bf16
             activations as the engine hands it, GroupedRoutes built outside the timed call, `--threads`
             threads;
  kt-kernel  KTransformers' MXFP4 MoE op (kt_kernel_ext; on AVX2 its AVX2MXFP4_MOE) as kt-kernel's
             bench_moe drives it: MOEConfig(expert_num=256, num_experts_per_tok=6), max_len 512, the same
             packed bytes (ue8m0 scales as bf16), forward_task(qlen, k, ids, weights, x, out) submitted and
             synced per call, bf16 in and out, in a process of its own (below); threads - 1 workers (at least
             1): its queue thread and the caller's sync busy-wait, so one core is left to them;
  ggml       llama.cpp's, through bench/ggml_kernel.py: the mul_mat_id graph build_moe_ffn makes, random
             experts of its own in llama.cpp's weight buffer type (CPU_REPACK on AVX2), float32
             activations, a persistent ggml threadpool of `--threads` threads, in a process of its own.
Call shapes: uniform n = 1, 2, ..., 256 tokens, each token's 6 experts drawn uniformly at random (distinct),
route weights ~ 1/6; grouped n = 512 tokens in m groups of 6 distinct experts (disjoint), n/m tokens per
group, t = n/m tokens per expert in {16, 32, 64}: long prompts, where kt's batched path is what runs. Per
shape: the distinct experts per call and tokens per expert t = routes / distinct (means over the calls).
Rounds alternate the systems (round r: ours, then kt, then ggml, each over every shape: a warm-up call, then
its share of the timed calls); the table reports the median seconds per call. kt's queue thread busy-waits
and ggml's threadpool polls after a call, so each runs in a process of its own that is SIGSTOPped while
the others are timed (SIGCONT before its turn) with 0.1 s of quiet between systems. The machine's
streaming read bandwidth (a multi-threaded sum over 2 GiB, best of the rounds) is measured in the same run;
the 1-minute load average before and after goes into the output.

ours and kt compute the same thing on the same bytes: one small call is compared (relative error printed;
kt is left out of the table if it is above 5e-2). ggml checks one call against its own float reference.

kt-kernel 0.7.2 pins torch==2.9.1: install it with `pip install --no-deps kt-kernel==0.7.2 gguf` (its
extension does not link torch). ggml needs a llama.cpp build with shared ggml libraries (bench/ggml_kernel.py
finds it: --llama-cpp-build/--llama-cpp-src, $OSTINATO_LLAMA_CPP_BUILD/SRC, or bench/llama_cpp_build.py's
cache) and a C compiler. A system that cannot run is left out of the table with the reason printed.

`--out FILE` (default bench/measured/cpu_expert_kernels.<isa>.yaml, the ISA ours is built for) writes the table
the session simulator prices each system's CPU experts with on boxes of that ISA: one table per ISA
(bench/simulator/kernels.py picks a box's, or the nearest measured one and says so). kt-kernel is made to load
its extension for the same ISA (KT_KERNEL_CPU_VARIANT, unless set: avx512 -> avx512_base). No AMX table
exists yet: measuring one needs an AMX machine (--isa amx there: ours builds its avx512_bf16 path, kt-kernel
its AMX tile kernels). Memory: ours 3.4 GB, kt's own copy 3.6 GB (its process briefly holds the
3.4 GB it copies from too), ggml's 3.4 GB, the 2 GiB bandwidth buffer.

`--isa avx2` builds ours (and picks kt-kernel's extension) for AVX2 on an AVX-512 host; pair it with a ggml
build without AVX-512 (--llama-cpp-build) to run the three AVX2 variants side by side. `--clock cpu` times each
call in its process's CPU seconds (all threads, spinning included) instead of wall seconds: on a machine others
load, a descheduled thread then costs nothing, and the rate per core (bytes / CPU seconds) stays comparable
between systems; it writes no table. `--doc` also rewrites the written table's block in docs/benchmarks.md
(bench/kernel_table_doc.py renders it; `python -m ostinato.bench.kernel_table_doc --doc` re-renders every
committed table's).

Usage: python -m ostinato.bench.kernel_side_by_side [--threads N] [--rounds R] [--samples S] [--out FILE]
           [--llama-cpp-build DIR --llama-cpp-src DIR] [--isa ISA] [--clock wall|cpu] [--quick] [--doc [FILE]]
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ostinato.host import cpu_model
from ostinato.isa import ISAS, detect_isa, supports

from .expert_layer import EXPERT_BYTES, MAX_LEN, N_EXPERTS, SEED, TOP_K, D, I, layer_checksum, random_layer
from .kernel_table_doc import DOC, write_doc
from .kt_process import KtProcess
from .simulator.kernels import table_file

UNIFORM_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
GROUPED_TOKENS = 512
GROUPED_T = (16, 32, 64)
QUIET_S = 0.1                        # between systems: spinning threads of the last one go idle
KT_AGREE = 5e-2                      # ours vs kt on one call: above this, kt is left out
# kt-kernel's extension for each of our ISAs (its loader's KT_KERNEL_CPU_VARIANT names, kt_kernel/_cpu_detect.py)
KT_VARIANT = {"avx2": "avx2", "avx512": "avx512_base", "avx512_bf16": "avx512_bf16", "amx": "amx"}


# ---- call shapes ----

@dataclass(frozen=True)
class Shape:
    """uniform: n tokens, each routed to top_k experts drawn uniformly; grouped: n tokens in `groups`
    disjoint groups of top_k experts, n / groups tokens each."""

    kind: str
    n: int
    groups: int = 0

    @property
    def name(self) -> str:
        return f"uniform n={self.n}" if self.kind == "uniform" else f"grouped n={self.n} t={self.n // self.groups}"

    def expected_distinct(self, n_experts: int = N_EXPERTS, top_k: int = TOP_K) -> float:
        if self.kind == "grouped":
            return float(self.groups * top_k)
        return n_experts * (1.0 - (1.0 - top_k / n_experts) ** self.n)

    def draw(self, calls: int, gen: torch.Generator, n_experts: int = N_EXPERTS,
             top_k: int = TOP_K) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [calls, n, top_k] int64 (distinct within a token) and route weights [calls, n, top_k] float32
        (positive, summing to 1 per token: ~ 1/top_k each)."""
        if self.kind == "uniform":
            ids = torch.rand(calls, self.n, n_experts, generator=gen).topk(top_k, dim=-1).indices
        else:
            if self.groups * top_k > n_experts or self.n % self.groups:
                raise ValueError(f"{self.name}: {self.groups} disjoint groups of {top_k} need {self.groups * top_k} "
                                 f"<= {n_experts} experts and {self.groups} dividing {self.n}")
            ids = torch.empty(calls, self.n, top_k, dtype=torch.int64)
            for c in range(calls):
                groups = torch.randperm(n_experts, generator=gen)[:self.groups * top_k].view(self.groups, top_k)
                ids[c] = groups[torch.randperm(self.n, generator=gen) % self.groups]
        w = torch.rand(calls, self.n, top_k, generator=gen) + 0.5
        return ids.contiguous(), (w / w.sum(-1, keepdim=True)).contiguous()


def shapes(quick: bool = False) -> list[Shape]:
    """The call shapes, ascending in tokens per expert."""
    uniform = (1, 8, 64) if quick else UNIFORM_TOKENS
    grouped = (64,) if quick else GROUPED_T
    return ([Shape("uniform", n) for n in uniform]
            + [Shape("grouped", GROUPED_TOKENS, GROUPED_TOKENS // t) for t in grouped])


def route_stats(ids: torch.Tensor) -> tuple[float, float]:
    """(mean distinct experts per call, mean tokens per expert = routes / distinct) of ids [calls, n, k]."""
    distinct = [int(c.unique().numel()) for c in ids]
    routes = ids.shape[1] * ids.shape[2]
    return sum(distinct) / len(distinct), sum(routes / d for d in distinct) / len(distinct)


def timed_calls(shape: Shape, samples: int, rounds: int) -> int:
    """Timed calls of a shape, all rounds together: `samples` for the cheap shapes, fewer as a call reads
    more expert bytes and does more work per expert (about distinct x (1 + t / 8) expert-calls), at
    least two a round."""
    distinct = shape.expected_distinct()
    cost = distinct * (1.0 + shape.n * TOP_K / distinct / 8.0)
    return max(2 * rounds, min(samples, round(samples * 40.0 / cost)))


def median(xs: list[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


# ---- the machine ----

def load_average() -> float:
    """The 1-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def busy_processes(interval: float = 1.0, min_share: float = 0.1, skip: set[int] | None = None) -> list[tuple]:
    """(pid, command, share of one core) of processes that used more than min_share of a core during
    `interval` seconds (a `top` look at what else runs), this process and `skip` not counted."""
    tick = os.sysconf("SC_CLK_TCK")
    skip = (skip or set()) | {os.getpid()}

    def sample() -> dict:
        got = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) not in skip:
                try:
                    stat = (d / "stat").read_text()
                except OSError:
                    continue
                rest = stat[stat.rindex(")") + 2:].split()
                got[int(d.name)] = (stat[stat.index("(") + 1:stat.rindex(")")], int(rest[11]) + int(rest[12]))
        return got
    a = sample()
    time.sleep(interval)
    b = sample()
    busy = [(pid, name, (t - a[pid][1]) / tick / interval) for pid, (name, t) in b.items() if pid in a]
    return sorted([x for x in busy if x[2] > min_share], key=lambda x: -x[2])


def cpu_name() -> str:
    """The CPU's model name, for the measurement's source line."""
    return cpu_model()


def read_bandwidth(buf: torch.Tensor, calls: int = 3) -> float:
    """Bytes/s of a multi-threaded streaming sum over buf (torch's vectorized reduction), best of `calls`."""
    best = float("inf")
    for _ in range(calls):
        t = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t)
    return buf.numel() * buf.element_size() / best


# ---- ours ----

class Ours:
    """The generated kernel, in this process."""

    name = "ostinato"

    def __init__(self, experts: list, threads: int, dim: int = D, inter: int = I, build_root: str | None = None,
                 isa: str | None = None, cpu_time: bool = False):
        from ostinato.compiler.codegen.kernels import CpuExpertParams, build_cpu_experts, host_cpu_params
        from ostinato.runtime.kernels.cpu_experts import CpuExpertKernel

        self.params = host_cpu_params(dim, inter) if isa is None else CpuExpertParams(D=dim, I=inter, isa=isa)
        self.clock = time.process_time if cpu_time else time.perf_counter
        self.kern = CpuExpertKernel(build_cpu_experts(self.params, root=build_root).path)
        self.table = self.kern.table(experts)
        self.n_experts, self.threads, self.dim = len(experts), threads, dim
        self.pid = None  # in this process: nothing to stop

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """One call: x [n, D] bf16, ids/weights [n, k] -> out [n, D] float32."""
        from ostinato.runtime.kernels.routes import group_routes

        out = torch.zeros(x.shape[0], self.dim)
        return self.kern(x, group_routes(ids, weights, self.n_experts), self.table, out, self.threads)

    def run(self, ids: torch.Tensor, weights: torch.Tensor, warmup: int) -> list[float]:
        """Seconds of each call after the first `warmup` (the routes are grouped outside the timing)."""
        from ostinato.runtime.kernels.routes import group_routes

        n = ids.shape[1]
        x = torch.randn(n, self.dim, generator=torch.Generator().manual_seed(n)).bfloat16()
        out = torch.zeros(n, self.dim)
        secs = []
        for c in range(ids.shape[0]):
            routes = group_routes(ids[c], weights[c], self.n_experts)
            out.zero_()
            t = self.clock()
            self.kern(x, routes, self.table, out, self.threads)
            if c >= warmup:
                secs.append(self.clock() - t)
        return secs

    def close(self) -> None:
        pass


# ---- kt-kernel, in a process of its own ----

class Ggml:
    """bench/ggml_kernel.py's GgmlMxfp4, stopped (SIGSTOP) between its turns (its threadpool polls)."""

    name = "ggml"

    def __init__(self, threads: int, build: str | None, src: str | None, cpu_time: bool = False):
        from .ggml_kernel import GgmlMxfp4

        self.g = GgmlMxfp4(threads, N_EXPERTS, TOP_K, build, src, cpu_time=cpu_time)
        self.pid, self.stopped = self.g.pid, False

    def stop(self) -> None:
        if not self.stopped and self.g.proc.poll() is None:
            os.kill(self.pid, signal.SIGSTOP)
            self.stopped = True

    def cont(self) -> None:
        if self.stopped and self.g.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
        self.stopped = False

    def run(self, ids: torch.Tensor, weights: torch.Tensor, warmup: int) -> list[float]:
        return self.g.run(ids.numpy(), weights.numpy(), warmup)

    def close(self) -> None:
        self.cont()
        self.g.close()


# ---- the table ----

def sig4(v: float) -> float:
    """v rounded to 4 significant digits."""
    return float(f"{v:.4g}")


def per_core(distinct: float, seconds: float, threads: int, expert_bytes: int = EXPERT_BYTES) -> float:
    """Bytes/s of expert weights per computing thread."""
    return distinct * expert_bytes / (seconds * threads)


def table_data(meta: dict, shape_names: list[str], tpe: list[float], distinct: list[float], systems: dict) -> dict:
    """The YAML table (bench/measured/cpu_expert_kernels.yaml) as a dict. meta: source, cpu, isa, cores,
    read_bandwidth; systems: name -> {threads, reserved_cores, seconds (median per shape), driven}; shapes
    sorted here by tokens per expert."""
    order = sorted(range(len(shape_names)), key=lambda i: (tpe[i], distinct[i]))
    data = {"source": meta["source"], "cpu": meta["cpu"], "isa": meta["isa"], "cores": int(meta["cores"]),
            "read_bandwidth": sig4(meta["read_bandwidth"]), "expert_bytes": int(meta.get("expert_bytes", EXPERT_BYTES)),
            "layer_experts": int(meta.get("layer_experts", N_EXPERTS)), "top_k": int(meta.get("top_k", TOP_K)),
            "shapes": [shape_names[i] for i in order], "tokens_per_expert": [sig4(tpe[i]) for i in order],
            "distinct_experts": [sig4(distinct[i]) for i in order], "systems": {}}
    for name, s in systems.items():
        secs = [s["seconds"][i] for i in order]
        data["systems"][name] = {
            "threads": int(s["threads"]), "reserved_cores": int(s["reserved_cores"]),
            "per_core": [sig4(per_core(distinct[i], s["seconds"][i], s["threads"], data["expert_bytes"]))
                         for i in order],
            "ms": [sig4(x * 1e3) for x in secs], "driven": s["driven"]}
    return data


HEADER = ("# Each system's CPU MXFP4 expert kernel on whole-layer calls of DeepSeek-V4-Flash's routed experts (256\n"
          "# experts, top-6), side by side on one machine. Written by python -m ostinato.bench.kernel_side_by_side\n"
          "# (bench/kernel_side_by_side.py); read by the session simulator (bench/simulator/) to price each\n"
          "# system's CPU experts. per_core: expert-weight bytes/s per computing thread, distinct experts x\n"
          "# expert_bytes / (median s x threads); ms: median ms per call; shapes ascend in tokens per expert.\n"
          "# One table per ISA (isa: what the kernels were built for): a box is priced with its host ISA's, else the\n"
          "# nearest measured one, named (bench/simulator/kernels.py). No AMX table: no AMX machine was available,\n"
          "# so AMX boxes use the avx512_bf16 table (Ostinato's amx build is that path; kt-kernel's AMX kernels are\n"
          "# priced at its AVX-512 ones).\n")


def write_table(path: str | Path, data: dict) -> None:
    """data (table_data) as YAML, written whole (atomic replace)."""
    import yaml

    path = Path(path)
    text = HEADER + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=4096)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---- the run ----

def pause_all(systems: list) -> None:
    for s in systems:
        if s.pid is not None:
            s.stop()


def main(argv: list[str] | None = None) -> int:
    from ostinato.host import usable_cores

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=usable_cores(), help="cores to use (default: this process's)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds alternating the systems (default 3)")
    ap.add_argument("--samples", type=int, default=30,
                    help="timed calls per shape for the small shapes, all rounds together; big shapes get fewer, "
                         "at least two a round (default 30)")
    ap.add_argument("--out", default=None, help="the YAML table (default bench/measured/cpu_expert_kernels.<isa>.yaml "
                                                "for the --isa built; '' for none)")
    ap.add_argument("--llama-cpp-build", default=os.environ.get("OSTINATO_LLAMA_CPP_BUILD"),
                    help="llama.cpp build directory with bin/libggml*.so (default $OSTINATO_LLAMA_CPP_BUILD, else "
                         "bench/llama_cpp_build.py's cache)")
    ap.add_argument("--llama-cpp-src", default=os.environ.get("OSTINATO_LLAMA_CPP_SRC"),
                    help="llama.cpp source directory with ggml/include (default $OSTINATO_LLAMA_CPP_SRC, else "
                         "the cache)")
    ap.add_argument("--build-root", default=None, help="kernel build directory (default build/kernels)")
    ap.add_argument("--isa", choices=ISAS, default=None,
                    help="build our kernel for this ISA (default: this CPU's best) and load kt-kernel's for it; ggml's "
                         "follows its build "
                         "(--llama-cpp-build: e.g. one configured with GGML_NATIVE=OFF GGML_AVX2=ON GGML_AVX512=OFF)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: seconds per call; cpu: each system's process CPU seconds per call (all its "
                         "threads, spinning included), so the rate per core holds on a machine others load; "
                         "kt-kernel (no CPU clock) is left out and no table is written")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 5 shapes, 2 rounds, few calls")
    ap.add_argument("--no-kt", action="store_true", help="leave kt-kernel out")
    ap.add_argument("--no-ggml", action="store_true", help="leave ggml out")
    ap.add_argument("--doc", type=Path, nargs="?", const=DOC, default=None, metavar="FILE",
                    help=f"also rewrite the written table's block in FILE (default {DOC}; "
                         "bench/kernel_table_doc.py renders it)")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.rounds < 1 or args.samples < 1:
        ap.error("--threads, --rounds and --samples must be >= 1")
    if args.isa is not None and not supports(args.isa):
        ap.error(f"--isa {args.isa}: this CPU cannot run it (it has {detect_isa()})")
    if args.clock == "cpu" and args.out:
        ap.error("--clock cpu: the table holds wall seconds; pass --out '' (or no --out)")
    if args.out is None:
        args.out = "" if args.clock == "cpu" else str(table_file(args.isa or detect_isa()))
    if args.doc is not None and not args.out:
        ap.error("--doc writes the block of the table this run writes: it needs a table (--out, and --clock wall)")
    if args.doc is not None and not args.doc.is_file():
        ap.error(f"--doc {args.doc}: no such file (run from the repository root, or name the file)")
    if args.out:
        out_dir = Path(args.out).resolve().parent
        if not out_dir.is_dir():
            ap.error(f"--out {args.out}: no directory {out_dir}")
    if args.isa is not None and not args.no_kt:  # its child process loads the extension for the same ISA
        os.environ.setdefault("KT_KERNEL_CPU_VARIANT", KT_VARIANT[args.isa])
    if args.quick:
        args.rounds, args.samples = min(args.rounds, 2), min(args.samples, 4)
    return run(args)


@dataclass
class Measured:
    systems: list          # those timed to the end, ours first
    left_out: dict         # name -> why
    shapes: list
    secs: dict             # (system name, shape) -> seconds of each timed call
    drawn: dict            # shape -> the timed calls' ids, one tensor per round
    bandwidth: float
    load_after: float
    warmup: int


def setup(args, threads: int, kt_workers: int, started: list) -> tuple[list, dict]:
    """Start the systems (appended to `started` as they start): ours, kt (checked against ours), ggml."""
    left_out, systems = {}, []
    kt = None
    if args.clock == "cpu" and not args.no_kt:
        left_out["kt-kernel"] = "--clock cpu: its process reports no CPU time"
    elif not args.no_kt:
        try:  # started first: it builds the same layer in its own process while this one does
            kt = KtProcess(kt_workers)
            started.append(kt)
        except (RuntimeError, OSError, ValueError) as e:
            left_out["kt-kernel"] = str(e)
    t0 = time.perf_counter()
    experts = random_layer(N_EXPERTS, D, I, SEED)
    assert experts[0].nbytes == EXPERT_BYTES
    ours = Ours(experts, threads, build_root=args.build_root, isa=args.isa, cpu_time=args.clock == "cpu")
    print(f"ours: {ours.kern.info}; {N_EXPERTS} experts x {EXPERT_BYTES:,} B = {N_EXPERTS * EXPERT_BYTES / 1e9:.2f} GB "
          f"({time.perf_counter() - t0:.0f} s to build)")
    systems.append(ours)

    if kt is not None:
        print(f"kt-kernel {kt.info['version']}: {kt.info['variant']} extension, {kt.info['backend']}, "
              f"{kt_workers} worker{'s' if kt_workers > 1 else ''} + its queue thread")
        if kt.checksum != layer_checksum(experts):
            left_out["kt-kernel"] = "its process built different expert bytes (checksum differs)"
        else:
            g = torch.Generator().manual_seed(1)
            ids, w = Shape("uniform", 4).draw(1, g)
            x = torch.randn(4, D, generator=g).bfloat16()
            a = ours.forward(x, ids[0], w[0])
            b = kt.forward(x, ids[0], w[0]).float()
            rel = float((a - b).abs().max() / a.abs().max())
            print(f"ours vs kt on one call (4 tokens x top-6, bf16 activations): rel err {rel:.2e} "
                  f"(max |diff| over max |ours|)")
            if not rel <= KT_AGREE:
                left_out["kt-kernel"] = f"its output differs from ours by {rel:.2e} (> {KT_AGREE})"
        if "kt-kernel" in left_out:
            kt.close()
        else:
            kt.stop()
            systems.append(kt)

    if not args.no_ggml:
        try:
            ggml = Ggml(threads, args.llama_cpp_build, args.llama_cpp_src, cpu_time=args.clock == "cpu")
            started.append(ggml)
            print(f"ggml: {ggml.g.variant}; " + "; ".join(ggml.g.notes))
            ggml.stop()
            systems.append(ggml)
        except Exception as e:  # not found, failed to compile, failed its check
            left_out["ggml"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    for name, why in left_out.items():
        print(f"{name}: LEFT OUT ({why})")
    return systems, left_out


def measure(args, systems: list, left_out: dict) -> Measured:
    """The rounds: per round the read bandwidth (everything else stopped), then each system in turn over
    every shape (a warm-up call, then its share of the timed calls), the same ids for all."""
    rounds, warmup = args.rounds, 1
    shape_list = shapes(args.quick)
    per_round = {s: math.ceil(timed_calls(s, args.samples, rounds) / rounds) for s in shape_list}
    gen = torch.Generator().manual_seed(SEED + 1)
    secs = {(sy.name, s): [] for sy in systems for s in shape_list}
    drawn = {s: [] for s in shape_list}
    bw = 0.0
    t_run = time.perf_counter()
    for r in range(rounds):
        pause_all(systems)
        time.sleep(QUIET_S)
        buf = torch.ones(512 * 2**20, dtype=torch.float32)  # 2 GiB, touched; held only while measured
        bw = max(bw, read_bandwidth(buf))
        del buf
        routes = {s: s.draw(warmup + per_round[s], gen) for s in shape_list}
        for s in shape_list:
            drawn[s].append(routes[s][0][warmup:])
        for sy in list(systems):
            if sy.pid is not None:
                sy.cont()
            time.sleep(QUIET_S)
            try:
                for s in shape_list:
                    ids, w = routes[s]
                    secs[sy.name, s] += sy.run(ids, w, warmup)
            except (RuntimeError, OSError, ValueError) as e:
                if sy is systems[0]:
                    raise
                left_out[sy.name] = f"failed in round {r + 1}: {e}"
                print(f"{sy.name}: LEFT OUT ({left_out[sy.name]})")
                systems.remove(sy)
                sy.close()
                continue
            if sy.pid is not None:
                sy.stop()
            time.sleep(QUIET_S)
        print(f"round {r + 1}/{rounds} done ({time.perf_counter() - t_run:.0f} s)", flush=True)
    return Measured(systems, left_out, shape_list, secs, drawn, bw, load_average(), warmup)


def run(args) -> int:
    threads, rounds = args.threads, args.rounds
    torch.set_num_threads(threads)
    cpu = cpu_name()
    load_before = load_average()
    print(f"{cpu}; {threads} threads; load average (1 min) before: {load_before:.2f}")
    busy = busy_processes()
    for pid, name, share in busy:
        print(f"  busy: pid {pid} ({name}) used {share:.0%} of a core in the last second")
    if not busy:
        print("  nothing else used more than 10% of a core in the last second")

    kt_workers = max(1, threads - 1)
    started = []
    try:
        systems, left_out = setup(args, threads, kt_workers, started)
        m = measure(args, systems, left_out)
    finally:
        for sy in started:  # continued and ended, whatever happened
            sy.close()
    for pid, name, share in busy_processes():
        print(f"  busy after the run: pid {pid} ({name}) used {share:.0%} of a core in the last second")

    shape_list, systems, secs = m.shapes, m.systems, m.secs
    stats = [route_stats(torch.cat(m.drawn[s])) for s in shape_list]
    distinct, tpe = [d for d, _ in stats], [t for _, t in stats]
    present = [sy.name for sy in systems]
    med = {(n, s): median(secs[n, s]) for n in present for s in shape_list}
    threads_of = {"ostinato": threads, "kt-kernel": kt_workers, "ggml": threads}
    if args.clock == "cpu":  # CPU seconds are core-seconds already
        threads_of = dict.fromkeys(threads_of, 1)
    # kt-kernel's queue thread busy-waits on a core of its own wherever it runs (at --threads 1 too, where it
    # took the core outside the run's one): a host computes with its cores less that one
    reserved_of = {"ostinato": 0, "kt-kernel": 1, "ggml": 0}

    print(f"\nread bandwidth: {m.bandwidth / 1e9:.1f} GB/s ({m.bandwidth / threads / 1e9:.1f} per core); load average "
          f"(1 min) before/after: {load_before:.2f}/{m.load_after:.2f} (after: includes this run's own threads)")
    print(f"ours: {systems[0].params.isa} build; clock: {args.clock}"
          + (" (ms: CPU ms of the system's process per call, all threads)" if args.clock == "cpu" else ""))
    head = f"{'shape':<20} {'t':>6} {'distinct':>8} {'calls':>5}"
    for n in present:
        head += f" | {n + ' ms':>12} {'GB/s/core':>9}"
    head += "".join(f" | {n + '/ours':>14}" for n in present[1:])
    print(head)
    for i, s in enumerate(shape_list):
        line = f"{s.name:<20} {tpe[i]:6.2f} {distinct[i]:8.1f} {len(secs['ostinato', s]):5d}"
        for n in present:
            line += f" | {med[n, s] * 1e3:12.2f} {per_core(distinct[i], med[n, s], threads_of[n]) / 1e9:9.2f}"
        line += "".join(f" | {med[n, s] / med['ostinato', s]:13.2f}x" for n in present[1:])
        print(line)
    for name, why in m.left_out.items():
        print(f"{name}: not in the table ({why})")

    if args.out:
        from ostinato.compiler.codegen.kernels import host_cpu_params

        isa = args.isa or host_cpu_params(D, I).isa
        n_calls = sorted({len(secs["ostinato", s]) for s in shape_list})
        span = f"{n_calls[0]}" if len(n_calls) == 1 else f"{n_calls[0]}-{n_calls[-1]}"
        how = (f"per shape {m.warmup} warm-up call a round and {span} timed calls over {rounds} rounds alternating "
               f"the systems, median")
        driven = {"ostinato": f"generated kernel ({isa}), bf16 activations, GroupedRoutes built outside the timing, "
                              f"{threads} OpenMP threads; {how}"}
        for sy in systems:
            if sy.name == "kt-kernel":
                driven[sy.name] = (
                    f"kt-kernel {sy.info['version']} {sy.info['backend']} ({sy.info['variant']} extension) as "
                    f"bench_moe drives it: MOEConfig(256, 6), max_len {MAX_LEN}, forward_task submit + sync per "
                    f"call, bf16 in and out, the same packed bytes; {kt_workers} worker"
                    f"{'s' if kt_workers > 1 else ''}, its queue thread (busy-waits) on the remaining core; own "
                    f"process, SIGSTOPped while the others run; {how}")
            elif sy.name == "ggml":
                driven[sy.name] = (
                    f"{sy.g.variant}: build_moe_ffn's mul_mat_id graph (gate, up, clamped SwiGLU, down, weighted sum "
                    f"of the top-6), float32 activations, a persistent threadpool of {threads} (poll 50); own "
                    f"process and random experts, SIGSTOPped while the others run; {how}")
        data = table_data(
            {"source": f"python -m ostinato.bench.kernel_side_by_side, one run, {cpu}, {time.strftime('%Y-%m-%d')}, "
                       f"load average {load_before:.2f}/{m.load_after:.2f}",
             "cpu": cpu, "isa": isa, "cores": threads, "read_bandwidth": m.bandwidth},
            [s.name for s in shape_list], tpe, distinct,
            {n: {"threads": threads_of[n], "reserved_cores": reserved_of[n],
                 "seconds": [med[n, s] for s in shape_list], "driven": driven[n]} for n in present})
        write_table(args.out, data)
        print(f"wrote {args.out}")
        if args.doc is not None:
            write_doc(args.doc, [Path(args.out)])
            print(f"wrote its block into {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
