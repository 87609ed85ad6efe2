"""Published measurements to check the cost model against: plans/published/*.yaml, one row per file.

A row names its source (a paper, a repository's doc, issue or PR) and the figure's context, the box it was
measured on (a preset in plans/hardware/ or a spec in plans/published/boxes/), the model's config changes
(e.g. top-4 routing), the system and its flags as published, the metric and the published value: a number,
a range [low, high], or a bound (below: x). bench/validate.py prints the model's figure beside each.

A row a constant of the model was set from (`calibration`: which constant) cannot check the model: the table
shows it apart and leaves it out of the count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from ostinato.validation import Name, Record, SchemaError, validate
from ostinato.yaml_files import read_yaml

PUBLISHED_DIR = Path(__file__).resolve().parents[1] / "plans" / "published"
BOXES_DIR = PUBLISHED_DIR / "boxes"

METRICS = ("median_wait_s", "decode_tok_s", "wait_ratio", "decode_ratio", "ours_wait_ratio", "session_speedup",
           "hot_share", "route_coverage", "kernel_us_per_layer", "prefill_tok_s", "mtp_gain")


class Bound(Record):
    below: float


class SystemSpec(Record):
    name: Name                        # a system the simulator models (bench/validate.py SYSTEMS)
    flags: str = ""                   # as published
    config: Literal["documented", "best"] = "best"
    gpu_experts: int | None = None    # KTransformers: --kt-num-gpu-experts
    strategy: Literal["uniform", "frequency"] = "frequency"   # KTransformers' GPU expert placement
    workers: int | None = None        # KTransformers: --kt-cpuinfer
    # KTransformers: --kt-threadpool-count, one pool per NUMA node with its share of every expert in that node's
    # memory; None: the box's sockets, as kt-kernel's docs say to set it (bench/validate.py numa_host)
    pools: int | None = Field(default=None, ge=1)
    threshold: int | None = None      # KTransformers: --kt-gpu-prefill-token-threshold
    # True: prefix reuse across turns (a radix cache), which KTransformers' DeepSeek-V4 recipe turns off
    # (--disable-radix-cache; SGLang's DSV4 radix cache is in open pull requests): off unless a row says so
    reuses_prefix: bool = False


class Row(Record):
    source: Name                      # paper / doc / issue / PR, citable
    context: Name                     # what the figure is and how it was taken
    kind: Literal["measured", "documented"]
    box: Name                         # preset name, or boxes/NAME
    sockets: int = Field(default=1, ge=1)   # the box's CPU sockets (NUMA nodes), as published
    model: dict[str, Any] = Field(default_factory=dict)   # config.json changes
    system: SystemSpec
    metric: Literal[METRICS]  # type: ignore[valid-type]
    params: dict[str, Any] = Field(default_factory=dict)  # the metric's own (tokens, other system, ...)
    value: float | list[float] | Bound
    why_off: str = ""                 # where the model is known to miss it, and why (shown in the table)
    calibration: str = ""             # the model's constant set from this row (so it checks nothing); "" for a check


class RowError(SchemaError):
    """A published row is malformed; the message names the file and field."""


def load_rows(folder: Path = PUBLISHED_DIR) -> dict[str, Row]:
    """Every row in `folder`, by file stem, in name order."""
    rows = {}
    for path in sorted(Path(folder).glob("*.yaml")):
        try:
            row = validate(Row, read_yaml(path, RowError), str(path))
        except SchemaError as e:
            raise RowError(str(e)) from None
        if isinstance(row.value, list) and (len(row.value) != 2 or row.value[0] > row.value[1]):
            raise RowError(f"{path}: field 'value': a range is [low, high], got {row.value}")
        rows[path.stem] = row
    if not rows:
        raise RowError(f"{folder}: no published rows (*.yaml)")
    return rows


def box_spec(box: str) -> str:
    """What load_hardware takes for a row's box: a preset name, or the path of boxes/NAME.yaml."""
    if box.startswith("boxes/"):
        path = BOXES_DIR / f"{box.removeprefix('boxes/')}.yaml"
        if not path.exists():
            raise RowError(f"box {box}: no {path}")
        return str(path)
    return box
