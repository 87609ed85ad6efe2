"""The wait after a human pause: a long session kept in --session-dir and restored for its next turn, against
computing its whole prefix again, side by side in one run.

    python -m ostinato.bench.session_restore [--plan plans/tiny.cpu-only.yaml] [--tokens 120000] [--append 300]
        [--rounds 3] [--session-dir DIR] [--out OUT.md] [--doc]

An agent's conversation (TraceLab's median cached prefix: 118,656 tokens) waits minutes for its human; a
server cannot hold every such session in memory, so ostinato-serve --session-dir writes it to a file
(server/session_store.py, model/session_file.py) and loads it when the next turn comes. The tool times the
next turn (--append new tokens after a conversation of --tokens tokens, which came in turns of --turn-tokens) to
its first token, per round, both ways:

- restore: a store opened on the folder (the server's restart: its index read back from the files'
  headers), the file matched and loaded (its pages dropped from the OS cache first, so it is read from disk
  as after a long pause), and only the new tokens prefilled;
- recompute: a new session prefilling the whole conversation, turn by turn, then the new tokens; the first
  round's writes the session to the store (the server's write on eviction) once its stored part is in, untimed.

The two alternate (recompute first in odd rounds, restore first in even ones) so drift in the machine's load
falls on both; the table gives the medians, each round, the 1-minute load averages read around each
measurement and the bytes the session takes on disk. Both ways must pick the same first token (greedy): the
tool fails otherwise. The plan's model must exist (the tiny plan's: tools/demo.sh step 1).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ostinato.plans import plans_dir

DEFAULT_PLAN = plans_dir() / "tiny.cpu-only.yaml"
DOC = plans_dir().parent / "docs" / "benchmarks.md"
DOC_BEGIN = "<!-- session restore: written by python -m ostinato.bench.session_restore --doc; do not edit -->"
DOC_END = "<!-- end of the session restore table -->"
DOC_HEADING = "## The next turn after a pause: a session restored from --session-dir against recomputed"
WAYS = ("restore", "recompute")


def conversation(tokens: int, append: int, vocab: int, seed: int) -> tuple[list[int], list[int]]:
    """(the stored conversation's ids [tokens], the next turn's new ids [append]): seeded, ids 3.. (past the
    tiny tokenizer's specials)."""
    ids = torch.randint(3, vocab, (tokens + append,), generator=torch.Generator().manual_seed(seed)).tolist()
    return ids[:tokens], ids[tokens:]


def turn_sizes(tokens: int, turn: int) -> list[int]:
    """The stored conversation's prefill calls: `turn` tokens each, the rest in the last (each call ends a turn:
    a snapshot the session file keeps)."""
    if tokens < 1 or turn < 1:
        raise ValueError(f"--tokens and --turn-tokens must be positive, got {tokens} and {turn}")
    return [turn] * (tokens // turn) + ([tokens % turn] if tokens % turn else [])


@dataclass
class Timing:
    way: str
    seconds: float
    computed: int          # tokens this way prefilled
    first_token: int
    load_before: float     # 1-minute load averages around it
    load_after: float


@dataclass
class Result:
    plan: str
    tokens: int
    append: int
    turn: int
    file_bytes: int        # the session file and its logits file
    timings: list[Timing] = field(default_factory=list)
    logits_max_diff: float = 0.0  # |restored - recomputed| over the first token's logits, largest

    def of(self, way: str) -> list[Timing]:
        return [t for t in self.timings if t.way == way]

    def median(self, way: str) -> float:
        return statistics.median(t.seconds for t in self.of(way))


def drop_from_page_cache(paths) -> None:
    """Ask the kernel to forget the files' cached pages (clean after write_session's fsync), so the next read
    comes from the disk, as after a pause long enough for other work to push them out. Advice only: where
    posix_fadvise does not exist the read may be served from memory (the table says which)."""
    if not hasattr(os, "posix_fadvise"):
        return
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _greedy_first(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits.float()))


def recompute(engine, prefix: list[int], new: list[int], turn: int, progress, keep=None
              ) -> tuple[Timing, torch.Tensor]:
    """The next turn with nothing kept: the whole conversation prefilled in a new session, its turns as they came
    (calls of `turn` tokens: the same 4,096-token chunks as one call when `turn` is a multiple of them), then the
    new tokens -> (its timing, the first token's logits [V]). `keep(session, logits)`, when given, runs untimed
    once the stored part is in (the first round writes the store with it)."""
    gc.collect()
    load_before = os.getloadavg()[0]
    start, paused = time.perf_counter(), 0.0
    session = engine.new_session()
    done = 0
    for n in turn_sizes(len(prefix), turn):
        logits = session.prefill(prefix[done:done + n], last_only=True)[-1]
        done += n
        progress(f"    recompute: {done:,d} of {len(prefix):,d} tokens ({time.perf_counter() - start:.0f} s)")
    if keep is not None:
        t = time.perf_counter()
        keep(session, logits)
        paused = time.perf_counter() - t
    logits = session.prefill(new, last_only=True)[-1]
    token = _greedy_first(logits)
    seconds = time.perf_counter() - start - paused
    return (Timing("recompute", seconds, len(prefix) + len(new), token, load_before, os.getloadavg()[0]),
            logits.float().clone())


def restore(engine, store_dir: Path, identity: dict, prefix: list[int], new: list[int]) -> tuple[Timing, torch.Tensor]:
    """The next turn from the store, as a restarted server serves it: the folder's index read back from the files'
    headers, the file read from disk (its cached pages dropped first) into a new session, the new tokens
    prefilled -> (its timing, the first token's logits [V])."""
    from ostinato.server.session_store import SessionStore

    ids = prefix + new
    gc.collect()
    drop_from_page_cache(sorted(store_dir.glob("*.safetensors")))
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    store = SessionStore(store_dir, identity)
    name, reused = store.match(ids)
    state = store.load(name, engine.model) if name is not None else None
    if state is None:
        raise SystemExit(f"the store in {store_dir} did not serve the conversation (match: {name!r}, {reused} "
                         f"tokens); see its log")
    session = engine.new_session()
    session.adopt(state)
    reused = session.rewind_point(reused)
    logits = session.prefill(ids[reused:], last_only=True)[-1]
    token = _greedy_first(logits)
    seconds = time.perf_counter() - start
    return Timing("restore", seconds, len(ids) - reused, token, load_before, os.getloadavg()[0]), logits.float().clone()


def run(plan_path: Path, tokens: int, append: int, turn: int, rounds: int, store_dir: Path, seed: int = 0,
        progress=print) -> Result:
    """Round 1 recomputes first (and writes the store on the way, untimed), then the order alternates."""
    from ostinato.runtime.engine.loader import load_engine
    from ostinato.server.session_store import SessionStore, engine_identity

    if rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {rounds}")
    engine = load_engine(plan_path, device="cpu")
    if tokens + append > engine.plan.policy.context:
        raise SystemExit(f"{tokens + append:,d} tokens pass the plan's context of {engine.plan.policy.context:,d} "
                         f"(policy.context): compile it with ostinato-compile --context {tokens + append}")
    identity = engine_identity(engine)
    prefix, new = conversation(tokens, append, engine.model.config.vocab_size, seed)
    result = Result(str(plan_path), tokens, append, turn, 0)

    def keep(session, logits) -> None:  # what ostinato-serve --session-dir writes when it evicts the session
        store = SessionStore(store_dir, identity)
        if not store.save(list(prefix), session.state(), (tokens, logits.clone())):
            raise SystemExit(f"the session was not written to {store_dir}; see the log")
        result.file_bytes = store.bytes

    firsts: dict[str, torch.Tensor] = {}
    for r in range(rounds):
        for way in (WAYS[::-1] if r % 2 == 0 else WAYS):
            if way == "restore":
                timing, logits = restore(engine, store_dir, identity, prefix, new)
            else:
                timing, logits = recompute(engine, prefix, new, turn, progress, keep if r == 0 else None)
            result.timings.append(timing)
            firsts.setdefault(way, logits)
            progress(f"  round {r + 1}/{rounds} {way}: {timing.seconds:.2f} s ({timing.computed:,d} tokens "
                     f"computed, load {timing.load_before:.1f} -> {timing.load_after:.1f})")
    tokens_seen = {t.first_token for t in result.timings}
    if len(tokens_seen) != 1:
        raise SystemExit(f"restored and recomputed sessions picked different first tokens: {sorted(tokens_seen)}")
    result.logits_max_diff = float((firsts["restore"] - firsts["recompute"]).abs().max())
    engine.close()
    return result


def _loads(ts: list[Timing]) -> str:
    values = [v for t in ts for v in (t.load_before, t.load_after)]
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def table(r: Result, machine: str) -> str:
    """The markdown block: a line of what ran, the table, a line of what it says."""
    restore, recompute = r.of("restore"), r.of("recompute")
    ratio = r.median("recompute") / r.median("restore")
    lines = [
        f"{r.tokens:,d}-token conversation (stored in turns of {r.turn:,d}), next turn {r.append:,d} new tokens, "
        f"plan `{Path(r.plan).name}`, {machine}, {len(restore)} round{'s' if len(restore) > 1 else ''} alternating "
        f"(recompute first in odd rounds: the first one also writes the store, untimed).",
        "",
        "| next turn's first token | restored from --session-dir | whole prefix recomputed |",
        "|---|---|---|",
        f"| median s | {r.median('restore'):.2f} | {r.median('recompute'):.2f} |",
        f"| each round s | {' / '.join(f'{t.seconds:.2f}' for t in restore)} | "
        f"{' / '.join(f'{t.seconds:.2f}' for t in recompute)} |",
        f"| tokens computed | {restore[0].computed:,d} | {recompute[0].computed:,d} |",
        f"| bytes read from disk | {r.file_bytes / 1e6:.1f} MB (session file and its end logits; "
        f"page cache dropped first) | - |",
        f"| 1-min load average, median (range) | {_loads(restore)} | {_loads(recompute)} |",
        "",
        f"Restoring is {ratio:.1f}x faster than recomputing (medians); both pick the same greedy first token "
        f"(largest logit difference {r.logits_max_diff:.2e}).",
    ]
    return "\n".join(lines)


def doc_with(doc: str, block: str, begin: str = DOC_BEGIN, end: str = DOC_END, heading: str = DOC_HEADING) -> str:
    """The document with the block between `begin` and `end` replaced by `block`; a document without it gets it
    at its end, under `heading` (this tool's markers by default; bench/parallel_model.py passes its own)."""
    i, j = doc.find(begin), doc.find(end)
    if i < 0 and j < 0:
        return doc.rstrip("\n") + f"\n\n{heading}\n\n{begin}\n\n{block}\n\n{end}\n"
    if i < 0 or j < i:
        raise ValueError(f"the document's '{begin}' ... '{end}' block is broken (one marker without the "
                         f"other, or in the wrong order)")
    return doc[:i + len(begin)] + "\n\n" + block + "\n\n" + doc[j:]


def machine_line() -> str:
    return f"{os.cpu_count()} CPU threads ({platform.machine()}), torch {torch.__version__}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ostinato.bench.session_restore", description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", type=Path, default=DEFAULT_PLAN, help=f"the plan to run (default: {DEFAULT_PLAN.name})")
    p.add_argument("--tokens", type=int, default=120_000, help="tokens of the stored conversation (120,000)")
    p.add_argument("--append", type=int, default=300, help="new tokens of the next turn (300: a tool's output)")
    p.add_argument("--turn-tokens", type=int, default=8192, help="the stored conversation's turns (8,192 tokens)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--session-dir", type=Path, help="the folder to keep the session in (default: a temporary one, "
                                                    "deleted after)")
    p.add_argument("--out", type=Path, help="write the markdown block here too")
    p.add_argument("--doc", action="store_true", help=f"write it into {DOC.name} between its markers")
    a = p.parse_args(argv)
    if not a.plan.is_file():
        p.error(f"--plan {a.plan}: no such file")
    with tempfile.TemporaryDirectory(prefix="session-restore-") as tmp:
        store_dir = a.session_dir if a.session_dir is not None else Path(tmp)
        if a.session_dir is not None and any(store_dir.glob("*.safetensors")):
            p.error(f"--session-dir {store_dir} holds session files already: give an empty folder")
        result = run(a.plan, a.tokens, a.append, a.turn_tokens, a.rounds, store_dir, a.seed,
                     progress=lambda line: print(line, file=sys.stderr, flush=True))
    block = table(result, machine_line())
    print(block)
    if a.out is not None:
        a.out.write_text(block + "\n")
    if a.doc:
        DOC.write_text(doc_with(DOC.read_text(), block))
        print(f"(rewrote the session restore block in {DOC})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
