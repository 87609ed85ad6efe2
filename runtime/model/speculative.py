"""Speculative decoding with the MTP block (mtp.py), exact: the MTP block drafts the next token, the
main model verifies it and the token before it in one two-token forward.

    spec = SpeculativeDecoder(model.new_session())
    logits = spec.prefill(prompt_ids)            # the main model's prefill; the MTP block follows it
    tokens = spec.start(logits)                  # [the first token]
    while ...: tokens = spec.step()              # 1 or 2 tokens per step, in order

Between steps (P = tokens the session holds): `pending` is the token at position P (decided, not yet
run); `hidden` the main model's residual streams at P-1; the MTP cache holds the pairs of positions
< P-1 but the `backlog` (a pair accepted but not yet run; it runs with the next draft, one call).

A step: the MTP block runs the backlog and the pair (hidden, pending) at P-1 and drafts d for P+1;
the main model runs [pending, d] at P, P+1. Its pick y for P+1 (from the logits of P):
  - y == d: both stand. Emitted: pending, d; next pending: the pick from the logits of P+1.
  - y != d: the session goes back to its mark before the verify (session.back_to: windows, compressor
    and indexer states, rows, tokens exactly as they were) and pending runs alone, as a plain decode
    step would run it; the cache is then the one plain decoding builds, tensor for tensor. Emitted:
    pending; next pending: the pick from that step's logits.
Every emitted token is therefore the main model's own pick from its own logits: greedy output is the
plain greedy output whatever the drafts are (only what the verify step computes in one forward of two
tokens may differ from two one-token steps in the last bits, as the bucket steps may). The MTP cache
never needs undoing at depth 1: a rejected draft never enters it.

`draft(position, mtp_logits) -> token` replaces the MTP block's greedy pick (tests force acceptance with
the known continuation and rejection with a wrong token); `pick(logits) -> token` is the main model's
(greedy by default). `drafted` and `accepted` count drafts.

Sampling (`sampling=Sampled(temperature, seed)`): the standard rule that keeps the target distribution
(Leviathan et al. 2023, Chen et al. 2023). The draft d is drawn from q (the MTP block's distribution)
and kept with probability min(1, p(d) / q(d)), p the main model's distribution from the verify step;
a rejected draft is replaced by a draw from max(0, p - q), normalized. Whatever q is, the kept or
replacing token is distributed as p (`accept_or_resample`); one CPU generator, seeded, draws everything,
so a seed repeats the reply. On a rejection the session is rolled back as in greedy decoding and the
verify step's p has already chosen the replacement.

Legend: N hc_mult streams, D hidden, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..kernels.argmax import argmax
from .mtp import mtp_logits


class Sampled:
    """Temperature sampling for speculative decoding: distributions and draws from one seeded generator."""

    def __init__(self, temperature: float, seed: int):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling (greedy is the default), got {temperature}")
        self.temperature = temperature
        self.generator = torch.Generator().manual_seed(seed)  # on the CPU: the same draws on any device

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[V] logits -> [V] float64 probabilities on the CPU."""
        return torch.softmax(logits.reshape(-1).double().cpu() / self.temperature, dim=-1)

    def draw(self, p: torch.Tensor) -> int:
        return int(torch.multinomial(p, 1, generator=self.generator))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator, dtype=torch.float64))


def accept_or_resample(p: torch.Tensor, q: torch.Tensor, d: int, sampling: Sampled) -> tuple[int, bool]:
    """The token for a position whose draft d came from q, given the target p ([V] float64 each): (d, True)
    with probability min(1, p[d] / q[d]), else (a draw from max(0, p - q) normalized, False). The result
    is distributed as p whatever q is."""
    if q[d] > 0 and sampling.uniform() < min(1.0, float(p[d] / q[d])):
        return d, True
    residual = (p - q).clamp_(min=0)
    total = float(residual.sum())
    return sampling.draw(residual / total if total > 0 else p), False


class SpeculativeDecoder:
    def __init__(self, session, pick: Callable[[torch.Tensor], int] = argmax,
                 draft: Callable[[int, torch.Tensor], int] | None = None, sampling: Sampled | None = None):
        model = session.model
        if not model.weights.mtp:
            raise ValueError("speculative decoding needs the checkpoint's MTP block (mtp.0.*): load the model "
                             "with load_model(..., mtp=True)")
        self.session, self.model, self.sampling = session, model, sampling
        self.pick = pick if sampling is None else (lambda logits: sampling.draw(sampling.probs(logits)))
        self.draws_from_mtp = draft is None  # else a given draft is certain: its q is a point mass
        if draft is None:
            draft = (lambda position, logits: argmax(logits)) if sampling is None else \
                (lambda position, logits: sampling.draw(sampling.probs(logits)))
        self.draft = draft
        self.mtp_cache = model.new_mtp_cache()
        self.mtp_next = 0               # the position of the next pair the MTP block runs
        self.backlog: list[tuple[torch.Tensor, int]] = []  # (streams [1, N, D], next token) not yet run
        self.hidden: torch.Tensor | None = None  # [1, N, D]: streams at P-1
        self.pending: int | None = None
        self.drafted = self.accepted = 0

    # -- the prompt ---------------------------------------------------------------------------------------
    def prefill(self, token_ids) -> torch.Tensor:
        """The session's prefill ([1, V] logits of the last token); the MTP block runs the prompt's pairs
        chunk by chunk, so its cache covers every position but the last (whose next token is not known).
        One prompt per decoder, on a fresh session: continuing a session across turns (the MTP cache in its
        snapshots, truncation and session files) is not built yet."""
        if len(self.session) or self.pending is not None:
            raise ValueError("SpeculativeDecoder.prefill() needs a fresh session (one prompt per decoder)")
        return self.session.prefill(token_ids, last_only=True, on_chunk=self._follow)

    def _follow(self, ids: torch.Tensor, streams: torch.Tensor) -> None:
        """A prefill chunk: run the pairs it completes (the previous chunk's last streams with its first
        token, then its own streams with the tokens after them); keep its last streams."""
        pairs_streams = streams[:-1] if self.hidden is None else torch.cat((self.hidden, streams[:-1]))
        pairs_next = ids[1:] if self.hidden is None else ids
        if pairs_next.numel():
            mtp_logits(self.model, pairs_streams, pairs_next, self.mtp_next, self.mtp_cache)
            self.mtp_next += pairs_next.numel()
        self.hidden = streams[-1:]

    # -- generation -----------------------------------------------------------------------------------------
    def start(self, logits: torch.Tensor) -> list[int]:
        """The first token, picked from the prefill's logits (it runs in the first step)."""
        self.pending = self.pick(logits)
        return [self.pending]

    def step(self) -> list[int]:
        """Run the pending token (and a draft): the tokens now decided after the ones returned so far, 1 or 2."""
        s, p = self.session, len(self.session)
        pairs = self.backlog + [(self.hidden, self.pending)]
        mtp = mtp_logits(self.model, torch.cat([h for h, _ in pairs]), torch.tensor([t for _, t in pairs]),
                         self.mtp_next, self.mtp_cache)[0]  # [V]: the draft for position P+1
        self.mtp_next += len(pairs)
        self.backlog = []
        d = self.draft(p + 1, mtp)
        self.drafted += 1
        mark = s.mark()
        logits, streams = s.extend([self.pending, d])  # [2, V], [2, N, D]
        if self.sampling is None:
            y = self.pick(logits[0])
            kept = y == d
        else:
            sp = self.sampling
            q = sp.probs(mtp) if self.draws_from_mtp else torch.nn.functional.one_hot(
                torch.tensor(d), mtp.shape[-1]).double()
            y, kept = accept_or_resample(sp.probs(logits[0]), q, d, sp)
        if kept:
            self.accepted += 1
            self.backlog = [(streams[:1], d)]  # pair P: streams of P, token P+1
            self.hidden, self.pending = streams[1:], self.pick(logits[1])
            return [d, self.pending]
        s.back_to(mark)  # the draft never happened
        logits, streams = s.extend([self.pending])
        # greedy: the pick of this one-token step, as plain decoding makes it; sampled: the replacement drawn
        self.hidden, self.pending = streams, self.pick(logits[0]) if self.sampling is None else y
        return [self.pending]
