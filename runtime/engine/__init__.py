"""The placement engine: a plan run as planned (hot/cold/upload executors, decode step, sessions).

This is the runtime's public face: ostinato-run and the server use these names, not the modules behind
them.

    engine = load_engine("plan.yaml", device="cpu")     # loader.py, in stages: read the plan, place the
                                                        # experts, load the model, build the steps
    session = engine.new_session()                      # an EngineSession (session.py)
    logits = session.prefill(prompt_ids, last_only=True)[-1]
    reply = generate(session, logits, 32, eos)          # the whole reply, greedy: Finished(reason, tokens, ...)
    for event in Generation(session, logits, picker, 32, eos):   # or event by event: Token ..., Finished
        ...

Several sessions decode together (`load_engine(..., parallel=N)`): decode_together(sessions, tokens) runs their
tokens in one step (batch_runner.py), each session's logits what its solo step gives; Generation.steps() lets
a scheduler drive several replies through it (server/worker.py).

Generation (generation.py) is the one generation loop: it drafts, verifies and rejects when the session
speculates, and picks every token through its picker (GreedyPicker, or the server's sampler).

The names are imported when first used (PEP 562): the kernels import engine.streams, and importing the
loader here, with the executor behind it, while a kernel module is half-initialized is a circular import.
"""

from __future__ import annotations

import importlib

_MODULE_OF = {
    "Engine": "loader", "load_engine": "loader",
    "EngineSession": "session", "ContextFull": "session",
    "Generation": "generation", "generate": "generation", "GreedyPicker": "generation", "Picker": "generation",
    "Token": "generation", "Finished": "generation", "Forward": "generation",
    "BatchRunner": "batch_runner", "decode_together": "batch_runner",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next lookup is a plain one
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
