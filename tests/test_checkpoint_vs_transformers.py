"""Every tensor our reader dequantizes equals transformers' loaded parameter, bit for bit."""

import pytest
import torch
from hf_reference import hf_parameter, load_reference

from ostinato.checkpoint.reader import Checkpoint

pytestmark = pytest.mark.slow  # transformers (the reference)


@pytest.mark.parametrize("fixture", ["tiny_ckpt", "small_ckpt"])
def test_every_tensor_equals_transformers(fixture, request):
    path = request.getfixturevalue(fixture)
    ref = load_reference(str(path))
    state = dict(ref.state_dict())
    claimed = set()
    with Checkpoint.open(path) as ckpt:
        kinds = set()
        weights = [n for n, s in ckpt.specs.items() if not s.is_scale]
        for name in weights:
            spec = ckpt.specs[name]
            ours = ckpt.dequantized(name, torch.float32)
            theirs = hf_parameter(state, name, ckpt.config.moe_intermediate_size)
            assert ours.dtype == theirs.dtype, name
            assert torch.equal(ours, theirs), f"{name}: max diff {(ours.double() - theirs.double()).abs().max()}"
            kinds.add((spec.role, spec.dtype))
            claimed.add(theirs.data_ptr())
    # every tensor kind of the format was compared, including routed experts and hash tables
    assert {("routed_expert", "I8"), ("attention", "F8_E4M3"), ("shared_expert", "F8_E4M3"),
            ("indexer", "F8_E4M3"), ("hash_table", "I64"), ("gate", "F32"), ("gate", "BF16"), ("hc", "F32"),
            ("compressor", "BF16"), ("compressor", "F32"), ("embed", "BF16"), ("head", "BF16")} <= kinds
    # and no transformers parameter was left unmatched (expert slices share their merged tensor's storage)
    unmatched = [k for k, v in state.items() if v.data_ptr() not in claimed and "experts" not in k]
    assert unmatched == []
