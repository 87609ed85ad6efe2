"""One safetensors shard: its header read eagerly (cheap), its data opened lazily (mmap).

Reading the header ourselves gives shapes, dtypes and offsets without touching tensor data, which
is all planning needs, and lets us detect a truncated file before anything is loaded.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from .errors import CheckpointError

_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit


@dataclass(frozen=True)
class HeaderEntry:
    dtype: str
    shape: tuple[int, ...]
    begin: int  # offsets relative to the start of the data section
    end: int


class Shard:
    """A safetensors file. `entries` is parsed on construction; data is opened on first `get`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.entries, self.data_start, self.file_size = self._read_header()
        self._handle = None

    def _read_header(self) -> tuple[dict[str, HeaderEntry], int, int]:
        path = self.path
        if not path.exists():
            raise CheckpointError(path, "shard file is missing")
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(path, f"truncated: {size} bytes is too short for a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise CheckpointError(path, f"truncated or corrupt: header claims {n} bytes, file has {size}")
            try:
                raw = json.loads(f.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise CheckpointError(path, f"corrupt safetensors header ({e})") from None
        entries = {}
        data_size = size - 8 - n
        for name, e in raw.items():
            if name == "__metadata__":
                continue
            try:
                begin, end = (int(x) for x in e["data_offsets"])
                entry = HeaderEntry(str(e["dtype"]), tuple(int(x) for x in e["shape"]), begin, end)
            except (KeyError, TypeError, ValueError):
                raise CheckpointError(path, "malformed header entry", tensor=name) from None
            if end > data_size:
                raise CheckpointError(path, f"truncated: tensor data ends at byte {end} of the data section, "
                                      f"which holds only {data_size} bytes", tensor=name)
            entries[name] = entry
        return entries, 8 + n, size

    @property
    def is_open(self) -> bool:
        return self._handle is not None

    def get(self, name: str) -> torch.Tensor:
        if name not in self.entries:
            raise CheckpointError(self.path, "tensor is not in this file", tensor=name)
        if self._handle is None:
            self._handle = safe_open(str(self.path), framework="pt", device="cpu")
        return self._handle.get_tensor(name)

    def close(self) -> None:
        self._handle = None
