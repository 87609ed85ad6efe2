"""Greedy generation on an engine session, speculative when the session drafts (engine/session.py):
what ostinato-run's prompt and replay decode with. The server's worker does the same through its
sampler (server/worker.py)."""

from __future__ import annotations

from ..kernels.argmax import argmax


def greedy_tokens(session, first: int, n: int, eos: int | None = None) -> list[int]:
    """[first, ...]: n greedy tokens (fewer when eos comes), `first` picked and not run yet; the last one is
    not run either, except when it was a kept draft (a verify step ran it)."""
    gen = [int(first)]
    while len(gen) < n and gen[-1] != eos:
        d_logits = session.draft(gen[-1]) if len(gen) + 1 < n else None  # one token left: no draft to use
        if d_logits is None:
            gen.append(argmax(session.decode(gen[-1])))
            continue
        d = argmax(d_logits)
        logits = session.verify(gen[-1], d)  # [2, V]
        if argmax(logits[0]) != d:
            gen.append(argmax(session.reject()))
            continue
        gen.append(d)
        if d != eos and len(gen) < n:
            gen.append(argmax(logits[1]))
    return gen
