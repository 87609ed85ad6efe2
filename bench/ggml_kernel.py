"""ggml's (llama.cpp's) CPU MXFP4 MoE expert kernel, timed from Python for bench/kernel_side_by_side.py.

bench/ggml_expert_kernel.c runs the graph a llama.cpp MoE layer builds for its routed experts (mul_mat_id
gate and up with each token's top-k expert ids, clamped SwiGLU, mul_mat_id down, times the route weights,
the k results added) on a layer of DeepSeek-V4-Flash's experts (256 x D=4096, I=2048 by default) with
ggml's CPU backend and a persistent ggml threadpool, and times it internally; this module finds a
llama.cpp source tree and a build of its shared ggml libraries, compiles the program against them
(`cc -O2`, cached under build/ggml_kernel and rebuilt only when the source, the paths or the compiler
change), and talks to it.

llama.cpp is located by arguments or, failing those, the environment, or else where
bench/llama_cpp_side_by_side.py builds it (bench/llama_cpp_build.py's cache):
  OSTINATO_LLAMA_CPP_BUILD  the build directory: bin/ holds libggml.so, libggml-base.so, libggml-cpu.so
                            (`cmake -B build -DBUILD_SHARED_LIBS=ON && cmake --build build`; the libraries
                            may also sit in the directory itself)
  OSTINATO_LLAMA_CPP_SRC    the source tree: ggml/include holds ggml.h, ggml-cpu.h, ggml-backend.h, ggml-alloc.h

`GgmlMxfp4(threads)` starts the program once (its experts set up, one call checked against a float
reference); `.run(ids, weights, warmup)` then computes one call per row of ids [calls, T, k] (the first
`warmup` untimed) and returns each timed call's seconds, process start-up, set-up and setting the ids not
included (`cpu_time=True`: the process's CPU seconds, all its threads, instead of wall seconds).
`.variant` says which ggml CPU features the library was built with and where the weights went
(CPU_REPACK: llama.cpp's default for CPU MXFP4 experts on AVX2). `.pid` is the process (its threadpool
polls after each call: bench/kernel_side_by_side.py stops it while other systems are timed).

Standalone: python -m ostinato.bench.ggml_kernel [--threads N] [--tokens 1,2,4] [--calls C] [--experts N]
            [--top-k K] [--plain]  (uniform random top-k routes; median ms per call)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ENV_BUILD = "OSTINATO_LLAMA_CPP_BUILD"
ENV_SRC = "OSTINATO_LLAMA_CPP_SRC"
SOURCE = Path(__file__).resolve().with_name("ggml_expert_kernel.c")
CACHE = Path(__file__).resolve().parent.parent / "build" / "ggml_kernel"
LIBS = ("libggml.so", "libggml-base.so", "libggml-cpu.so")
HEADERS = ("ggml.h", "ggml-cpu.h", "ggml-backend.h", "ggml-alloc.h")


class GgmlNotFound(RuntimeError):
    """llama.cpp's source or its built ggml libraries are not where they were looked for."""


def locate(build: str | os.PathLike | None = None, src: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """(the directory with the ggml shared libraries, ggml's include directory); GgmlNotFound naming what is
    missing otherwise."""
    from .llama_cpp_build import default_cache  # where llama_cpp_side_by_side.py builds llama.cpp
    cached = default_cache()
    build = build or os.environ.get(ENV_BUILD) or ((cached / "build") if (cached / "build").is_dir() else None)
    src = src or os.environ.get(ENV_SRC) or ((cached / "src" / "llama.cpp") if (cached / "src").is_dir() else None)
    if not build:
        raise GgmlNotFound(f"no llama.cpp build directory: pass --llama-cpp-build DIR or set {ENV_BUILD}")
    if not src:
        raise GgmlNotFound(f"no llama.cpp source directory: pass --llama-cpp-src DIR or set {ENV_SRC}")
    build, src = Path(build).expanduser().resolve(), Path(src).expanduser().resolve()
    lib_dir = next((d for d in (build / "bin", build) if all((d / n).exists() for n in LIBS)), None)
    if lib_dir is None:
        missing = [n for n in LIBS if not (build / "bin" / n).exists()]
        raise GgmlNotFound(f"llama.cpp build {build}: no {', '.join(missing)} in {build / 'bin'} (a shared-library "
                           "build: cmake -DBUILD_SHARED_LIBS=ON)")
    inc = src / "ggml" / "include"
    missing = [n for n in HEADERS if not (inc / n).exists()]
    if missing:
        raise GgmlNotFound(f"llama.cpp source {src}: no {', '.join(missing)} in {inc}")
    return lib_dir, inc


def compile_binary(lib_dir: Path, inc: Path, cache: Path = CACHE, cc: str | None = None) -> Path:
    """bench/ggml_expert_kernel.c linked against lib_dir's ggml, cached by source, paths and compiler."""
    cc = cc or os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise GgmlNotFound(f"no C compiler {cc!r} on PATH")
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), str(lib_dir).encode(), str(inc).encode(),
                                     cc.encode()])).hexdigest()[:16]
    out = cache / f"ggml_expert_kernel-{key}"
    if out.exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [cc, "-O2", "-o", None, str(SOURCE), f"-I{inc}", f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}",
           "-lggml", "-lggml-base", "-lggml-cpu", "-lm"]
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd[3] = str(Path(tmp) / out.name)
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode:
            raise RuntimeError(f"compiling {SOURCE.name} failed ({' '.join(cmd)}):\n{r.stderr.strip()}")
        os.replace(cmd[3], out)  # atomic: a half-written binary is never cached
    for stale in cache.glob("ggml_expert_kernel-*"):  # earlier sources' builds
        if stale != out:
            stale.unlink(missing_ok=True)
    return out


def info(binary: Path, threads: int = 1, n_experts: int = 256, top_k: int = 6, plain: bool = False) -> dict:
    """The program's --info lines as a dict: ggml (version), cpu_features, weights_buffer."""
    cmd = ([str(binary), "--info", "--threads", str(threads), "--experts", str(n_experts), "--top-k", str(top_k)]
           + (["--plain"] if plain else []))
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    got = {}
    for line in r.stdout.splitlines():
        if line.startswith("ggml "):
            got["ggml"] = line.split()[1]
        elif ":" in line:
            k, v = line.split(":", 1)
            got[k.strip()] = v.strip()
    return got


class GgmlMxfp4:
    """ggml's MXFP4 expert kernel in a process of its own: a layer of `n_experts` random experts stacked as
    ggml tensors in llama.cpp's weight buffer type (256 x 13.4 MB = 3.4 GB by default), `top_k` routes per
    token."""

    def __init__(self, threads: int, n_experts: int = 256, top_k: int = 6, build: str | None = None,
                 src: str | None = None, plain: bool = False, cache: Path = CACHE, cpu_time: bool = False):
        lib_dir, inc = locate(build, src)
        self.binary = compile_binary(lib_dir, inc, cache)
        self.threads, self.n_experts, self.top_k = threads, n_experts, top_k
        got = info(self.binary, threads, n_experts, top_k, plain)
        self.weights_buffer = got.get("weights_buffer", "?")
        self.variant = (f"ggml {got.get('ggml', '?')} [{got.get('cpu_features', '')}], MXFP4 weights in "
                        f"{self.weights_buffer}")
        self._err = tempfile.TemporaryFile(mode="w+")
        self._dir = tempfile.TemporaryDirectory(prefix="ggml_kernel-")
        self.proc = subprocess.Popen(
            [str(self.binary), "--serve", "--threads", str(threads), "--experts", str(n_experts),
             "--top-k", str(top_k)] + (["--plain"] if plain else []) + (["--cpu-time"] if cpu_time else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True, bufsize=1)
        self.pid = self.proc.pid
        self.check_rel_err = self.check_rel_err_q8 = float("nan")
        self.notes = []
        while self.check_rel_err_q8 != self.check_rel_err_q8:  # nan until the second check line
            line = self.proc.stdout.readline()
            if not line:
                self._fail("exited during set-up")
            self.notes.append(line[1:].strip())
            for word in line.split():
                if word.startswith("rel_err="):
                    self.check_rel_err = float(word.split("=", 1)[1])
                elif word.startswith("rel_err_q8="):
                    self.check_rel_err_q8 = float(word.split("=", 1)[1])

    def _fail(self, what: str):
        self.proc.wait(timeout=10)
        self._err.seek(0)
        err = "; ".join(line for line in self._err.read().splitlines() if not line.startswith("repack:"))
        raise RuntimeError(f"{self.binary.name} {what} (exit {self.proc.returncode}): {err}")

    def run(self, ids, weights, warmup: int = 0) -> list[float]:
        """Seconds of each call after the first `warmup`: ids [calls, T, top_k] expert ids (any integer array
        type with .numpy(), or numpy), weights [calls, T, top_k] route weights."""
        import numpy as np

        ids = np.ascontiguousarray(np.asarray(ids), dtype=np.int32)
        weights = np.ascontiguousarray(np.asarray(weights), dtype=np.float32)
        if ids.ndim != 3 or ids.shape[2] != self.top_k or weights.shape != ids.shape:
            raise ValueError(f"ids and weights: need [calls, T, {self.top_k}], got {ids.shape} and {weights.shape}")
        calls, T = ids.shape[0] - warmup, ids.shape[1]
        if calls < 1 or warmup < 0:
            raise ValueError(f"warmup {warmup} leaves no timed call of {ids.shape[0]}")
        if ids.min() < 0 or ids.max() >= self.n_experts:
            raise ValueError(f"expert ids outside 0..{self.n_experts - 1}")
        path = Path(self._dir.name) / "routes.bin"
        with open(path, "wb") as f:
            f.write(ids.tobytes())
            f.write(weights.tobytes())
        self.proc.stdin.write(f"{T} {calls} {warmup} {path}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self._fail(f"exited while timing {T} tokens")
        words = line.split()
        if words[0] == "error:" or int(words[0]) != T or len(words) != calls + 1:
            raise RuntimeError(f"{self.binary.name} answered {line.strip()!r} to {T} tokens x {calls} calls")
        return [float(w) / 1e3 for w in words[1:]]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._err.close()
        self._dir.cleanup()

    def __enter__(self) -> GgmlMxfp4:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "proc", None) is not None and self.proc.poll() is None:
            self.proc.kill()


def uniform_routes(calls: int, tokens: int, n_experts: int, top_k: int, seed: int = 0):
    """ids [calls, tokens, top_k]: each token's top_k distinct experts uniformly at random; weights 1/top_k."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = np.argsort(rng.random((calls, tokens, n_experts)), axis=2)[:, :, :top_k]
    return ids.astype(np.int32), np.full(ids.shape, 1.0 / top_k, dtype=np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--top-k", type=int, default=6)
    ap.add_argument("--plain", action="store_true", help="weights in plain CPU memory, not repacked")
    ap.add_argument("--llama-cpp-build", default=os.environ.get(ENV_BUILD))
    ap.add_argument("--llama-cpp-src", default=os.environ.get(ENV_SRC))
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    with GgmlMxfp4(args.threads, args.experts, args.top_k, args.llama_cpp_build, args.llama_cpp_src,
                   args.plain) as g:
        print(g.variant)
        print("\n".join(g.notes))
        print("tokens | median ms per call")
        for T in tokens:
            ids, w = uniform_routes(args.calls + 1, T, args.experts, args.top_k, seed=T)
            times = sorted(g.run(ids, w, warmup=1))
            print(f"{T:>6} | {times[len(times) // 2] * 1e3:.3f}")


if __name__ == "__main__":
    main()
