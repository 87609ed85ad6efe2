"""An agent session: one growing context with its KV cache, decoded turn by turn.

    session = model.new_session()
    logits = session.prefill(ids)     # [len, V] float32; any length, on top of what is cached
    logits = session.prefill(ids, last_only=True)   # [1, V]: what a reply needs, at any length
    logits = session.decode(tok)      # [V]
    session.truncate(n)               # back to the first n tokens (an agent's context edit)
    other = session.fork()            # independent copy

Truncation. The cache keeps, per token, only compressed rows (CSA/HCA) and indexer keys; the
sliding windows and the compressors' partial windows are constant-size and are overwritten as the
context grows, so they cannot be rewound. Instead the session takes a snapshot of that
constant-size state at the end of every prefill call (a turn boundary) and at every truncation
point; `truncate(n)` drops the compressed rows past the nearest snapshot at or before n, restores it
and re-prefills the tokens from there to n. Cost: a re-prefill of (n - snapshot position) tokens,
i.e. zero when n is a turn boundary and at most the tokens since the last prefill call (typically
the decoded reply plus that turn's input) otherwise; nothing when n equals the length. Memory per
snapshot: the windows (W-1 rows per layer) and partial compressor windows (< m rows each), about
16 MB for V4-Flash in bf16, independent of the context length; `max_snapshots` bounds the count.

Fork clones the growing rows (O(context) memory) and shares the immutable snapshots.
"""

from __future__ import annotations

import torch

from .kv_cache import CacheSnapshot, KvCache


class Session:
    def __init__(self, model, cache: KvCache | None = None, tokens: list[int] | None = None,
                 snapshots: list[CacheSnapshot] | None = None, max_snapshots: int = 256):
        self.model = model
        self.cache = cache if cache is not None else model.new_cache()
        self.tokens: list[int] = tokens if tokens is not None else []
        self.snapshots: list[CacheSnapshot] = snapshots if snapshots is not None else []
        self.max_snapshots = max_snapshots

    def __len__(self) -> int:
        return len(self.tokens)

    def prefill(self, token_ids, last_only: bool = False, on_chunk=None) -> torch.Tensor:
        """token_ids: 1-D ints -> logits [len, V] float32 ([1, V], the last token's, with last_only).
        Long inputs run in chunks of model.prefill_chunk. on_chunk(ids [t], streams [t, N, D]): called
        with each chunk's last-layer residual streams (the MTP block follows the prompt, speculative.py)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1).to(self.model.device)  # [T]
        chunk, n = self.model.prefill_chunk, ids.shape[0]
        out = []
        for s in range(0, n, chunk):
            if on_chunk is None:
                out.append(self.model.forward(ids[s:s + chunk], self.cache, last_only))
                continue
            logits, streams = self.model.forward(ids[s:s + chunk], self.cache, last_only, with_streams=True)
            on_chunk(ids[s:s + chunk], streams)
            out.append(logits)
        if last_only:
            out = out[-1:]
        self.tokens.extend(ids.tolist())
        self.snapshot()
        if not out:
            return torch.zeros(0, self.model.config.vocab_size)
        return torch.cat(out)  # [T, V] or [1, V]

    def decode(self, token_id) -> torch.Tensor:
        """One token -> its logits [V] float32."""
        ids = torch.as_tensor(token_id, dtype=torch.long).reshape(1).to(self.model.device)  # [1]
        logits = self.model.forward(ids, self.cache)[0]  # [V]
        self.tokens.append(int(ids[0]))
        return logits

    def extend(self, token_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step of any width (no snapshot): tokens [T] -> (logits [T, V], residual streams
        [T, N, D]); speculative.py's verify step."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1).to(self.model.device)  # [T]
        logits, streams = self.model.forward(ids, self.cache, with_streams=True)
        self.tokens.extend(ids.tolist())
        return logits, streams

    def mark(self) -> tuple[CacheSnapshot, int]:
        """The state now, for back_to(): the cache's snapshot (references, cheap) and the token count."""
        return self.cache.snapshot(), len(self.tokens)

    def back_to(self, mark: tuple[CacheSnapshot, int]) -> None:
        """Exactly the state of mark(): windows, compressor and indexer states, rows and tokens after it
        dropped. Only back to a mark taken since the last truncate() (rows below it are never rewritten)."""
        snapshot, n = mark
        self.cache.restore(snapshot)
        self.snapshots = [s for s in self.snapshots if s.position <= snapshot.position]
        del self.tokens[n:]

    def snapshot(self) -> None:
        """Remember the cache state at the current length (a point truncate() can return to cheaply)."""
        if self.snapshots and self.snapshots[-1].position == self.cache.position:
            return
        self.snapshots.append(self.cache.snapshot())
        if len(self.snapshots) > self.max_snapshots:
            del self.snapshots[0]

    def rewind_point(self, n: int) -> int:
        """The longest prefix of at most n tokens that truncate() keeps without re-prefilling anything: n
        itself when nothing is cut, else the nearest snapshot at or before n (0 when there is none)."""
        if n >= len(self.tokens):
            return len(self.tokens)
        return max((s.position for s in self.snapshots if s.position <= n), default=0)

    def truncate(self, n: int) -> None:
        """Keep the first n tokens: restore the nearest snapshot at or before n, re-prefill the rest."""
        if not 0 <= n <= len(self.tokens):
            raise ValueError(f"truncate({n}): the session holds {len(self.tokens)} tokens")
        if n == len(self.tokens):
            return
        self.snapshots = [s for s in self.snapshots if s.position <= n]
        if self.snapshots:
            self.cache.restore(self.snapshots[-1])
        else:
            self.cache = self.model.new_cache()
        start = self.cache.position
        tail, self.tokens = self.tokens[start:n], self.tokens[:start]
        if tail:
            self.prefill(tail)

    def fork(self) -> Session:
        return Session(self.model, self.cache.clone(), list(self.tokens), list(self.snapshots), self.max_snapshots)
