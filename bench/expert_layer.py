"""The layer every CPU kernel of the side-by-side bench computes: DeepSeek-V4-Flash's routed experts in
MXFP4, random but the same bytes in every process that asks for the same arguments."""

from __future__ import annotations

import torch

D, I = 4096, 2048
N_EXPERTS, TOP_K = 256, 6
EXPERT_BYTES = 13_369_344            # packed MXFP4 bytes of one V4-Flash expert (w1, w3, w2 and their scales)
SEED = 0
MAX_LEN = 512                        # kt's max_len (its chunked_prefill_size): the largest call


def random_layer(n_experts: int, dim: int, inter: int, seed: int) -> list:
    """The layer's packed experts: the same bytes for the same arguments, in any process."""
    from ostinato.runtime.kernels.testing import random_packed_expert

    g = torch.Generator().manual_seed(seed)
    return [random_packed_expert(dim, inter, g) for _ in range(n_experts)]


def layer_checksum(experts: list) -> int:
    """A cheap fingerprint of the packed bytes (every 17th expert's tensors), to show two processes hold
    the same layer."""
    s = 0
    for e in experts[::17]:
        for name in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale"):
            s = (s * 1_000_003 + int(getattr(e, name).view(torch.uint8).to(torch.int64).sum())) % (1 << 61)
    return s
