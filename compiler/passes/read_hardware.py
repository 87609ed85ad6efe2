"""read_hardware: the hardware spec (a preset or a file), and a note where its CPU expert rates are estimated
rather than measured."""

from __future__ import annotations

from ostinato.hardware import load_hardware

from .build import Build


def read_hardware(b: Build) -> None:
    b.hardware = load_hardware(b.options.hardware)
    host = b.hardware.host
    if host.expert_read_bandwidth is None or host.expert_flops is None:
        how = (f"the per-core rates of its expert_kernel ({host.expert_kernel.source}) times its {host.cores} cores"
               if host.expert_kernel is not None else "its host bandwidth and matmul_flops")
        b.notes.append(f"the hardware spec's CPU expert rates are not calibrated: the cost model uses {how} "
                       f"(measure them on the host with ostinato-calibrate)")
