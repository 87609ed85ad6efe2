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
        E = self.cdf.shape[1]
        out = np.empty((n, self.k), dtype=np.int64)
        todo = np.arange(n)
        m = 3 * self.k
        while todo.size:
            cand = np.searchsorted(self.cdf[layer], self.rng.random((todo.size, m)), side="right")  # [T, m]
            cand = np.minimum(cand, E - 1)
            dup = _drawn_before(cand, E)                                        # [T, m] drawn before by the token
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
        if n <= EXACT_MAX:
            return counts_of(self.ids(n), self.shares.shape[1])
        return self.rng.multinomial(n * self.k, self.route_p)   # one draw per layer, in layer order

    def counts_of_pieces(self, sizes: list[int]) -> list[np.ndarray]:
        """[L, E] counts() of consecutive forward passes of `sizes` tokens, the same numbers in the same order as
        one counts() call each: the long ones in a row are drawn by one multinomial call over [pieces, L] (numpy
        draws its rows in C order, piece after piece and layer after layer, as the calls one by one would), which
        saves a Python call per piece and layer (a re-prefilled context is hundreds of pieces a turn)."""
        out: list[np.ndarray] = []
        i = 0
        while i < len(sizes):
            j = i
            while j < len(sizes) and sizes[j] > EXACT_MAX:
                j += 1
            if j == i:
                out.append(self.counts(sizes[i]))
                i += 1
                continue
            n = np.asarray(sizes[i:j], dtype=np.int64)[:, None] * self.k   # [P, 1]
            out.extend(self.rng.multinomial(n, self.route_p))           # [P, L, E]
            i = j
        return out


def _drawn_before(cand: np.ndarray, n_experts: int) -> np.ndarray:
    """[T, m] bool: whether cand[t, j] (ids [T, m]) is among cand[t, :j]: each token's first draw of each id written
    last to first, then every draw compared with its id's first (m scatters over [T, E], not [T, m, m] pairs)."""
    T, m = cand.shape
    rows = np.arange(T)
    first = np.full((T, n_experts), m, dtype=np.int64)   # [T, E]
    for j in range(m - 1, -1, -1):
        first[rows, cand[:, j]] = j
    return first[rows[:, None], cand] < np.arange(m)[None, :]


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


# ---- session drift (issue #31) -----------------------------------------------------------------------------
# Published routing of DeepSeek-V4-Flash (plans/published, PUBLISHED.md: colibri issues 864 and 175): the hot sets
# of five topics, the top 500 (layer, expert) pairs of each, overlap with a median Jaccard of 0.08.
PUBLISHED_JACCARD = 0.08
HOT_SET_PAIRS = 500
JACCARD_TOPICS = 5


def session_shares(shares: np.ndarray, weight: float, rng: np.random.Generator) -> np.ndarray:
    """[L, E] one session's routing law: (1 - weight) * the profile's shares + weight * a session-specific law,
    the profile's own popularity curve dealt to the experts anew in every layer (a random permutation per
    layer: a topic with a hot set of its own, as steep as the profile's). weight 0: the profile."""
    s = shares / shares.sum(axis=1, keepdims=True)
    if weight == 0:
        return s
    own = np.stack([rng.permutation(row) for row in s])
    return (1.0 - weight) * s + weight * own


def hot_set(shares: np.ndarray, pairs: int = HOT_SET_PAIRS) -> np.ndarray:
    """Flat (layer * E + expert) ids of a law's hot set of about `pairs` (layer, expert) pairs: each layer's
    round(pairs / L) most-routed experts (per layer, since the synthetic profile's layers share one popularity
    curve, so a top-`pairs` over all layers at once would be decided by ties)."""
    L, E = shares.shape
    n = max(1, round(pairs / L))
    top = np.argsort(-shares, axis=1, kind="stable")[:, :n]
    return (top + np.arange(L)[:, None] * E).ravel()


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    inter = np.intersect1d(a, b).size
    return inter / (a.size + b.size - inter)


def median_jaccard(shares: np.ndarray, weight: float, seed: int = 0, draws: int = 8,
                   topics: int = JACCARD_TOPICS) -> float:
    """The published measure on drawn sessions: the median Jaccard of the hot sets of `topics` sessions' laws,
    averaged over `draws` draws (of the laws themselves: no sampling noise)."""
    out = []
    for d in range(draws):
        rng = np.random.default_rng((seed, d))
        sets = [hot_set(session_shares(shares, weight, rng)) for _ in range(topics)]
        out.append(float(np.median([jaccard(sets[i], sets[j]) for i in range(topics) for j in range(i + 1, topics)])))
    return float(np.mean(out))


def calibrate_drift(shares: np.ndarray, target: float = PUBLISHED_JACCARD, seed: int = 0, steps: int = 16) -> float:
    """The mixing weight whose sessions' hot sets overlap as published (median_jaccard = target), by bisection:
    the overlap falls as the weight grows (from 1 at weight 0 to chance at weight 1)."""
    lo, hi = 0.0, 1.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        if median_jaccard(shares, mid, seed) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


class DriftSampler:
    """Per-session routing traces: session i is routed by session_shares(profile, weight) drawn from (seed, i).
    weight 0 is no drift: every session shares one sampler, the traces of a TraceSampler(shares, top_k, seed)."""

    def __init__(self, shares: np.ndarray, top_k: int, weight: float, seed: int = 0):
        self.base = TraceSampler(shares, top_k, seed)
        self.weight, self.seed = weight, seed

    def for_session(self, index: int) -> TraceSampler:
        if self.weight == 0:
            return self.base
        law = session_shares(self.base.shares, self.weight, np.random.default_rng((self.seed, 31, index)))
        return TraceSampler(law, self.base.k, seed=(self.seed, 31, index))

    def fork(self, stream: int) -> TraceSampler:
        return self.base.fork(stream)
