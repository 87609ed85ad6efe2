"""Compile a rendered C++ kernel into a shared library with the system compiler."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

from .render import KernelRecord

BASE_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-fno-math-errno")


class KernelCompileError(RuntimeError):
    """The system compiler rejected a generated kernel; the message carries its output."""


def compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise KernelCompileError("no C++ compiler found (set CXX or install g++)")
    return cxx


def compile_shared(record: KernelRecord) -> KernelRecord:
    """Build record.path (a .cpp) into lib<name>.so beside it (skipped when it exists); the record's
    path then names the library. record.flags (covered by its content hash) are the full flag list; the
    headers render copied into include/ beside the source (covered by the hash too) are found there, so
    the build reads nothing from the source tree and the library needs none of it at run time."""
    src = Path(record.path)
    lib = src.with_name(f"lib{src.stem}.so")
    if not lib.exists():
        tmp = lib.with_name(f"{lib.name}.tmp{os.getpid()}")
        include = src.with_name("include")
        include_flags = ["-I", str(include)] if include.is_dir() else []
        cmd = [compiler(), *record.flags, *include_flags, str(src), "-o", str(tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise KernelCompileError(f"compiling {src} failed ({' '.join(cmd)}):\n{proc.stderr.strip()}")
        os.replace(tmp, lib)
    return replace(record, path=str(lib))
