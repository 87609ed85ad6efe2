"""The cost model beside published measurements: every row of plans/published/, the model's figure, the ratio.

    python -m ostinato.bench.validate [--rows DIR] [--kernels DIR|FILE|none] [--doc [FILE]] [--readme [FILE]]

For each row (bench/published.py) it builds the box's plan for DeepSeek-V4-Flash (with the row's config
changes), prices the row's system on it with the session simulator (bench/simulator: every system's CPU
kernel by its measured per-core rates, from the table of the box's host ISA, bench/measured/
cpu_expert_kernels.<isa>.yaml, or the nearest measured one, named under the table) and prints the model's figure
beside the published one, their score (band_ratio: how far the model's band lies from the published band, 1.00
only inside it) and whether it is within 1.5x. Rows a constant of the model was set from (Row.calibration) are
shown apart and left out of the count. `--doc` writes the table into docs/validation.md between its markers (a
test regenerates it), and the paper's abstract claims beside the model's direction on each (bench/paper_claims.py)
between their own markers; `--readme` writes the claims' one-line summary between its markers in README.md.
Session metrics replay DOC_SESSIONS shipped sessions per workload; their figure is the
range over the workloads (coding, customer service).

Two-socket boxes are priced by one NUMA rule (numa_host).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from ostinato.bench import paper_claims
from ostinato.bench.published import PUBLISHED_DIR, Bound, Row, box_spec, load_rows
from ostinato.bench.simulator.bench import DOC_SESSIONS, by_workload, config_runs, doc_with
from ostinato.bench.simulator.formats import CHECKPOINT, GGUF_MXFP4_MOE
from ostinato.bench.simulator.kernels import KERNEL_TABLES
from ostinato.bench.simulator.ktransformers import (
    KTransformers,
    best_threshold,
    frequency_placed,
    is_hypothetical,
    uniform_placed,
)
from ostinato.bench.simulator.ostinato_policy import is_ostinato
from ostinato.bench.simulator.policy import Policy, static_decode
from ostinato.bench.simulator.replay import chunked_prefill, chunks, summarize
from ostinato.bench.simulator.trace import TraceSampler
from ostinato.bench.simulator.world import PROFILE, V4_FLASH, World, build_world
from ostinato.compiler.host_kernel import kernel_time, numa_read_share
from ostinato.workload import read_sessions

SHIPPED = Path(__file__).resolve().parents[1] / "plans" / "workloads" / "agent_turns.csv"
DOC = Path("docs/validation.md")  # --doc's default (from the repository root)
README = Path("README.md")        # --readme's default
DOC_BEGIN = "<!-- validation table: written by python -m ostinato.bench.validate --doc; do not edit -->"
DOC_END = "<!-- end of the validation table -->"
WITHIN = 1.5
DECODE_TOKENS = 256   # decode steps a standalone decode figure averages over


class Boxes:
    """One World per (box, config changes), built once; session runs per (world, configuration), once."""

    def __init__(self, kernels: Path | None):
        self.kernels, self._worlds = kernels, {}
        self.sessions = read_sessions(SHIPPED)

    def world(self, row: Row) -> World:
        key = (row.box, json.dumps(row.model, sort_keys=True))
        if key not in self._worlds:
            with tempfile.TemporaryDirectory() as tmp:
                model = V4_FLASH
                if row.model:
                    cfg = json.loads((V4_FLASH / "config.json").read_text()) | row.model
                    model = Path(tmp)
                    (model / "config.json").write_text(json.dumps(cfg))
                self._worlds[key] = build_world(model=model, hardware=box_spec(row.box), profile=PROFILE,
                                                kernels=self.kernels)
        return self._worlds[key]

    def runs(self, row: Row, config: str) -> dict[str, dict]:
        """workload -> system -> Summary of the shipped sessions under `config`."""
        world = self.world(row)
        return {w: {n: summarize(r) for n, r in config_runs(world, config, ss, 0).items()}
                for w, ss in by_workload(self.sessions, DOC_SESSIONS).items()}

    def kernel_tables(self) -> list[str]:
        """Per box priced so far: its host ISA, the kernel table that priced it and every stand-in row."""
        seen = {}
        for (box, _), world in self._worlds.items():
            k, isa = world.kernels, world.build.hardware.host.isa
            if k is not None and box not in seen:
                seen[box] = f"{box} ({isa}): the {k.isa} table" + "".join(f"; {n}" for n in k.notes)
        return [seen[b] for b in sorted(seen)]


def numa_host(host, sockets: int, pools: int):
    """The host as a CPU kernel of `pools` thread pools reads it on a box of `sockets` sockets (NUMA nodes): its
    read bandwidth (and its published kernel read, where it has one) x compiler/host_kernel.py numa_read_share,
    min(pools, sockets) / sockets (kt-kernel's pool per NUMA node reads all of it; one pool across two sockets
    about half, D. Lemire 2024-01-18, cited there)."""
    share = numa_read_share(sockets, pools)
    if share == 1:
        return host
    scaled = host.expert_read_bandwidth * share if host.expert_read_bandwidth is not None else None
    return host.replace(bandwidth=host.bandwidth * share, expert_read_bandwidth=scaled)


def row_host(world: World, row: Row, reserved: int):
    """The row's box host with the row's workers (plus the cores the system reserves) and its NUMA rule."""
    host = world.build.hardware.host
    if row.system.workers is not None:
        host = host.replace(cores=row.system.workers + reserved)
    pools = row.system.pools if row.system.pools is not None else row.sockets
    return numa_host(host, row.sockets, pools)


def system_named(world: World, row: Row) -> Policy:
    """The row's system on its box: a KTransformers configured by the row's flags, else a simulator policy
    of the row's configuration by name."""
    s = row.system
    if s.name == "KTransformers":
        cost, (L, E) = world.cost, world.hot.shape
        kt = world.kernel("kt-kernel")
        host = row_host(world, row, kt.reserved_cores if kt is not None else 0)   # --kt-cpuinfer workers compute,
        if host != cost.hw.host:                                                 # its queue thread is reserved
            cost = copy.copy(cost)
            cost.hw = cost.hw.replace(host=host)
        n = s.gpu_experts or 0
        gpu = frequency_placed(world.shares, n) if s.strategy == "frequency" else uniform_placed((L, E), n)
        threshold = s.threshold if s.threshold is not None else best_threshold(cost, gpu, kt)
        return KTransformers(cost, threshold, gpu, kt, reuses_prefix=s.reuses_prefix)
    found = [p for p in world.policies(s.config) if p.name == s.name]
    if not found:
        raise KeyError(f"system {s.name!r} is not among the {s.config} systems: "
                       f"{[p.name for p in world.policies(s.config)]}")
    return found[0]


def model_figure(row: Row, boxes: Boxes) -> tuple[float, float]:
    """The model's figure for the row as (low, high): a value is (v, v)."""
    world, m, p = boxes.world(row), row.metric, row.params
    if m == "hot_share":
        return (world.build.cost.hot_share(),) * 2
    if m == "route_coverage":
        top = np.sort(world.shares, axis=1)[:, ::-1][:, :int(p["experts"])].sum(axis=1)   # [L]
        return (float(top.mean()),) * 2
    if m == "kernel_us_per_layer":
        kt = world.kernel(row.system.name)
        host = row_host(world, row, kt.reserved_cores)
        t, experts = float(p["tokens_per_expert"]), float(p["experts"])
        return (kernel_time(kt, host, experts, experts * t, world.build.cost.expert_bytes) * 1e6,) * 2
    if m == "mtp_gain":   # decode tok/s with EAGLE speculation over without, on one decode trace
        system = system_named(world, row)
        ids = TraceSampler(world.shares, world.build.config.num_experts_per_tok, 0).ids(DECODE_TOKENS)
        plain, _ = system.decode(ids)
        _, spec = system.with_mtp(float(p["acceptance"]), int(p["depth"])).decode(ids)
        return (float(plain.sum()) / spec.seconds,) * 2
    if m in ("decode_tok_s", "prefill_tok_s") and row.system.name == "KTransformers":
        system = system_named(world, row)
        sampler = TraceSampler(world.shares, world.build.config.num_experts_per_tok, 0)
        if m == "decode_tok_s":
            steps, _ = static_decode(system.cost, system.gpu, sampler.ids(DECODE_TOKENS))
            return (1.0 / float(np.mean(steps)),) * 2
        n = int(p["tokens"])
        pre = chunked_prefill(system, [(sampler.counts(c), c) for c in chunks(n, world.build.cost.prefill_chunk)])
        return (n / pre.seconds,) * 2
    runs = boxes.runs(row, row.system.config)
    name = system_named(world, row).name
    per = {w: r for w, r in runs.items()}

    def spread(values) -> tuple[float, float]:
        v = list(values)
        return (min(v), max(v))
    if m == "median_wait_s":
        return spread(r[name].median_wait_s for r in per.values())
    if m == "decode_tok_s":
        return spread(r[name].decode_tokens_per_s for r in per.values())
    if m == "wait_ratio":
        return spread(r[name].median_wait_s / r[p["other"]].median_wait_s for r in per.values())
    if m == "decode_ratio":
        return spread(r[name].decode_tokens_per_s / r[p["other"]].decode_tokens_per_s for r in per.values())
    if m == "ours_wait_ratio":   # Ostinato's median wait over each of the others'
        return spread(r[name].median_wait_s / r[o].median_wait_s for r in per.values() for o in p["others"])
    if m == "session_speedup":   # each other system's median session over Ostinato's
        return spread(r[o].median_session_s / r[name].median_session_s for r in per.values() for o in r
                      if not is_ostinato(o) and not is_hypothetical(o))
    raise ValueError(f"metric {m!r} has no model figure")


@dataclass(frozen=True)
class Verdict:
    model: tuple[float, float]
    ratio: float | None        # band_ratio of the model's band to the published one; None for a bound
    within: bool


def band_ratio(published: tuple[float, float], model: tuple[float, float]) -> float:
    """How far the model's band [lo, hi] lies from the published band [a, b] (all positive): the ratio of the
    model's point farthest outside the published band to the published end nearest it, hi / b above it or lo / a
    below it (where the model's band runs past both ends, the end it overshoots more, as a factor). 1.0 only
    when the model's band lies inside the published one: merely meeting it is not a match."""
    (a, b), (lo, hi) = published, model
    above = hi / b if hi > b else 1.0
    below = lo / a if lo < a else 1.0
    return above if above * below >= 1.0 else below


def verdict(published, model: tuple[float, float]) -> Verdict:
    lo, hi = model
    if isinstance(published, Bound):
        return Verdict(model, None, hi < published.below)
    band = (published, published) if isinstance(published, float | int) else tuple(published)
    ratio = band_ratio(band, model)
    return Verdict(model, ratio, 1 / WITHIN <= ratio <= WITHIN)


def fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def shown(value) -> str:
    if isinstance(value, Bound):
        return f"< {fmt(value.below)}"
    if isinstance(value, list):
        return f"{fmt(value[0])}-{fmt(value[1])}"
    return fmt(value)


@dataclass
class Validation:
    rows: dict[str, Row]
    kernels: Path | None = KERNEL_TABLES

    @cached_property
    def boxes(self) -> Boxes:
        return Boxes(self.kernels)

    @cached_property
    def verdicts(self) -> dict[str, Verdict]:
        return {rid: verdict(r.value, model_figure(r, self.boxes)) for rid, r in self.rows.items()}

    def table(self) -> str:
        out = ["| row | system (box) | metric | published | model's band | score (model / published) | "
               "within 1.5x |", "|---|---|---|---|---|---|---|"]
        for rid, r in self.rows.items():
            v = self.verdicts[rid]
            model = fmt(v.model[0]) if v.model[0] == v.model[1] else f"{fmt(v.model[0])}-{fmt(v.model[1])}"
            ratio = "-" if v.ratio is None else f"{v.ratio:.2f}"
            flags = f" `{r.system.flags}`" if r.system.flags else ""
            if r.calibration:
                ok = f"calibration (not counted): sets {r.calibration}"
            else:
                ok = "yes" if v.within else f"**no**: {r.why_off}" if r.why_off else "**no**"
            # links relative to docs/validation.md, where --doc writes the table
            out.append(f"| [{rid}](../plans/published/{rid}.yaml) | {r.system.name}{flags} ({r.box}) | "
                       f"{r.metric}{params_text(r)} | {shown(r.value)} | {model} | {ratio} | {ok} |")
        checks = {rid: v for rid, v in self.verdicts.items() if not self.rows[rid].calibration}
        n = sum(v.within for v in checks.values())
        out.append("")
        out.append(f"{n} of {len(checks)} rows within {WITHIN}x (or holding, for a bound); "
                   f"{len(self.rows) - len(checks)} calibration rows, which set a constant of the model, not counted. "
                   "The score is band_ratio (bench/validate.py): the model's point farthest outside the published "
                   "band over the published end nearest it, 1.00 only when the model's band lies inside.")
        out.append("")
        out.append("Weights each system is priced with (bench/simulator/formats.py): llama.cpp, "
                   f"{GGUF_MXFP4_MOE.name}; KTransformers and kt-kernel, {CHECKPOINT.name}; Ostinato, its plan's.")
        tables = self.boxes.kernel_tables()
        if tables:
            out.append("")
            out.append("CPU kernels by box (host ISA): each system's rates from the table of the box's ISA "
                       "(bench/measured/cpu_expert_kernels.<isa>.yaml), or the stand-in named:")
            out.append("")
            out.extend(f"- {t}" for t in tables)
        return "\n".join(out)

    def claims(self) -> list[paper_claims.ClaimVerdict]:
        """The paper's abstract claims whose rows are among these rows, each with the model's direction."""
        v = self.verdicts
        return paper_claims.verdicts(self.rows, {rid: x.model for rid, x in v.items()},
                                     {rid: x.within for rid, x in v.items()})

    def claims_table(self) -> str:
        return paper_claims.claims_table(self.rows, self.claims())


def params_text(r: Row) -> str:
    def value(v) -> str:
        return ", ".join(map(str, v)) if isinstance(v, list) else str(v)
    return f" ({'; '.join(f'{k}: {value(v)}' for k, v in r.params.items())})" if r.params else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=Path, default=PUBLISHED_DIR,
                   help=f"folder of published rows (default {PUBLISHED_DIR})")
    p.add_argument("--kernels", default=str(KERNEL_TABLES),
                   help="the side-by-side kernel tables, a folder with one per ISA (default %(default)s: each box "
                        "gets its host ISA's), one table file for every box, or 'none' for every system at the "
                        "cost model's own kernel")
    p.add_argument("--doc", type=Path, nargs="?", const=DOC, metavar="FILE",
                   help=f"write the table and the paper's claims between their markers in FILE (default {DOC})")
    p.add_argument("--readme", type=Path, nargs="?", const=README, metavar="FILE",
                   help=f"write the paper claims' summary line between its markers in FILE (default {README})")
    a = p.parse_args(argv)
    kernels = None if a.kernels == "none" else Path(a.kernels)
    if kernels is not None and not kernels.exists():
        p.error(f"--kernels {kernels}: no such file or folder")
    validation = Validation(load_rows(a.rows), kernels)
    table, claims = validation.table(), validation.claims_table()
    print(table)
    print()
    print(claims)
    if a.doc:
        doc = doc_with(a.doc.read_text(), table, DOC_BEGIN, DOC_END)
        a.doc.write_text(doc_with(doc, claims, paper_claims.CLAIMS_BEGIN, paper_claims.CLAIMS_END))
        print(f"wrote the table and the paper's claims into {a.doc}", file=sys.stderr)
    if a.readme:
        summary = paper_claims.claims_summary(validation.claims())
        a.readme.write_text(doc_with(a.readme.read_text(), summary, paper_claims.README_BEGIN,
                                     paper_claims.README_END))
        print(f"wrote the paper claims' summary into {a.readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
