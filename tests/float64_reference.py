"""DeepSeek-V4 re-derived in float64 from the model description (docs/model.md section 3; DeepSeek's
published formulas), for checking the float32 model at long positions without transformers.

Written independently of runtime/model (it reads only the weights' tensors from the runtime's weight
records) and affordable at 100k+ positions: a query's output needs only the keys it attends to (its
sliding window and the compressed entries it may use), and a compressed entry is a local pooling over
its window. What it does not do is the O(n^2) part: it runs no query whose output nobody reads.

Rope: the frequency table is the model's float32 one (tests/test_long_positions.py checks it against
the float64 YaRN derivation, `yarn_inv_freq`), and each angle is fl32(pos * theta_i), the float32
product that both transformers and DeepSeek's reference compute (positions < 2^24 are exact in float32);
cos, sin and everything after them are float64.

Legend: L context length, T queries, D hidden, N hc_mult, H heads, hd head_dim, R rope dims, m ratio,
C compressor projection width, HI / dI indexer heads / head dim, V vocab.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

F64 = torch.float64


def yarn_inv_freq(base: float, rope_dim: int, factor: float, original_max: int, beta_fast: float,
                  beta_slow: float) -> torch.Tensor:
    """theta_i of a compress layer in float64, as docs/model.md states YaRN: d(r) = R ln(orig / (2 pi r)) /
    (2 ln base), low = max(floor d(beta_fast), 0), high = min(ceil d(beta_slow), R - 1),
    ramp_i = clamp((i - low) / (high - low), 0, 1), theta_i = base^(-2i/R) (ramp_i / factor + 1 - ramp_i)."""
    def d(r: float) -> float:
        return rope_dim * math.log(original_max / (2 * math.pi * r)) / (2 * math.log(base))

    low, high = max(math.floor(d(beta_fast)), 0), min(math.ceil(d(beta_slow)), rope_dim - 1)
    i = torch.arange(rope_dim // 2, dtype=F64)
    theta = base ** (-2 * i / rope_dim)
    ramp = ((i - low) / (high - low)).clamp(0, 1)
    return theta / factor * ramp + theta * (1 - ramp)  # [R/2]


def plain_inv_freq(base: float, rope_dim: int) -> torch.Tensor:
    return base ** (-2 * torch.arange(rope_dim // 2, dtype=F64) / rope_dim)  # [R/2]


def angles(inv_freq32: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[T, R/2] float64 values of the float32 angles fl32(pos * theta_i)."""
    return (positions.to(torch.float32)[:, None] * inv_freq32[None, :]).to(F64)


def rope(x: torch.Tensor, ang: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate pairs (2i, 2i+1) of the last R channels of x [T, ..., C] by ang [T, R/2] (or -ang)."""
    r = 2 * ang.shape[-1]
    shape = (ang.shape[0],) + (1,) * (x.dim() - 2) + (-1,)
    c, s = ang.cos().reshape(shape), ang.sin().reshape(shape)
    s = -s if inverse else s
    a, b = x[..., -r::2], x[..., -r + 1::2]
    out = x.clone()
    out[..., -r::2], out[..., -r + 1::2] = a * c - b * s, a * s + b * c
    return out


def rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def compressed_entries(c, kv: torch.Tensor, gate: torch.Tensor, n: int, inv_freq32: torch.Tensor, eps: float,
                       windows: torch.Tensor | None = None) -> torch.Tensor:
    """Entries [n, hd] of compressor weights `c` (ratio m), or those of `windows` only [w, hd], from the
    projections of >= n*m tokens: values kv = x Wkv^T and gates = x Wgate^T (ape not added) [>= n*m, C]
    float64 (only the rows of the windows asked for, and for CSA of the windows before them, are read).
    Window w (tokens [w*m, (w+1)*m)) pools its tokens per channel with softmax(gate + ape[pos mod m])
    weights; CSA (overlap) pools 2m slots: window w-1's first-half channels and window w's second-half
    ones (none before window 0). Then rms norm and rope at the window's start w*m."""
    m, hd = c.ratio, c.norm.numel()
    windows = torch.arange(n) if windows is None else windows
    C = kv.shape[1]
    a_all = kv[:n * m].reshape(n, m, C)
    z_all = gate[:n * m].reshape(n, m, C) + d64(c.ape)  # [n, m, C]
    a, z = a_all[windows], z_all[windows]  # [w, m, C]
    if c.overlap:
        first = windows == 0  # no previous window: weight 0
        prev_a = a_all[(windows - 1).clamp(min=0), :, :hd].masked_fill(first[:, None, None], 0.0)
        prev_z = z_all[(windows - 1).clamp(min=0), :, :hd].masked_fill(first[:, None, None], float("-inf"))
        a, z = torch.cat((prev_a, a[..., hd:]), 1), torch.cat((prev_z, z[..., hd:]), 1)  # [w, 2m, hd]
    pooled = rms((a * torch.softmax(z, dim=1)).sum(1), d64(c.norm), eps)  # [w, hd]
    return rope(pooled, angles(inv_freq32, windows * m))


def projections(c, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D] float64 -> compressor values and gates [T, C] each (float64)."""
    w = d64(c.wkv_gate)
    half = w.shape[0] // 2
    return x @ w[:half].T, x @ w[half:].T


def d64(t):
    return None if t is None else t.detach().to(F64)


class Reference:
    """The float64 model of a runtime Model's weights. Only layer 0 may have a compressor (CSA or HCA):
    its sublayer input depends on the token alone, so every entry over any length costs O(L); the later
    layers' keys are then the sliding windows of the queries, which the reference computes (layer by
    layer the positions needed widen by W - 1 to the left)."""

    def __init__(self, model):
        self.cfg, self.w = model.config, model.weights
        cfg = self.cfg
        assert all(cfg.compress_ratio(i) == 0 for i in range(1, cfg.num_hidden_layers)), \
            "only layer 0 may compress: later layers' entries would need every position's output"
        dev = model.layer_devices[0]
        self.inv = {k: r.inv_freq.cpu() for k, r in model.ropes[dev].items()}  # float32 tables
        self.expert_w13 = [d64(w) for w in model.executor.w13]  # [E, 2I, D] per layer
        self.expert_w2 = [d64(w) for w in model.executor.w2]    # [E, D, I]
        self.eps = cfg.rms_norm_eps

    # ----- mHC --------------------------------------------------------------------------------
    def hc_pre(self, X: torch.Tensor, hc) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """X [T, N, D] -> (collapsed [T, D], post [T, N], comb [T, N, N]) per docs/model.md (mHC pre)."""
        cfg, n, t = self.cfg, self.cfg.hc_mult, X.shape[0]
        m = rms(X.reshape(t, -1), None, self.eps) @ d64(hc.fn).T  # [T, (2+N)N]
        base, scale = d64(hc.base), d64(hc.scale)
        pre = torch.sigmoid(m[:, :n] * scale[0] + base[:n]) + cfg.hc_eps
        post = 2 * torch.sigmoid(m[:, n:2 * n] * scale[1] + base[n:2 * n])
        C = torch.softmax(m[:, 2 * n:].reshape(t, n, n) * scale[2] + base[2 * n:].reshape(n, n), dim=-1) + cfg.hc_eps
        C = C / (C.sum(-2, keepdim=True) + cfg.hc_eps)
        for _ in range(cfg.hc_sinkhorn_iters - 1):
            C = C / (C.sum(-1, keepdim=True) + cfg.hc_eps)
            C = C / (C.sum(-2, keepdim=True) + cfg.hc_eps)
        return (pre[..., None] * X).sum(1), post, C

    @staticmethod
    def hc_post(X: torch.Tensor, y: torch.Tensor, post: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
        return post[..., None] * y[:, None, :] + torch.einsum("tjk,tjd->tkd", C, X)  # X'_k = post_k y + sum_j C_jk X_j

    # ----- compressed entries -------------------------------------------------------------------
    def entries(self, c, kv: torch.Tensor, gate: torch.Tensor, n: int) -> torch.Tensor:
        return compressed_entries(c, kv, gate, n, self.inv["compress"], self.eps)

    def indexer_picks(self, ix, qr: torch.Tensor, x: torch.Tensor, t: int, keys: torch.Tensor) -> list[int]:
        """The entries query t (latent qr [ql], input x [D]) attends to: the top min(k, n) by index score
        among the visible ones (w < (t+1)/m); every visible one when they are no more than k."""
        visible = (t + 1) // ix.compressor.ratio
        if visible <= ix.topk:
            return list(range(visible))
        q = (qr @ d64(ix.wq_b).T).view(ix.n_heads, ix.head_dim)
        q = rope(q[None], angles(self.inv["compress"], torch.tensor([t])))[0]  # [HI, dI]
        weight = x @ d64(ix.weights_proj).T * ix.n_heads ** -0.5  # [HI]
        score = (weight[:, None] * torch.relu(q @ keys[:visible].T) * ix.head_dim ** -0.5).sum(0)  # [visible]
        # Equal scores (the relu makes exact zeros, and a query whose head weights are all negative scores
        # every entry <= 0): the earlier entry wins, the rule runtime/model/indexer.py defines.
        return sorted(score.sort(descending=True, stable=True).indices[:ix.topk].tolist())

    # ----- sublayers ----------------------------------------------------------------------------
    def attention(self, lw, x_at, queries: list[int], rows: torch.Tensor | None, index_keys: torch.Tensor | None
                  ) -> torch.Tensor:
        """Outputs [T, D] of `queries` (positions); x_at(positions [P]) -> attention inputs [P, D] float64;
        rows / index_keys: the layer's entries (enough of them for the last query)."""
        a = lw.attn
        H, hd, W = a.n_heads, a.head_dim, a.window
        inv = self.inv["main" if lw.kind == "sliding" else "compress"]
        out = []
        for t in queries:
            span = torch.arange(max(0, t - W + 1), t + 1)  # window positions, self included
            xs = x_at(span)  # [w, D]
            kv = rope(rms(xs @ d64(a.wkv).T, d64(a.kv_norm), self.eps), angles(inv, span))  # [w, hd]
            x = xs[-1]
            qr = rms(x @ d64(a.wq_a).T, d64(a.q_norm), self.eps)
            q = rms((qr @ d64(a.wq_b).T).view(H, hd), None, self.eps)
            q = rope(q[None], angles(inv, torch.tensor([t])))[0]  # [H, hd]
            keys = kv
            if rows is not None:
                if a.indexer is not None:
                    picked = self.indexer_picks(a.indexer, qr, x, t, index_keys)
                else:
                    picked = list(range((t + 1) // a.compressor.ratio))
                keys = torch.cat((kv, rows[picked]))
            logits = q @ keys.T * hd ** -0.5  # [H, keys]
            logits = torch.cat((logits, d64(a.sink)[:, None]), dim=1)  # the sink joins the denominator only
            o = torch.softmax(logits, dim=1)[:, :-1] @ keys  # [H, hd]: values are the keys
            o = rope(o[None], angles(inv, torch.tensor([t])), inverse=True)[0]
            G = a.o_groups
            u = o.reshape(G, -1)  # [G, H/G * hd]: heads grouped contiguously
            wo_a = d64(a.wo_a).view(G, -1, u.shape[1])  # [G, ol, H/G * hd]
            z = torch.einsum("gk,gok->go", u, wo_a).reshape(-1)  # [G * ol]
            out.append(z @ d64(a.wo_b).T)
        return torch.stack(out)  # [T, D]

    def moe(self, lw, layer: int, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """x [T, D], token ids [T] -> [T, D]: routed experts (weighted) plus the shared one."""
        r, lim = lw.moe.router, lw.moe.limit
        s = F.softplus(x @ d64(r.gate).T).sqrt()  # [T, E]
        ids = r.tid2eid[token_ids] if r.tid2eid is not None else (s + d64(r.bias)).topk(r.top_k, dim=-1).indices
        w = s.gather(1, ids)
        w = w / w.sum(-1, keepdim=True) * r.scaling  # [T, k]

        def swiglu(x, w13, w2):  # x [T, D], w13 [2I, D], w2 [D, I]
            g, u = (x @ w13.T).chunk(2, dim=-1)
            return (F.silu(g.clamp(max=lim)) * u.clamp(-lim, lim)) @ w2.T

        out = swiglu(x, d64(lw.moe.shared_w13), d64(lw.moe.shared_w2))
        for j in range(ids.shape[1]):
            for e in ids[:, j].unique().tolist():
                sel = ids[:, j] == e
                out[sel] += w[sel, j, None] * swiglu(x[sel], self.expert_w13[layer][e], self.expert_w2[layer][e])
        return out

    # ----- the model ----------------------------------------------------------------------------
    def layer0_entries(self, ids: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Layer 0's compressed entries and index keys over the whole context ids [L] (None: it has none)."""
        lw = self.w.layers[0]
        c = lw.attn.compressor
        if c is None:
            return None, None
        table = self.layer0_inputs()  # [V, D]
        n = ids.shape[0] // c.ratio

        def of(comp):  # projections per vocabulary entry, gathered per position: [L, C] each
            return self.entries(comp, *(p[ids] for p in projections(comp, table)), n)

        return of(c), (of(lw.attn.indexer.compressor) if lw.attn.indexer is not None else None)

    def layer0_inputs(self) -> torch.Tensor:
        """Layer 0's attention input per vocabulary entry [V, D]: at layer 0 it depends on the token alone."""
        lw, cfg = self.w.layers[0], self.cfg
        X = d64(self.w.embed)[:, None, :].expand(-1, cfg.hc_mult, -1)  # [V, N, D]
        h, _, _ = self.hc_pre(X, lw.hc_attn)
        return rms(h, d64(lw.attn_norm), self.eps)

    def logits(self, ids: torch.Tensor, queries: list[int]) -> torch.Tensor:
        """Logits [T, V] at `queries` (positions, ascending) of the context ids [L] (L > max(queries))."""
        cfg, W = self.cfg, self.cfg.sliding_window
        n_layers = cfg.num_hidden_layers
        need = [None] * n_layers  # positions whose layer-l output is needed
        need[-1] = sorted(set(queries))
        for layer in range(n_layers - 1, 0, -1):
            need[layer - 1] = sorted({s for t in need[layer] for s in range(max(0, t - W + 1), t + 1)})
        rows, index_keys = self.layer0_entries(ids[:max(queries) + 1])
        streams: dict[int, torch.Tensor] = {}  # position -> [N, D] residual after the current layer

        def embed_streams(pos: list[int]) -> torch.Tensor:
            return d64(self.w.embed)[ids[pos]][:, None, :].expand(-1, cfg.hc_mult, -1)

        for layer, lw in enumerate(self.w.layers):
            pos = need[layer]
            if layer == 0:
                table = self.layer0_inputs()
                X = embed_streams(pos)

                def x_at(span, table=table):
                    return table[ids[span]]
            else:  # the inputs of this layer's windows: the previous layer's outputs at need[layer - 1]
                inputs = need[layer - 1]
                h, _, _ = self.hc_pre(torch.stack([streams[p] for p in inputs]), lw.hc_attn)
                by_pos = dict(zip(inputs, rms(h, d64(lw.attn_norm), self.eps)))

                def x_at(span, by_pos=by_pos):
                    return torch.stack([by_pos[int(s)] for s in span])
                X = torch.stack([streams[p] for p in pos])
            _, post, comb = self.hc_pre(X, lw.hc_attn)
            y = self.attention(lw, x_at, pos, rows if layer == 0 else None, index_keys if layer == 0 else None)
            X = self.hc_post(X, y, post, comb)
            h, post, comb = self.hc_pre(X, lw.hc_ffn)
            X = self.hc_post(X, self.moe(lw, layer, rms(h, d64(lw.ffn_norm), self.eps), ids[pos]), post, comb)
            streams = dict(zip(pos, X))
        X = torch.stack([streams[q] for q in queries])  # [T, N, D]
        hh = self.w.hc_head
        t = X.shape[0]
        m = rms(X.reshape(t, -1), None, self.eps) @ d64(hh.fn).T
        pre = torch.sigmoid(m * d64(hh.scale) + d64(hh.base)) + cfg.hc_eps  # [T, N]
        h = rms((pre[..., None] * X).sum(1), d64(self.w.norm), self.eps)
        return h @ d64(self.w.head).T  # [T, V]
