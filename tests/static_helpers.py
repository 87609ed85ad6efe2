"""Helpers of the static-step tests (test_static_decode.py, test_static_buckets.py); their `model`
fixture (the plain model of each preset) is in tests/conftest.py."""

import torch
from conftest import assert_close_to_scale

MAX_CONTEXT = 512
# Relative to the logit scale; observed max |diff| / scale: 5e-7 (tiny), 8e-7 (small).
TOL = 1e-5


def assert_close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert_close_to_scale(ours, ref, TOL, what)


def _tokens(model, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def _cache_items(cache):
    """Every tensor a KvCache holds, named (None where a compressor has no previous window yet)."""
    items = {"position": cache.position}
    for i, lc in enumerate(cache.layers):
        items[f"{i}.window"] = lc.window
        for name, comp, rows in (("comp", lc.comp, lc.rows), ("index", lc.index_comp, lc.index_rows)):
            if comp is not None:
                for f in ("buf_kv", "buf_gate", "prev_kv", "prev_gate"):
                    items[f"{i}.{name}.{f}"] = getattr(comp, f)
                items[f"{i}.{name}.rows"] = rows.view()
    return items
