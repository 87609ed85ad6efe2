"""shard_copy: whether a plan that shards its uploads holds the pinned host rows' down matrices once more,
shard-major (policy.shard_major_copy; runtime/engine/shard_rows.py).

With the copy each GPU's w2 slice is one contiguous run of page-locked bytes, one async copy; without it the
slice is strided in the row, and torch gathers it through a pageable temporary first (a copy that holds the
host thread: runtime/engine/sharded_upload.py). The copy is a third of every pinned row (V4-Flash on
rtx4090d-x4: ~50 GB), for a speed-up not yet measured on GPUs: so it is held only where the host's usable memory
has room for it beside everything else the host holds (footprint.host_components), and a host that fits the
plan without it still compiles, its slices copied from the strided rows. After cost_model (which decides
whether the plan shards) and the placement (whose cold and re-placed rows the copy doubles a third of); in the
re-plan loop, since both can change."""

from __future__ import annotations

from ostinato.checkpoint import model_sizes

from .build import Build
from .footprint import host_components

GB = 1e9


def shard_copy(b: Build) -> None:
    b.shard_major_copy, b.shard_copy_why = False, ""
    if b.shard_threshold is None:  # no sharded uploads: nothing to copy slices from
        return
    expert = model_sizes(b.config).expert_bytes
    parts = host_components(b, expert, shard_major_copy=True)
    copy = parts.pop("shard_major_down")
    rest = sum(parts.values())
    room = b.hardware.host.usable_bytes - rest
    b.shard_major_copy = copy <= room
    b.shard_copy_why = shard_copy_line(b.shard_major_copy, copy, room)


def shard_copy_line(held: bool, copy: int, room: int) -> str:
    """The plan's choice in one line (the compile's notes, --explain): the copy's bytes, held or not and why;
    `room`: the host's usable bytes less everything else it holds."""
    if held:
        return (f"shard-major copy of the down matrices: {copy / GB:.1f} GB of host memory (held: the host has "
                f"room, {room / GB:.1f} GB beside the rest)")
    return (f"shard-major copy of the down matrices: {copy / GB:.1f} GB of host memory (not held: the host lacks "
            f"{(copy - room) / GB:.1f} GB; slices of w2 are copied from strided rows)")
