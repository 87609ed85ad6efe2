"""Exactness at long positions: past 65,536 (V4-Flash's YaRN original length) and past 100k, against a
float64 re-derivation of the model (tests/float64_reference.py) rather than transformers, whose full
forward over 100k tokens is O(n^2) and out of reach here.

Models are built in memory with V4-Flash's own rope settings (tests/long_context_model.py: rope_theta
10000, compress_rope_theta 160000, YaRN factor 16 from 65,536, max 1,048,576) and small dimensions.
What each part checks and how it stays affordable:
- rope: the frequency tables against DeepSeek's YaRN formula in float64, and cos/sin at positions up to
  1,048,575 against float64 within the float32 angle's own rounding (fast);
- compressors and indexer as modules over 100k+ positions (fast): CSA and HCA compressors fed 100k
  positions in uneven chunks, their rows sampled (the first, around 65,536, every 97th, the last), and
  the indexer's picks for queries past 100k, with planted entries at the edge of visibility;
- one attention layer of each kind run over 100k+ positions (slow): every compressed row and index key,
  and the outputs of the last chunk's queries and decode steps (each query's float64 output needs only
  the keys it attends to). The CSA prefix runs with the indexer's top-k replaced by "no pick": the
  prefix's outputs are thrown away and the cache updates never read the picks, while scoring every
  entry for every prefix query is the O(n^2) part;
- a whole model's session over 100k+ positions (slow; runtime/model/session.py, which the engine's
  sessions and the server's prefix cache and speculative reject run on): turn-boundary
  snapshots, truncation (to a snapshot, between snapshots, before 65,536), mark / back_to (speculative
  reject), a session file round trip, each then continued and compared in float64. Its compressing layer
  is layer 0 (HCA), whose input depends on the token alone, so its float64 rows cost O(L); the sliding
  layer after it needs only its window.

Tolerances sit about 10x above the float32 rounding observed (the reasons are at each constant). Each
test was checked to fail under a deliberate bug of the kind it guards against (a wrong YaRN factor or
original length, positions off by one everywhere or only past 65,536, entries roped one position off past
65,536, an entry visible one token early, a restore that keeps the rows past the snapshot).
"""

from __future__ import annotations

import math

import pytest
import torch
from float64_reference import F64, Reference, compressed_entries, plain_inv_freq, projections, yarn_inv_freq
from long_context_model import build_model, flash_config, long_context_config
from test_model_session import TokenCounter

from ostinato.runtime.model import attention as attention_module
from ostinato.runtime.model.attention import attention
from ostinato.runtime.model.compressor import CompressorState, CompressorWeights, compress
from ostinato.runtime.model.indexer import select
from ostinato.runtime.model.rope import rope_tables
from ostinato.runtime.model.session_file import read_session, write_session

YARN_ORIGINAL = 65_536
# float32 frequency tables vs float64: base ** (2i/R), a reciprocal and the ramp's blend, each rounded to
# float32 (2^-24 relative): observed 1.6e-7 relative, bound at ~5 roundings.
FREQ_RTOL = 3e-7
# compressed rows (rms-normed, so O(1) values) float32 vs float64: projections over D terms, a softmax
# over 8 or 128 slots, the norm, rope with float32 cos/sin: observed <= 3.2e-6 (25,000 rows).
ROW_ATOL = 3e-5
# outputs and logits, relative to the reference's largest magnitude: observed <= 5.5e-7 (attention over
# the window plus up to 800 entries, the MoE and the head in float32). A position off by one moves a
# rope angle by up to 1 radian, far beyond this.
OUT_RTOL = 5e-6


def assert_close(ours: torch.Tensor, ref: torch.Tensor, rtol: float, what: str) -> None:
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    scale = ref.abs().max().item()
    diff = (ours.to(F64) - ref).abs().max().item()
    assert diff <= rtol * scale, f"{what}: max |diff| {diff:.3g} > {rtol} x scale {scale:.3g}"


def chunk_sizes(total: int, pattern=(1, 3, 4, 124, 4099, 5000)) -> list[int]:
    """Uneven chunks summing to `total`: they cross CSA (4) and HCA (128) windows at every offset."""
    sizes, done, i = [], 0, 0
    while done < total:
        sizes.append(min(pattern[i % len(pattern)], total - done))
        done += sizes[-1]
        i += 1
    return sizes


# ----- rope past 65,536 ---------------------------------------------------------------------------
def test_rope_tables_are_v4_flash_yarn_in_float64():
    """The compress table is DeepSeek's YaRN (factor 16 from 65,536, beta 32/1, base 160000) and the
    sliding table plain base 10000, each within float32 rounding of the float64 formula."""
    cfg = long_context_config([0, 4, 128])
    rs = flash_config()["rope_scaling"]
    assert (rs["factor"], rs["original_max_position_embeddings"]) == (16, YARN_ORIGINAL)
    assert cfg.max_position_embeddings == 1_048_576 and cfg.qk_rope_head_dim == 64
    tables = rope_tables(cfg)
    want = {"compress": yarn_inv_freq(160000.0, 64, 16.0, YARN_ORIGINAL, 32.0, 1.0),
            "main": plain_inv_freq(10000.0, 64)}
    for name, ref in want.items():
        got = tables[name].inv_freq.to(F64)
        rel = ((got - ref).abs() / ref).max().item()
        assert rel <= FREQ_RTOL, f"{name} rope frequencies: relative error {rel:.3g} > {FREQ_RTOL}"
    # YaRN's three bands at V4-Flash's values: pairs 0-14 keep base^(-2i/64), 25-31 are divided by 16
    plain = plain_inv_freq(160000.0, 64)
    ratio = plain / tables["compress"].inv_freq.to(F64)
    assert torch.allclose(ratio[:15], torch.ones(15, dtype=F64), rtol=FREQ_RTOL)
    assert torch.allclose(ratio[25:], torch.full((7,), 16.0, dtype=F64), rtol=FREQ_RTOL)
    assert ((ratio[15:25] > 1) & (ratio[15:25] < 16)).all()


@pytest.mark.parametrize("table", ["compress", "main"])
def test_cos_sin_past_65536_within_float32_angle_rounding(table):
    """cos/sin at positions around and far past 65,536, up to the last of 1,048,576, against float64
    cos/sin of pos * theta (float64 theta). The float32 angle fl32(pos * theta32) is what the model (and
    transformers, and DeepSeek's reference) computes, so each element may differ by its own rounding:
    |pos| * |theta32 - theta64| + ulp(angle) / 2, plus the cos/sin rounding."""
    cfg = long_context_config([0, 4])
    rope = rope_tables(cfg)[table]
    theta = yarn_inv_freq(160000.0, 64, 16.0, YARN_ORIGINAL, 32.0, 1.0) if table == "compress" else \
        plain_inv_freq(10000.0, 64)
    positions = torch.tensor([0, 1, 65_535, 65_536, 65_537, 100_003, 131_071, 524_288, 999_999, 1_048_575])
    cos, sin = rope.cos_sin(positions)  # [P, 32] float32
    exact = positions.to(F64)[:, None] * theta  # [P, 32]
    angle32 = positions.float()[:, None] * rope.inv_freq  # [P, 32]
    ulp = torch.nextafter(angle32.abs(), torch.tensor(math.inf)) - angle32.abs()
    bound = positions.to(F64)[:, None] * (rope.inv_freq.to(F64) - theta).abs() + ulp.to(F64) / 2 + 2e-7
    for got, ref, what in ((cos, exact.cos(), "cos"), (sin, exact.sin(), "sin")):
        err = (got.to(F64) - ref).abs()
        worst = (err - bound).max().item()
        assert worst <= 0, f"{table} {what}: an element exceeds its float32 rounding bound by {worst:.3g}"
    # the bound is tight enough to see one position of difference in any pair
    assert (bound < (theta * 0.5)).all()


# ----- compressors and indexer as modules, 100k+ positions ------------------------------------------
@pytest.mark.parametrize("ratio", [4, 128])
def test_compressor_rows_over_100k_positions(ratio):
    """compress() fed 100,037 positions in uneven chunks (25,009 CSA / 781 HCA windows): the entries of
    the first windows, of those around 65,536, of the last ones and every 97th between equal the float64
    pooling of their windows, rope at their start w * m (the slow layer test compares every row)."""
    d, hd, n_pos = 32, 64, 100_037
    g = torch.Generator().manual_seed(ratio)
    width = (2 if ratio == 4 else 1) * hd
    w = CompressorWeights(torch.randn(2 * width, d, generator=g) / math.sqrt(d),
                          0.5 * torch.randn(ratio, width, generator=g), 1 + 0.1 * torch.randn(hd, generator=g), ratio,
                          overlap=ratio == 4)
    rope = rope_tables(long_context_config([ratio]))["compress"]
    x = torch.randn(n_pos, d, generator=g)
    state, rows, done = CompressorState.empty(w, "cpu"), [], 0
    for size in chunk_sizes(n_pos):
        new, state = compress(w, x[done:done + size], state, sum(r.shape[0] for r in rows), rope, 1e-6)
        rows.append(new)
        done += size
    got = torch.cat(rows)
    n = n_pos // ratio
    assert got.shape == (n, hd)
    near = YARN_ORIGINAL // ratio
    windows = torch.cat((torch.arange(3), torch.arange(near - 3, near + 3), torch.arange(0, n, 97),
                         torch.arange(n - 40, n))).unique()  # [w]
    # float64 projections of just the tokens these windows (and, for CSA, the windows before them) pool
    tokens = (torch.cat((windows, (windows - 1).clamp(min=0)))[:, None] * ratio + torch.arange(ratio)).flatten()
    kv, gate = torch.zeros(n * ratio, width, dtype=F64), torch.zeros(n * ratio, width, dtype=F64)
    kv[tokens], gate[tokens] = projections(w, x[tokens].to(F64))
    ref = compressed_entries(w, kv, gate, n, rope.inv_freq, 1e-6, windows)  # [w, hd]
    err = (got[windows].to(F64) - ref).abs().max(dim=1).values  # [w]
    worst = int(err.argmax())
    assert err[worst] <= ROW_ATOL, f"ratio {ratio}: entry {int(windows[worst])} (position " \
        f"{int(windows[worst]) * ratio}) off by {err[worst]:.3g}"


def test_indexer_picks_past_100k_positions():
    """select() for queries at 100,000-100,011 over 25,003 index keys: the picks are the float64 top-k
    (earliest first among exact ties) of the visible entries; an entry completed at the query is
    visible, one completed a token later is not (both planted with the largest scores)."""
    g = torch.Generator().manual_seed(5)
    n, hi, di, k = 25_003, 2, 64, 8
    positions = torch.arange(100_000, 100_012)  # (t+1)//4 = 25,000 until 100,002, 25,001 from 100,003
    keys = torch.randn(n, di, generator=g)
    u = torch.nn.functional.normalize(torch.randn(di, generator=g), dim=0)
    q = torch.randn(len(positions), hi, di, generator=g) + 2 * u  # every head leans towards u
    weights = torch.rand(len(positions), hi, generator=g) + 0.1
    keys[25_000] = 100 * u  # completes at t = 100,003: picked from then on, never before
    keys[25_001] = 100 * u  # completes at t = 100,007
    picks = select(q, weights, keys, positions, 4, k)  # [T, k]
    scores = (weights[..., None].to(F64) * torch.relu(q.to(F64) @ keys.to(F64).T)).sum(1) * di ** -0.5  # [T, n]
    for i, t in enumerate(positions.tolist()):
        visible = (t + 1) // 4
        ours = sorted(picks[i][picks[i] >= 0].tolist())
        order = scores[i, :visible].sort(descending=True, stable=True)
        theirs = sorted(order.indices[:k].tolist())
        kth = order.values[k - 1]
        tol = 1e-5 * order.values[0].item()
        for e in set(ours) ^ set(theirs):  # only an exact (float32-rounding) tie at the k-th place may differ
            assert abs(scores[i, e] - kth) <= tol, f"query {t}: entry {e} picked by one side only, not a tie"
        assert len(ours) == k and max(ours) < visible, f"query {t}: picks {ours} ({visible} visible)"
        assert (25_000 in ours) == (t >= 100_003) and (25_001 in ours) == (t >= 100_007), f"query {t}: {ours}"


# ----- one attention layer over 100k+ positions -----------------------------------------------------
PREFIX, TAIL, DECODES = 100_080, 20, 3  # the tail holds 100,095 (an HCA window completes) and CSA completions


def _no_picks(q, weights, keys, positions, ratio, topk):
    """The indexer's top-k for prefix queries whose outputs are discarded: every pick dropped (-1)."""
    return torch.full((weights.shape[0], min(topk, keys.shape[0])), -1, dtype=torch.long, device=keys.device)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["csa", "hca", "sliding"])
def test_attention_layer_past_100k_positions(kind, monkeypatch):
    ratio = {"csa": 4, "hca": 128, "sliding": 0}[kind]
    model = build_model(long_context_config([ratio]), seed=11)
    lw = model.weights.layers[0]
    a, rope, eps = lw.attn, model.ropes[model.device]["main" if kind == "sliding" else "compress"], 1e-6
    total = PREFIX + TAIL + DECODES
    x = torch.randn(total, model.config.hidden_size, generator=torch.Generator().manual_seed(12))
    cache, done = model.new_cache().layers[0], 0
    with monkeypatch.context() as m:
        m.setattr(attention_module, "select", _no_picks)
        for size in chunk_sizes(PREFIX):
            attention(a, x[done:done + size], torch.arange(done, done + size), cache, rope, eps)
            done += size
    queries = list(range(PREFIX, total))
    x64 = x.to(F64)
    rows = index_keys = None  # float64 entries of every window of the whole context
    if a.compressor is not None:
        n = total // ratio
        rows = compressed_entries(a.compressor, *projections(a.compressor, x64), n, rope.inv_freq, eps)
        if a.indexer is not None:
            index_keys = compressed_entries(a.indexer.compressor, *projections(a.indexer.compressor, x64), n,
                                            rope.inv_freq, eps)
    want = Reference(model).attention(lw, lambda span: x64[span], queries, rows, index_keys)  # [T, D]

    paths = {"gathered": 0.0, "dense": math.inf} if kind == "csa" else {"default": None}
    for path, dense_ratio in paths.items():
        c = cache.clone()
        with monkeypatch.context() as m:
            if dense_ratio is not None:
                m.setattr(attention_module, "CSA_DENSE_MAX_RATIO", dense_ratio)
            out = [attention(a, x[PREFIX:PREFIX + TAIL], torch.arange(PREFIX, PREFIX + TAIL), c, rope, eps)]
            out += [attention(a, x[t:t + 1], torch.tensor([t]), c, rope, eps) for t in range(PREFIX + TAIL, total)]
        assert_close(torch.cat(out), want, OUT_RTOL, f"{kind} ({path}): outputs at {PREFIX}..{total - 1}")
        if rows is not None:
            assert c.rows.n == rows.shape[0]
            err = (c.rows.view().to(F64) - rows).abs().max().item()
            assert err <= ROW_ATOL, f"{kind}: compressed rows off by {err:.3g}"
        if index_keys is not None:
            err = (c.index_rows.view().to(F64) - index_keys).abs().max().item()
            assert err <= ROW_ATOL, f"{kind}: index keys off by {err:.3g}"


# ----- a whole model's session over 100k+ positions ---------------------------------------------------
TURNS = (60_000, 40_000, 421)  # snapshots at 60,000, 100,000 and 100,421; 65,536 falls inside turn 2
CHECK = (59_999, 65_535, 65_536, 65_537, 99_999, 100_095, 100_096, 100_420)  # rows of the prefills' logits




class LongSession:
    def __init__(self):
        # hc_mult 2 (V4-Flash: 4): the residual mixing's small reductions dominate a 100k prefill on a
        # 2-core CPU, and nothing here depends on the stream count (tests/test_model_exact.py has 4)
        self.model = build_model(long_context_config([128, 0], hc_mult=2), seed=3)
        self.ref = Reference(self.model)
        vocab = self.model.config.vocab_size
        self.ids = torch.randint(0, vocab, (sum(TURNS) + 400,), generator=torch.Generator().manual_seed(4))
        self.session, self.logits, done = self.model.new_session(), {}, 0
        for n in TURNS:
            out = self.session.prefill(self.ids[done:done + n])  # [n, V]
            self.logits.update({p: out[p - done] for p in CHECK if done <= p < done + n})
            done += n

    def fork(self):
        return self.session.fork()

    def expect(self, ids: torch.Tensor, got: dict[int, torch.Tensor], what: str) -> None:
        queries = sorted(got)
        assert_close(torch.stack([got[p] for p in queries]), self.ref.logits(ids, queries), OUT_RTOL, what)


@pytest.fixture(scope="module")
def long_session():
    return LongSession()


@pytest.mark.slow
def test_long_session_prefill_and_decode(long_session):
    """Three prefill turns to 100,421 tokens then decode steps: logits around 65,536 and 100k, and the
    HCA rows of all 784 windows, against float64."""
    ls = long_session
    s = ls.fork()
    got = dict(ls.logits)
    for p in range(len(s), len(s) + 3):
        got[p] = s.decode(ls.ids[p])
    ls.expect(ls.ids, got, "prefill turns and decode")
    rows, _ = ls.ref.layer0_entries(ls.ids[:len(s)])
    err = (s.cache.layers[0].rows.view().to(F64) - rows).abs().max().item()
    assert rows.shape[0] == len(s) // 128 == 784 and err <= ROW_ATOL, f"HCA rows off by {err:.3g}"


@pytest.mark.slow
@pytest.mark.parametrize("n,rerun", [(100_000, 0), (100_100, 100), (65_600, 5_600)])
def test_long_session_truncate_then_continue(long_session, n, rerun):
    """Decode past the last snapshot, cut back to n (a snapshot; 100 tokens after one, across the HCA
    window completed at 100,096; before 65,536 re-prefilling across it), then a new turn of 130 tokens
    and a decode step: float64 of the cut history plus the new tokens."""
    ls = long_session
    s = ls.fork()
    for t in ls.ids[len(s):len(s) + 5]:
        s.decode(t)
    assert s.rewind_point(n) == n - rerun  # what the server's prefix cache asks before it cuts
    counter = TokenCounter()
    ls.model.set_observer(counter)
    try:
        s.truncate(n)
    finally:
        ls.model.set_observer(None)
    assert counter.n == rerun, f"truncate({n}) re-ran {counter.n} tokens, expected {rerun}"
    assert len(s) == s.cache.position == n and s.cache.layers[0].rows.n == n // 128
    new = torch.randint(0, ls.model.config.vocab_size, (131,), generator=torch.Generator().manual_seed(n))
    out = s.prefill(new[:130])
    last = s.decode(new[130])
    ids = torch.cat((ls.ids[:n], new))
    ls.expect(ids, {n: out[0], n + 95: out[95], n + 129: out[129], n + 130: last}, f"truncate({n}) + new turn")


@pytest.mark.slow
def test_long_session_back_to_mark(long_session):
    """A speculative reject at 100k+: mark, a 60-token step that completes an HCA window (100,480), back
    to the mark, then other tokens: as if the step never ran."""
    ls = long_session
    s = ls.fork()
    mark, rows = s.mark(), s.cache.layers[0].rows.n
    s.extend(ls.ids[len(s):len(s) + 60])
    assert s.cache.layers[0].rows.n == rows + 1
    s.back_to(mark)
    assert len(s) == s.cache.position == sum(TURNS) and s.cache.layers[0].rows.n == rows
    other = torch.randint(0, ls.model.config.vocab_size, (61,), generator=torch.Generator().manual_seed(9))
    out, _ = s.extend(other[:60])
    last = s.decode(other[60])
    ids = torch.cat((ls.ids[:sum(TURNS)], other))
    L = sum(TURNS)
    ls.expect(ids, {L: out[0], L + 58: out[58], L + 59: out[59], L + 60: last}, "back_to(mark) then other tokens")


@pytest.mark.slow
def test_long_session_file_round_trip(long_session, tmp_path):
    """A 100k-token session written to a file and read back continues exactly, and so does a truncation
    of the read session to its turn-boundary snapshot at 100,000 followed by other tokens."""
    ls = long_session
    identity = {"model": "tests/test_long_positions.py"}
    write_session(tmp_path / "long.session", ls.session, identity)
    s = read_session(tmp_path / "long.session", ls.model, identity)
    L = len(s)
    assert L == sum(TURNS) and s.tokens == ls.ids[:L].tolist()
    got = {L: s.decode(ls.ids[L]), L + 1: s.decode(ls.ids[L + 1])}
    ls.expect(ls.ids, got, "decode after reading the session file")
    s.truncate(100_000)
    assert s.cache.layers[0].rows.n == 100_000 // 128
    new = torch.randint(0, ls.model.config.vocab_size, (130,), generator=torch.Generator().manual_seed(8))
    out = s.prefill(new)  # completes the window of 100,096 with other tokens than the file's
    ids = torch.cat((ls.ids[:100_000], new))
    ls.expect(ids, {100_000: out[0], 100_095: out[95], 100_129: out[129]}, "truncate(100,000) of the read session")
