"""Remembered file digests: a shard's SHA-256 is computed once, then found again by what stat says.

V4-Flash's shards are ~160 GB; hashing them takes minutes, so every start after the first looks the
digest up instead. An entry is keyed by the file's resolved path and its (size, mtime_ns, ctime_ns,
inode): a rewrite in place changes mtime and ctime, a copy or a tmp-file-and-rename changes the
inode, and ctime cannot be set back by a tool that restores mtime (cp -p, rsync -t), so a stale entry
is never taken for a changed file (nor is a file remembered that was written in the last seconds: file
times tick coarsely, see remember_digest). A chmod or a new hard link changes ctime too: that costs one more
hash, not a wrong answer.

Entries live in a cache folder, not beside the checkpoint: checkpoint folders are often read-only or
shared, and the committed planning folder (plans/models/) is under git. The folder is
$OSTINATO_CACHE_DIR, else $XDG_CACHE_HOME/ostinato, else ~/.cache/ostinato, else one under the
system temp folder; the first that can be written is used, and when none can, digests are just not
remembered (the next start hashes again): caching never makes a start fail.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

SUBFOLDER = "shard-digests"
RACY_NS = 2_000_000_000   # a file modified less than this before it was hashed is not remembered
ALGORITHM = "sha256"  # OpenSSL's, with the CPU's SHA extensions: faster than hashlib's blake2b on x86


def cache_folders() -> list[Path]:
    """Where entries may be, in the order they are tried (written to the first that works)."""
    roots = []
    if os.environ.get("OSTINATO_CACHE_DIR"):
        roots.append(Path(os.environ["OSTINATO_CACHE_DIR"]))
    if os.environ.get("XDG_CACHE_HOME"):
        roots.append(Path(os.environ["XDG_CACHE_HOME"]) / "ostinato")
    roots.append(Path.home() / ".cache" / "ostinato")
    roots.append(Path(tempfile.gettempdir()) / f"ostinato-{os.getuid() if hasattr(os, 'getuid') else 'user'}")
    return [r / SUBFOLDER for r in roots]


def _key(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "inode": st.st_ino, "algorithm": ALGORITHM}


def _entry_name(path: Path) -> str:
    return hashlib.sha256(str(path).encode()).hexdigest()[:32] + ".json"


def cached_digest(path: str | Path) -> str | None:
    """The remembered digest of `path` as it is now, or None (never seen, or changed since)."""
    path = Path(path).resolve()
    key = _key(path)
    for folder in cache_folders():
        try:
            entry = json.loads((folder / _entry_name(path)).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict) and {k: entry.get(k) for k in key} == key and isinstance(entry.get("digest"), str):
            return entry["digest"]
    return None


def remember_digest(path: str | Path, digest: str, key: dict | None = None) -> Path | None:
    """Remember `digest` for `path`; `key`: the stat taken before hashing (a file changed while it was
    hashed then misses next time instead of matching a digest of mixed bytes). Returns the entry's
    file, or None when no cache folder could be written."""
    path = Path(path).resolve()
    key = key or _key(path)
    if key != _key(path):
        return None
    if time.time_ns() - key["mtime_ns"] < RACY_NS:
        # File times tick coarsely (a few ms): a file written this recently could be written again within
        # the same tick, keeping size and mtime, and its entry would then match other bytes (git's "racy" case).
        return None
    text = json.dumps({**key, "digest": digest}, sort_keys=True)
    for folder in cache_folders():
        entry = folder / _entry_name(path)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{entry.name}.tmp{os.getpid()}"
            tmp.write_text(text)
            os.replace(tmp, entry)
            return entry
        except OSError:
            continue
    log.warning("no writable cache folder (tried %s): the digest of %s is not remembered",
                ", ".join(map(str, cache_folders())), path)
    return None


def stat_key(path: str | Path) -> dict:
    """What an entry for `path` is keyed by, now (take it before hashing; pass it to remember_digest)."""
    return _key(Path(path).resolve())
