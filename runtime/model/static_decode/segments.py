"""Pipeline segments of the decode step: runs of consecutive layers on one planned GPU.

The CUDA-graph runner captures one graph per segment (one per GPU of the pipeline); between
segments the host copies the residual streams and the token id into the next segment's input
buffers (StaticStep.hand_off). Segments follow the plan's GPUs, not torch devices: a plan
whose GPUs all map to the CPU keeps its segments, so CPU runs hand off where GPU runs do.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Segment(NamedTuple):
    device: torch.device
    first_layer: int
    end_layer: int  # exclusive


def pipeline_segments(layer_devices: list[torch.device], layer_gpus: list[int] | None = None) -> list[Segment]:
    """layer_devices[i] = device of layer i, layer_gpus[i] = its planned GPU (default: by device) ->
    the maximal runs of layers on one planned GPU, in layer order."""
    keys = layer_devices if layer_gpus is None else layer_gpus
    if len(keys) != len(layer_devices):
        raise ValueError(f"layer_gpus names {len(keys)} layers, the model has {len(layer_devices)}")
    segments: list[Segment] = []
    for layer, dev in enumerate(layer_devices):
        if segments and keys[layer] == keys[segments[-1].first_layer]:
            segments[-1] = segments[-1]._replace(end_layer=layer + 1)
        else:
            segments.append(Segment(dev, layer, layer + 1))
    return segments
