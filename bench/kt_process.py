"""kt-kernel (KTransformers' CPU MoE kernels) in a process of its own, for bench/kernel_side_by_side.py.

Its MXFP4 MoE op is driven as kt-kernel's bench_moe drives it (MOEConfig with the model's expert count and
top-k, forward_task submitted and synced per call, bf16 in and out) on the packed bytes of
expert_layer.random_layer. It runs in a child process (`python -m ostinato.bench.kt_process`, a line
protocol on stdin/stdout) for two reasons: its queue thread busy-waits and its workers spin after each
call, so the parent SIGSTOPs it while other systems are timed; and its extension turns on flush-to-zero
for the whole process that loads it (it is built with fast-math), which must not reach anyone else's
float arithmetic.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .expert_layer import MAX_LEN, N_EXPERTS, SEED, TOP_K, D, I, layer_checksum, random_layer


def _kt_bf16_scale(scale: torch.Tensor) -> torch.Tensor:
    """ue8m0 byte b -> bf16 bits b << 7 (exact), as kt's MXFP4 loader hands it scales."""
    return (scale.view(torch.uint8).to(torch.int32) << 7).to(torch.int16).view(torch.bfloat16).contiguous()


class KtMoe:
    """kt-kernel's MXFP4 MoE op through its extension (the KTMoEWrapper front end wants pinned memory and
    a safetensors checkpoint): MOEConfig(expert_num, num_experts_per_tok, hidden, intermediate), per-expert
    pointers to the packed bytes, ue8m0 scales as bf16, SwiGLU limit 10, load_weights_task, then
    forward_task(qlen, k, ids, weights, x, out) submitted and synced per call as kt's bench_moe does."""

    def __init__(self, experts: list, top_k: int, workers: int, max_len: int, dim: int, inter: int):
        import kt_kernel  # picks the extension for this CPU
        import kt_kernel_ext
        from kt_kernel_ext import moe

        self.variant = kt_kernel.__cpu_variant__
        backend = getattr(moe, "AMXFP4_KGroup_MOE", None) or getattr(moe, "AVX2MXFP4_MOE", None)  # its own order
        if backend is None:
            raise RuntimeError("no MXFP4 backend compiled into kt_kernel_ext")
        self.backend = backend.__name__
        pool = kt_kernel_ext.WorkerPoolConfig()
        pool.subpool_count, pool.subpool_numa_map, pool.subpool_thread_count = 1, [0], [workers]
        self.cpu = kt_kernel_ext.CPUInfer(pool)
        self.mask = torch.zeros(len(experts), dtype=torch.bool)  # no GPU experts
        cfg = moe.MOEConfig(len(experts), top_k, dim, inter, self.mask.data_ptr())
        cfg.layer_idx, cfg.pool, cfg.max_len, cfg.swiglu_limit = 0, self.cpu.backend_, max_len, 10.0
        scales = [[_kt_bf16_scale(getattr(e, n)) for e in experts] for n in ("w1_scale", "w3_scale", "w2_scale")]
        cfg.gate_projs, cfg.up_projs, cfg.down_projs = ([[getattr(e, n).data_ptr() for e in experts]]
                                                        for n in ("w1", "w3", "w2"))
        cfg.gate_scales, cfg.up_scales, cfg.down_scales = ([[t.data_ptr() for t in s]] for s in scales)
        cfg.quant_config.bits, cfg.quant_config.group_size, cfg.quant_config.zero_point = 4, 32, False
        self.moe = backend(cfg)
        p2l = torch.arange(len(experts), dtype=torch.int64)
        self.cpu.submit(self.moe.load_weights_task(p2l.data_ptr()))
        self.cpu.sync()
        self.top_k, self.dim, self.max_len = top_k, dim, max_len
        # kt copies the weights into its own buffers: the caller may free `experts` and `scales` now

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        x, ids, weights = x.bfloat16().contiguous(), ids.to(torch.int64).contiguous(), weights.float().contiguous()
        out = torch.zeros(n, self.dim, dtype=torch.bfloat16)
        bsz = torch.tensor([n], dtype=torch.int32)
        self.cpu.submit(self.moe.forward_task(bsz.data_ptr(), self.top_k, ids.data_ptr(), weights.data_ptr(),
                                              x.data_ptr(), out.data_ptr(), False))
        self.cpu.sync()
        return out

    def run(self, ids: torch.Tensor, weights: torch.Tensor, warmup: int) -> list[float]:
        n = ids.shape[1]
        if n > self.max_len:
            raise ValueError(f"{n} tokens > kt's max_len {self.max_len}")
        x = torch.randn(n, self.dim, generator=torch.Generator().manual_seed(n)).bfloat16()
        out = torch.zeros(n, self.dim, dtype=torch.bfloat16)
        bsz = torch.tensor([n], dtype=torch.int32)
        ids, weights = ids.to(torch.int64).contiguous(), weights.float().contiguous()
        secs = []
        for c in range(ids.shape[0]):
            task = self.moe.forward_task(bsz.data_ptr(), self.top_k, ids[c].data_ptr(), weights[c].data_ptr(),
                                         x.data_ptr(), out.data_ptr(), False)
            t = time.perf_counter()
            self.cpu.submit(task)
            self.cpu.sync()
            if c >= warmup:
                secs.append(time.perf_counter() - t)
        return secs


def _release_freed_memory() -> None:
    """Hand the heap's freed pages back to the system (glibc keeps them after big frees)."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def kt_serve(args) -> int:
    """The kt process: build the layer (the same bytes as the parent's), load it into kt, answer requests
    on stdin, one a line: `run PATH` (torch.save'd {ids, weights, warmup}: answer `ok s_1 ... s_C`),
    `forward PATH OUT` (torch.save'd {x, ids, weights}; kt's output saved to OUT: answer `ok`). Protocol
    lines go to the original stdout; whatever kt prints goes to stderr."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # kt's C++ printf lines must not reach the protocol
    torch.set_num_threads(1)

    def say(line: str) -> None:
        proto.write(line + "\n")
        proto.flush()
    try:
        # The caller's sync and kt's queue thread busy-wait: keep them (and this thread) on the cores kt's
        # workers are not bound to (kt binds worker i to the i-th core of the NUMA node; threads it starts
        # from here inherit this mask).
        cores = sorted(os.sched_getaffinity(0))
        if args.workers < len(cores):
            os.sched_setaffinity(0, cores[args.workers:])
        experts = random_layer(args.experts, args.dim, args.inter, args.seed)
        checksum = layer_checksum(experts)
        kt = KtMoe(experts, args.top_k, args.workers, args.max_len, args.dim, args.inter)
        del experts  # kt holds its own copy
        _release_freed_memory()
        import importlib.metadata
        version = importlib.metadata.version("kt-kernel")
        say(f"ready variant={kt.variant} backend={kt.backend} version={version} checksum={checksum}")
    except Exception as e:  # not installed, no MXFP4 backend, ...
        say(f"error {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return 1
    for line in sys.stdin:
        words = line.split()
        try:
            if words[:1] == ["run"]:
                req = torch.load(words[1])
                secs = kt.run(req["ids"], req["weights"], req["warmup"])
                say("ok " + " ".join(f"{s:.9f}" for s in secs))
            elif words[:1] == ["forward"]:
                req = torch.load(words[1])
                torch.save(kt.forward(req["x"], req["ids"], req["weights"]), words[2])
                say("ok")
            else:
                say(f"error unknown request {line.strip()!r}")
        except Exception as e:
            say(f"error {type(e).__name__}: {e}")
    return 0


class KtProcess:
    """kt-kernel in a child process (kt_serve), stopped (SIGSTOP) between its turns."""

    name = "kt-kernel"

    def __init__(self, workers: int, n_experts: int = N_EXPERTS, top_k: int = TOP_K, dim: int = D, inter: int = I,
                 seed: int = SEED, max_len: int = MAX_LEN):
        self.workers, self.top_k = workers, top_k
        self._dir = tempfile.TemporaryDirectory(prefix="kt_serve-")
        self._err = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-m", "ostinato.bench.kt_process", "--workers", str(workers),
               "--experts", str(n_experts), "--top-k", str(top_k), "--dim", str(dim), "--inter", str(inter),
               "--seed", str(seed), "--max-len", str(max_len)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True,
                                     bufsize=1)
        self.pid = self.proc.pid
        self.stopped = False
        words = self._answer("starting")
        if words[0] != "ready":
            raise RuntimeError(" ".join(words[1:]))
        self.info = dict(w.split("=", 1) for w in words[1:])
        self.checksum = int(self.info["checksum"])

    def _answer(self, what: str) -> list[str]:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            self._err.seek(0)
            tail = " | ".join(self._err.read().strip().splitlines()[-3:])
            raise RuntimeError(f"the kt process exited while {what} (exit {self.proc.returncode}): {tail}")
        words = line.split()
        if words[0] == "error":
            raise RuntimeError(f"the kt process, {what}: {' '.join(words[1:])}")
        return words

    def stop(self) -> None:
        if not self.stopped and self.proc.poll() is None:
            os.kill(self.pid, signal.SIGSTOP)
            self.stopped = True

    def cont(self) -> None:
        if self.stopped and self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
        self.stopped = False

    def run(self, ids: torch.Tensor, weights: torch.Tensor, warmup: int) -> list[float]:
        path = Path(self._dir.name) / "run.pt"
        torch.save({"ids": ids, "weights": weights, "warmup": warmup}, path)
        self.proc.stdin.write(f"run {path}\n")
        self.proc.stdin.flush()
        return [float(s) for s in self._answer(f"timing {ids.shape[1]} tokens")[1:]]

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        path, out = Path(self._dir.name) / "fwd.pt", Path(self._dir.name) / "out.pt"
        torch.save({"x": x, "ids": ids, "weights": weights}, path)
        self.proc.stdin.write(f"forward {path} {out}\n")
        self.proc.stdin.flush()
        self._answer("computing one call")
        return torch.load(out)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.cont()
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._err.close()
        self._dir.cleanup()

    def __del__(self) -> None:
        if getattr(self, "proc", None) is not None and self.proc.poll() is None:
            self.cont()
            self.proc.kill()


# ---- ggml, in a process of its own ----


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="kt-kernel's MXFP4 MoE op serving timed calls on stdin/stdout")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--experts", type=int, default=N_EXPERTS)
    ap.add_argument("--top-k", type=int, default=TOP_K)
    ap.add_argument("--dim", type=int, default=D)
    ap.add_argument("--inter", type=int, default=I)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--max-len", type=int, default=MAX_LEN)
    return kt_serve(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
