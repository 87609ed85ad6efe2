"""Compile rendered Triton kernels with real Triton (not its interpreter) for NVIDIA GPUs that need not be here.

    python tools/triton_compile_check.py < jobs.json > results.json

Needs only the standard library and triton (no torch, no ostinato), so any Python with a Triton
runs it: the project's .venv and the pinned one of tools/setup_triton_pin.sh
(tests/test_triton_targets.py runs both). Nothing touches a GPU: triton.compile gets an explicit
target, and ptxas (bundled with Triton's wheel) turns the PTX into a cubin on the CPU.

A job: {"path": rendered kernel module, "kernel": function name, "signature": ["*fp32", "*u8", ...]
(one type per argument, in order), "arch": 90}. A result: the job's kernel and arch, plus "triton"
(version), "error" (None, or the exception's type and text), "ptx_entry" (the PTX defines the
kernel), "ptx_target" (the PTX's .target line), "cubin_bytes" (0 when there is none), "seconds".
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

WARP_SIZE = 32  # GPUTarget's third argument is the warp size: 32 on every NVIDIA GPU (64 is AMD's wavefront)


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_job(job: dict, modules: dict) -> dict:
    if job["path"] not in modules:  # each rendered module is imported once
        modules[job["path"]] = _load(job["path"], f"rendered_kernels_{len(modules)}")
    fn = getattr(modules[job["path"]], job["kernel"])
    names, types = fn.arg_names, job["signature"]
    if len(names) != len(types):
        raise TypeError(f"{job['kernel']} takes {len(names)} arguments {names}, the launcher passes {len(types)}")
    # Every pointer 16-byte aligned, as Triton's launcher specializes fresh torch tensors (tt.divisibility).
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(types) if t.startswith("*")}
    compiled = triton.compile(ASTSource(fn, dict(zip(names, types, strict=True)), attrs=attrs),
                              target=GPUTarget("cuda", job["arch"], WARP_SIZE))
    ptx = compiled.asm["ptx"]
    target = re.search(r"^\.target\s+(\S+)", ptx, re.MULTILINE)
    return {"ptx_entry": re.search(rf"\.entry\s+{job['kernel']}\s*\(", ptx) is not None,
            "ptx_target": target.group(1) if target else None, "cubin_bytes": len(compiled.asm.get("cubin", b""))}


def main() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("TRITON_INTERPRET is set: this check needs the real compiler")
    modules, results = {}, []
    for job in json.load(sys.stdin):
        t0, res = time.perf_counter(), {"kernel": job["kernel"], "arch": job["arch"], "triton": triton.__version__}
        try:
            res |= compile_job(job, modules) | {"error": None}
        except Exception as e:  # noqa: BLE001 - reported per job, the other jobs still run
            res["error"] = f"{type(e).__name__}: {e}"
        results.append(res | {"seconds": round(time.perf_counter() - t0, 2)})
    json.dump(results, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
