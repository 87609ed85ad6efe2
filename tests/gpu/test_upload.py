"""The executor's upload-once path on the GPU: cold experts copied group by group (pinned memory, two staging
buffers, copies overlapped with the previous group's compute) compute what the same routes give on the
same experts held resident: equal up to the output's rounding (bf16) after float32 sums of the k
routes in another order (gpu_setup.tolerance)."""

from __future__ import annotations

import pytest
import torch

from ostinato.bench.gpu_setup import rel_err, tolerance, upload_rig

pytestmark = pytest.mark.gpu


def test_upload_once_equals_resident_experts(h200):
    tokens = 2048 if h200.cuda else 16
    rig = upload_rig(h200, groups=3, tokens=tokens)
    try:
        uploaded = rig.upload()
        resident = rig.on_resident(torch.zeros(tokens, h200.cfg.hidden_size, device=h200.device))
    finally:
        rig.close()
    assert rel_err(uploaded, resident.to(uploaded.dtype)) <= tolerance(uploaded.dtype, h200.cfg.num_experts_per_tok)
