"""Render a jinja2 template into a content-addressed build directory.

The content hash covers the template's text, the text of every header it includes (C++ templates:
`#include "..."` resolved in include/ beside the template, followed through the headers), its
parameters and the compiler flags, so a changed input gives a new directory and an existing directory
is never stale. The headers are copied into the directory (include/), so what was hashed is what the
compiler reads. Rendered files start with a header naming the template, its sha256, the headers',
and the parameters; they are never edited by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jinja2

TEMPLATE_ROOT = Path(__file__).resolve().parents[2] / "templates"
if not TEMPLATE_ROOT.is_dir():  # installed (non-editable): templates ship as package data
    import ostinato.templates

    TEMPLATE_ROOT = Path(ostinato.templates.__file__).parent

DEFAULT_BUILD_ROOT = Path("build") / "kernels"
_COMMENT = {".cpp": "//", ".c": "//", ".h": "//", ".py": "#"}
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)  # quoted includes only


@dataclass(frozen=True)
class KernelRecord:
    """What a plan's `kernels` section stores about one generated kernel."""

    template: str          # path under templates/, e.g. "cpu/moe_experts.cpp.j2"
    template_hash: str     # sha256 of the template text
    params: dict = field(hash=False)
    flags: tuple[str, ...]
    content_hash: str      # sha256 over template text, included headers' text, params and flags
    path: str              # the artifact: rendered source, or the compiled library for C++

    def to_dict(self) -> dict:
        return asdict(self) | {"flags": list(self.flags)}


def template_text(template: str, template_root: Path = TEMPLATE_ROOT) -> str:
    path = Path(template_root) / template
    if not path.is_file():
        raise FileNotFoundError(f"template {template!r} not found under {template_root}")
    return path.read_text()


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _canonical(params: dict) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def include_dir(template: str) -> str:
    """Where a template's quoted includes resolve, as a path under templates/: include/ beside it."""
    return posixpath.join(posixpath.dirname(template), "include")


def header_texts(template: str, template_root: str | Path = TEMPLATE_ROOT) -> dict[str, str]:
    """{path under templates/: text} of every header `template` includes, directly or through another
    header, sorted; {} for a template without quoted includes. A header resolves as the compiler resolves
    it: beside the including header, then in include_dir(template); one found in neither is an error."""
    root, inc = Path(template_root), include_dir(template)
    found: dict[str, str] = {}
    if Path(template.removesuffix(".j2")).suffix not in (".cpp", ".c", ".h"):
        return found  # no preprocessor: a Python template's `#include` would be a comment
    todo = [(template, template_text(template, root))]
    while todo:
        name, text = todo.pop()
        for ref in _INCLUDE.findall(text):
            beside = [posixpath.join(posixpath.dirname(name), ref)] if name != template else []
            path = next((posixpath.normpath(p) for p in (*beside, posixpath.join(inc, ref))
                         if (root / p).is_file()), None)
            if path is None:
                raise FileNotFoundError(f'{name}: #include "{ref}" not found under {root / inc}')
            if not path.startswith(inc + "/"):
                raise ValueError(f'{name}: #include "{ref}" resolves to {path}, outside {inc}/')
            if path not in found:
                found[path] = template_text(path, root)
                todo.append((path, found[path]))
    return dict(sorted(found.items()))


def included_headers(template: str, template_root: str | Path = TEMPLATE_ROOT) -> dict[str, str]:
    """{path under templates/: sha256} of the headers `template` includes (header_texts)."""
    return {h: sha256(s) for h, s in header_texts(template, template_root).items()}


def content_hash(template: str, text: str, params: dict, flags: tuple[str, ...],
                 headers: dict[str, str] | None = None) -> str:
    """sha256 over everything that makes the artifact; `headers` ({path: sha256}, included_headers)
    enters only when there are any, so a template without includes keeps its hash."""
    inputs = {"template": template, "text": text, "params": params, "flags": list(flags)}
    return sha256(_canonical(inputs | ({"headers": headers} if headers else {})))


def stamp(template: str, t_hash: str, params: dict, flags: tuple[str, ...], suffix: str,
          headers: dict[str, str] | None = None) -> str:
    c = _COMMENT[suffix]
    return (f"{c} GENERATED by ostinato codegen: do not edit.\n"
            f"{c} template: {template}\n{c} template_sha256: {t_hash}\n"
            f"{c} params: {_canonical(params)}\n{c} flags: {' '.join(flags)}\n"
            + "".join(f"{c} header: {h} {s}\n" for h, s in (headers or {}).items()))


def _write(path: Path, text: str) -> None:
    """Write `text` to `path` unless it holds it already; atomic: a concurrent build never sees half a file."""
    if path.exists() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def render(template: str, params: dict, flags: tuple[str, ...] = (), root: str | Path | None = None,
           template_root: str | Path = TEMPLATE_ROOT) -> KernelRecord:
    """Render `template` with `params` into <root>/<content hash>/<name>, its headers into include/ there
    (the compile step passes that folder to the compiler); returns its record."""
    text = template_text(template, template_root)
    t_hash = sha256(text)
    header_text = header_texts(template, template_root)
    headers = {h: sha256(s) for h, s in header_text.items()}
    c_hash = content_hash(template, text, params, tuple(flags), headers)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
                             lstrip_blocks=True, autoescape=False)
    name = Path(template).name.removesuffix(".j2")
    source = stamp(template, t_hash, params, tuple(flags), Path(name).suffix, headers)
    source += env.from_string(text).render(**params)
    out_dir = Path(root if root is not None else DEFAULT_BUILD_ROOT) / c_hash[:20]
    out_dir.mkdir(parents=True, exist_ok=True)
    for h, s in header_text.items():
        _write(out_dir / "include" / posixpath.relpath(h, include_dir(template)), s)
    path = out_dir / name
    _write(path, source)
    return KernelRecord(template, t_hash, dict(params), tuple(flags), c_hash, str(path.resolve()))
