"""Triton's interpreter (TRITON_INTERPRET=1: every Triton kernel the CPU tests run) without a set-up it repeats.

A launch patches triton.language for the interpreter (triton.runtime.interpreter._patch_lang: inspect.getmembers
over the language modules, closures set on them) and restores it when the launch ends. Triton 3.x patches again
on every call of a @triton.jit helper inside the kernel, once per program instance, though the launch around it
already patched the same modules: the helper's patches set nothing the launch's did not (the builtins are
replaced already, so only equivalent closures are set again), and were never restored. Measured on the tiny
engine's expert kernels, whose helpers (_dequant, _unpack, _nibble, ...) run per block: about a third of an
interpreted kernel's time went to that repetition. Skipped here when the helper sees the same language modules
as its launch did; a helper that sees others still patches them, as before. Nothing the kernel computes
changes: it runs with the launch's patches either way.

install() is idempotent and does nothing where Triton lacks the functions it wraps (another version: the
interpreter then runs as it comes).
"""

from __future__ import annotations

_LAUNCHES: list[dict] = []  # per running launch: {"langs": the language modules its own patch covered}


def _langs(fn, tl) -> frozenset[int]:
    """The language modules _patch_lang patches for fn (those its globals name), by id."""
    return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)


def install() -> bool:
    """Wrap the interpreter's launch and its _patch_lang -> whether they were wrapped (now or before)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    grid_executor = getattr(interpreter, "GridExecutor", None)
    patch_lang, scope = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "_LangPatchScope", None)
    if grid_executor is None or patch_lang is None or scope is None:
        return False
    if getattr(patch_lang, "_once_per_launch", False):
        return True
    launch = grid_executor.__call__

    def launch_noting_its_patches(self, *args, **kwargs):
        _LAUNCHES.append({"langs": None})
        try:
            return launch(self, *args, **kwargs)
        finally:
            _LAUNCHES.pop()

    def patch_lang_once_per_launch(fn):
        langs = _langs(fn, tl)
        if _LAUNCHES and _LAUNCHES[-1]["langs"] is not None and langs <= _LAUNCHES[-1]["langs"]:
            return scope()  # a helper inside the launch: patched already, by the launch (restored when it ends)
        patched = patch_lang(fn)
        if _LAUNCHES and _LAUNCHES[-1]["langs"] is None:  # the launch's own patch (its first call)
            _LAUNCHES[-1]["langs"] = langs
        return patched

    patch_lang_once_per_launch._once_per_launch = True
    patch_lang_once_per_launch.__wrapped__ = patch_lang
    grid_executor.__call__ = launch_noting_its_patches
    interpreter._patch_lang = patch_lang_once_per_launch
    return True
