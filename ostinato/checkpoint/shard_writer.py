"""Write one safetensors shard tensor by tensor: memory bounded by the largest tensor, not the shard.

The safetensors layout is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the tensors' bytes back to back. Every spec's shape
and dtype are known before any value exists (tensor_specs), so the header is written first and
each tensor's bytes follow as soon as it is made, then dropped. `safetensors.torch.save_file`
would need the whole shard in memory: 3.4 GB for one V4-Flash layer's experts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from .tensor_specs import TensorSpec

_ALIGN = 8  # the header is padded with spaces so tensor data starts 8-byte aligned


def _header(specs: list[TensorSpec], metadata: dict[str, str]) -> bytes:
    entries: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for s in specs:
        entries[s.name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % _ALIGN)


def write_shard(path: Path, specs: list[TensorSpec],
                produce: Callable[[TensorSpec], Iterable[tuple[str, torch.Tensor]]],
                metadata: dict[str, str] | None = None) -> int:
    """Write `specs` to `path` in their order; `produce(spec)` yields (name, tensor) pairs for that
    spec and possibly the specs right after it (a weight and its scale come from one quantization).
    Returns the bytes of tensor data written. Each tensor must match its spec's shape and byte size."""
    by_name = {s.name: s for s in specs}
    header = _header(specs, metadata or {"format": "pt"})
    pending = [s.name for s in specs]
    written = 0
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        while pending:
            for name, tensor in produce(by_name[pending[0]]):
                spec = by_name.get(name)
                if spec is None or name != pending[0]:
                    raise ValueError(f"{path.name}: produced '{name}' out of order (expected '{pending[0]}')")
                data = tensor.contiguous().view(torch.uint8).reshape(-1)
                if tuple(tensor.shape) != spec.shape or data.numel() != spec.nbytes:
                    raise ValueError(f"{path.name}: tensor '{name}' is {tuple(tensor.shape)} {tensor.dtype}, "
                                     f"its spec says {spec.shape} {spec.dtype}")
                f.write(data.numpy().data)
                written += spec.nbytes
                pending.pop(0)
                del tensor, data  # a written tensor must not outlive its write: the next produce() makes the next
    return written
