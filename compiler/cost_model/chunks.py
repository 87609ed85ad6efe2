"""A prompt as the runtime prefills it: forwards of the plan's prefill chunk, each at its own position.

runtime/model/session.py runs a prompt longer than the model's prefill_chunk (the plan's policy.prefill_chunk) as
one forward per chunk, the last one shorter, each after the chunks before it; runtime/engine/session.py chooses the
mode once for the whole prompt (prefill_mode of its n tokens) and runs every chunk in it. So a prompt of n tokens
in a mode costs the sum of that mode's forwards over its chunks: each forward uploads its own distinct cold
experts, its exchange carries its own tokens, its attention reads the rows visible at its own end. The forwards
themselves are layers.py's and sharded.py's (split_forward, upload_forward, sharded_forward).
"""

from __future__ import annotations

from collections.abc import Callable


class PromptChunks:
    """CostModel's prompts as chunk forwards (it sets prefill_chunk and context; `at` is attention by position's)."""

    def prefill_chunks(self, n: int, position: int | None = None) -> list[tuple[int, int | None]]:
        """(tokens, position) of each forward a prompt of n tokens after `position` runs as: (n, position) itself
        when it fits one chunk, else prefill_chunk tokens a forward from the prompt's start (`at`), the last one
        shorter."""
        if n <= self.prefill_chunk:
            return [(n, position)]
        start = self.at(n, position)
        return [(min(self.prefill_chunk, n - s), start + s) for s in range(0, n, self.prefill_chunk)]

    def chunked(self, forward: Callable[[int, int | None], float], n: int, position: int | None = None) -> float:
        """A prompt of n tokens after `position`: `forward` (a mode's one forward of t tokens at a position) over
        its chunks, one after another."""
        return float(sum(forward(t, at) for t, at in self.prefill_chunks(n, position)))

    def longest_prompt(self, position: int | None = None) -> int:
        """The most tokens a prompt after `position` may have: the plan's context less the tokens already in the
        session (the runtime refuses a longer one, engine/session.py ContextFull); None: the whole context."""
        return max(1, self.context - (0 if position is None else position))
