"""The CPU expert kernel tables (bench/measured/cpu_expert_kernels.<isa>.yaml) as docs/benchmarks.md shows them.

kernel_side_by_side measures a table and writes its YAML; this module renders one table as a markdown block
(the machine, its load, each system's per-core rate per shape, ours against each other system, and the
kernel goal of #58 judged shape by shape) and writes it between its ISA's markers. A test re-renders every
committed table and compares it with the page, so the page's figures are always the tables' own.

Usage: python -m ostinato.bench.kernel_table_doc [--doc [FILE]]   (re-renders every committed table's block;
       kernel_side_by_side --doc does the same for the table it has just written)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from . import llama_cpp_side_by_side as sbs
from .simulator.kernels import KERNEL_TABLES, OURS, TABLE_STEM

DOC = Path("docs/benchmarks.md")  # --doc's default (from the repository root)
DOC_BEGIN = ("<!-- CPU expert kernels ({}): written by python -m ostinato.bench.kernel_side_by_side --doc; "
             "do not edit -->")
DOC_END = "<!-- end of the CPU expert kernels table ({}) -->"
# The kernel goal (#58): ours at least this many times each other system's per-core rate at the uniform shapes
# of up to GOAL_SMALL_TOKENS tokens a call, at least 1.0x at every other shape.
GOAL_SMALL = 1.1
GOAL_SMALL_TOKENS = 8
LABELS = {"ostinato": "Ostinato", "ggml": "ggml (llama.cpp)", "kt-kernel": "kt-kernel (KTransformers)"}


def committed_tables(folder: Path = KERNEL_TABLES) -> list[Path]:
    """The committed tables, one per ISA, in name order."""
    return sorted(folder.glob(f"{TABLE_STEM}.*.yaml"))


def goal_for(shape: str) -> float:
    """The least ours / other per-core ratio the goal asks at a shape ('uniform n=8', 'grouped n=512 t=16')."""
    kind, _, rest = shape.partition(" n=")
    tokens = int(rest.split()[0])
    return GOAL_SMALL if kind == "uniform" and tokens <= GOAL_SMALL_TOKENS else 1.0


def render(data: dict) -> str:
    """One table (kernel_side_by_side.table_data's dict, as its YAML holds it) as a markdown block."""
    others = [n for n in data["systems"] if n != OURS]
    systems = {n: data["systems"][n] for n in (OURS, *others)}  # ours first, whatever the file's order
    ours = systems[OURS]["per_core"]
    lines = [f"#### CPU expert kernels side by side ({data['isa']}: {data['cpu']}, {data['cores']} "
             f"thread{'s' if data['cores'] > 1 else ''} a run, one run)", "",
             f"{data['source']} (load: the 1-minute load average before/after; after includes the run's own "
             f"threads). Read bandwidth {data['read_bandwidth'] / 1e9:.1f} GB/s. GB/s: expert-weight bytes a "
             f"computing core reads per second, {data['layer_experts']} experts of {data['expert_bytes']:,} B, "
             f"top-{data['top_k']}; each system's median over the timed calls.", ""]
    head = "| shape | tokens per expert | " + " | ".join(f"{LABELS.get(n, n)} GB/s" for n in systems)
    head += "".join(f" | ours / {n}" for n in others) + " | goal |"
    lines += [head, "|" + "---|" * (3 + len(systems) + len(others))]
    met = {n: 0 for n in others}
    for i, shape in enumerate(data["shapes"]):
        goal = goal_for(shape)
        row = f"| {shape} | {data['tokens_per_expert'][i]:.2f} | "
        row += " | ".join(f"{systems[n]['per_core'][i] / 1e9:.2f}" for n in systems)
        for n in others:
            ratio = ours[i] / systems[n]["per_core"][i]
            met[n] += ratio >= goal
            row += f" | {ratio:.2f}x"
        lines.append(row + f" | {goal:.1f}x |")
    n_shapes = len(data["shapes"])
    lines += ["", f"Goal (#58: ours at least {GOAL_SMALL}x at the uniform shapes of up to {GOAL_SMALL_TOKENS} tokens, "
              "1.0x elsewhere) met at "
              + ", ".join(f"{met[n]} of {n_shapes} shapes against {n}" for n in others) + ".", "",
              "How each system was driven:", ""]
    lines += [f"- {LABELS.get(n, n)}: {systems[n]['driven']}" for n in systems]
    return "\n".join(lines)


def doc_with(doc: str, text: str, isa: str) -> str:
    """The page with `isa`'s block replaced by `text` (a block is added at the end if it has none)."""
    if DOC_BEGIN.format(isa) not in doc:
        doc = doc.rstrip("\n") + f"\n\n{DOC_BEGIN.format(isa)}\n{DOC_END.format(isa)}\n"
    return sbs.doc_with(doc, text, isa, DOC_BEGIN, DOC_END)


def write_doc(doc_path: Path, tables: list[Path]) -> None:
    """Rewrite each table's block in the page."""
    doc = doc_path.read_text()
    for path in tables:
        data = yaml.safe_load(path.read_text())
        doc = doc_with(doc, render(data), data["isa"])
    doc_path.write_text(doc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--doc", type=Path, nargs="?", const=DOC, default=None, metavar="FILE",
                   help=f"rewrite the tables' blocks in FILE (default {DOC}); without it, print them")
    a = p.parse_args(argv)
    tables = committed_tables()
    if a.doc is not None:
        if not a.doc.is_file():
            p.error(f"--doc {a.doc}: no such file (run from the repository root, or name the file)")
        write_doc(a.doc, tables)
        print(f"wrote {len(tables)} table blocks into {a.doc}")
    else:
        for path in tables:
            print(render(yaml.safe_load(path.read_text())) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
