"""Each system's CPU expert kernel as measured side by side, one table per ISA, for the cost model's scaling rule.

bench/measured/cpu_expert_kernels.<isa>.yaml (python -m ostinato.bench.kernel_side_by_side, one run per ISA)
holds, per system, the bytes of expert weights per second per computing thread in whole-layer calls of
V4-Flash's 256 experts with top-6 routing, at several tokens per expert, with the run's read bandwidth. The
cost model scales them to a host by one rule (compiler/host_kernel.py): per-core rate x the host's cores (less
those the system reserves), capped by the host's expert read bandwidth. Ostinato's own row prices Ostinato in
the simulator too, so every system is scaled the same way.

A box is priced with the table of its host ISA (the hardware spec's host.isa). Where none was measured at that
ISA, or a system has no row in it, the nearest measured ISA's (NEAREST) stands in and the table says so in
its `notes`: nothing falls back silently. No AMX table exists: no AMX machine has been available to measure
on, so AMX boxes use the avx512_bf16 table. For Ostinato that is its own code (an amx build is the
avx512_bf16 path, ostinato/isa.py kernel_variant); kt-kernel's AMX tile kernels are priced at its AVX-512
ones, which likely understates them past a few tokens per expert, where AMX's matrix units pay.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from ostinato.compiler.host_kernel import KernelRates
from ostinato.isa import ISAS

KERNEL_TABLES = Path(__file__).resolve().parents[1] / "measured"   # every cpu_expert_kernels.<isa>.yaml there
TABLE_STEM = "cpu_expert_kernels"
OURS = "ostinato"

# For a box whose ISA has no table (or whose table lacks a system), the measured ISAs to use instead, nearest
# first. AVX-512 without bf16 is nearest the AVX-512 bf16 path (the same vector width and the same AVX-512
# kernel families, less the bf16 dot products) before AVX2; AMX's nearest is avx512_bf16, which every AMX CPU
# has and which Ostinato's amx build runs (only kt-kernel has AMX tile kernels).
NEAREST = {
    "amx": ("avx512_bf16", "avx512", "avx2"),
    "avx512_bf16": ("avx512", "amx", "avx2"),
    "avx512": ("avx512_bf16", "avx2", "amx"),
    "avx2": ("avx512", "avx512_bf16", "amx"),
}
WHY_NO_AMX = ("AMX is not measured (no AMX machine available): Ostinato's amx build is its avx512_bf16 path; "
              "kt-kernel's AMX tile kernels are priced at its AVX-512 ones")


def table_file(isa: str, folder: Path = KERNEL_TABLES) -> Path:
    """Where the table measured at `isa` lives (written by kernel_side_by_side --isa ISA)."""
    if isa not in ISAS:
        raise ValueError(f"isa {isa!r} is not one of {list(ISAS)}")
    return Path(folder) / f"{TABLE_STEM}.{isa}.yaml"


@dataclass(frozen=True)
class KernelTable:
    systems: dict[str, KernelRates]   # system -> its measured per-core rates
    read_bandwidth: float             # bytes/s, the run's streaming read with all its cores
    cores: int                        # cores of the measuring machine
    source: str                       # where and how they were measured
    isa: str = ""                     # the ISA the kernels were built for and run at
    notes: tuple[str, ...] = ()       # for a box: which rows stand in for its ISA's, and why (empty: none)

    def of(self, system: str) -> KernelRates:
        if system not in self.systems:
            raise KeyError(f"{system!r} has no kernel measurement; measured: {sorted(self.systems)}")
        return self.systems[system]


def load_kernel_table(path: Path) -> KernelTable:
    """One side-by-side table; errors name the file and the field that is wrong."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a kernel table (a mapping with tokens_per_expert, read_bandwidth, cores, "
                         f"isa and systems)")

    def field(name, convert, within=data, where=""):
        if name not in within:
            raise ValueError(f"{path}: field '{where}{name}' is missing")
        try:
            return convert(within[name])
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: field '{where}{name}': {within[name]!r} ({e})") from None

    tokens = field("tokens_per_expert", lambda v: tuple(float(t) for t in v))
    isa = field("isa", str)
    if isa not in ISAS:
        raise ValueError(f"{path}: field 'isa': {isa!r} is not one of {list(ISAS)}")
    rows = field("systems", lambda v: v if isinstance(v, dict) and v else _fail("a mapping of system -> row"))
    systems = {}
    for name, row in rows.items():
        where = f"systems.{name}."
        if not isinstance(row, dict):
            raise ValueError(f"{path}: field 'systems.{name}': not a mapping with per_core")
        rates = field("per_core", lambda v: tuple(float(x) for x in v), row, where)
        try:
            systems[name] = KernelRates(name, tokens, rates, int(row.get("reserved_cores", 0)),
                                        str(row.get("driven", "")))
        except ValueError as e:
            raise ValueError(f"{path}: field '{where}per_core' against 'tokens_per_expert': {e}") from None
    if OURS not in systems:
        raise ValueError(f"{path}: field 'systems': needs an '{OURS}' row (has {sorted(systems)})")
    return KernelTable(systems, field("read_bandwidth", float), field("cores", int), str(data.get("source", "")),
                       isa)


def _fail(what: str):
    raise ValueError(f"expected {what}")


def load_kernel_tables(folder: Path = KERNEL_TABLES) -> dict[str, KernelTable]:
    """isa -> the table measured at it, every cpu_expert_kernels.<isa>.yaml in `folder`; a file whose name and
    `isa` field disagree is refused."""
    tables = {}
    for path in sorted(Path(folder).glob(f"{TABLE_STEM}.*.yaml")):
        named = path.name[len(TABLE_STEM) + 1:-len(".yaml")]
        if named not in ISAS:
            raise ValueError(f"{path}: its name's ISA {named!r} is not one of {list(ISAS)}")
        table = load_kernel_table(path)
        if table.isa != named:
            raise ValueError(f"{path}: field 'isa' is {table.isa!r}, but the file is named for {named!r}")
        tables[named] = table
    if not tables:
        raise ValueError(f"{folder}: no kernel tables ({TABLE_STEM}.<isa>.yaml, isa one of {list(ISAS)})")
    return tables


def why_stand_in(isa: str, used: str) -> str:
    """Why the `used` ISA's rows price a box of `isa`."""
    return WHY_NO_AMX if isa == "amx" and used == "avx512_bf16" else f"nearest measured to {isa}"


def table_for_isa(tables: dict[str, KernelTable], isa: str) -> KernelTable:
    """The table that prices a box of `isa`: its own ISA's, else the nearest measured one (NEAREST); a system
    missing from it takes its row from the nearest table that has it. Every stand-in is named in `notes`."""
    if isa not in NEAREST:
        raise ValueError(f"isa {isa!r} is not one of {list(ISAS)}")
    order = [i for i in (isa, *NEAREST[isa]) if i in tables]
    if not order:
        raise ValueError(f"no kernel table for {isa} nor for any of {list(NEAREST[isa])}")
    base = tables[order[0]]
    notes = [] if order[0] == isa else [f"no {isa} kernel table: every system priced with the {order[0]} table "
                                        f"({why_stand_in(isa, order[0])})"]
    systems = dict(base.systems)
    for other in order[1:]:
        for name, rates in tables[other].systems.items():
            if name not in systems:
                systems[name] = rates
                notes.append(f"{name} has no {order[0]} row: priced with its {other} row "
                             f"({why_stand_in(isa, other)})")
    return replace(base, systems=systems, notes=tuple(notes))


def kernels_for(path: Path, isa: str) -> KernelTable:
    """What prices a box of `isa`: with a folder of per-ISA tables (KERNEL_TABLES), table_for_isa; with one
    table file, that table for every box, a note saying so where its ISA is not the box's."""
    path = Path(path)
    if path.is_dir():
        return table_for_isa(load_kernel_tables(path), isa)
    table = load_kernel_table(path)
    if table.isa == isa:
        return table
    return replace(table, notes=(f"the box is {isa}: priced with {path.name}, measured at {table.isa}, as given",))
