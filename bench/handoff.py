"""Measure the CPU side of the per-layer GPU -> CPU -> GPU hand-off on this machine, and carry the cited GPU side.

Every hybrid CPU-GPU MoE engine pays, per layer whose cold experts run on the CPU: the GPU stream reaches the
layer's CPU task (a CUDA host function or a stream sync plus a small device -> host copy), the host wakes its
expert thread pool, the pool computes and meets at a barrier, the result goes back (a small host -> device copy).
This tool measures the CPU-side parts here, each as a median and a 90th percentile over many samples after
warm-up:

(a) our CPU expert kernel (ostinato.runtime.kernels.cpu_experts, built at D=I=64, the smallest shape its
    generator allows, so the compute is small), 1 token routed to 1 expert: the call at N threads and at 1
    thread, interleaved, and their paired difference, i.e. what waking the OpenMP team and its barriers cost
    net of what splitting the call's own work across the team saves (one call opens two parallel regions: the
    activation permute, then the two expert phases with an implicit barrier after each work-sharing loop);
    the same after an idle gap longer than libgomp's spin window (its threads then sleep in the kernel and
    must be woken); the call with zero routes (it returns before any parallel region: the Python wrapper,
    ctypes and the argument checks); and, with no work at all, that OpenMP skeleton alone (2 forks and joins,
    2 barriers, in bench/handoff_pingpong.c) at N threads minus 1 thread, hot and after the idle gap;
(b) kt-kernel's pool (where `kt_kernel` imports): submit(forward_task) + sync() round trip of its MXFP4 MoE op
    on the same tiny expert, 1 token, 1 worker thread; also after an idle gap longer than its workers' 50 ms
    spin (they then poll in 1 ms sleeps);
(c) a thread wake-up round trip: two threads hand a token back and forth through a pthread condition variable
    (the waiter blocks in the kernel: futex), and through one spinning atomic flag for contrast
    (bench/handoff_pingpong.c, compiled with the system `cc -O2 -pthread` into build/handoff/, cached);
    one-way = round trip / 2;
(d) Python <-> C transitions: a ctypes call of a no-op C function (what calling a host-side extension from
    Python costs), and C calling a Python callback, on the calling thread and from another thread (what a
    CUDA host function implemented in Python pays to enter the interpreter: the GIL, on the driver's thread).

The GPU-side parts cannot be measured without a GPU: CITED below holds published figures (what each measured,
on which GPU, with its address), written to the YAML's `cited:` block; CITED_MISSING names what no solid
source was found for.

Usage: python -m ostinato.bench.handoff [--threads N] [--samples S] [--out FILE] [--idle-gap-ms G]
                                        [--build-dir DIR] [--kernel-root DIR]
--out defaults to bench/measured/handoff.yaml; `--out -` writes no file.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import platform
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from ostinato.host import cpu_model

SOURCE = Path(__file__).resolve().with_name("handoff_pingpong.c")
DEFAULT_BUILD = Path(__file__).resolve().parent.parent / "build" / "handoff"
DEFAULT_OUT = Path(__file__).resolve().parent / "measured" / "handoff.yaml"
D, I = 64, 64              # the smallest expert shape the kernel generator allows: compute small next to the
K_CHUNK = 64               # thread hand-offs (k_chunk must divide D and I)
KT_IDLE_GAP_S = 0.060      # past kt-kernel's 50 ms worker spin (worker_pool.cpp: then 1 ms sleeps)
HIDDEN = 4096              # DeepSeek-V4-Flash's hidden size: the per-layer copies of the recommendation
NS = 1e-9

# Published GPU-side figures (the tool cannot measure them without a GPU). Paraphrased; `derived` marks a
# number computed here from the source's own figures.
CITED = {
    "cuda_host_func_round_trip": {
        "value": 26.0, "unit": "us",
        "what": "cudaLaunchHostFunc node per CUDA-graph replay, described as a CPU round trip of about 26 us "
                "(replaced by a device-side counter costing about 1.7 us); GPU and driver not stated",
        "source": "https://github.com/meta-pytorch/torchcomms/pull/1203"},
    "cuda_host_callback_from_stream": {
        "value": 100.0, "unit": "us",
        "what": "a host callback enqueued on a CUDA stream, about 100 us; same PR: stream-to-stream event sync "
                "on device about 3 us, a pre-enqueued kernel launch about 3 us; GeForce RTX 3080, PCIe 4.0 x16, "
                "driver not stated",
        "source": "https://github.com/facebookincubator/velox/pull/6096"},
    "d2h_4_bytes_plus_stream_sync": {
        "value": 31.4, "unit": "us",
        "what": "isolated 4-byte device->host copy + cudaStreamSynchronize, median of 2000 after 200 warm-up, "
                "into pinned memory (31.35 us; pageable 32.2 us; minimum about 9.2 us); RTX 5090 (sm_120a), "
                "driver not stated",
        "source": "https://github.com/kekzl/imp/issues/1654"},
    "cudamemcpy_fixed_overhead": {
        "value": 6.5, "unit": "us",
        "what": "GDRCopy's README: a cudaMemcpy incurs a 6-7 us overhead (its motivation for CPU-driven BAR "
                "copies); older Tesla-class GPUs (its sample run: P100 PCIe), driver not stated",
        "source": "https://github.com/NVIDIA/gdrcopy/blob/master/README.md"},
    "h2d_pinned_bw_pcie4_x16_rtx4090": {
        "value": 25.5, "unit": "GB/s",
        "what": "nvbandwidth host_to_device_memcpy_ce on 8x RTX 4090 (PCIe 4.0): 23.9-26.4 GB/s per GPU (GPU 0: "
                "25.5); device_to_host_memcpy_ce 26.3-27.1 GB/s; driver 545.29.06, CUDA 12.3",
        "source": "https://github.com/NVIDIA/nvbandwidth/issues/15"},
    "rtx4090_kernel_read_bw": {
        "value": 921.0, "unit": "GB/s",
        "what": "clpeak global memory bandwidth (float16 vectors) on an RTX 4090: 921 GB/s = 91% of the 1008 GB/s "
                "peak (derived); OpenCL, Windows 11, driver 531.61, power limited to 248 W",
        "source": "https://github.com/krrishnarraj/clpeak/issues/106"},
    "triton_decode_bw_fraction_a100": {
        "value": 0.685, "unit": "fraction of peak",
        "what": "gpt-fast (torch.compile, i.e. Triton-generated kernels, CUDA graphs) Llama-2-7B bf16 decode at "
                "batch 1: 1397 GB/s on an A100-80GB power-limited to 330 W = 68.5% of the 2039 GB/s A100-80GB SXM "
                "spec (derived); the README puts that box's empirical peak at about 1700 GB/s (82% of it); int8 "
                "weights: 1069 GB/s",
        "source": "https://github.com/pytorch-labs/gpt-fast/blob/main/README.md"},
    "triton_fp8_m1_bw_fraction_h800": {
        "value": 0.11, "unit": "fraction of peak",
        "what": "a user's run of the PyTorch blog's Triton split-k FP8 GEMM at m=1, n=k=8192 on an H800: 178 us vs "
                "33.4 us for torch._scaled_mm; the 67 MB FP8 weight streamed at 0.38 vs 2.0 TB/s = 11% vs 60% of "
                "3.35 TB/s (derived): an untuned Triton kernel at M=1 can sit far below peak",
        "source": "https://github.com/meta-pytorch/applied-ai/issues/21"},
    "triton_streaming_bw_fraction_h100": {
        "value": 0.908, "unit": "fraction of peak",
        "what": "a bandwidth-bound Triton gather/copy kernel (torchrec pooled-embedding regroup, fp32, 1.06 GB "
                "moved) at 2.179 TB/s = 90.8% of H100 peak, as the PR reports; large streaming op, not a "
                "decode GEMV",
        "source": "https://github.com/meta-pytorch/torchrec/pull/4634"},
    "libgomp_default_spin_before_sleep": {
        "value": 3.0, "unit": "ms",
        "what": "libgomp's default GOMP_SPINCOUNT when OMP_WAIT_POLICY is unset: 300000 spins, estimated by its "
                "authors at 100000 spins/ms (about 3 ms, 5x either way by CPU), then the thread sleeps on a "
                "futex; 100 spins when libgomp has more threads than CPUs",
        "source": "https://github.com/gcc-mirror/gcc/blob/master/libgomp/env.c"},
    "kt_worker_spin_before_sleep": {
        "value": 50.0, "unit": "ms",
        "what": "kt-kernel's pool workers and NUMA distributor spin on an atomic status with _mm_pause for 50 ms "
                "after their last task, then poll in 1 ms sleeps; its task-queue thread and sync() spin without "
                "sleeping",
        "source": "https://github.com/kvcache-ai/ktransformers/blob/main/kt-kernel/cpu_backend/worker_pool.cpp"},
    "ggml_barrier_share_of_cpu_decode": {
        "value": 7.0, "unit": "% of graph time",
        "what": "ggml_barrier (the CPU backend's per-op thread barrier) measured at about 7% of the CPU graph "
                "evaluation time in token generation with DeepSeek-Lite; thread count and CPU not stated",
        "source": "https://github.com/ikawrakow/ik_llama.cpp/pull/238"},
    # the two figures behind ostinato/host_sync.py's growth of the pool's hand-off with its threads (issue #58)
    "ggml_test_barrier_epyc_openmp_4_threads": {
        "value": 2504.67, "unit": "ns per graph node",
        "what": "llama.cpp tests/test-barrier (2000 nodes, each a tiny Q4_0 matrix-vector product followed by a "
                "barrier; 100 rounds) on an AMD EPYC, OpenMP build, 4 threads (the threadpool build: 1962.74)",
        "source": "https://github.com/ggml-org/llama.cpp/pull/9598"},
    "ggml_test_barrier_epyc_openmp_8_threads": {
        "value": 3158.78, "unit": "ns per graph node",
        "what": "the same run at 8 threads (the threadpool build: 3039.05); the comment also ran 16, 32 and 64 "
                "threads, not read here",
        "source": "https://github.com/ggml-org/llama.cpp/pull/9598"},
    "core_to_core_latency_epyc7453": {
        "value": 230.0, "unit": "ns",
        "what": "one cache-line round between two cores of an AMD EPYC 7453 (28 cores): 24-30 ns within a core "
                "complex, 136-139 and 225-243 ns across (the table's typical cells)",
        "source": "https://github.com/nviennot/core-to-core-latency/issues/125"},
    "cas_shared_line_threadripper5995wx": {
        "value": 70.9, "unit": "ns",
        "what": "CAS latency on a single shared cache line between two cores of an AMD Ryzen Threadripper PRO 5995WX "
                "(64 cores, one socket), mean over core pairs (min 8.0 ns, max 95.0 ns): what each arriving "
                "thread's atomic decrement of a centralized barrier's counter waits for the line",
        "source": "https://github.com/nviennot/core-to-core-latency/issues/133"},
}
CITED_MISSING = [
    "a published OpenMP barrier (or fork/join) cost at 32-64 threads on a many-core x86, e.g. EPCC syncbench "
    "tables: the EPCC suite, a scaling study (Iwainsky et al., Euro-Par 2015, 'How Many Threads will be too "
    "Many?') and llama.cpp PR #9598's 16-64-thread test-barrier rows were found, but those numbers were not read; "
    "ostinato/host_sync.py bounds the growth from the 4- and 8-thread rows",
    "the fraction of peak bandwidth a Triton / CUTLASS / vLLM fused-MoE kernel reaches at decode (1-4 tokens) "
    "on an RTX 4090, H100 or H200 as an absolute figure: vLLM/SGLang tuning PRs report speed-ups, not GB/s",
    "a cudaLaunchHostFunc latency measured on an RTX 4090 or H100/H200 with the driver named",
]


# ---- statistics --------------------------------------------------------------------------------------------

def quantile(sorted_xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_xs:
        raise ValueError("no samples")
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def sig3(x: float) -> float:
    return float(f"{x:.3g}")


def summarize(samples: list[float]) -> dict:
    xs = sorted(samples)
    return {"median_s": sig3(quantile(xs, 0.5)), "p90_s": sig3(quantile(xs, 0.9)), "samples": len(xs)}


def load_1min() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


class OtherLoad:
    """How many cores other processes kept busy since mark(): the machine's busy CPU time (/proc/stat) minus this
    process's own (all its threads), over the wall time. On a shared machine it tells which figures were taken
    while something else competed for the cores; None where /proc/stat is not there or the section was too short
    to tell."""

    def __init__(self):
        self.mark()

    @staticmethod
    def _machine() -> float:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")  # all but idle, iowait

    @staticmethod
    def _own() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def mark(self) -> None:
        try:
            self.t0, self.m0, self.o0 = time.perf_counter(), self._machine(), self._own()
        except (OSError, ValueError, IndexError):
            self.t0 = None

    def cores(self) -> float | None:
        if self.t0 is None:
            return None
        wall = time.perf_counter() - self.t0
        if wall < 0.25:  # /proc/stat counts 10 ms ticks: too coarse for a shorter section
            return None
        other = (self._machine() - self.m0) - (self._own() - self.o0)
        return round(min(max(0.0, other) / wall, float(os.cpu_count() or 1)), 2)


def cpu_name() -> str:
    """The CPU's model name, for the measurement's source line."""
    return cpu_model()


# ---- (c) + (d): the C helper -------------------------------------------------------------------------------

CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int)


def build_pingpong(build_dir: str | os.PathLike | None = None) -> Path:
    """Compile bench/handoff_pingpong.c into a shared library under build_dir (default build/handoff), cached by
    the source and compiler; RuntimeError where there is no C compiler or it fails."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc) on PATH")
    cache = Path(build_dir) if build_dir else DEFAULT_BUILD
    key = hashlib.sha256(SOURCE.read_bytes() + b"\0" + cc.encode()).hexdigest()[:16]
    out = cache / f"libhandoff_pingpong-{key}.so"
    if out.exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        tmp_out = Path(tmp) / out.name
        cmd = [cc, "-O2", "-pthread", "-fopenmp", "-shared", "-fPIC", "-o", str(tmp_out), str(SOURCE)]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode:
            raise RuntimeError(f"compiling {SOURCE.name} failed ({' '.join(cmd)}):\n{r.stderr.strip()}")
        os.replace(tmp_out, out)  # atomic: a half-written library is never cached
    for stale in cache.glob("libhandoff_pingpong-*.so"):
        if stale != out:
            stale.unlink(missing_ok=True)
    return out


class Pingpong:
    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))  # CDLL: ctypes releases the GIL around each call
        self.lib.hp_noop.argtypes, self.lib.hp_noop.restype = [], ctypes.c_int
        dbl = ctypes.POINTER(ctypes.c_double)
        for name in ("hp_condvar_pingpong", "hp_spin_pingpong"):
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int, dbl], ctypes.c_int
        for name in ("hp_callback_same_thread", "hp_callback_other_thread"):
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = [CALLBACK, ctypes.c_int, dbl], ctypes.c_int
        self.lib.hp_omp_region.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64, dbl]
        self.lib.hp_omp_region.restype = ctypes.c_int

    def omp_regions(self, threads: int, warmup: int, n: int, gap_s: float = 0.0) -> list[float]:
        """Seconds per empty OpenMP parallel region with one barrier, measured inside C."""
        buf = (ctypes.c_double * n)()
        if self.lib.hp_omp_region(threads, warmup, n, int(gap_s * 1e9), buf):
            raise RuntimeError("hp_omp_region: the region did not run")
        return [v * NS for v in buf]

    def round_trips(self, kind: str, warmup: int, n: int) -> list[float]:
        """Seconds per round trip, measured inside C."""
        buf = (ctypes.c_double * n)()
        fn = self.lib.hp_condvar_pingpong if kind == "condvar" else self.lib.hp_spin_pingpong
        if fn(warmup, n, buf):
            raise RuntimeError("pthread_create failed")
        return [v * NS for v in buf]

    def callbacks(self, other_thread: bool, warmup: int, n: int) -> list[float]:
        """Seconds per C -> Python callback call, measured inside C."""
        cb = CALLBACK(lambda: 0)
        fn = self.lib.hp_callback_other_thread if other_thread else self.lib.hp_callback_same_thread
        fn(cb, warmup, (ctypes.c_double * max(warmup, 1))())
        buf = (ctypes.c_double * n)()
        if fn(cb, n, buf):
            raise RuntimeError("pthread_create failed")
        return [v * NS for v in buf]

    def noop_calls(self, warmup: int, n: int, batch: int = 100) -> list[float]:
        """Seconds per Python -> C no-op call: each sample times `batch` calls (timer cost amortized)."""
        f = self.lib.hp_noop
        for _ in range(warmup):
            f()
        out = []
        for _ in range(n):
            t = time.perf_counter_ns()
            for _ in range(batch):
                f()
            out.append((time.perf_counter_ns() - t) * NS / batch)
        return out


# ---- (a): our kernel ---------------------------------------------------------------------------------------

class OurPool:
    """The CPU expert kernel at D, I with one expert; 1 token routed to it, or none."""

    def __init__(self, kernel_root=None):
        import torch

        from ostinato.compiler.codegen.kernels import build_cpu_experts, host_cpu_params
        from ostinato.runtime.kernels.cpu_experts import CpuExpertKernel
        from ostinato.runtime.kernels.routes import GroupedRoutes
        from ostinato.runtime.kernels.testing import random_packed_expert

        built = build_cpu_experts(host_cpu_params(D, I, k_chunk=K_CHUNK), root=kernel_root)
        self.kern = CpuExpertKernel(built.path, gemm=False)
        self.table = self.kern.table([random_packed_expert(D, I, torch.Generator().manual_seed(0))])
        self.x = torch.randn(1, D, generator=torch.Generator().manual_seed(1)).bfloat16()
        self.out = torch.zeros(1, D)
        self.one = GroupedRoutes(torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([0.5]))
        self.none = GroupedRoutes(torch.tensor([0, 0]), torch.zeros(0, dtype=torch.int64), torch.zeros(0))

    def call(self, threads: int, routes=None) -> float:
        t = time.perf_counter_ns()
        self.kern(self.x, self.one if routes is None else routes, self.table, self.out, threads)
        return (time.perf_counter_ns() - t) * NS

    def paired(self, threads: int, warmup: int, n: int, gap_s: float = 0.0) -> tuple[list[float], list[float]]:
        """(times at `threads`, times at 1 thread), interleaved so drift and load hit both alike; with gap_s,
        the process sleeps that long before every call."""
        for _ in range(warmup):
            self.call(threads)
            self.call(1)
        many, one = [], []
        for _ in range(n):
            if gap_s:
                time.sleep(gap_s)
            many.append(self.call(threads))
            if gap_s:
                time.sleep(gap_s)
            one.append(self.call(1))
        return many, one

    def empty(self, threads: int, warmup: int, n: int) -> list[float]:
        for _ in range(warmup):
            self.call(threads, self.none)
        return [self.call(threads, self.none) for _ in range(n)]


# ---- (b): kt-kernel ---------------------------------------------------------------------------------------

class KtPool:
    """kt-kernel's MXFP4 MoE op (as bench/kt_process.py's KtMoe builds it) on two tiny experts, 1 worker."""

    def __init__(self, workers: int = 1):
        import kt_kernel  # noqa: F401  (picks the extension for this CPU; kt_kernel_ext imports after it)
        import kt_kernel_ext
        import torch
        from kt_kernel_ext import moe

        from ostinato.runtime.kernels.testing import random_packed_expert

        backend = getattr(moe, "AMXFP4_KGroup_MOE", None) or getattr(moe, "AVX2MXFP4_MOE", None)
        if backend is None:
            raise RuntimeError("no MXFP4 backend compiled into kt_kernel_ext")
        self.backend = backend.__name__
        g = torch.Generator().manual_seed(0)
        experts = [random_packed_expert(D, I, g) for _ in range(2)]
        pool = kt_kernel_ext.WorkerPoolConfig()
        pool.subpool_count, pool.subpool_numa_map, pool.subpool_thread_count = 1, [0], [workers]
        self.cpu = kt_kernel_ext.CPUInfer(pool)
        self.mask = torch.zeros(len(experts), dtype=torch.bool)
        cfg = moe.MOEConfig(len(experts), 1, D, I, self.mask.data_ptr())
        cfg.layer_idx, cfg.pool, cfg.max_len, cfg.swiglu_limit = 0, self.cpu.backend_, 4, 10.0

        def bf16(scale):  # ue8m0 byte b -> bf16 bits b << 7 (exact), as kt's MXFP4 loader keeps scales
            return (scale.view(torch.uint8).to(torch.int32) << 7).to(torch.int16).view(torch.bfloat16).contiguous()
        self.experts = experts
        self.keep = [[bf16(getattr(e, n)) for e in experts] for n in ("w1_scale", "w3_scale", "w2_scale")]
        cfg.gate_projs, cfg.up_projs, cfg.down_projs = ([[getattr(e, n).data_ptr() for e in experts]]
                                                        for n in ("w1", "w3", "w2"))
        cfg.gate_scales, cfg.up_scales, cfg.down_scales = ([[t.data_ptr() for t in s]] for s in self.keep)
        cfg.quant_config.bits, cfg.quant_config.group_size, cfg.quant_config.zero_point = 4, 32, False
        self.moe = backend(cfg)
        p2l = torch.arange(len(experts), dtype=torch.int64)
        self.cpu.submit(self.moe.load_weights_task(p2l.data_ptr()))
        self.cpu.sync()
        self.x = torch.randn(1, D, generator=g).bfloat16()
        self.out = torch.zeros(1, D, dtype=torch.bfloat16)
        self.ids, self.w = torch.zeros(1, 1, dtype=torch.int64), torch.full((1, 1), 0.5)
        self.bsz = torch.tensor([1], dtype=torch.int32)

    def call(self) -> float:
        t = time.perf_counter_ns()
        self.cpu.submit(self.moe.forward_task(self.bsz.data_ptr(), 1, self.ids.data_ptr(), self.w.data_ptr(),
                                              self.x.data_ptr(), self.out.data_ptr(), False))
        self.cpu.sync()
        return (time.perf_counter_ns() - t) * NS

    def samples(self, warmup: int, n: int, gap_s: float = 0.0) -> list[float]:
        for _ in range(warmup):
            self.call()
        out = []
        for _ in range(n):
            if gap_s:
                time.sleep(gap_s)
            out.append(self.call())
        return out


# ---- the run -----------------------------------------------------------------------------------------------

WHAT = {
    "ours_1route_Nthreads": f"our CPU expert kernel, 1 token x 1 expert (D={D}, I={I}), N threads, back to back",
    "ours_1route_1thread": "the same at 1 thread (no team), interleaved with the N-thread calls",
    "ours_0routes_Nthreads": "the same call with zero routes (returns before any parallel region): Python "
                             "wrapper + ctypes + argument checks",
    "ours_1route_Nthreads_after_idle": "1 route at N threads after the process slept idle_gap (the team's "
                                       "threads sleep past libgomp's spin window)",
    "ours_1route_1thread_after_idle": "1 route at 1 thread after the same idle gap",
    "kt_submit_sync_1worker": "kt-kernel CPUInfer submit(forward_task) + sync(), its MXFP4 MoE op on the tiny "
                              "expert, 1 token, 1 pool worker, back to back",
    "kt_submit_sync_1worker_after_idle": "the same after a 60 ms idle gap (past its workers' 50 ms spin)",
    "omp_skeleton_Nthreads": "the OpenMP skeleton of one kernel call (2 forks + joins, 2 barriers, no work) at "
                             "N threads, back to back, timed in C",
    "omp_skeleton_1thread": "the same at 1 thread (libgomp runs it on the caller, no team), interleaved",
    "omp_skeleton_Nthreads_after_idle": "the skeleton at N threads after the caller slept idle_gap in C",
    "condvar_round_trip": "two threads ping-pong through a pthread mutex + condition variable (futex sleep/wake)",
    "condvar_one_way": "condvar_round_trip / 2 per sample: one thread waking another",
    "spin_round_trip": "two threads ping-pong through one spinning atomic flag (no sleep)",
    "spin_one_way": "spin_round_trip / 2 per sample",
    "ctypes_noop_call": "one Python -> C ctypes call of a no-op (mean of 100 calls per sample)",
    "c_to_python_callback_same_thread": "C calling a Python ctypes callback on the calling thread (GIL re-taken)",
    "c_to_python_callback_other_thread": "C calling a Python ctypes callback from a C thread (as a CUDA host "
                                         "function would run on the driver's thread; main thread in a "
                                         "GIL-released call)",
}


def run(threads: int, samples: int, idle_gap_s: float, build_dir=None, kernel_root=None,
        log=print) -> dict:
    """All measurements; returns the YAML document (minus nothing: `main` writes it as is)."""
    from ostinato.host import usable_cores

    warm = max(20, samples // 10)
    idle_n = max(10, samples // 10)
    kt_idle_n = max(3, samples // 100)
    load_before = load_1min()
    whole, section = OtherLoad(), OtherLoad()
    meas: dict[str, dict] = {}
    derived: dict[str, dict] = {}
    skipped: dict[str, str] = {}

    def put(name: str, xs: list[float]) -> None:
        meas[name] = {**summarize(xs), "others_cores": section.cores(), "what": WHAT[name]}

    def paired_diff(name: str, many: list[float], one: list[float], what: str) -> None:
        d = sorted(a - b for a, b in zip(many, one))
        derived[name] = {"median_s": sig3(quantile(d, 0.5)), "p90_s": sig3(quantile(d, 0.9)), "samples": len(d),
                         "what": what}

    # (a)
    log(f"(a) our CPU expert kernel, D={D} I={I}, {threads} vs 1 thread, {samples} pairs ...")
    ours = OurPool(kernel_root)
    section.mark()
    many, one = ours.paired(threads, warm, samples)
    put("ours_1route_Nthreads", many)
    put("ours_1route_1thread", one)
    paired_diff("ours_pool_wake_barrier", many, one,
                "paired per-sample difference ours_1route_Nthreads - ours_1route_1thread: waking the OpenMP "
                "team (2 parallel regions per call) and its barriers, threads still spinning from the last call, "
                "net of what splitting the call's own work (allocations, 1-token GEMVs) across the team saves")
    section.mark()
    put("ours_0routes_Nthreads", ours.empty(threads, warm, samples))
    log(f"    ... and after a {idle_gap_s * 1e3:.0f} ms idle gap, {idle_n} pairs")
    section.mark()
    many_i, one_i = ours.paired(threads, 5, idle_n, gap_s=idle_gap_s)
    put("ours_1route_Nthreads_after_idle", many_i)
    put("ours_1route_1thread_after_idle", one_i)
    paired_diff("ours_pool_wake_barrier_after_idle", many_i, one_i,
                "paired difference after the idle gap: waking a team whose threads sleep in the kernel")

    # (b)
    try:
        kt = KtPool(1)
        log(f"(b) kt-kernel {kt.backend}, 1 worker, {samples} calls ...")
        section.mark()
        put("kt_submit_sync_1worker", kt.samples(warm, samples))
        log(f"    ... and after a {KT_IDLE_GAP_S * 1e3:.0f} ms idle gap, {kt_idle_n} calls")
        section.mark()
        put("kt_submit_sync_1worker_after_idle", kt.samples(2, kt_idle_n, gap_s=KT_IDLE_GAP_S))
        del kt
    except (ImportError, RuntimeError, AttributeError, TypeError) as e:
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        skipped["kt_submit_sync_1worker"] = why
        log(f"(b) kt-kernel: skipped ({why})")

    # (c) + (d)
    try:
        pp = Pingpong(build_pingpong(build_dir))
    except (RuntimeError, OSError) as e:
        pp = None
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        for name in ("omp_skeleton", "condvar_round_trip", "spin_round_trip", "ctypes_noop_call",
                     "c_to_python_callback"):
            skipped[name] = why
        log(f"(c)/(d) skipped ({why})")
    if pp:
        log(f"(a) OpenMP skeleton alone, {threads} vs 1 thread, {samples} pairs, and {idle_n} after the idle gap ...")
        pp.omp_regions(threads, warm, 1)
        pp.omp_regions(1, warm, 1)
        many, one = [], []
        section.mark()
        for _ in range(samples):
            many += pp.omp_regions(threads, 0, 1)
            one += pp.omp_regions(1, 0, 1)
        put("omp_skeleton_Nthreads", many)
        put("omp_skeleton_1thread", one)
        paired_diff("omp_pool_wake_barrier", many, one,
                    "paired difference omp_skeleton_Nthreads - omp_skeleton_1thread: waking the team, its barriers "
                    "and joins for one kernel call, threads still spinning from the last call; no work to split")
        section.mark()
        put("omp_skeleton_Nthreads_after_idle", pp.omp_regions(threads, 0, idle_n, gap_s=idle_gap_s))
        log(f"(c) thread ping-pong, {samples} round trips each ...")
        section.mark()
        rt = pp.round_trips("condvar", warm, samples)
        put("condvar_round_trip", rt)
        put("condvar_one_way", [v / 2 for v in rt])
        section.mark()
        rt = pp.round_trips("spin", warm, samples)
        put("spin_round_trip", rt)
        put("spin_one_way", [v / 2 for v in rt])
        log(f"(d) Python <-> C, {samples} samples each ...")
        section.mark()
        put("ctypes_noop_call", pp.noop_calls(warm, samples))
        section.mark()
        put("c_to_python_callback_same_thread", pp.callbacks(False, warm, samples))
        section.mark()
        put("c_to_python_callback_other_thread", pp.callbacks(True, warm, samples))

    load_after = load_1min()
    others = whole.cores()
    cpu = cpu_name()
    date = time.strftime("%Y-%m-%d")
    return {
        "source": f"python -m ostinato.bench.handoff --threads {threads} --samples {samples}; CPU {cpu} "
                  f"({usable_cores()} usable cores); {date}; 1-minute load average {load_before} before, "
                  f"{load_after} after (this run's own threads included); other processes kept {others} cores "
                  "busy on average during the run",
        "cpu": cpu, "date": date, "platform": platform.platform(),
        "load_average_1min": {"before": load_before, "after": load_after},
        "others_cores": others,
        "threads": threads, "samples": samples, "idle_gap_s": idle_gap_s,
        "measurements": meas,
        "derived": derived,
        "skipped": skipped,
        "recommended_handoff_per_layer": recommend(derived),
        "cited": CITED,
        "cited_missing": CITED_MISSING,
    }


def recommend(derived: dict) -> dict:
    """One per-layer hand-off constant for a hybrid engine on a GPU box, as the engine's decode step does it
    (runtime/kernels/cold_task.py: copy x and routes device -> host, a host node runs the CPU kernel, copy the
    result host -> device, join): the sum of cited GPU-side parts and the measured pool wake-up, no fitting."""
    us, fixed = 1e-6, CITED["cudamemcpy_fixed_overhead"]["value"] * 1e-6
    # the team's wake-up without the kernel's own work (which a 1-thread call does alone and N threads split)
    pool = "omp_pool_wake_barrier" if "omp_pool_wake_barrier" in derived else "ours_pool_wake_barrier"
    bytes_per_copy = 1 * HIDDEN * 4  # 1 decode token, float32 rows (the result is float32; x may be bf16)
    bw = CITED["h2d_pinned_bw_pcie4_x16_rtx4090"]["value"] * 1e9
    parts = [
        ("host_node_round_trip", CITED["cuda_host_func_round_trip"]["value"] * us, "cited:cuda_host_func_round_trip"),
        ("copy_fixed_overhead_d2h", fixed, "cited:cudamemcpy_fixed_overhead"),
        ("copy_fixed_overhead_h2d", fixed, "cited:cudamemcpy_fixed_overhead"),
        ("transfer_d2h_16KiB", bytes_per_copy / bw, "cited:h2d_pinned_bw_pcie4_x16_rtx4090 (16 KiB)"),
        ("transfer_h2d_16KiB", bytes_per_copy / bw, "cited:h2d_pinned_bw_pcie4_x16_rtx4090 (16 KiB)"),
        ("pool_wake_barrier", max(0.0, derived[pool]["median_s"]), f"measured:{pool}"),
    ]
    return {"value_s": sig3(sum(v for _, v, _ in parts)),
            "components": [{"name": n, "value_s": sig3(v), "from": f} for n, v, f in parts],
            "note": "per layer with cold experts, T=1 decode token, D=4096; the pool part is this machine's "
                    "hot wake-up (team still spinning, floored at 0) at the run's thread count; a spec's "
                    "host.handoff_s grows it to the host's cores (ostinato/host_sync.py); the copy fixed overheads "
                    "are host-issued cudaMemcpy figures (a CUDA graph's memcpy nodes may cost less)"}


def table(doc: dict) -> str:
    rows = [("measurement", "median us", "p90 us", "n", "others' cores")]
    for block in ("measurements", "derived"):
        for name, m in doc[block].items():
            rows.append((name if block == "measurements" else f"{name} (derived)", f"{m['median_s'] * 1e6:.3g}",
                         f"{m['p90_s'] * 1e6:.3g}", str(m["samples"]), str(m.get("others_cores", ""))))
    w = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]:>{w[3]}}  {r[4]:>{w[4]}}" for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    for name, why in doc["skipped"].items():
        lines.append(f"{name}: skipped ({why})")
    rec = doc["recommended_handoff_per_layer"]
    lines.append(f"recommended per-layer hand-off: {rec['value_s'] * 1e6:.3g} us = "
                 + " + ".join(f"{c['name']} {c['value_s'] * 1e6:.3g}" for c in rec["components"]))
    lines.append(f"threads={doc['threads']}  load average (1 min): {doc['load_average_1min']['before']} before, "
                 f"{doc['load_average_1min']['after']} after; other processes: {doc['others_cores']} cores busy")
    return "\n".join(lines)


def write_yaml(path: str | os.PathLike, doc: dict) -> None:
    import yaml

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.write("# The per-layer CPU-GPU hand-off: CPU-side parts measured on this machine, GPU-side parts cited.\n"
                "# Written by bench/handoff.py (python -m ostinato.bench.handoff); times in seconds, 3 significant\n"
                "# digits; `cited` values in the unit given with each.\n")
        yaml.safe_dump(doc, f, sort_keys=False, width=120)


def main(argv=None) -> int:
    from ostinato.host import usable_cores

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=usable_cores(), help="pool threads (default: usable cores)")
    ap.add_argument("--samples", type=int, default=5000, help="samples per measurement (idle ones: a tenth)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="YAML to write (default bench/measured/handoff.yaml; "
                                                            "'-': none)")
    ap.add_argument("--idle-gap-ms", type=float, default=10.0,
                    help="idle gap before each 'after idle' call (default 10 ms: past libgomp's ~3 ms spin)")
    ap.add_argument("--build-dir", default=None, help="where the ping-pong library is built (default build/handoff)")
    ap.add_argument("--kernel-root", default=None, help="kernel build directory (default build/kernels)")
    a = ap.parse_args(argv)
    if a.threads < 1 or a.samples < 2 or a.idle_gap_ms < 0:
        ap.error("--threads must be >= 1, --samples >= 2, --idle-gap-ms >= 0")
    doc = run(a.threads, a.samples, a.idle_gap_ms / 1e3, a.build_dir, a.kernel_root)
    print(table(doc))
    if a.out != "-":
        write_yaml(a.out, doc)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
