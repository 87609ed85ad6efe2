"""Routing traces: which experts each forward pass routes to, per layer.

A trace is sampled from per-layer expert shares (a profile's route counts, normalized): each token
picks top_k distinct experts, drawn one after another with probability proportional to the share
among those not yet picked (sampling without replacement, the way a top-k over noisy gate scores
picks a set). Draws are seeded, so every policy of one run sees the same routing.
Legend: T tokens, L layers, E experts, k routes per token.
"""

from __future__ import annotations

import numpy as np

EXACT_MAX = 256   # batches up to this many tokens are drawn token by token; longer ones by route counts


class TraceSampler:
    def __init__(self, shares: np.ndarray, top_k: int, seed: int | tuple = 0):
        self.seed = seed
        self.shares = shares / shares.sum(axis=1, keepdims=True)       # [L, E]
        self.cdf = np.cumsum(self.shares, axis=1)                        # [L, E]
        self.cdf[:, -1] = 1.0
        self.k = top_k
        self.rng = np.random.default_rng(seed)
        # per-route marginal of the without-replacement draw, for long batches (see counts())
        q = np.minimum(1.0, top_k * self.shares)
        self.route_p = q / q.sum(axis=1, keepdims=True)

    def fork(self, stream: int) -> TraceSampler:
        """A sampler of the same routing law on its own random stream (seeded from this one's seed)."""
        return TraceSampler(self.shares, self.k, seed=(self.seed, stream))

    @property
    def shape(self) -> tuple[int, int]:
        return self.shares.shape

    def ids(self, n: int) -> np.ndarray:
        """[T, L, k] expert ids of n tokens, k distinct per token and layer."""
        L, E = self.shares.shape
        out = np.empty((n, L, self.k), dtype=np.int64)
        for layer in range(L):
            out[:, layer] = self._draw(layer, n)
        return out

    def _draw(self, layer: int, n: int) -> np.ndarray:
        """[T, k]: successive draws with replacement, keeping each token's first k distinct ids (the
        same law as drawing without replacement); tokens short of k distinct draw again."""
        out = np.empty((n, self.k), dtype=np.int64)
        todo = np.arange(n)
        m = 3 * self.k
        earlier = np.tri(m, m, -1, dtype=bool)                                  # [m, m]: [j, i] = i < j
        while todo.size:
            cand = np.searchsorted(self.cdf[layer], self.rng.random((todo.size, m)), side="right")  # [T, m]
            cand = np.minimum(cand, self.cdf.shape[1] - 1)
            dup = ((cand[:, :, None] == cand[:, None, :]) & earlier).any(axis=2)    # drawn before by the token
            rank = np.cumsum(~dup, axis=1)                                   # [T, m]
            keep = ~dup & (rank <= self.k)
            ok = rank[:, -1] >= self.k
            out[todo[ok]] = cand[ok][keep[ok]].reshape(-1, self.k)
            todo = todo[~ok]
        return out

    def counts(self, n: int) -> np.ndarray:
        """[L, E] routes per expert of one n-token forward pass. Up to EXACT_MAX tokens exactly from ids();
        longer batches as a multinomial of n*k routes over the per-route marginal (the per-token
        distinctness barely changes the counts of a long batch, and drawing it token by token is slow)."""
        L, E = self.shares.shape
        if n <= EXACT_MAX:
            return counts_of(self.ids(n), E)
        return np.stack([self.rng.multinomial(n * self.k, self.route_p[l]) for l in range(L)])


def counts_of(ids: np.ndarray, n_experts: int) -> np.ndarray:
    """[T, L, k] ids -> [L, E] routes per expert."""
    T, L, k = ids.shape
    flat = (ids + np.arange(L)[None, :, None] * n_experts).reshape(-1)
    return np.bincount(flat, minlength=L * n_experts).reshape(L, n_experts)


def at_coverage(shares: np.ndarray, hot: np.ndarray, coverage: float) -> np.ndarray:
    """Shares rescaled so that the hot experts of each layer get `coverage` of its routes, keeping the
    relative popularity inside the hot and inside the cold set (synthetic traces at a given coverage)."""
    s = shares / shares.sum(axis=1, keepdims=True)
    h = np.where(hot, s, 0.0)
    c = np.where(hot, 0.0, s)
    hs, cs = h.sum(axis=1, keepdims=True), c.sum(axis=1, keepdims=True)
    return (coverage * h / np.where(hs > 0, hs, 1.0) + (1.0 - coverage) * c / np.where(cs > 0, cs, 1.0))
