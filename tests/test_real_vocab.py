"""The real-vocab preset: tiny's dimensions with DeepSeek-V4's vocabulary and tokenizer, and
index_head_dim != head_dim (what llama.cpp's converter and DSV4 loader need). A plan's engine on it
(its generated head kernel then streams 129,280 bf16 rows per token) against transformers."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_close_to_scale, compile_tiny_plan
from hf_reference import load_reference
from tokenizers import Tokenizer

from ostinato.runtime.engine.loader import load_engine
from ostinato.tiny import write_tiny_checkpoint

pytestmark = pytest.mark.slow  # the real tokenizer's vocabulary, compiled kernels and transformers


def test_real_vocab_preset_runs_exactly_against_transformers(tmp_path, kernel_dir):
    ckpt = write_tiny_checkpoint(tmp_path / "rv", "real-vocab", seed=3, popularity=1.0, progress=False)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["vocab_size"] == 129280 and cfg["index_head_dim"] != cfg["head_dim"]
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    assert tok.get_vocab_size() > 128000 and tok.encode("def main():").ids  # the real tokenizer, not a toy one

    ids = torch.randint(0, cfg["vocab_size"], (150,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = load_reference(str(ckpt))(ids[None]).logits[0].float()  # [150, V]
    plan = compile_tiny_plan(ckpt, tmp_path, kernel_dir, context=1024, max_hot_per_layer=4)
    engine = load_engine(plan, ckpt, device="cpu")
    session = engine.new_session()
    assert_close_to_scale(session.prefill(ids[:140])[-1], ref[139], 1e-4, "prefill, last logits")
    for t in range(140, 149):  # decode steps: the static step's head through the generated kernel
        assert_close_to_scale(session.decode(int(ids[t])), ref[t], 1e-4, f"decode at {t}")
    engine.close()
