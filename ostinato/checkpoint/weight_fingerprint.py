"""The weights' fingerprint: a SHA-256 of every shard's bytes, so a checkpoint with the same layout
and other weights (a re-quantization, an update, a fine-tune) is another model.

fingerprint.py hashes config.json and the index only: cheap, and blind to the weights. A plan (its
provenance) and every session file carry this fingerprint too, so a plan is refused at load when its
weights changed after compile (the message names the shard) and a session computed with other
weights is never reused. The shards are the files the weight map names (what the loader reads);
each is hashed whole (header and tensor bytes) in 16 MiB blocks, a few shards at a time (hashlib
drops the GIL while it hashes), once: digest_cache.py remembers each by path and stat. A long hash
(the first start on V4-Flash) shows a bar on stderr.

A folder without its weight files (planning from config.json alone) has no weight fingerprint: None.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .digest_cache import ALGORITHM, cached_digest, remember_digest, stat_key
from .errors import CheckpointError
from .reader import INDEX_NAME, SINGLE_NAME

BLOCK = 16 << 20
LONG_BYTES = 1 << 30   # hashing at least this much shows a progress bar (about a second or more)
WORKERS = 4            # shards hashed at once: enough to keep an NVMe drive busy


@dataclass(frozen=True)
class WeightFingerprint:
    shards: dict[str, str]   # shard file name -> sha256 of its bytes, in name order

    @property
    def combined(self) -> str:
        """One digest for all shards (names and digests), for identities that need a single string."""
        return hashlib.sha256(json.dumps(self.shards, sort_keys=True).encode()).hexdigest()


def shard_files(directory: str | Path) -> list[str]:
    """The weight files the checkpoint's weight map names (sorted); [] without an index or a single file."""
    directory = Path(directory)
    index = directory / INDEX_NAME
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            return sorted(set(map(str, weight_map.values())))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(index, f"unreadable weight map: {e}", field="weight_map") from None
    return [SINGLE_NAME] if (directory / SINGLE_NAME).exists() else []


def weight_fingerprint(directory: str | Path, progress: bool | None = None) -> WeightFingerprint | None:
    """The fingerprint of the weights in `directory`; None when its weights are not all there (config.json
    and maybe an index alone: planning only; a folder missing a shard cannot be loaded either, and the
    loader names the shard). `progress`: a bar on stderr; None: only when there is at least LONG_BYTES
    to hash."""
    directory = Path(directory)
    files = shard_files(directory)
    if not files or not all((directory / f).is_file() for f in files):
        return None
    digests = {f: cached_digest(directory / f) for f in files}
    todo = [f for f in files if digests[f] is None]
    if todo:
        total = sum((directory / f).stat().st_size for f in todo)
        show = total >= LONG_BYTES if progress is None else progress
        with tqdm(total=total, unit="B", unit_scale=True, file=sys.stderr, disable=not show, mininterval=1.0,
                  desc=f"fingerprinting weights ({len(todo)} shards, once: remembered for later starts)") as bar:
            lock = threading.Lock()

            def advance(n: int) -> None:
                with lock:
                    bar.update(n)

            with ThreadPoolExecutor(max_workers=min(WORKERS, len(todo), os.cpu_count() or 1)) as pool:
                for f, digest in zip(todo, pool.map(lambda f: _hash_and_remember(directory / f, advance), todo)):
                    digests[f] = digest
    return WeightFingerprint(dict(sorted(digests.items())))


def _hash_and_remember(path: Path, advance) -> str:
    key = stat_key(path)
    digest = hash_file(path, advance)
    remember_digest(path, digest, key)
    return digest


def hash_file(path: Path, advance=lambda n: None) -> str:
    """SHA-256 of the file's bytes, streamed in BLOCK-sized reads into one reused buffer."""
    h, buf = hashlib.new(ALGORITHM), bytearray(BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            advance(n)
    return h.hexdigest()
