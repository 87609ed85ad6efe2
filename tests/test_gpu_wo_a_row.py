"""The GPU report's wo_a row times wo_a as the engine runs it: the model's attention applies every layer's wo_a
through attention.grouped_linear (so a change of how wo_a launches lands there), and the row calls that same
function, looked up on the attention module, on the FP8 matrix and the grouped view the attention hands it."""

from __future__ import annotations

import pytest
import torch

from ostinato.bench import gpu_report
from ostinato.bench.gpu_setup import dense_fp8_shapes, make_setup
from ostinato.checkpoint.config import ModelConfig
from ostinato.runtime.model import attention
from ostinato.runtime.model.fp8_matrix import Fp8Matrix
from ostinato.runtime.model.model import load_model

pytestmark = pytest.mark.slow  # a model forward, the tiny plans compiled


def recording(monkeypatch) -> list:
    """attention.grouped_linear wrapped: each call's (x shape, w) recorded, then the real function run."""
    calls, real = [], attention.grouped_linear

    def grouped_linear(x, w):
        calls.append((tuple(x.shape), w))
        return real(x, w)

    monkeypatch.setattr(attention, "grouped_linear", grouped_linear)
    return calls


def test_the_attention_applies_every_layers_wo_a_through_grouped_linear(tiny_ckpt, monkeypatch):
    cfg = ModelConfig.from_json(tiny_ckpt)
    wo_a = next(shape for shape, names in dense_fp8_shapes(cfg).items() if "wo_a" in names)
    model = load_model(tiny_ckpt, fp8=True)
    calls = recording(monkeypatch)
    model.new_session().prefill(list(range(5)), last_only=True)
    assert len(calls) == cfg.num_hidden_layers, f"{len(calls)} calls for {cfg.num_hidden_layers} layers"
    assert all(isinstance(w, Fp8Matrix) and tuple(w.shape) == wo_a for _, w in calls)
    assert {x for x, _ in calls} == {(cfg.o_groups, 5, wo_a[1])}  # [G, T, H*hd/G]


def test_the_wo_a_row_calls_the_attentions_function(tmp_path, monkeypatch):
    setup = make_setup(torch.device("cpu"), tmp_path)
    cfg = setup.cfg
    N, K = next(shape for shape, names in dense_fp8_shapes(cfg).items() if "wo_a" in names)
    calls = recording(monkeypatch)
    [row] = gpu_report.wo_a_as_run(setup, 4800.0, gemv_s=1e-3)
    copies = gpu_report.fp8_copies(setup, N, K)
    assert len(calls) >= copies and len(calls) % copies == 0  # captured (a warm-up run on the CPU) and timed
    assert all(x == (cfg.o_groups, 1, K) and isinstance(w, Fp8Matrix) and tuple(w.shape) == (N, K) for x, w in calls)
    assert row.ratio_key == "fp8_gemv_bw/peak:wo_a_as_run" and "grouped_linear" in row.what and not row.failed
