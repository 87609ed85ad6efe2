"""OSTINATO_ISA caps the ISA this CPU reports (ostinato/isa.py): how an AVX-512 machine runs an AVX2 host's code
paths for the whole engine, and never reports one the CPU lacks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ostinato.isa import ISA_ENV, detect_isa, supports

ZEN4 = "avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_bf16 avx512vbmi avx512_vnni"


@pytest.fixture
def zen4(tmp_path):
    (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {ZEN4}\n")
    return tmp_path / "cpuinfo"


@pytest.mark.parametrize("cap,isa", [("avx2", "avx2"), ("avx512", "avx512"), ("avx512_bf16", "avx512_bf16"),
                                     ("amx", "avx512_bf16")])
def test_the_cap_bounds_what_the_cpu_reports(zen4, monkeypatch, cap, isa):
    monkeypatch.setenv(ISA_ENV, cap)
    assert detect_isa(zen4) == isa
    assert supports("avx2", zen4)
    assert supports("avx512_bf16", zen4) == (isa == "avx512_bf16")
    assert supports("avx512", zen4) == (isa != "avx2")
    assert not supports("amx", zen4)  # the cap never adds what the CPU lacks


def test_unset_or_empty_reports_the_cpu_as_it_is(zen4, monkeypatch):
    monkeypatch.delenv(ISA_ENV, raising=False)
    assert detect_isa(zen4) == "avx512_bf16"
    monkeypatch.setenv(ISA_ENV, "")
    assert detect_isa(zen4) == "avx512_bf16"


def test_a_bad_value_is_named(zen4, monkeypatch):
    monkeypatch.setenv(ISA_ENV, "sse4")
    with pytest.raises(ValueError, match="OSTINATO_ISA='sse4'"):
        detect_isa(zen4)


@pytest.mark.slow  # a fresh interpreter importing torch, seconds
def test_the_engine_reads_the_cap_for_its_bf16_arithmetic():
    """bf16_widening.NATIVE_BF16 (the bf16 slabs' and torch's bf16 products' switch) follows the cap, read at
    import: forced to avx2 the engine takes the paths of a host without bf16 arithmetic."""
    code = "from ostinato.runtime.model import bf16_widening as b; print(b.NATIVE_BF16)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, ISA_ENV: "avx2"}).stdout.strip()
    assert out == "False"
