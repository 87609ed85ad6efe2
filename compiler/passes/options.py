"""What ostinato-compile is asked for: CompileOptions (the command line, parsed), its defaults and the values
its choices take, and CompileError, which a pass raises when the inputs cannot give a plan."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ostinato.chat_encodings import ENCODINGS
from ostinato.plans import plans_dir

ADAPT = ("off", "idle")  # --adapt (ostinato/adaptation.py)
CPU_STEP = ("compiled", "eager")  # --cpu-step (runtime/engine/cpu_step.py)
SPECULATIVE = ("auto", "off", "mtp")  # --speculative: the cost model decides, never, always (the block must exist)
CHAT_ENCODINGS = ("auto", *ENCODINGS)

# Tokens a session may hold by default: coding agents' sessions run past 100k tokens (TraceLab's median cached
# prefix is 118,656, shared/PUBLISHED.md), so a plan reserves agent scale unless told less (--context).
DEFAULT_CONTEXT = 262_144
# The workloads a plan's choices are priced on unless told otherwise (--workload): the shipped ones
# (least_wait.py's docstring), in this order (the order breaks ties).
DEFAULT_WORKLOADS = tuple(plans_dir() / "workloads" / name for name in ("agent_turns.csv", "agent_scale.csv"))


class CompileError(ValueError):
    """The inputs cannot give a plan; the message says what is short and what to change."""


@dataclass(frozen=True)
class CompileOptions:
    model: Path
    output: Path                             # where the plan will be written: its paths are relative to it
    hardware: str
    profile: str | None = None               # a profile file, "synthetic:ALPHA", or None (uniform)
    context: int = DEFAULT_CONTEXT          # tokens per session the plan reserves KV (and the steps' state) for
    sessions: int = 1
    prefill_chunk: int = 4096
    upload_group: int = 16
    snapshots: int = 64                      # turn-boundary snapshots a session keeps
    dense_format: str | None = None          # fp8 | bf16 | float32; None: float32 on cpu-only hardware, else fp8
    max_hot_per_layer: int | None = None
    objective_phases: tuple[str, ...] = ("decode", "short_prefill")
    prefill_buckets: tuple[int, ...] | None = None  # None: the cost model chooses (CostModel.choose_buckets)
    speculative: str = "auto"                # SPECULATIVE: decode with the MTP block where it pays / never / always
    adapt: str | None = None                 # ADAPT: re-place hot experts between turns (None: idle with GPUs, else
                                             # off: on a cpu-only spec the hot pools are host memory too)
    cpu_step: str = "compiled"               # CPU_STEP: the decode step's CPU segments compiled into one call, or eager
    chat_encoding: str = "auto"              # CHAT_ENCODINGS: the release's chat encoder; auto: from the checkpoint's
                                             # files (ostinato/chat_encodings.py choose_encoding)
    build_kernels: bool = True
    kernel_dir: Path | None = None           # content-addressed build folder (default: build/kernels here)
    workloads: tuple[Path, ...] = DEFAULT_WORKLOADS  # workload CSVs the choices are priced on (least_wait.py);
                                                     # (): none, the choices at the plan's context alone
