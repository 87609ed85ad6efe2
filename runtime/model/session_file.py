"""A session as one file: its KV cache, its latest turn-boundary snapshots and its token ids, so a
restarted server continues it exactly (server/session_store.py keeps a folder of them).

    write_session(path, session, identity)          # atomic: temp file in the same folder, fsync, os.replace
    header = read_header(path)                      # cheap: the safetensors header only (a folder scan)
    session = read_session(path, model, identity)   # SessionFileError (with the reason) when refused

Format: safetensors, so loading executes nothing; every tensor is written from the CPU and goes back
to its layer's device on load. The header's metadata holds, as JSON, what the file is (FORMAT), who
computed it (`identity`: model, weights, plan, dtype; anything else refuses it), the token ids (what a scan
needs), the layout (which tensors make each layer's state and each snapshot) and a SHA-256 over that
JSON and every tensor's bytes: safetensors checks the structure, the hash catches flipped bytes, so
nothing a file claims is reused unless it is exactly what was written. Constant-size state is
immutable and snapshots hold references to it (kv_cache.py), so a tensor shared by the current state
and a snapshot is written once and shared again after loading.

Snapshots: the latest KEEP_SNAPSHOTS only; each costs the sliding windows and partial compressor
windows (about 16 MB for V4-Flash in bf16), and a truncation before the oldest kept one re-prefills
from the start, as for a session that never had it.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .compressor import CompressorState
from .kv_cache import CacheSnapshot, KvCache, LayerCache, LayerSnapshot
from .session import Session

FORMAT = "ostinato-session/1"
KEEP_SNAPSHOTS = 8
META_KEY, HASH_KEY = "ostinato.session", "ostinato.sha256"
MAX_HEADER = 100_000_000  # safetensors' own limit; a 1M-token session's ids take about 7 MB


class SessionFileError(Exception):
    """A session file that must not be used; str(e) is the reason."""


# ----- writing -----------------------------------------------------------------------------------
class _Tensors:
    """Names for the tensors to write, each distinct tensor once (snapshots share the current state's)."""

    def __init__(self):
        self.named: dict[str, torch.Tensor] = {}
        self._names: dict[tuple, str] = {}

    def add(self, t: torch.Tensor | None) -> str | None:
        if t is None:
            return None
        key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
        if key not in self._names:
            self._names[key] = name = f"t{len(self.named)}"
            self.named[name] = t.detach().to("cpu").contiguous()
        return self._names[key]

    def comp(self, c: CompressorState | None) -> list | None:
        return None if c is None else [self.add(t) for t in (c.buf_kv, c.buf_gate, c.prev_kv, c.prev_gate)]


def _layout(session: Session, keep_snapshots: int) -> tuple[dict, dict[str, torch.Tensor]]:
    tensors, layers = _Tensors(), []
    for lc in session.cache.layers:
        layers.append({"window": tensors.add(lc.window), "comp": tensors.comp(lc.comp),
                       "rows": tensors.add(lc.rows.view()) if lc.rows is not None else None,
                       "index_comp": tensors.comp(lc.index_comp),
                       "index_rows": tensors.add(lc.index_rows.view()) if lc.index_rows is not None else None})
    snapshots = [{"position": s.position, "layers": [
        {"window": tensors.add(ls.window), "comp": tensors.comp(ls.comp), "index_comp": tensors.comp(ls.index_comp),
         "n_rows": ls.n_rows, "n_index_rows": ls.n_index_rows} for ls in s.layers]}
        for s in session.snapshots[-keep_snapshots:] if keep_snapshots > 0]
    return {"position": session.cache.position, "layers": layers, "snapshots": snapshots}, tensors.named


def _digest(meta: str, tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256(meta.encode())
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}:{t.dtype}:{list(t.shape)};".encode())
        if t.numel():
            h.update(t.contiguous().view(torch.uint8).numpy().data)
    return h.hexdigest()


def write_session(path: str | Path, session: Session, identity: dict, keep_snapshots: int = KEEP_SNAPSHOTS) -> int:
    """Write `session` (a model session, current: see EngineSession.state) to `path` atomically; its size."""
    path = Path(path)
    if session.cache.position != len(session.tokens):
        raise ValueError(f"the cache holds {session.cache.position} positions, the session "
                         f"{len(session.tokens)} tokens")
    layout, tensors = _layout(session, keep_snapshots)
    meta = json.dumps({"format": FORMAT, "identity": identity, "tokens": session.tokens, **layout})
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        save_file(tensors, tmp, metadata={META_KEY: meta, HASH_KEY: _digest(meta, tensors)})
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path.stat().st_size


# ----- reading -----------------------------------------------------------------------------------
def read_header(path: str | Path) -> dict:
    """The file's metadata (format, identity, tokens, layout), reading only its header; refuses a file
    that is not one of ours or whose size is not what its header says (a truncated or extended file)."""
    return _header(Path(path))[0]


def _header(path: Path) -> tuple[dict, str, str]:
    """(metadata, its JSON as written, the SHA-256 written with it)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SessionFileError(f"{len(head)} bytes: shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER:
                raise SessionFileError(f"header length {n} is not plausible (not a safetensors file?)")
            raw = f.read(n)
        size = path.stat().st_size
    except OSError as e:
        raise SessionFileError(f"unreadable: {e}") from None
    if len(raw) < n:
        raise SessionFileError(f"truncated: {size} bytes, the header alone takes {8 + n}")
    try:
        header = json.loads(raw)
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        text, digest = header["__metadata__"][META_KEY], header["__metadata__"][HASH_KEY]
        meta = json.loads(text)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise SessionFileError(f"not an Ostinato session file (header: {type(e).__name__}: {e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise SessionFileError(f"format {meta.get('format') if isinstance(meta, dict) else None!r}, "
                               f"this Ostinato reads {FORMAT!r}")
    expected = 8 + n + max(ends, default=0)
    if size != expected:
        raise SessionFileError(f"{'truncated' if size < expected else 'extended'}: {size} bytes, "
                               f"the header says {expected}")
    tokens = meta.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise SessionFileError("the header's token ids are not a list of integers")
    return meta, text, digest


def check_identity(meta: dict, identity: dict) -> None:
    """Refuse a file computed by another model (its config and index, or its weights), plan or dtype, naming
    what differs."""
    theirs = meta.get("identity")
    if not isinstance(theirs, dict):
        raise SessionFileError("the header has no identity")
    for key in sorted(set(identity) | set(theirs)):
        if theirs.get(key) != identity.get(key):
            what = "other weights" if key == "weights" else f"another {key}"
            raise SessionFileError(f"computed with {what}: {theirs.get(key)!r} in the file, "
                                   f"{identity.get(key)!r} here")


def read_session(path: str | Path, model, identity: dict) -> Session:
    """The session stored at `path`, on `model`'s devices; SessionFileError when it must not be used."""
    meta, text, digest = _header(Path(path))
    check_identity(meta, identity)
    try:
        tensors = load_file(str(path))
    except Exception as e:  # safetensors' own checks (it raises its own error type)
        raise SessionFileError(f"unreadable tensors: {type(e).__name__}: {e}") from None
    if _digest(text, tensors) != digest:
        raise SessionFileError("corrupt: the SHA-256 of its contents is not the one written")
    try:
        return _Builder(model, tensors).session(meta)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise SessionFileError(f"its layout does not fit this model: {type(e).__name__}: {e}") from None


class _Builder:
    """Rebuilds a session from the file's tensors, checked against a fresh cache of `model`."""

    def __init__(self, model, tensors: dict[str, torch.Tensor]):
        self.model, self.tensors, self.placed = model, tensors, {}
        self.template = model.new_cache()

    def tensor(self, name: str, dtype: torch.dtype, width: int, device: torch.device) -> torch.Tensor:
        if (name, device) not in self.placed:
            t = self.tensors[name]
            if t.dtype != dtype or t.dim() != 2 or t.shape[1] != width:
                raise ValueError(f"tensor {name} is {t.dtype} {list(t.shape)}, expected {dtype} [n, {width}]")
            self.placed[name, device] = t.to(device)
        return self.placed[name, device]

    def comp(self, names, like: CompressorState | None, width: int, device) -> CompressorState | None:
        if (names is None) != (like is None):
            raise ValueError("a compressor state where the model has none, or none where it has one")
        if names is None:
            return None
        if len(names) != 4 or names[0] is None or names[1] is None or (names[2] is None) != (names[3] is None):
            raise ValueError(f"a compressor state of tensors {names}")
        c = like.buf_kv.shape[1]
        kv, gate = (self.tensor(n, torch.float32, c, device) for n in names[:2])
        prev = [None if n is None else self.tensor(n, torch.float32, width, device) for n in names[2:]]
        return CompressorState(kv, gate, *prev)

    def layer_state(self, spec: dict, lc: LayerCache) -> tuple:
        """(window, comp, index_comp) of one layer, shaped like the template's layer `lc`."""
        dev = lc.window.device
        rows_w = lc.rows.view().shape[1] if lc.rows is not None else 0
        index_w = lc.index_rows.view().shape[1] if lc.index_rows is not None else 0
        return (self.tensor(spec["window"], self.model.dtype, lc.window.shape[1], dev),
                self.comp(spec["comp"], lc.comp, rows_w, dev),
                self.comp(spec["index_comp"], lc.index_comp, index_w, dev))

    def session(self, meta: dict) -> Session:
        tokens, layers = meta["tokens"], meta["layers"]
        if len(layers) != len(self.template.layers):
            raise ValueError(f"{len(layers)} layers, the model has {len(self.template.layers)}")
        if meta["position"] != len(tokens):
            raise ValueError(f"position {meta['position']} for {len(tokens)} tokens")
        built = []
        for spec, lc in zip(layers, self.template.layers):
            window, comp, index_comp = self.layer_state(spec, lc)
            for kind, grow in (("rows", lc.rows), ("index_rows", lc.index_rows)):
                if (spec[kind] is None) != (grow is None):
                    raise ValueError(f"{kind} where the model has none, or none where it has them")
                if grow is not None:  # appended into the template's buffer: its capacity limit stays the plan's
                    grow.append(self.tensor(spec[kind], self.model.dtype, grow.view().shape[1], grow.view().device))
            built.append(LayerCache(window, comp, lc.rows, index_comp, lc.index_rows))
        cache = KvCache(built)
        cache.position = len(tokens)
        snapshots = []
        for s in meta["snapshots"]:
            if not 0 <= s["position"] <= cache.position or (snapshots and s["position"] <= snapshots[-1].position):
                raise ValueError(f"snapshot positions {[x['position'] for x in meta['snapshots']]} for "
                                 f"{cache.position} tokens")
            ls = []
            for spec, lc in zip(s["layers"], built):
                held = (lc.rows.n if lc.rows is not None else 0, lc.index_rows.n if lc.index_rows is not None else 0)
                if not (0 <= spec["n_rows"] <= held[0] and 0 <= spec["n_index_rows"] <= held[1]):
                    raise ValueError(f"a snapshot counts rows {spec['n_rows']}/{spec['n_index_rows']}, "
                                     f"the cache holds {held}")
                ls.append(LayerSnapshot(*self.layer_state(spec, lc), spec["n_rows"], spec["n_index_rows"]))
            if len(ls) != len(built):
                raise ValueError(f"a snapshot of {len(ls)} layers, the model has {len(built)}")
            snapshots.append(CacheSnapshot(s["position"], tuple(ls)))
        session = Session(self.model, cache, list(tokens), snapshots, self.model.max_snapshots)
        session.snapshot()  # the state it holds is a free truncation point
        return session
