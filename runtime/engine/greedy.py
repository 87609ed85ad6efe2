"""Greedy tokens after one already picked: the generation loop (generation.py) with the argmax, speculative
when the session drafts. What ostinato-run's replay decodes a turn with (engine/replay.py)."""

from __future__ import annotations

from .generation import Generation, GreedyPicker


def greedy_tokens(session, first: int, n: int, eos: int | None = None) -> list[int]:
    """[first, ...]: n greedy tokens (at least `first`; fewer when eos comes), `first` picked and not run yet;
    the last one is not run either, except when it was a kept draft (a verify step ran it)."""
    run = Generation(session, None, GreedyPicker(forced=[first]), max(n, 1), eos)
    for _ in run:
        pass
    return list(run.finished.tokens)
