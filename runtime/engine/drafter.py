"""The MTP block's side of an engine session: it follows everything the main model runs and drafts the
token after the pending one (model/mtp.py; the speculative step itself is engine/session.py's).

Pair t is (the main model's last-layer streams at position t, token t+1), run by the MTP block at
position t; its logits draft token t+2. The drafter keeps the streams the main model produced that no
pair has used yet, with their tokens (`unrun`: positions next .. next+u-1, where next + u is the main
session's length), and runs them as soon as the token after each is known: a prefill's pairs chunk by
chunk (bounded memory), a decode's when the next pending token is drafted from (one MTP forward for
the backlog and the new pair together).

With the engine's fixed-shape steps (a StepRunner) a draft of 1 or 2 pairs (every decode-time draft)
runs as the MTP block's static step, on buffers lent to this drafter until a dynamic forward, a fork or
a restart needs its cache back (`_release`).

Rejected drafts never reach the MTP cache: a draft is the output of the last pair, and the verify
step's streams are dropped by `cut()` when the session goes back. Anything else that cuts the session
below what the MTP block has run (truncate, a fork, a session read from a file) restarts the drafter on
an empty cache at that point. Its positions then count from there: attention only sees relative
positions (rope), so this is the block on a shorter context, and it only changes how good the drafts
are: every emitted token is the main model's own pick whatever the drafts are.

Legend: t tokens, N hc_mult streams, D hidden, V vocab.
"""

from __future__ import annotations

import torch

from ..model.mtp import mtp_logits


class MtpDrafter:
    def __init__(self, model, executor, position: int = 0, runner=None, chunk: int | None = None):
        """A drafter for a session of `position` tokens whose streams it has not seen (0: a new session).
        `runner`: the engine's StepRunner, whose fixed-shape MTP steps run the drafts (else the dynamic block)."""
        self.model, self.executor, self.runner = model, executor, runner
        self.chunk = chunk or model.prefill_chunk  # pairs per MTP forward while following a prefill
        self.restart(position)

    def restart(self, position: int) -> None:
        """An empty MTP cache at `position` (the first pair it runs is at that position)."""
        self._release(keep=False)
        self.cache = self.model.new_mtp_cache()
        self.origin = self.next = position  # `origin`: where this cache's positions start
        self.streams = torch.zeros(0, self.model.config.hc_mult, self.model.config.hidden_size)  # [u, N, D]
        self.ids: list[int] = []  # [u]: the token at each unrun position

    @property
    def end(self) -> int:
        """The main session's length as the drafter has followed it."""
        return self.next + len(self.ids)

    def ran(self, ids, streams: torch.Tensor) -> None:
        """The main model ran tokens `ids` [t] (at positions end .. end+t-1) with last-layer streams [t, N, D]."""
        self.streams = torch.cat((self.streams.to(streams.device), streams))
        self.ids.extend(int(i) for i in torch.as_tensor(ids).reshape(-1))

    def catch_up(self) -> None:
        """Run every pair whose next token is known (all unrun positions but the last), in chunks: what a
        prefill does after each chunk, so the backlog stays small."""
        while len(self.ids) > 1:
            n = min(self.chunk, len(self.ids) - 1)
            self._run(n, torch.tensor(self.ids[1:n + 1]), "split")

    def draft(self, pending: int) -> torch.Tensor | None:
        """The MTP block's logits [V] for the token after `pending` (the token at position end, decided, not
        run yet); None when the streams before it are not known (a new or restarted drafter)."""
        if not self.ids:
            return None
        if self.runner is not None and len(self.ids) <= 2:  # the fixed-shape steps: 1 or 2 pairs
            logits = self.runner.draft(self, self.streams, torch.tensor(self.ids[1:] + [pending]))
            self.next += len(self.ids)
            self.streams, self.ids = self.streams[:0], []
            return logits
        self.catch_up()
        return self._run(1, torch.tensor([pending]), "decode")

    def cut(self, n: int) -> None:
        """The main session now holds its first n tokens: forget the streams past n, or restart at n when
        the MTP block already ran pairs past it."""
        if n >= self.end:
            return
        if n < self.next:
            self.restart(n)
            return
        keep = n - self.next
        self.streams, self.ids = self.streams[:keep], self.ids[:keep]

    def fork(self) -> MtpDrafter:
        """An independent copy (a forked session's)."""
        self._release()
        other = MtpDrafter.__new__(MtpDrafter)
        other.model, other.executor, other.runner, other.chunk = self.model, self.executor, self.runner, self.chunk
        other.cache, other.origin, other.next = self.cache.clone(), self.origin, self.next
        other.streams, other.ids = self.streams.clone(), list(self.ids)
        return other

    def _release(self, keep: bool = True) -> None:
        """The MTP cache back from the runner's buffers (dropped with keep=False), before it is read or replaced."""
        if self.runner is not None:
            self.runner.release_drafter(self, keep)

    def _run(self, n: int, next_ids: torch.Tensor, mode: str) -> torch.Tensor:
        """The first n unrun pairs, with their next tokens [n] -> the last pair's draft logits [V]."""
        self._release()
        self.executor.set_mode(mode)
        logits = mtp_logits(self.model, self.streams[:n], next_ids, self.next - self.origin, self.cache)[0]
        self.streams, self.ids = self.streams[n:], self.ids[n:]
        self.next += n
        return logits
