"""The GPU throughput report's rows and table: a Row per figure, the issue's goals that judge its ratio,
the table and its ratio and goal lines, and the table file that is rewritten as each row arrives."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ostinato.bench.gpu_setup import GRAPH_VS_EAGER


@dataclass(frozen=True)
class Row:
    name: str                 # the measurement it belongs to
    what: str
    value: str                # what was measured
    reference: str = ""       # what it is compared with
    ratio: float | None = None
    ratio_key: str = ""       # its name in the ratio line, saying what over what ("key:detail" per shape)
    failed: bool = False      # the measurement raised, crashed, hung or did not run
    seconds: float = 0.0      # the measurement's process time, on its last row
    goal: str = ""            # the goal for this ratio, and whether it was met
    met: bool | None = None


@dataclass(frozen=True)
class Goal:
    what: str                 # for a goal nothing measured
    text: str
    met: Callable[[float], bool]


# The issue's goals, by ratio key (its part before ':'); the last three are the checks' figures.
GOALS = {
    "decode_bw/peak": Goal("(a) hot decode at HBM bandwidth", ">= 0.7", lambda r: r >= 0.7),
    "fp8_gemv_bw/peak": Goal("(h) FP8 GEMV at peak bandwidth", ">= 0.6", lambda r: r >= 0.6),
    "graph/eager_decode": Goal("(c) decode graphs vs eager steps, float32 logits (tests/gpu)",
                               f"<= {GRAPH_VS_EAGER:g}", lambda r: r <= GRAPH_VS_EAGER),
    "graph/eager_bucket": Goal("(i) bucket graphs vs eager steps, float32 logits (tests/gpu)",
                               f"<= {GRAPH_VS_EAGER:g}", lambda r: r <= GRAPH_VS_EAGER),
    "alloc/plan_gpu0": Goal("allocation vs the plan less headroom (tests/gpu)", "1 +- 0.05",
                            lambda r: abs(r - 1) <= 0.05),
}


def judged(row: Row) -> Row:
    goal = GOALS.get(row.ratio_key.split(":")[0])
    if goal is None or row.ratio is None or row.failed:
        return row
    return replace(row, goal=goal.text, met=bool(goal.met(row.ratio)))


def figure_rows(path: Path | None) -> list[Row]:
    """The checks' figures that have a goal (tests/gpu/conftest.py writes them, one JSON object a line)."""
    if path is None or not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        fig = json.loads(line)
        key, value = fig["figure"], fig["value"]
        if goal := GOALS.get(key.split(":")[0]):
            rows.append(Row("checks", f"{goal.what}: {key}", f"{value:.3g}", "", value, key))
    return rows


def unmeasured_goals(rows: list[Row]) -> list[Row]:
    keys = {r.ratio_key.split(":")[0] for r in rows if r.met is not None}
    return [Row("goals", g.what, "not measured", goal=g.text) for k, g in GOALS.items() if k not in keys]


# ----- output ---------------------------------------------------------------------------------------
def table(rows: list[Row]) -> str:
    head = ("what", "measured", "reference", "ratio", "goal", "s")
    cells = [(r.what, "FAILED: " + r.value if r.failed else r.value, r.reference,
              "" if r.ratio is None else f"{r.ratio:.3g}",
              r.goal + ("" if r.met is None else " pass" if r.met else " MISSED"),
              f"{r.seconds:.1f}" if r.seconds else "") for r in rows]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *cells]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def ratio_line(rows: list[Row]) -> str:
    return "ratios: " + (" ".join(f"{r.ratio_key}={r.ratio:.3g}" for r in rows if r.ratio_key) or "none")


def goals_line(rows: list[Row]) -> str:
    judged_rows = [r for r in rows if r.met is not None]
    missed = [r.ratio_key for r in judged_rows if not r.met]
    unmeasured = [r.what for r in rows if r.name == "goals"]
    return (f"goals: {len(judged_rows) - len(missed)} of {len(judged_rows)} met"
            + (f"; missed: {' '.join(missed)}" if missed else "")
            + (f"; not measured: {', '.join(unmeasured)}" if unmeasured else ""))


class TableFile:
    """The table so far in a file, rewritten whenever a row arrives (replaced whole: a reader never sees
    half of it), so a run cut short keeps every row it finished. With a state file (JSON lines, one Row each)
    the rows of an earlier run that wrote it come first, and it is kept up to date too."""

    def __init__(self, path: Path, state: Path | None = None):
        self.path, self.state, self.rows = path, state, []
        path.parent.mkdir(parents=True, exist_ok=True)
        if state is not None and state.exists():
            self.rows = [Row(**json.loads(line)) for line in state.read_text().splitlines() if line]

    def add(self, rows: list[Row]) -> None:
        self.rows += [judged(r) for r in rows]
        self.write()

    def drop(self, names: set[str]) -> None:
        self.rows = [r for r in self.rows if r.name not in names]

    def finish_measurement(self, name: str, seconds: float) -> None:
        """The measurement's time on its last row."""
        last = max(i for i, r in enumerate(self.rows) if r.name == name)
        self.rows[last] = replace(self.rows[last], seconds=seconds)
        self.write()

    def write(self, *lines: str) -> None:
        _replace(self.path, "\n".join([table(self.rows), *lines]) + "\n")
        if self.state is not None:
            _replace(self.state, "".join(json.dumps(asdict(r)) + "\n" for r in self.rows))


def _replace(path: Path, text: str) -> None:
    """path's text replaced whole (a reader sees the old file or the new one)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
