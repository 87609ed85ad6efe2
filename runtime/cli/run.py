"""ostinato-run: load a plan and run its model as planned: replay a session, or answer a prompt."""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

from ostinato.checkpoint import CheckpointError
from ostinato.cli.common import refuse
from ostinato.plan import PlanError
from ostinato.workload import WorkloadError

from ..engine import ContextFull, generate
from .engine_args import add_engine_args, load_engine_from_args

SERVE_ALIAS_NOTE = ("ostinato-run: note: `ostinato-run PLAN --serve` is now `ostinato-serve PLAN` (same options); "
                    "the alias goes away in the next release")


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="ostinato-run",
        description="Run a plan from ostinato-compile: weights placed as planned (hot experts on their device, cold "
                    "experts behind the CPU kernel), split-route or upload-once prefill, the decode step. "
                    "To serve agents over HTTP, use ostinato-serve.")
    add_engine_args(p)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--session", type=Path, help="replay an agent session from a workload CSV and time every turn")
    what.add_argument("--prompt", help="generate a reply to this text (greedy)")
    p.add_argument("--session-index", type=int, help="which session of the CSV, from 0 (0)")
    p.add_argument("--limit-turns", type=int, help="replay at most this many turns")
    p.add_argument("--from-turn", type=int, default=0,
                   help="start at this call of the session, the calls before it prefilled once as a cached prefix "
                        "(an agent-scale session's 100k+ tokens), not measured (0)")
    p.add_argument("--idle-scale", type=float, default=1.0,
                   help="sleep each call's recorded idle_before_s (tool latency, human wait) x this before it: the "
                        "re-placement between turns uploads meanwhile; 0: no waits, 0.01: compressed 100x (1.0)")
    p.add_argument("--max-generated", type=int, help="decode at most this many tokens per turn")
    p.add_argument("--scale", type=float, default=1.0, help="multiply appended tokens by this factor (1.0)")
    p.add_argument("--max-new", type=int, default=32, help="tokens to generate for --prompt (32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the replayed token ids (0)")
    a = p.parse_args(argv)
    if a.scale <= 0:
        p.error(f"--scale must be positive, got {a.scale}")
    if a.idle_scale < 0 or a.from_turn < 0:
        p.error(f"--idle-scale and --from-turn must be >= 0, got {a.idle_scale} and {a.from_turn}")
    for name in ("max_new", "limit_turns"):
        v = getattr(a, name)
        if v is not None and v <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {v}")
    if a.max_generated is not None and a.max_generated < 0:
        p.error(f"--max-generated must be >= 0, got {a.max_generated}")
    if a.session_index is not None and a.session is None:
        p.error("--session-index picks a session of --session FILE, and no --session was given")
    if a.session_index is not None and a.session_index < 0:
        p.error(f"--session-index must be >= 0, got {a.session_index}")
    return a


def session_shape(a: argparse.Namespace):
    """The session --session and --session-index name, shrunk as asked; WorkloadError naming the file or the
    index. Read before the engine loads: a missing file or a bad index must not cost a model load."""
    from ostinato.workload import read_sessions, shrink_sessions

    try:
        sessions = read_sessions(a.session)
    except (OSError, UnicodeDecodeError, csv.Error) as e:  # a folder, no permission, not text
        raise WorkloadError(f"{a.session}: cannot read it as a sessions CSV: {e}") from None
    index = a.session_index or 0
    if not sessions:
        raise WorkloadError(f"{a.session}: the file holds no sessions")
    if index >= len(sessions):
        raise WorkloadError(f"{a.session}: --session-index {index} out of range (the file has {len(sessions)} "
                            f"sessions: 0..{len(sessions) - 1})")
    return shrink_sessions([sessions[index].starting_at(a.from_turn)], a.scale, a.limit_turns, a.max_generated)[0]


def serve_alias(argv: list[str]) -> None:
    """`ostinato-run PLAN --serve ...`, the old spelling: this process becomes `ostinato-serve PLAN ...`.
    An exec, not an import: the runtime never imports the server."""
    print(SERVE_ALIAS_NOTE, file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "ostinato.server", *(arg for arg in argv if arg != "--serve")])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--serve" in argv:
        serve_alias(argv)
    a = parse_args(argv)
    from ostinato.workload import TokenSource

    from ..engine.replay import HEADER, format_turn, replay, summary

    try:
        shape = session_shape(a) if a.session else None  # first: the inputs, then the engine (seconds to minutes)
        engine = load_engine_from_args(a)
        model_dir = engine.model_dir
        if shape is not None:
            print(f"session {shape.name}: {len(shape.turns)} turns\n{HEADER}")
            start, prefix_s = time.perf_counter(), [0.0]

            def on_prefix(n: int, seconds: float) -> None:  # before the first turn: not the session's time
                prefix_s[0] = seconds
                print(f"cached prefix: {n:,d} tokens prefilled in {seconds:.1f} s (not a turn)", flush=True)

            results = replay(engine, shape, TokenSource(model_dir, engine.model.config.vocab_size, a.seed),
                             on_turn=lambda r: print(format_turn(r), flush=True), idle_scale=a.idle_scale,
                             on_prefix=on_prefix)
            print(summary(results, engine.plan, time.perf_counter() - start - prefix_s[0]))
        else:
            _prompt(engine, model_dir, a.prompt or "Hello", a.max_new)
    except (PlanError, CheckpointError, WorkloadError, ContextFull) as e:  # ContextFull: past the plan's context
        return refuse("ostinato-run", e)
    return 0


def _prompt(engine, model_dir: Path, text: str, max_new: int) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = [engine.model.config.bos_token_id] + tok.encode(text).ids
    session = engine.new_session()
    reply = generate(session, session.prefill(ids, last_only=True)[-1], max_new, engine.model.config.eos_token_id)
    print(tok.decode(list(reply.tokens)))


if __name__ == "__main__":
    sys.exit(main())
