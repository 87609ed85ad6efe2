"""Model fingerprints: what ties a plan or a routing profile to one checkpoint.

The fingerprint hashes config.json and the weight index as they are on disk (bytes), so any
change of shapes, sharding or names gives another fingerprint, while the weights' bytes (hundreds
of GB) are never read. A directory with config.json alone (planning the real model without its
files) has no index; its fingerprint says so.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError
from .reader import INDEX_NAME, SINGLE_NAME


@dataclass(frozen=True)
class ModelFingerprint:
    config_sha256: str
    index_sha256: str | None   # None when the directory has no index (config.json alone)

    @property
    def combined(self) -> str:
        h = hashlib.sha256(self.config_sha256.encode())
        h.update((self.index_sha256 or "no-index").encode())
        return h.hexdigest()


def model_fingerprint(directory: str | Path) -> ModelFingerprint:
    directory = Path(directory)
    config = directory / "config.json"
    if not config.exists():
        raise CheckpointError(config, "config.json not found")
    index = directory / INDEX_NAME
    if not index.exists():
        # A single-file checkpoint: its header plays the index's role.
        single = directory / SINGLE_NAME
        index = single if single.exists() else None
    index_hash = None
    if index is not None:
        index_hash = _sha256_file(index) if index.name == INDEX_NAME else _sha256_header(index)
    return ModelFingerprint(_sha256_file(config), index_hash)


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sha256_header(path: Path) -> str:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return hashlib.sha256(f.read(n)).hexdigest()
