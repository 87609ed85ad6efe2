"""What each device holds under a placement, by kind: a GPU's layers, hot experts and fixed buffers; the
host's cold experts and workspace. The placement pass checks the host against it; the plan pass writes it
as the plan's memory rows."""

from __future__ import annotations

from ostinato.plan import DeviceMemory

from ..memory_model import host_expert_bytes, workspace_bytes
from .build import Build
from .policy import adapt_policy


def device_components(b: Build, g: int, expert: int) -> dict[str, int]:
    """What GPU g holds under the placement, by kind (its plan.memory row)."""
    cfg, pl = b.config, b.placement
    comps = {"dense_weights": 0, "kv_cache": 0, "kv_snapshots": 0, "decode_state": 0, "decode_graph": 0}
    for l in range(cfg.n_layers):
        if pl.layer_gpu[l] == g:
            for k, v in b.layer_bytes[l].items():
                comps[k] += v
    hot = sum(len(pl.hot[l]) for l in range(cfg.n_layers) if pl.layer_gpu[l] == g)
    if b.mtp_placed and g == pl.layer_gpu[-1]:  # the MTP block, beside the head: a layer's components
        for k, v in b.mtp_bytes.items():
            comps[k] = comps.get(k, 0) + v
        hot += len(pl.mtp_hot)
    comps["hot_experts"] = hot * expert
    comps.update(b.gpu_fixed[g])
    return comps


def host_components(b: Build, expert: int, shard_major_copy: bool | None = None) -> dict[str, int]:
    """What the host holds under the placement, by kind (its plan.memory row); `shard_major_copy`: whether it
    holds the down matrices' shard-major copy (default: the plan's choice, b.shard_major_copy)."""
    cfg = b.config
    n_cold = sum(cfg.n_routed_experts - len(h) for h in b.placement.hot)
    if b.mtp_placed:  # the MTP block's cold experts, like a layer's
        n_cold += cfg.n_routed_experts - len(b.placement.mtp_hot)
    n_hot = sum(len(h) for h in b.placement.hot)  # the model's layers: the MTP block's experts never move
    # Host rows of experts (memory_model.host_expert_bytes): the checkpoint's mapped pages on a CPU run,
    # pinned copies with GPUs; with re-placement the hot ones' rows too.
    copy = b.shard_major_copy if shard_major_copy is None else shard_major_copy
    return {**host_expert_bytes(n_cold, n_hot, expert, adapt_policy(b).mode, copy),
            "cpu_workspace": workspace_bytes(cfg, b.policy.prefill_chunk)}


def device_memory(device: str, usable: int, components: dict[str, int]) -> DeviceMemory:
    total = sum(components.values())
    return DeviceMemory(device=device, usable_bytes=usable, components=components, total_bytes=total,
                        free_bytes=usable - total)
