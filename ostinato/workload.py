"""Agent-session workloads (plans/workloads/README.md) and the token ids a replay feeds.

A workload CSV has one row per model call: the tokens appended on top of the cached context and
the tokens generated (and, where recorded, the seconds the engine sat idle before the call). The
compiler prices its choices on a workload's summary (WorkloadSummary: appends, cached prefixes, idle
periods). Replays (profiling, ostinato-run --session, benchmarks) need token ids of
those lengths: real text through the model's tokenizer when the checkpoint has one (hash-routed
layers route by token id, so real ids matter), cut from a seeded offset; else seeded random ids.
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ostinato.plans import plans_dir

CORPUS = plans_dir() / "workloads" / "corpus.txt"  # agent-like text the package ships


class WorkloadError(ValueError):
    """A workload file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Turn:
    appended: int
    generated: int
    idle_before_s: float | None = None  # the agent's tool or its human before this call (None: not recorded)


@dataclass(frozen=True)
class SessionShape:
    name: str        # "source/session"
    turns: tuple[Turn, ...]
    prefix: int = 0  # tokens cached before the first of `turns` (a session replayed from a later call: starting_at)
    first: int = 0   # the index of the first of `turns` among the recorded session's calls

    def cached_before(self, turn: int) -> int:
        """Tokens in the session's cache when call `turn` starts: the prefix and every earlier call's appended and
        generated tokens. Computed, not read: agent_turns.csv's context_before column counts the call's own
        appended tokens too (the provider's prompt count), agent_scale.csv's does not (plans/workloads/README.md)."""
        return self.prefix + sum(t.appended + t.generated for t in self.turns[:turn])

    def starting_at(self, turn: int) -> SessionShape:
        """The session from call `turn` on, the calls before it a cached prefix of as many tokens: a replay
        reaches an agent's position (100k+ tokens) in one prefill instead of every call before it."""
        if not 0 <= turn < len(self.turns):
            raise WorkloadError(f"session {self.name} has calls 0..{len(self.turns) - 1}: no call {turn} to start at")
        return SessionShape(self.name, self.turns[turn:], self.cached_before(turn), self.first + turn)


def read_sessions(path: str | Path) -> list[SessionShape]:
    """Sessions of a workload CSV (plans/workloads/README.md), in file order."""
    path = Path(path)
    if not path.exists():
        raise WorkloadError(f"{path}: sessions file not found")
    sessions: dict[str, list[Turn]] = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        need = {"source", "session", "turn", "appended_tokens", "generated_tokens"}
        if reader.fieldnames is None or not need <= set(reader.fieldnames):
            raise WorkloadError(f"{path}:1: columns {sorted(need)} are required, got {reader.fieldnames}")
        for line, row in enumerate(reader, start=2):
            try:
                turn = Turn(int(row["appended_tokens"]), int(row["generated_tokens"]))
            except ValueError:
                raise WorkloadError(f"{path}:{line}: appended_tokens and generated_tokens must be integers") from None
            if turn.appended < 0 or turn.generated < 0:
                raise WorkloadError(f"{path}:{line}: token counts must be non-negative")
            if row.get("idle_before_s") not in (None, ""):
                try:
                    idle = float(row["idle_before_s"])
                except ValueError:
                    idle = -1.0
                if not idle >= 0:
                    raise WorkloadError(f"{path}:{line}: idle_before_s must be a non-negative number of seconds, "
                                        f"got {row['idle_before_s']!r}")
                turn = Turn(turn.appended, turn.generated, idle)
            sessions.setdefault(f"{row['source']}/{row['session']}", []).append(turn)
    return [SessionShape(name, tuple(turns)) for name, turns in sessions.items()]


def shrink_sessions(sessions: list[SessionShape], scale: float = 1.0, max_turns: int | None = None,
                    max_generated: int | None = None) -> list[SessionShape]:
    """Smaller replays of the same shapes, for small machines: appended tokens and the cached prefix x scale
    (at least 1), the first max_turns turns, at most max_generated generated tokens per turn."""
    out = []
    for s in sessions:
        turns = s.turns[:max_turns] if max_turns else s.turns
        out.append(SessionShape(s.name, tuple(
            Turn(max(1, round(t.appended * scale)) if t.appended else 0,
                 t.generated if max_generated is None else min(t.generated, max_generated), t.idle_before_s)
            for t in turns), max(1, round(s.prefix * scale)) if s.prefix else 0, s.first))
    return out


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass(frozen=True)
class WorkloadSummary:
    """What the compiler prices its choices on (compiler/passes/least_wait.py): a workload's calls after each session's
    first (a tool output or a user message on a cached context; the first call is the session's start, not a
    wait after a tool) and the idle periods it records. Legend: C such calls, I recorded idle periods."""
    name: str                 # the file's name: how the plan names it (provenance.workloads, notes)
    sha256: str               # of the file's bytes: the plan's fingerprint covers its inputs
    sessions: int
    appended: np.ndarray      # [C] int64 tokens each call prefills
    cached: np.ndarray        # [C] int64 tokens in the cache when it starts (SessionShape.cached_before)
    idle_s: np.ndarray        # [I] float64 seconds idle before a call (its tool, or its human); empty: none recorded

    @property
    def median_cached(self) -> int:
        """The position a typical call's prefill starts at (the lower middle value: a token count)."""
        return int(np.sort(self.cached)[(len(self.cached) - 1) // 2]) if len(self.cached) else 0


def summarize_workload(path: str | Path) -> WorkloadSummary:
    """The WorkloadSummary of a workload CSV; WorkloadError naming the file when it has no call after a
    session's first."""
    path = Path(path)
    sessions = read_sessions(path)
    calls = [(t.appended, s.cached_before(i), t.idle_before_s) for s in sessions for i, t in enumerate(s.turns) if i]
    if not calls:
        raise WorkloadError(f"{path}: no session has a call after its first: nothing to price a turn on")
    return WorkloadSummary(
        name=path.name, sha256=file_sha256(path), sessions=len(sessions),
        appended=np.array([c[0] for c in calls], dtype=np.int64),
        cached=np.array([c[1] for c in calls], dtype=np.int64),
        idle_s=np.array([c[2] for c in calls if c[2] is not None], dtype=np.float64))


class TokenSource:
    """Deterministic token ids of a given length: windows of tokenized text, or seeded random ids."""

    def __init__(self, model_dir: Path, vocab_size: int, seed: int, text: Path | None = None):
        self.gen = torch.Generator().manual_seed(seed)
        self.vocab = vocab_size
        self.ids: torch.Tensor | None = None
        tok_file = model_dir / "tokenizer.json"
        if tok_file.exists():
            from tokenizers import Tokenizer

            ids = Tokenizer.from_file(str(tok_file)).encode((text or CORPUS).read_text()).ids
            self.ids = torch.tensor([i for i in ids if i < vocab_size], dtype=torch.int64)
        self.kind = "text" if self.ids is not None and self.ids.numel() > 0 else "random"

    def take(self, n: int) -> torch.Tensor:
        if self.kind == "random":
            return torch.randint(0, self.vocab, (n,), generator=self.gen)
        start = int(torch.randint(0, self.ids.numel(), (1,), generator=self.gen))
        reps = (start + n) // self.ids.numel() + 1
        return self.ids.repeat(reps)[start:start + n]
