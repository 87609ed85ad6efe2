"""The down matrices of the host rows a sharded upload copies from, held shard-major in page-locked memory.

A sharded upload (sharded_upload.py) copies GPU g's slice of each expert: rows g*W .. (g+1)*W of w1/w3 (and
their scales), already one contiguous run of the host row, and columns g*W .. (g+1)*W of every row of w2
[D, I/2] (and w2_scale [D, I/32]): D runs of W/2 bytes, I/2 bytes apart. torch copies such a strided source by
gathering it into a pageable temporary first, and a copy from pageable memory is staged by the driver and holds
the host thread: a third of each slice's bytes would cross its link serialized with the others. So where the
rows are DMA sources (the loader pins them: GPUs) and the plan holds the copy (policy.shard_major_copy: the
compiler's choice where the host has room for it), their w2 and w2_scale are also held here, shard-major:
[G, D, W/2] and [G, D, W/32], so GPU g's slice of each is one contiguous run of page-locked bytes, one async copy.

The host rows themselves stay as they are: the CPU expert kernel reads each w2 row whole ([D, I/2], its
ExpertTable's layout). What this holds is extra host memory: per row, its w2 and w2_scale bytes (a third of the
expert, 3 x (I D/2 + I D/32) bytes in all), for every row that is pinned (each placed layer's cold experts, and
every expert of the layers that re-place between turns), in one buffer page-locked once
(pinned_arena.pin; tests replace it).
Legend: G shards, D hidden, I expert intermediate, W = I/G.
"""

from __future__ import annotations

import mmap

import torch

from ostinato.checkpoint.reader import PackedExpert

from . import pinned_arena

ALIGN = pinned_arena.ALIGN  # each tensor at a multiple of a cache line, as in the arenas


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def held_bytes(rows: list[list[PackedExpert]], ids: list[list[int]]) -> int:
    """Bytes shard_major_down holds for `rows` and `ids`: each listed row's w2 and w2_scale (each rounded up to
    ALIGN; V4-Flash's and the tiny models' are whole multiples of it)."""
    return sum(_aligned(rows[l][r].w2.nbytes) + _aligned(rows[l][r].w2_scale.nbytes)
               for l, listed in enumerate(ids) for r in listed)


def shard_major_down(rows: list[list[PackedExpert]], ids: list[list[int]], shards: int
                     ) -> list[dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    """[layer] {row: (w2 [G, D, W/2], w2_scale [G, D, W/32])}: rows[layer][row]'s down matrix and its scales for
    each row in ids[layer], cut into `shards` column slices (W = I/G, a whole number of MXFP4 blocks:
    sharded_upload.slice_width) and laid out slice after slice in one page-locked buffer."""
    total = held_bytes(rows, ids)
    if total == 0:
        return [{} for _ in rows]
    buffer = torch.frombuffer(mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE), dtype=torch.uint8)  # page-aligned
    out, offset = [], 0
    for layer, listed in zip(rows, ids, strict=True):
        held = {}
        for r in listed:
            pair = []
            for t in (layer[r].w2, layer[r].w2_scale):  # [D, C] bytes, C = I/2 or I/32
                D, C = t.shape
                if C % shards:
                    raise ValueError(f"a down matrix of {C} bytes a row does not cut into {shards} slices")
                view = buffer[offset:offset + t.nbytes].view(shards, D, C // shards)  # [G, D, C/G]
                view.copy_(t.view(torch.uint8).reshape(D, shards, C // shards).transpose(0, 1))
                pair.append(view.view(t.dtype))
                offset += _aligned(t.nbytes)
            held[r] = tuple(pair)
        out.append(held)
    pinned_arena.pin(buffer)
    return out
