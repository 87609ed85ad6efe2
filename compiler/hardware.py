"""Hardware specs: the GPUs, the host and the link between them, from YAML, validated.

A spec is a file or the name of a preset in plans/hardware/. Every number is a rate or a size a
datasheet or a quick benchmark gives; the cost model and the memory model read nothing else.
Errors name the file and the field (`gpus.count`, `host.isa`, ...).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..plans import plans_dir
from ..runtime.kernels.host_isa import ISAS



class HardwareError(ValueError):
    """A hardware spec is missing a field or holds a wrong value; the message names the file and field."""


@dataclass(frozen=True)
class GpuSpec:
    name: str
    count: int
    usable_bytes: int          # memory Ostinato may use per GPU (after the driver/context reserve)
    bandwidth: float           # bytes/s, device memory read
    matmul_flops: float        # FLOP/s for the expert and dense matmuls (bf16 inputs, fp32 accumulate)
    launch_overhead_s: float   # fixed cost per decode graph replay / kernel batch


@dataclass(frozen=True)
class HostSpec:
    cores: int
    usable_bytes: int
    bandwidth: float           # bytes/s, DRAM read with all cores
    matmul_flops: float        # FLOP/s of the CPU expert kernels, all cores
    isa: str
    op_dispatch_s: float       # host seconds per framework op dispatched eagerly (Python + PyTorch)


@dataclass(frozen=True)
class LinkSpec:
    h2d_bandwidth: float       # bytes/s host -> device (pinned)
    d2h_bandwidth: float
    latency_s: float


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    description: str
    gpu: GpuSpec
    host: HostSpec
    link: LinkSpec
    cpu_only: bool             # every "GPU" is the CPU itself (tests, CI, this machine's kind)
    source_sha256: str

    @property
    def gpu_count(self) -> int:
        return self.gpu.count


def available_presets() -> list[str]:
    return sorted(p.stem for p in (plans_dir() / "hardware").glob("*.yaml"))


def load_hardware(spec: str | Path) -> HardwareSpec:
    """A YAML file path, or the name of a preset (`rtx4090d-x4`, `h200-x1`, `cpu-only`)."""
    path = Path(spec)
    if not path.exists():
        preset = plans_dir() / "hardware" / f"{spec}.yaml"
        if not preset.exists():
            raise HardwareError(f"{spec}: no such file, and not a preset (presets: {', '.join(available_presets())})")
        path = preset
    text = path.read_bytes()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise HardwareError(f"{path}: not valid YAML ({e})") from None
    return parse_hardware(data, str(path), hashlib.sha256(text).hexdigest())


def parse_hardware(data: object, source: str, sha256: str = "") -> HardwareSpec:
    reader = _Fields(data, source)
    gpus = reader.section("gpus")
    host = reader.section("host")
    link = reader.section("link")
    isa = host.text("isa")
    if isa not in ISAS:
        raise HardwareError(f"{source}: field 'host.isa': '{isa}' is not one of {list(ISAS)}")
    return HardwareSpec(
        name=reader.text("name"),
        description=reader.text("description", ""),
        gpu=GpuSpec(gpus.text("name"), gpus.integer("count"), gpus.integer("usable_bytes"),
                    gpus.rate("bandwidth"), gpus.rate("matmul_flops"), gpus.rate("launch_overhead_s", zero_ok=True)),
        host=HostSpec(host.integer("cores"), host.integer("usable_bytes"), host.rate("bandwidth"),
                      host.rate("matmul_flops"), isa, host.rate("op_dispatch_s", zero_ok=True)),
        link=LinkSpec(link.rate("h2d_bandwidth"), link.rate("d2h_bandwidth"), link.rate("latency_s", zero_ok=True)),
        cpu_only=bool(reader.flag("cpu_only")),
        source_sha256=sha256,
    )


class _Fields:
    """Typed access to one mapping of the YAML, with errors that name the dotted field."""

    def __init__(self, data: object, source: str, prefix: str = ""):
        if not isinstance(data, dict):
            where = f"field '{prefix.rstrip('.')}'" if prefix else "top level"
            raise HardwareError(f"{source}: {where} must be a mapping")
        self.data, self.source, self.prefix = data, source, prefix

    def _get(self, key: str, default: object = None) -> object:
        if key not in self.data:
            if default is not None:
                return default
            raise HardwareError(f"{self.source}: field '{self.prefix}{key}' is missing")
        return self.data[key]

    def _bad(self, key: str, problem: str) -> HardwareError:
        return HardwareError(f"{self.source}: field '{self.prefix}{key}': {problem}")

    def section(self, key: str) -> "_Fields":
        return _Fields(self._get(key), self.source, f"{self.prefix}{key}.")

    def text(self, key: str, default: str | None = None) -> str:
        v = self._get(key, default)
        if not isinstance(v, str) or not v:
            raise self._bad(key, f"must be a non-empty string, got {v!r}")
        return v

    def integer(self, key: str) -> int:
        v = self._get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v <= 0:
            raise self._bad(key, f"must be a positive integer, got {v!r}")
        return int(v)

    def rate(self, key: str, zero_ok: bool = False) -> float:
        v = self._get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (v == 0 and not zero_ok):
            raise self._bad(key, f"must be a {'non-negative' if zero_ok else 'positive'} number, got {v!r}")
        return float(v)

    def flag(self, key: str) -> bool:
        v = self.data.get(key, False)
        if not isinstance(v, bool):
            raise self._bad(key, f"must be true or false, got {v!r}")
        return v
