"""The generation loop: one reply's tokens from an engine session, picked one at a time, speculative when
the session drafts. ostinato-run (its prompt and its replay, through greedy.py) and the server's worker
(server/worker.py) decode through this one loop, so draft -> verify -> reject is written once.

    run = Generation(session, logits, GreedyPicker(), max_tokens=32, eos=eos)   # logits [V]: the prompt's last
    for event in run:                     # Token(id, index, pick) per token, in order, then one Finished
        if isinstance(event, Token) and ...:
            run.stop()                    # the reply ends on this token (a stop sequence completed on it)
    run.finished                          # Finished(reason, tokens, drafted, accepted)

Several replies at once (the server's --parallel): `run.steps()` is the same loop with its forwards left to
the caller, who runs the running sessions' tokens in one step (batch_runner.decode_together) and sends each
loop its token's logits; a loop whose session runs alone is sent `run.forward(token)`, which speculates.

A picker turns logits into the next token (`pick`), is told each token the reply takes (`accept`) and
may end the reply (`done`): GreedyPicker takes the argmax; the server's wraps its sampler (penalties,
bias, seeds, constraints, forced tokens: server/worker.py). pick() is a pure function of the logits and
the picker's state, and that is what keeps speculation exact (model/speculative.py): the draft is the
pick the picker would make from the MTP block's logits; the verify step's first logits give the real
pick at the same state, and the draft is kept exactly when the two agree; after a rejection the pick is
made again from the logits of the token run alone, as plain decoding makes it. So a reply, greedy or
sampled under a seed, is token for token plain decoding's (up to the last bits of a 2-token step's
logits, as with the prefill buckets).

After a reply the session holds every token but the last (picked, never run), except when the last was
a kept draft (the verify step ran it): len(session) says which. A forward that fails raises out of the
loop, and the caller drops the session (it may hold a half-processed token); nothing is emitted for it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ..kernels.argmax import argmax

REASONS = ("stop", "length", "cancelled")


class Picked(Protocol):
    """What a picker returns: the token, and whatever else it reports about it (the server's logprobs)."""
    token: int


class Picker(Protocol):
    def pick(self, logits: torch.Tensor, peek: bool = False) -> Picked:
        """The next token from logits [V], changing no state (`peek`: a draft's, its token only is read)."""

    def accept(self, token: int) -> None:
        """`token` is the reply's next."""

    def done(self) -> bool:
        """Nothing may follow the tokens accepted so far (a satisfied structured-output constraint)."""


@dataclass(frozen=True)
class Pick:
    """A pick that reports its token only (GreedyPicker's)."""
    token: int


class GreedyPicker:
    """The argmax, after `forced` tokens (generated first whatever the logits say)."""

    def __init__(self, forced: Sequence[int] = ()):
        self.forced, self.count = tuple(int(t) for t in forced), 0

    def pick(self, logits: torch.Tensor, peek: bool = False) -> Pick:
        return Pick(self.forced[self.count] if self.count < len(self.forced) else argmax(logits))

    def accept(self, token: int) -> None:
        self.count += 1

    def done(self) -> bool:
        return False


@dataclass(frozen=True)
class Token:
    """One token of the reply, emitted once it is decided (and accepted by the picker)."""
    id: int
    index: int          # its place in the reply, from 0
    pick: Picked        # the picker's result (pick.token == id)


@dataclass(frozen=True)
class Forward:
    """Generation.steps() needs `token` (just picked, accepted and emitted) run before it can go on."""
    token: int


@dataclass(frozen=True)
class Finished:
    """The last event of a reply."""
    reason: str                 # "stop": eos, stop(), or the picker is done; "length": max_tokens; "cancelled"
    tokens: tuple[int, ...]     # the reply
    drafted: int                # drafts verified for it (0 without speculation)
    accepted: int               # of those, kept

    def __post_init__(self):
        if self.reason not in REASONS:
            raise ValueError(f"Finished.reason must be one of {REASONS}, got {self.reason!r}")


class Generation:
    """One reply of at most `max_tokens` tokens on `session` (an EngineSession: decode, and draft / verify /
    reject when it speculates), the first picked from `logits` [V] (the last prompt token's; None when the
    picker forces the first token)."""

    def __init__(self, session, logits: torch.Tensor | None, picker: Picker, max_tokens: int,
                 eos: int | None = None, cancelled: Callable[[], bool] | None = None, speculate: bool | None = None):
        """`cancelled()` is asked before each token (reason "cancelled": the client left, the server stops);
        `speculate`: default, whether the session has a drafter (the plan's policy.speculative)."""
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.session, self.picker, self.max_tokens, self.eos = session, picker, max_tokens, eos
        self.cancelled = cancelled
        self.speculate = getattr(session, "drafter", None) is not None if speculate is None else speculate
        self.tokens: list[int] = []
        self.finished: Finished | None = None
        self._logits = logits
        self._started = self._stopping = False
        self._drafts_before = self._drafts()

    def stop(self) -> None:
        """End the reply on the token last emitted (reason "stop"): nothing more is run or picked."""
        self._stopping = True

    @property
    def drafted(self) -> int:
        return self._drafts()[0] - self._drafts_before[0]

    @property
    def accepted(self) -> int:
        return self._drafts()[1] - self._drafts_before[1]

    def __iter__(self) -> Iterator[Token | Finished]:
        """The reply event by event, every forward run here (drafting when the session speculates)."""
        steps = self.steps()
        event = next(steps)
        while True:
            if isinstance(event, Forward):
                event = steps.send(self.forward(event.token))
                continue
            yield event
            if isinstance(event, Finished):
                return
            event = next(steps)

    def steps(self) -> Generator[Token | Finished | Forward, tuple[torch.Tensor, Picked | None] | None, None]:
        """The loop with its forwards left to the caller: it yields Token and Finished events, and Forward(token)
        when the token just picked must run; the caller sends back what `forward(token)` returns (or, running
        several sessions' tokens in one step, (that token's logits [V], None)). __iter__ is this loop driven
        alone; the server's scheduler drives several at once (server/worker.py)."""
        if self._started:
            raise RuntimeError("a Generation runs once: make another for the next reply")
        self._started = True
        logits, self._logits = self._logits, None
        queued = None  # the next token's pick, already decided and run by the step that verified it as a draft
        reason = "length"
        while len(self.tokens) < self.max_tokens:
            if self.cancelled is not None and self.cancelled():
                reason = "cancelled"
                break
            ran = queued is not None  # a kept draft: `logits` are already the ones after it
            pick = queued if ran else self.picker.pick(logits)
            queued = None
            self.picker.accept(pick.token)
            self.tokens.append(pick.token)
            yield Token(pick.token, len(self.tokens) - 1, pick)
            if pick.token == self.eos or self._stopping or self.picker.done():
                reason = "stop"
                break
            if len(self.tokens) == self.max_tokens:
                break
            if not ran:
                logits, queued = yield Forward(pick.token)
        self.finished = Finished(reason, tuple(self.tokens), self.drafted, self.accepted)
        yield self.finished

    def forward(self, token: int) -> tuple[torch.Tensor, Picked | None]:
        """Run `token` (just picked) -> (the logits of the next pick, None); or with a kept draft, (the logits
        after the draft, the draft's pick: the next token, already decided and run)."""
        s = self.session
        last = len(self.tokens) + 1 >= self.max_tokens  # one token left: a draft could not be used
        d_logits = s.draft(token) if self.speculate and not last else None  # None: no streams yet (a restart)
        if d_logits is None:
            return s.decode(token), None
        d = self.picker.pick(d_logits, peek=True).token
        logits = s.verify(token, d)  # [2, V]: token's, the draft's
        pick = self.picker.pick(logits[0])
        if pick.token == d:
            return logits[1], pick
        return s.reject(), None  # picked again from the token's own logits, as plain decoding does

    def _drafts(self) -> tuple[int, int]:
        return getattr(self.session, "drafted", 0), getattr(self.session, "accepted", 0)


def generate(session, logits: torch.Tensor, max_tokens: int, eos: int | None = None,
             picker: Picker | None = None) -> Finished:
    """The whole reply at once (greedy unless `picker` says otherwise): the loop's Finished event."""
    run = Generation(session, logits, picker or GreedyPicker(), max_tokens, eos)
    for _ in run:
        pass
    return run.finished
