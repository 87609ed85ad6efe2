"""The multi-token-prediction block (issue #30): in the checkpoint in the official format, its forward
against a float64 reference, and speculative decoding that gives the plain greedy tokens exactly.

The reference is written independently of runtime/model/mtp.py: its decoder block is transformers'
own DeepseekV4DecoderLayer (transformers builds none for MTP, but the block is an ordinary decoder
block at layer index num_hidden_layers), its mHC head and norms transformers' modules, and the few
lines around them are the definition as the model's reference code states it (mtp.py's docstring):
    x = e_proj(enorm(embed(next))) [broadcast over the streams] + h_proj(hnorm(main streams))
    logits = head(norm(hc_head(block(x))))
all in float64, on the main model's own float64 streams (transformers' layers again).
"""

from __future__ import annotations

import copy

import pytest
import torch
from engine_helpers import caches_equal
from hf_reference import hf_parameter, load_reference

from ostinato.checkpoint.reader import Checkpoint
from ostinato.checkpoint.tensor_specs import mtp_block_specs
from ostinato.runtime import load_model
from ostinato.runtime.model.mtp import mtp_logits
from ostinato.runtime.model.speculative import Sampled, SpeculativeDecoder, accept_or_resample

S = 136  # > one HCA window (128), many CSA windows and sliding windows (16)
TOL = 1e-4


@pytest.fixture(scope="module")
def model(tiny_ckpt):
    return load_model(tiny_ckpt, dtype=torch.float32, device="cpu", mtp=True)


def _reference_block(hf, ckpt: Checkpoint):
    """transformers' decoder block at layer index n, its weights mtp.0's (float64)."""
    from transformers.models.deepseek_v4 import configuration_deepseek_v4 as conf
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4DecoderLayer

    cfg, n = ckpt.config, ckpt.config.num_hidden_layers
    hcfg = copy.deepcopy(hf.config)
    hcfg.layer_types = list(hcfg.layer_types) + [conf._COMPRESS_RATIO_TO_LAYER_TYPE[cfg.compress_ratio(n)]]
    hcfg.mlp_layer_types = list(hcfg.mlp_layer_types) + ["moe"]  # past num_hash_layers: score routing
    block = DeepseekV4DecoderLayer(hcfg, layer_idx=n).double().eval()
    state = {f"model.layers.{n}.{k}": v for k, v in block.state_dict(keep_vars=True).items()}
    own = {"e_proj", "h_proj", "enorm", "hnorm", "norm", "hc_head_fn", "hc_head_base", "hc_head_scale"}
    with torch.no_grad():
        for spec in mtp_block_specs(cfg, 0):
            suffix = spec.name.removeprefix("mtp.0.")
            if spec.is_scale or suffix.split(".")[0] in own:
                continue
            hf_parameter(state, f"layers.{n}.{suffix}", cfg.moe_intermediate_size).copy_(
                ckpt.dequantized(spec.name, torch.float64))
    return block


@pytest.mark.slow  # transformers' forward (the reference)
def test_the_mtp_block_matches_a_float64_reference(tiny_ckpt, model):
    from transformers.masking_utils import create_sliding_window_causal_mask
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperHead, DeepseekV4RMSNorm

    hf = copy.deepcopy(load_reference(str(tiny_ckpt))).double()
    hf.config._experts_implementation = "eager"  # the plain loop over experts: grouped_mm has no float64
    ids = torch.randint(0, model.config.vocab_size, (S,), generator=torch.Generator().manual_seed(11))
    with Checkpoint.open(tiny_ckpt) as ckpt, torch.no_grad():
        assert ckpt.has_mtp
        block = _reference_block(hf, ckpt)
        w = {k: ckpt.dequantized(f"mtp.0.{k}", torch.float64) for k in
             ("e_proj.weight", "h_proj.weight", "enorm.weight", "hnorm.weight", "norm.weight", "hc_head_fn",
              "hc_head_base", "hc_head_scale")}
        cfg = hf.config
        norm = {}
        for k in ("enorm", "hnorm", "norm"):
            norm[k] = DeepseekV4RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps).double()
            norm[k].weight.copy_(w[f"{k}.weight"])
        head = DeepseekV4HyperHead(cfg).double()
        head.hc_fn.copy_(w["hc_head_fn"])
        head.hc_base.copy_(w["hc_head_base"])
        head.hc_scale.copy_(w["hc_head_scale"])

        def run(layers, x, tokens):  # transformers' own model loop over `layers`, no cache
            pos = torch.arange(x.shape[1])[None]
            embeds = x[:, :, 0]
            mask = create_sliding_window_causal_mask(config=cfg, inputs_embeds=embeds, attention_mask=None,
                                                     cache=None, position_ids=pos)
            pe = {t: hf.model.rotary_emb(embeds, position_ids=pos, layer_type=t) for t in ("main", "compress")}
            for layer in layers:
                x = layer(x, position_embeddings=pe, position_ids=pos, attention_mask=mask, input_ids=tokens,
                          cache=None)
            return x

        e = hf.model.embed_tokens(ids[None])  # [1, S, D]
        streams = run(hf.model.layers, e.unsqueeze(2).expand(-1, -1, cfg.hc_mult, -1).contiguous(), ids[None])
        nxt = ids[1:][None]  # pair t: streams of t, token t+1
        x = (norm["enorm"](hf.model.embed_tokens(nxt)) @ w["e_proj.weight"].T).unsqueeze(2) \
            + norm["hnorm"](streams[:, :-1]) @ w["h_proj.weight"].T  # [1, S-1, N, D]
        x = run([block], x, nxt)
        ref = (norm["norm"](head(x)) @ hf.lm_head.weight.T)[0]  # [S-1, V]

        ours_logits, ours_streams = model.forward(ids, model.new_cache(), with_streams=True)
        ours = mtp_logits(model, ours_streams[:-1], ids[1:], 0, model.new_mtp_cache(), last_only=False)
        # the same pairs in two calls, the second on the cache of the first: a draft step continues a prefill
        cache = model.new_mtp_cache()
        mtp_logits(model, ours_streams[:100], ids[1:101], 0, cache, last_only=False)
        tail = mtp_logits(model, ours_streams[100:-1], ids[101:], 100, cache, last_only=False)
    for what, got in (("one call", ours), ("two calls", torch.cat((ours[:100], tail)))):
        scale, diff = ref.abs().max().item(), (got.double() - ref).abs().max().item()
        assert diff <= TOL * scale, f"{what}: max |diff| {diff:.3g} > {TOL} x logit scale {scale:.3g}"


def plain_greedy(model, prompt: list[int], n: int):
    """(n greedy tokens of plain decoding, its session)."""
    s = model.new_session()
    out = [int(s.prefill(prompt, last_only=True)[-1].argmax())]
    while len(out) < n:
        out.append(int(s.decode(out[-1]).argmax()))
    return out, s


def speculative(model, prompt: list[int], n: int, draft=None):
    spec = SpeculativeDecoder(model.new_session(), draft=draft)
    out = spec.start(spec.prefill(prompt)[-1])
    while len(out) < n:
        out += spec.step()
    return out[:n], spec


PROMPT = [(7 * i + 3) % 1000 + 2 for i in range(104)]  # the reply crosses position 128 (HCA) and many windows
N = 32


@pytest.fixture(scope="module")
def reference(model):
    return plain_greedy(model, PROMPT, N)


@pytest.mark.slow  # three generations of 40 tokens on the tiny model
def test_greedy_tokens_are_the_same_with_any_drafts(model, reference):
    want, _ = reference
    at = len(PROMPT)

    def oracle(position, logits):  # the known continuation: always accepted
        return want[position - at]

    def wrong(position, logits):  # never the continuation: always rejected
        return (want[position - at] + 1) % 1000
    for name, draft, accepted in (("MTP", None, None), ("oracle", oracle, "all"), ("wrong", wrong, "none")):
        got, spec = speculative(model, PROMPT, N, draft)
        assert got == want, name
        if accepted == "all":
            assert spec.accepted == spec.drafted and spec.drafted <= N // 2 + 1, (spec.drafted, spec.accepted)
        elif accepted == "none":
            assert spec.accepted == 0 and spec.drafted == N - 1


@pytest.mark.slow
def test_a_rejected_draft_leaves_the_cache_as_plain_decoding_builds_it(model, reference):
    """Every draft rejected: after the same tokens, every tensor of the session's cache equals plain
    decoding's bit for bit (the verify step was undone and the token ran alone)."""
    want, plain = reference
    at = len(PROMPT)
    _, spec = speculative(model, PROMPT, N, lambda position, logits: (want[position - at] + 1) % 1000)
    ours = spec.session
    assert ours.tokens == plain.tokens
    caches_equal(ours.cache, plain.cache)


@pytest.mark.slow  # 30,000 draws of the rule, one by one
def test_accept_or_resample_keeps_the_target_distribution():
    """Whatever the draft distribution q, the kept-or-replaced token is distributed as the target p
    (a draft drawn from q, or certain: q a point mass); 10,000 draws per case, within 5 standard errors."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64) * 2, 0)
    far = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64) * 2, 0)  # an unrelated draft model
    certain = torch.nn.functional.one_hot(torch.tensor(4), 6).double()
    n = 10_000
    for q in (far, p, certain):
        sampling = Sampled(1.0, seed=1)
        counts, kept = torch.zeros(6, dtype=torch.float64), 0
        for _ in range(n):
            d = sampling.draw(q)
            token, accepted = accept_or_resample(p, q, d, sampling)
            counts[token] += 1
            kept += accepted
        err = 5 * (p * (1 - p) / n).sqrt()
        assert ((counts / n - p).abs() <= err).all(), (counts / n, p)
        assert abs(kept / n - float(torch.minimum(p, q).sum())) < 0.03  # acceptance: sum of min(p, q)


@pytest.mark.slow
def test_sampled_speculative_decoding_repeats_under_a_seed(model):
    def run(seed):
        spec = SpeculativeDecoder(model.new_session(), sampling=Sampled(1.0, seed))
        out = spec.start(spec.prefill(PROMPT[:40])[-1])
        while len(out) < 12:
            out += spec.step()
        return out[:12]
    assert run(5) == run(5) and run(5) != run(6)
