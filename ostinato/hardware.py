"""Hardware specs: the GPUs, the host and the link between them, from YAML, validated.

A spec is a file or the name of a preset in plans/hardware/. Every number is a rate or a size a
datasheet or a quick benchmark gives; the compiler's memory and cost models read nothing else,
and a plan carries the spec it was planned for (the same type). Errors name the file and the
field (`gpus.count`, `host.isa`, ...); unknown fields are refused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from .host_sync import barrier_growth_s
from .isa import ISAS
from .plans import plans_dir
from .validation import Bytes, Count, Flag, Name, Rate, Record, SchemaError, Seconds, validate
from .yaml_files import read_yaml

Isa = Literal[ISAS]  # type: ignore[valid-type]


class HardwareError(SchemaError):
    """A hardware spec is missing a field or holds a wrong value; the message names the file and field."""


class GpuSpec(Record):
    name: Name
    count: Count
    usable_bytes: Bytes = Field(gt=0)   # memory Ostinato may use per GPU (after the driver/context reserve)
    bandwidth: Rate                     # bytes/s, device memory read
    matmul_flops: Rate                  # FLOP/s for the expert and dense matmuls (bf16 in, fp32 accumulate)
    launch_overhead_s: Seconds          # fixed cost per decode graph replay / kernel batch


class ExpertKernelSpec(Record):
    """Ostinato's CPU expert kernel measured per core in whole-layer calls (bench/kernel_side_by_side.py),
    scaled to the host by compiler/host_kernel.py's rule: cores x per_core, capped by the expert read."""
    tokens_per_expert: list[Rate] = Field(min_length=1)   # ascending
    per_core: list[Rate] = Field(min_length=1)            # bytes/s of expert weights per core at each
    source: str                                           # where and how it was measured

    @model_validator(mode="after")
    def _one_rate_per_count(self):
        t = self.tokens_per_expert
        if len(t) != len(self.per_core) or t != sorted(set(t)):
            raise ValueError(f"field 'host.expert_kernel': tokens_per_expert must ascend and have one per_core rate "
                             f"each (got {len(t)} token counts, {len(self.per_core)} rates)")
        return self


class HostSpec(Record):
    cores: Count
    usable_bytes: Bytes = Field(gt=0)
    bandwidth: Rate                     # bytes/s, DRAM read with all cores
    matmul_flops: Rate                  # FLOP/s of the CPU expert kernels, all cores
    isa: Isa
    op_dispatch_s: Seconds              # host seconds per framework op dispatched eagerly (Python + PyTorch)
    # Per layer whose cold routes run on the CPU: the GPU stream reaching the host task (a host callback
    # or a stream sync) plus the expert thread pool's wake-up and barrier; measured or cited per preset.
    task_handoff_s: Seconds
    expert_kernel: ExpertKernelSpec | None = None  # absent: the kernel priced at bandwidth / matmul_flops
    # What the CPU expert kernel itself reaches on this host, measured by ostinato-calibrate (absent:
    # the cost model falls back to bandwidth / matmul_flops, and the plan says it is uncalibrated):
    expert_read_bandwidth: Rate | None = None  # bytes/s of packed experts read, 1 token per expert, all cores
    expert_flops: Rate | None = None           # FLOP/s at 64 tokens per expert, all cores
    calibration: str | None = None             # how and where those were measured

    @property
    def handoff_s(self) -> float:
        """The per-layer hand-off at this host's cores: task_handoff_s (its pool's share measured at 2 threads) plus
        the pool's synchronizations grown to `cores` threads (host_sync.barrier_growth_s, a bound). What the cost
        model charges a layer whose cold routes run on the host."""
        return self.task_handoff_s + barrier_growth_s(self.cores)


class LinkSpec(Record):
    h2d_bandwidth: Rate                 # bytes/s host -> device (pinned)
    d2h_bandwidth: Rate
    latency_s: Seconds


class HardwareSpec(Record):
    name: Name
    description: str = ""
    # Every "GPU" is the CPU itself (tests, CI, a CPU-only box): its memory is a part of the host's, so
    # gpus.count x gpus.usable_bytes must fit in host.usable_bytes, and the compiler checks the devices' bytes
    # and the host's (cold experts, CPU workspace) together against host.usable_bytes.
    cpu_only: Flag = False
    gpus: GpuSpec
    host: HostSpec
    link: LinkSpec

    @model_validator(mode="after")
    def _a_cpu_device_is_host_memory(self):
        if self.cpu_only and self.gpus.count * self.gpus.usable_bytes > self.host.usable_bytes:
            raise ValueError(
                f"field 'gpus.usable_bytes': a cpu-only spec's device is the host itself, so its memory is a part "
                f"of the host's: {self.gpus.count} x {self.gpus.usable_bytes:,d} bytes is more than "
                f"host.usable_bytes ({self.host.usable_bytes:,d})")
        return self

    def device_name(self, gpu: int) -> str:
        """What to call planned device `gpu` to people: gpu0.. with GPUs; on a cpu-only spec, where the device
        is the CPU, `cpu` (cpu0.. when the spec plans several). Plans name devices gpu0.. either way."""
        if not self.cpu_only:
            return f"gpu{gpu}"
        return "cpu" if self.gpus.count == 1 else f"cpu{gpu}"

    @property
    def sha256(self) -> str:
        """Fingerprint of the resolved spec (comments and spelling of numbers do not change it)."""
        return hashlib.sha256(json.dumps(self.model_dump(mode="json", exclude_none=True),
                                         sort_keys=True).encode()).hexdigest()


def available_presets() -> list[str]:
    return sorted(p.stem for p in (plans_dir() / "hardware").glob("*.yaml"))


def load_hardware(spec: str | Path) -> HardwareSpec:
    """A YAML file path, or the name of a preset (`rtx4090d-x4`, `h200-x1`, `cpu-only`)."""
    path = Path(spec)
    if not path.exists():
        preset = plans_dir() / "hardware" / f"{spec}.yaml"
        if not preset.exists():
            raise HardwareError(f"hardware {spec}: no such file, and not a preset "
                                f"(presets: {', '.join(available_presets())})")
        path = preset
    return parse_hardware(read_yaml(path, HardwareError), str(path))


def parse_hardware(data: object, source: str) -> HardwareSpec:
    try:
        return validate(HardwareSpec, data, source)
    except SchemaError as e:
        raise HardwareError(str(e)) from None
