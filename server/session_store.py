"""Sessions that survive a restart: a folder of session files (model/session_file.py), indexed in
memory by the token ids they hold, bounded in bytes.

    store = SessionStore(folder, engine_identity(engine), max_bytes)
    name, n = store.match(ids)            # the file that reuses the most of `ids` (prefix_cache's rule)
    session = store.load(name, model)     # a model Session, or None when the file was refused
    store.save(tokens, session)

The prefix cache (prefix_cache.py) writes a session here when it evicts one, after the worker has
had no job for `idle_s`, and when the worker stops; it loads one when a file holds more of a
request's prompt than any session in memory. A written file whose tokens extend another file's makes
that one redundant (deleted), as in memory.

The index is rebuilt at start from the files' headers (token ids and identity; the tensors are read
only by a load). Least recently used files (written or loaded; a file's mtime, so the order survives
a restart) are deleted to keep the folder under max_bytes. A file that is corrupt, truncated, from
another model (config, index or weights: same layout, other bytes is another model), plan or dtype,
or otherwise unusable is refused by name: logged with the reason, moved to refused/ in the folder
under a name that starts with a tag of the identity in its header, and the prompt is recomputed.
refused/ keeps the newest REFUSED_KEPT files of each identity tag, so a later run refusing files of
another kind (corrupt ones, or another model's) never pushes them out. One server per folder: two would
delete each other's files, so ostinato-serve holds the folder's lock (session_lock.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ostinato.checkpoint.fingerprint import model_fingerprint
from ostinato.checkpoint.weight_fingerprint import weight_fingerprint
from ostinato.runtime.model.session import Session
from ostinato.runtime.model.session_file import (
    SessionFileError,
    check_identity,
    read_header,
    read_session,
    write_session,
)

from .prefix_cache import reusable

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 8 << 30
DEFAULT_IDLE_S = 10.0
SUFFIX = ".session.safetensors"
REFUSED_KEPT = 4


def engine_identity(engine) -> dict[str, str | None]:
    """What a stored cache was computed with: a file from another checkpoint (config and index: "model";
    the shards' bytes: "weights", None without weights), plan or dtype is refused. The weights'
    digests were computed when the engine loaded (cached: this costs a stat per shard)."""
    weights = weight_fingerprint(engine.model_dir)
    return {"model": model_fingerprint(engine.model_dir).combined, "weights": weights.combined if weights else None,
            "plan": engine.plan.sha256, "dtype": str(engine.model.dtype).removeprefix("torch.")}


def identity_tag(identity: object) -> str:
    """A short name for an identity (a refused file's name starts with its file's)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]


def file_name(tokens) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:32] + SUFFIX


def common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix (vectorized: a scan compares every stored file with each prompt)."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


@dataclass
class Stored:
    tokens: np.ndarray   # [n] int64, what the file's session holds
    size: int            # bytes on disk


@dataclass
class StoreStats:
    saved: int = 0
    loaded: int = 0
    refused: int = 0
    deleted: int = 0     # least recently used, for the byte bound


class SessionStore:
    def __init__(self, directory: str | Path, identity: dict, max_bytes: int = DEFAULT_MAX_BYTES,
                 idle_s: float = DEFAULT_IDLE_S):
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.dir, self.identity, self.max_bytes, self.idle_s = Path(directory), identity, max_bytes, idle_s
        self.dir.mkdir(parents=True, exist_ok=True)
        self.files: OrderedDict[str, Stored] = OrderedDict()  # least recently used first
        self.stats = StoreStats()
        self._clock = 0  # the last use stamped on a file (ns): strictly increasing, unlike coarse file times
        self._scan()

    def __len__(self) -> int:
        return len(self.files)

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.files.values())

    def _scan(self) -> None:
        found = []
        for path in self.dir.iterdir():
            if path.name.startswith(".") and ".tmp" in path.name:  # a write a crash cut short
                log.info("session store: removed the unfinished write %s", path)
                path.unlink(missing_ok=True)
            elif path.name.endswith(SUFFIX) and path.is_file():
                try:
                    meta = read_header(path)
                    check_identity(meta, self.identity)
                except SessionFileError as e:
                    self._refuse(path.name, str(e))
                    continue
                st = path.stat()
                found.append((st.st_mtime_ns, path.name, Stored(np.asarray(meta["tokens"], np.int64), st.st_size)))
        for _, name, stored in sorted(found, key=lambda f: f[:2]):
            self.files[name] = stored
        self._clock = max((f[0] for f in found), default=0)
        self._bound()
        log.info("session store %s: %d sessions, %d bytes", self.dir, len(self.files), self.bytes)

    def match(self, ids: list[int]) -> tuple[str | None, int]:
        """The stored file reusing the most of `ids` and how many tokens (at most len(ids) - 1, the rule of
        PrefixCache.acquire); (None, 0) when none does."""
        best, best_n = None, 0
        if len(ids) < 2:
            return best, best_n
        want = np.asarray(ids, dtype=np.int64)
        for name, s in self.files.items():
            n = min(common(s.tokens, want), len(ids) - 1)
            if n > best_n and reusable(n, len(s.tokens)):
                best, best_n = name, n
        return best, best_n

    def load(self, name: str, model) -> Session | None:
        """The session stored as `name` on `model`, or None: the file was refused (logged, moved aside)."""
        try:
            session = read_session(self.dir / name, model, self.identity)
            if not np.array_equal(np.asarray(session.tokens, np.int64), self.files[name].tokens):
                raise SessionFileError("its token ids are not the ones its header had at the scan")
        except torch.OutOfMemoryError as e:  # nothing wrong with the file
            log.warning("session file %s not loaded: %s", self.dir / name, e)
            return None
        except Exception as e:  # SessionFileError, or anything else it trips: refused, never a crash
            self._refuse(name, str(e) if isinstance(e, SessionFileError) else f"{type(e).__name__}: {e}")
            return None
        self.stats.loaded += 1
        self._touch(name)
        return session

    def save(self, tokens: list[int], session: Session) -> bool:
        """Store `session` (holding `tokens`; current, see EngineSession.state); whether it is stored now."""
        if not tokens:
            return False
        name, held = file_name(tokens), np.asarray(tokens, dtype=np.int64)
        if name in self.files and np.array_equal(self.files[name].tokens, held):
            self._touch(name)  # these tokens are on disk already (a session loaded and not extended)
            return True
        start = time.perf_counter()
        try:
            size = write_session(self.dir / name, session, self.identity)
        except Exception as e:  # a full disk, a permission: the session just is not stored
            log.warning("session store: could not write %s: %s: %s", self.dir / name, type(e).__name__, e)
            return False
        log.info("session store: wrote %s (%d tokens, %d bytes, %.3f s)", name, len(held), size,
                 time.perf_counter() - start)
        self.stats.saved += 1
        for other, s in list(self.files.items()):  # a file holding a prefix of these tokens is redundant
            if other != name and len(s.tokens) <= len(held) and common(s.tokens, held) == len(s.tokens):
                self._delete(other)
        self.files[name] = Stored(held, size)
        self._touch(name)
        if size > self.max_bytes:
            log.warning("session store: %s takes %d bytes, more than the bound of %d: not kept", name, size,
                        self.max_bytes)
        self._bound()
        return name in self.files

    def _touch(self, name: str) -> None:
        """Make `name` the most recently used, in memory and in its file's mtime (the next scan's order)."""
        self.files.move_to_end(name)
        self._clock = max(time.time_ns(), self._clock + 1)
        try:
            os.utime(self.dir / name, ns=(self._clock, self._clock))
        except OSError:
            pass

    def _bound(self) -> None:
        total = self.bytes
        while total > self.max_bytes and self.files:
            name, s = next(iter(self.files.items()))
            log.info("session store: deleted %s, the least recently used (%d bytes over the bound)", name,
                     total - self.max_bytes)
            self._delete(name)
            self.stats.deleted += 1
            total -= s.size

    def _delete(self, name: str) -> None:
        self.files.pop(name, None)
        (self.dir / name).unlink(missing_ok=True)

    def _refuse(self, name: str, reason: str) -> None:
        """Log why `name` is not used and move it aside (delete it when that fails), named by the identity in
        its header: the same tokens from two models are two files there, and each identity keeps its own
        newest REFUSED_KEPT."""
        self.files.pop(name, None)
        self.stats.refused += 1
        path, aside = self.dir / name, self.dir / "refused"
        try:
            tag = identity_tag(read_header(path).get("identity"))
        except Exception:  # unreadable: its own group
            tag = "unreadable"
        try:
            aside.mkdir(exist_ok=True)
            moved = aside / f"{tag}-{name}"
            os.replace(path, moved)
            os.utime(moved)
            kept = sorted(aside.glob(f"{tag}-*"), key=lambda p: p.stat().st_mtime_ns)
            for old in kept[:-REFUSED_KEPT]:
                old.unlink(missing_ok=True)
            where = f"moved to {moved}"
        except OSError:
            path.unlink(missing_ok=True)
            where = "deleted"
        log.warning("session file %s refused: %s; %s", path, reason, where)
