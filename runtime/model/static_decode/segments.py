"""Pipeline segments of the decode step: runs of consecutive layers on the same device.

A later CUDA-graph runner captures one graph per segment (one per GPU of the pipeline); between
segments the residual streams and the token id are copied into the next segment's input buffers.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Segment(NamedTuple):
    device: torch.device
    first_layer: int
    end_layer: int  # exclusive


def pipeline_segments(layer_devices: list[torch.device]) -> list[Segment]:
    """layer_devices[i] = device of layer i -> the maximal runs of equal devices, in layer order."""
    segments: list[Segment] = []
    for layer, dev in enumerate(layer_devices):
        if segments and segments[-1].device == dev:
            segments[-1] = segments[-1]._replace(end_layer=layer + 1)
        else:
            segments.append(Segment(dev, layer, layer + 1))
    return segments
