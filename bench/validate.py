"""The cost model beside published measurements: every row of plans/published/, the model's figure, the ratio.

    python -m ostinato.bench.validate [--rows DIR] [--kernels FILE|none] [--doc [FILE]]

For each row (bench/published.py) it builds the box's plan for DeepSeek-V4-Flash (with the row's config
changes), prices the row's system on it with the session simulator (bench/simulator: every system's CPU
kernel by its measured per-core rates, bench/measured/cpu_expert_kernels.yaml) and prints the model's figure
beside the published one: their ratio (1.00 where the model's range meets the published range) and whether
it is within 1.5x. `--doc` writes the table into docs/validation.md between its markers (a test regenerates it).
Session metrics replay DOC_SESSIONS shipped sessions per workload; their figure is the range over the
workloads (coding, customer service).
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

from ostinato.bench.published import PUBLISHED_DIR, Bound, Row, box_spec, load_rows
from ostinato.bench.simulator.bench import DOC_SESSIONS, by_workload, config_runs, doc_with
from ostinato.bench.simulator.kernels import KERNELS_FILE
from ostinato.bench.simulator.ktransformers import (
    KTransformers,
    best_threshold,
    frequency_placed,
    uniform_placed,
)
from ostinato.bench.simulator.ostinato_policy import is_ostinato
from ostinato.bench.simulator.policy import Policy, static_decode
from ostinato.bench.simulator.replay import chunked_prefill, chunks, summarize
from ostinato.bench.simulator.trace import TraceSampler
from ostinato.bench.simulator.world import PROFILE, V4_FLASH, World, build_world
from ostinato.compiler.host_kernel import kernel_time
from ostinato.workload import read_sessions

SHIPPED = Path(__file__).resolve().parents[1] / "plans" / "workloads" / "agent_turns.csv"
DOC = Path("docs/validation.md")  # --doc's default (from the repository root)
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


def system_named(world: World, row: Row) -> Policy:
    """The row's system on its box: a KTransformers configured by the row's flags, else a simulator policy
    of the row's configuration by name."""
    s = row.system
    if s.name == "KTransformers":
        cost, (L, E) = world.cost, world.hot.shape
        kt = world.kernel("kt-kernel")
        if s.workers is not None:   # --kt-cpuinfer: its workers compute, its queue thread is reserved
            cost = copy.copy(cost)
            reserved = kt.reserved_cores if kt is not None else 0
            cost.hw = cost.hw.replace(host=cost.hw.host.replace(cores=s.workers + reserved))
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
        host = world.build.hardware.host.replace(cores=row.system.workers + kt.reserved_cores)
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
                      if not is_ostinato(o))
    raise ValueError(f"metric {m!r} has no model figure")


@dataclass(frozen=True)
class Verdict:
    model: tuple[float, float]
    ratio: float | None        # model / published (1.0 where the ranges meet); None for a bound
    within: bool


def verdict(published, model: tuple[float, float]) -> Verdict:
    lo, hi = model
    if isinstance(published, Bound):
        return Verdict(model, None, hi < published.below)
    a, b = (published, published) if isinstance(published, float | int) else published
    ratio = 1.0 if lo <= b and hi >= a else (hi / a if hi < a else lo / b)
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
    kernels: Path | None = KERNELS_FILE

    @cached_property
    def verdicts(self) -> dict[str, Verdict]:
        boxes = Boxes(self.kernels)
        return {rid: verdict(r.value, model_figure(r, boxes)) for rid, r in self.rows.items()}

    def table(self) -> str:
        out = ["| row | system (box) | metric | published | model | model / published | within 1.5x |",
               "|---|---|---|---|---|---|---|"]
        for rid, r in self.rows.items():
            v = self.verdicts[rid]
            model = fmt(v.model[0]) if v.model[0] == v.model[1] else f"{fmt(v.model[0])}-{fmt(v.model[1])}"
            ratio = "-" if v.ratio is None else f"{v.ratio:.2f}"
            flags = f" `{r.system.flags}`" if r.system.flags else ""
            ok = "yes" if v.within else f"**no**: {r.why_off}" if r.why_off else "**no**"
            # links relative to docs/validation.md, where --doc writes the table
            out.append(f"| [{rid}](../plans/published/{rid}.yaml) | {r.system.name}{flags} ({r.box}) | "
                       f"{r.metric}{params_text(r)} | {shown(r.value)} | {model} | {ratio} | {ok} |")
        n = sum(v.within for v in self.verdicts.values())
        out.append("")
        out.append(f"{n} of {len(self.rows)} rows within {WITHIN}x (or holding, for a bound).")
        return "\n".join(out)


def params_text(r: Row) -> str:
    def value(v) -> str:
        return ", ".join(map(str, v)) if isinstance(v, list) else str(v)
    return f" ({'; '.join(f'{k}: {value(v)}' for k, v in r.params.items())})" if r.params else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=Path, default=PUBLISHED_DIR,
                   help=f"folder of published rows (default {PUBLISHED_DIR})")
    p.add_argument("--kernels", default=str(KERNELS_FILE),
                   help="the side-by-side kernel table, or 'none' for every system at the cost model's own kernel")
    p.add_argument("--doc", type=Path, nargs="?", const=DOC, metavar="FILE",
                   help=f"write the table between its markers in FILE (default {DOC})")
    a = p.parse_args(argv)
    kernels = None if a.kernels == "none" else Path(a.kernels)
    if kernels is not None and not kernels.is_file():
        p.error(f"--kernels {kernels}: no such file")
    table = Validation(load_rows(a.rows), kernels).table()
    print(table)
    if a.doc:
        a.doc.write_text(doc_with(a.doc.read_text(), table, DOC_BEGIN, DOC_END))
        print(f"wrote the table into {a.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
