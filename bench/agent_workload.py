"""An agent-scale workload built from published statistics of real coding-agent traffic.

TraceLab (uw-syfi/TraceLab: 4,265 Claude Code and Codex sessions, 357k model steps; shared/PUBLISHED.md)
measured, per model step: a median cached prefix of 118,656 tokens, a median of 875 appended tokens, more
than 90% of steps appending under 1k tokens while steps of 10k or more carry over 70% of all appended
tokens, a median output of 214 tokens; tool latency p50 0.3 s and p90 13.6 s; human waits p50 1.4 min and
p90 20.6 min. This module draws sessions with those statistics (plans/workloads/agent_scale.csv):

- appended tokens: a body (lognormal) and a tail of steps of at least 10k tokens (a lognormal above
  TAIL_MIN). The bounds are taken as equalities (50% of steps at most 875, 90% under 1k, 70% of the
  appended tokens in 10k+ steps); ASSUMPTIONS, for what was not published: the 10k+ steps are half of
  the steps over 1k (TAIL_WEIGHT) and their spread is TAIL_SIGMA;
- output tokens: lognormal, median 214; ASSUMPTION: spread OUTPUT_SIGMA (no quantile published);
- steps per session: geometric with the published mean (357k / 4,265); each session opens with a system
  prompt and tools (ASSUMPTION: lognormal, spread INITIAL_SIGMA) whose median is solved so that the
  step-weighted median cached prefix is the published 118,656; a session whose context would pass
  CONTEXT_CAP compacts, as agents do near their window: the next step starts a new session (no cache)
  whose prompt is its system prompt plus a summary (ASSUMPTION: SUMMARY_TOKENS);
- the idle time before each call: a tool's latency (lognormal through the published p50 and p90), or,
  for a call that follows a user message, a human wait (likewise); ASSUMPTION: USER_SHARE of calls.

Run `python -m ostinato.bench.agent_workload --doc` to write the file and its statistics (published
against drawn) into plans/workloads/README.md; a test regenerates both and compares.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import random
import sys
from pathlib import Path
from statistics import NormalDist

from ostinato.plans import plans_dir

OUT = plans_dir() / "workloads" / "agent_scale.csv"
SOURCE = "synthetic/TraceLab-statistics"

# Published (TraceLab, shared/PUBLISHED.md)
MEDIAN_PREFIX = 118_656
MEDIAN_APPENDED = 875
SHARE_UNDER_1K = 0.90
TAIL_MIN = 10_000
TAIL_TOKEN_SHARE = 0.70
MEDIAN_OUTPUT = 214
STEPS_PER_SESSION = 357_000 / 4_265
TOOL_P50_S, TOOL_P90_S = 0.3, 13.6
HUMAN_P50_S, HUMAN_P90_S = 1.4 * 60, 20.6 * 60
# ASSUMPTIONS (not published; see the module docstring)
TAIL_WEIGHT = (1 - SHARE_UNDER_1K) / 2
TAIL_SIGMA = 1.0
OUTPUT_SIGMA = 1.0
INITIAL_SIGMA = 0.3
USER_SHARE = 0.08
CONTEXT_CAP = 262_144
SUMMARY_TOKENS = 8_000

SESSIONS = 48
SEED = 0
Z90 = NormalDist().inv_cdf(0.9)


def _lognormal_through(p50: float, p90: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with these median and 90th percentile."""
    return math.log(p50), math.log(p90 / p50) / Z90


def _body() -> tuple[float, float]:
    """(mu, sigma) of the body of appended tokens: with TAIL_WEIGHT of the steps in the tail (all above 1k),
    the body holds the overall median and the share under 1k."""
    body = 1 - TAIL_WEIGHT
    z_median = NormalDist().inv_cdf(0.5 / body)
    z_1k = NormalDist().inv_cdf(SHARE_UNDER_1K / body)
    sigma = math.log(1000 / MEDIAN_APPENDED) / (z_1k - z_median)
    return math.log(MEDIAN_APPENDED) - z_median * sigma, sigma


def _tail_mu(body_mean: float) -> float:
    """mu of the tail lognormal (drawn above TAIL_MIN, spread TAIL_SIGMA) whose mean gives the 10k+ steps
    TAIL_TOKEN_SHARE of all appended tokens; solved by bisection on the truncated mean."""
    want = TAIL_TOKEN_SHARE / (1 - TAIL_TOKEN_SHARE) * (1 - TAIL_WEIGHT) * body_mean / TAIL_WEIGHT
    lo, hi = math.log(TAIL_MIN) - 5, math.log(TAIL_MIN) + 10
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _truncated_mean(mid, TAIL_SIGMA, TAIL_MIN) < want else (lo, mid)
    return (lo + hi) / 2


def _truncated_mean(mu: float, sigma: float, low: float) -> float:
    """E[X | X >= low] for X lognormal(mu, sigma)."""
    a = (math.log(low) - mu) / sigma
    n = NormalDist()
    return math.exp(mu + sigma ** 2 / 2) * (1 - n.cdf(a - sigma)) / (1 - n.cdf(a))


class Draws:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.body = _body()
        body_mean = math.exp(self.body[0] + self.body[1] ** 2 / 2)
        self.tail = (_tail_mu(body_mean), TAIL_SIGMA)
        self.tool = _lognormal_through(TOOL_P50_S, TOOL_P90_S)
        self.human = _lognormal_through(HUMAN_P50_S, HUMAN_P90_S)

    def lognormal(self, mu_sigma: tuple[float, float]) -> float:
        return self.rng.lognormvariate(*mu_sigma)

    def appended(self) -> int:
        if self.rng.random() < TAIL_WEIGHT:
            while (x := self.lognormal(self.tail)) < TAIL_MIN:  # the tail lies above TAIL_MIN
                pass
            return round(x)
        return max(1, round(self.lognormal(self.body)))

    def output(self) -> int:
        return max(1, round(self.rng.lognormvariate(math.log(MEDIAN_OUTPUT), OUTPUT_SIGMA)))

    def steps(self) -> int:
        p = 1 / STEPS_PER_SESSION  # geometric on 1, 2, ...
        return 1 + int(math.log(1 - self.rng.random()) / math.log(1 - p))


def sessions(initial_median: float, seed: int = SEED, count: int = SESSIONS) -> list[list[dict]]:
    """`count` agent sessions (lists of rows, compacted ones split off as sessions of their own)."""
    d = Draws(seed)
    out: list[list[dict]] = []
    for s in range(count):
        system = round(d.rng.lognormvariate(math.log(initial_median), INITIAL_SIGMA))
        part, rows, context, kind = 0, [], 0, "initial"
        appended = system
        for step in range(d.steps()):
            if step:
                kind = "user" if d.rng.random() < USER_SHARE else "tool"
                appended = d.appended()
            generated = d.output()
            if rows and context + appended + generated > CONTEXT_CAP:  # compaction: the cache starts over
                out.append(rows)
                part, rows, context, kind = part + 1, [], 0, "compacted"
                appended += system + SUMMARY_TOKENS  # the new context: the prompt, the summary, this step's input
            appended = min(appended, CONTEXT_CAP - context - generated)  # an input past the window is cut
            idle = 0.0 if not step else d.lognormal(d.human if kind == "user" else d.tool)
            rows.append(dict(source=SOURCE, model="claude-code-and-codex", session=f"agent-{s:02d}.{part}",
                             turn=len(rows), appended_kind=kind, appended_tokens=appended, generated_tokens=generated,
                             reasoning_tokens=0, context_before=context, idle_before_s=round(idle, 3)))
            context += appended + generated
        out.append(rows)
    return out


def median_prefix(all_sessions: list[list[dict]]) -> float:
    prefixes = sorted(r["context_before"] for rows in all_sessions for r in rows)
    return prefixes[len(prefixes) // 2]


def solve_initial_median(seed: int = SEED, count: int = SESSIONS) -> float:
    """The system prompt's median that gives the published median cached prefix (bisection, in tokens)."""
    lo, hi = 1_000.0, 100_000.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if median_prefix(sessions(mid, seed, count)) < MEDIAN_PREFIX else (lo, mid)
    return round((lo + hi) / 2)


COLUMNS = ("source", "model", "session", "turn", "appended_kind", "appended_tokens", "generated_tokens",
           "reasoning_tokens", "context_before", "idle_before_s")


def render(seed: int = SEED, count: int = SESSIONS) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, COLUMNS, lineterminator="\n")
    writer.writeheader()
    for rows in sessions(solve_initial_median(seed, count), seed, count):
        writer.writerows(rows)
    return buf.getvalue()


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def statistics_table(text: str) -> str:
    """The file's statistics beside the published ones (markdown)."""
    rows = list(csv.DictReader(io.StringIO(text)))
    steps = [r for r in rows if r["appended_kind"] in ("tool", "user")]
    appended = [int(r["appended_tokens"]) for r in steps]
    tools = [float(r["idle_before_s"]) for r in steps if r["appended_kind"] == "tool"]
    humans = [float(r["idle_before_s"]) for r in steps if r["appended_kind"] == "user"]
    agents = {r["session"].split(".")[0] for r in rows}
    lines = [f"{len(rows):,d} calls in {len(agents)} agent sessions ({len({r['session'] for r in rows})} after "
             f"compaction at {CONTEXT_CAP:,d} tokens); tool and user steps: {len(steps):,d}.", "",
             "| per model step | TraceLab (published) | agent_scale.csv |", "|---|---|---|",
             f"| median cached prefix | {MEDIAN_PREFIX:,d} | "
             f"{_quantile([int(r['context_before']) for r in rows], 0.5):,.0f} |",
             f"| median appended tokens | {MEDIAN_APPENDED:,d} | {_quantile(appended, 0.5):,.0f} |",
             f"| steps appending under 1k | more than 90% | {sum(a < 1000 for a in appended) / len(appended):.1%} |",
             f"| appended tokens in steps of 10k+ | more than 70% | "
             f"{sum(a for a in appended if a >= TAIL_MIN) / sum(appended):.1%} |",
             f"| median output tokens | {MEDIAN_OUTPUT} | "
             f"{_quantile([int(r['generated_tokens']) for r in rows], 0.5):.0f} |",
             f"| tool latency p50 / p90 s | {TOOL_P50_S} / {TOOL_P90_S} | {_quantile(tools, 0.5):.2f} / "
             f"{_quantile(tools, 0.9):.1f} |",
             f"| human wait p50 / p90 s | {HUMAN_P50_S:.0f} / {HUMAN_P90_S:.0f} | {_quantile(humans, 0.5):.0f} / "
             f"{_quantile(humans, 0.9):.0f} |"]
    return "\n".join(lines)


DOC = plans_dir() / "workloads" / "README.md"
DOC_BEGIN = "<!-- agent_scale statistics: written by python -m ostinato.bench.agent_workload --doc; do not edit -->"
DOC_END = "<!-- end of the agent_scale statistics -->"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ostinato.bench.agent_workload",
                                description="Write the agent-scale workload drawn from TraceLab's published "
                                            "statistics.")
    p.add_argument("--out", type=Path, default=OUT, help=f"the CSV to write (default: {OUT})")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--sessions", type=int, default=SESSIONS, help="agent sessions before compaction splits them")
    p.add_argument("--doc", action="store_true", help=f"also write its statistics into {DOC}")
    a = p.parse_args(argv)
    text = render(a.seed, a.sessions)
    a.out.write_text(text)
    table = statistics_table(text)
    print(f"wrote {a.out}\n\n{table}")
    if a.doc:
        from .simulator.bench import doc_with  # noqa: PLC0415  (the simulator: only when asked)

        DOC.write_text(doc_with(DOC.read_text(), table, DOC_BEGIN, DOC_END))
        print(f"(rewrote the statistics in {DOC})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
