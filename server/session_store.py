"""Sessions that survive a restart: a folder of session files (model/session_file.py), indexed in
memory by the token ids they hold, bounded in bytes.

    store = SessionStore(folder, engine_identity(engine), max_bytes)
    name, n = store.match(ids)            # the file that reuses the most of `ids` (prefix_cache's rule)
    session = store.load(name, model)     # a model Session, or None when the file was refused
    logits = store.end_logits(name, n)    # [V]: the kept logits after its first n tokens, or None
    store.save(tokens, session, (n, logits))   # the logits optional

The prefix cache (prefix_cache.py) writes a session here when it evicts one, after the worker has
had no job for `idle_s`, and when the worker stops; it loads one when a file holds more of a
request's prompt than any session in memory. A written file whose tokens extend another file's makes
that one redundant (deleted), as in memory.

Beside a session file, `<hash>.logits.safetensors` may keep the logits after the last prompt it prefilled
(prefix_cache's Entry.end_logits: [V] float32, 0.5 MB for V4-Flash): a file holds the prompt and its
reply, so an identical resend matches all of its prompt, and without those logits its last token (whose
logits give the reply's first) would have to be computed again: from the snapshot before it, which for
a first turn is the start. With them, the resend after a restart computes nothing, as it does in memory.
The logits file carries the identity and a SHA-256 like a session file; one that fails them is deleted and
the resend computes its last prompt token's turn again.

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
from safetensors import safe_open
from safetensors.torch import save_file

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
LOGITS_SUFFIX = ".logits.safetensors"
LOGITS_META, LOGITS_HASH = "ostinato.end_logits", "ostinato.sha256"
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


def logits_name(name: str) -> str:
    """The file beside session file `name` keeping its end logits."""
    return name.removesuffix(SUFFIX) + LOGITS_SUFFIX


def _logits_digest(meta: str, logits: torch.Tensor) -> str:
    return hashlib.sha256(meta.encode() + logits.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


@dataclass
class Stored:
    tokens: np.ndarray   # [n] int64, what the file's session holds
    size: int            # bytes on disk, its logits file's included
    logits_at: int | None = None  # its logits file keeps the logits after this many tokens (None: no file)


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
            stored.logits_at, size = self._logits_header(name, len(stored.tokens))
            stored.size += size
        indexed = {logits_name(name) for name, s in self.files.items() if s.logits_at is not None}
        for path in self.dir.glob("*" + LOGITS_SUFFIX):  # their session file is gone or was refused
            if path.name not in indexed:
                path.unlink(missing_ok=True)
        self._clock = max((f[0] for f in found), default=0)
        self._bound()
        log.info("session store %s: %d sessions, %d bytes", self.dir, len(self.files), self.bytes)

    def match(self, ids: list[int]) -> tuple[str | None, int]:
        """The stored file reusing the most of `ids` and how many tokens (the rule of PrefixCache.acquire:
        at most len(ids) - 1, all of them where the file keeps the logits after exactly `ids`); (None, 0)
        when none does. The whole prompt is worth a load whatever the file's length: its reply may be
        longer than it, and the file stays on disk."""
        best, best_n = None, 0
        if len(ids) < 2:
            return best, best_n
        want = np.asarray(ids, dtype=np.int64)
        for name, s in self.files.items():
            n = common(s.tokens, want)
            whole = n == len(ids) and s.logits_at == n
            n = n if whole else min(n, len(ids) - 1)
            if n > best_n and (whole or reusable(n, len(s.tokens))):
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

    def save(self, tokens: list[int], session: Session, end_logits: tuple[int, torch.Tensor] | None = None) -> bool:
        """Store `session` (holding `tokens`; current, see EngineSession.state), and `end_logits` (n, [V]: the
        logits after its first n tokens) beside it; whether it is stored now."""
        if not tokens:
            return False
        name, held = file_name(tokens), np.asarray(tokens, dtype=np.int64)
        if name in self.files and np.array_equal(self.files[name].tokens, held):
            self._touch(name)  # these tokens are on disk already (a session loaded and not extended)
            self._save_logits(name, end_logits)
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
        self._save_logits(name, end_logits)
        self._touch(name)
        if size > self.max_bytes:
            log.warning("session store: %s takes %d bytes, more than the bound of %d: not kept", name, size,
                        self.max_bytes)
        self._bound()
        return name in self.files

    # -- the logits beside a session file ---------------------------------------------------------------
    def _save_logits(self, name: str, end_logits: tuple[int, torch.Tensor] | None) -> None:
        """Write `end_logits` beside session file `name` (atomically, as a session file), unless it has them."""
        stored = self.files[name]
        if end_logits is None or stored.logits_at == end_logits[0] or not 0 < end_logits[0] <= len(stored.tokens):
            return
        path, logits = self.dir / logits_name(name), end_logits[1].detach().float().cpu().contiguous()
        meta = json.dumps({"session": name, "position": end_logits[0], "identity": self.identity})
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        try:
            save_file({"logits": logits}, tmp, metadata={LOGITS_META: meta, LOGITS_HASH: _logits_digest(meta, logits)})
            os.replace(tmp, path)
        except Exception as e:  # a full disk: the session is stored, its logits are not
            log.warning("session store: could not write %s: %s: %s", path, type(e).__name__, e)
            return
        finally:
            tmp.unlink(missing_ok=True)
        old = stored.logits_at is not None
        stored.logits_at = end_logits[0]
        stored.size += 0 if old else path.stat().st_size

    def _logits_header(self, name: str, held: int) -> tuple[int | None, int]:
        """(the position its logits file keeps logits at, the file's size) from the header, or (None, 0)
        when there is none or it does not belong to this session file (then it is deleted)."""
        path = self.dir / logits_name(name)
        if not path.exists():
            return None, 0
        try:
            with safe_open(str(path), "pt") as f:
                meta = json.loads(f.metadata()[LOGITS_META])
            position = meta["position"]
            if meta["session"] != name or meta["identity"] != self.identity or not 0 < position <= held:
                raise ValueError(f"it is not this session's: {meta['session']} at {position}")
        except Exception as e:
            log.warning("session store: deleted %s: %s: %s", path, type(e).__name__, e)
            path.unlink(missing_ok=True)
            return None, 0
        return position, path.stat().st_size

    def end_logits(self, name: str, n: int) -> torch.Tensor | None:
        """The logits kept beside `name` after its first n tokens ([V] float32, on the CPU), or None: there are
        none at n, or their file fails its SHA-256 (then it is deleted, logged)."""
        stored = self.files.get(name)
        if stored is None or stored.logits_at != n:
            return None
        path = self.dir / logits_name(name)
        try:
            with safe_open(str(path), "pt") as f:
                text, digest, logits = f.metadata()[LOGITS_META], f.metadata()[LOGITS_HASH], f.get_tensor("logits")
            if _logits_digest(text, logits) != digest:
                raise ValueError("corrupt: the SHA-256 of its contents is not the one written")
        except Exception as e:
            log.warning("session store: deleted %s: %s: %s", path, type(e).__name__, e)
            self._drop_logits(name)
            return None
        return logits

    def _drop_logits(self, name: str) -> None:
        stored = self.files.get(name)
        path = self.dir / logits_name(name)
        if stored is not None and stored.logits_at is not None:
            stored.logits_at = None
            stored.size -= path.stat().st_size if path.exists() else 0
        path.unlink(missing_ok=True)

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
        (self.dir / logits_name(name)).unlink(missing_ok=True)

    def _refuse(self, name: str, reason: str) -> None:
        """Log why `name` is not used and move it aside (delete it when that fails), named by the identity in
        its header: the same tokens from two models are two files there, and each identity keeps its own
        newest REFUSED_KEPT."""
        self.files.pop(name, None)
        (self.dir / logits_name(name)).unlink(missing_ok=True)
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
