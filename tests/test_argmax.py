"""The greedy pick's argmax (runtime/kernels/argmax.py) against torch.argmax, whose rules it keeps: the first
of equal maxima, a NaN counted as the largest, any shape read flat."""

import pytest
import torch

from ostinato.runtime.kernels.argmax import argmax


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_equals_torch_on_random_logits(dtype):
    g = torch.Generator().manual_seed(0)
    for n in (1, 7, 129_280):
        x = torch.randn(n, generator=g).to(dtype)
        assert argmax(x) == int(x.argmax())


def test_first_of_ties_and_nan():
    x = torch.zeros(1000)
    x[[17, 400, 999]] = 5.0  # three equal maxima: the first wins
    assert argmax(x) == int(x.argmax()) == 17
    x[600] = float("nan")
    x[300] = float("nan")  # NaN beats any number; the first NaN wins
    assert argmax(x) == int(x.argmax()) == 300
    x = torch.full((50,), float("-inf"))
    assert argmax(x) == int(x.argmax()) == 0


def test_shapes_and_views_read_flat():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 4, 50, generator=g)
    assert argmax(x) == int(x.argmax())
    for view in (x[1], x[:, 2], x.transpose(0, 2), x[..., ::3]):
        assert argmax(view) == int(view.argmax())
