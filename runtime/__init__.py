"""Online side: the model, placement execution, sessions, profile recording (ostinato-run,
ostinato-record). Serving agents over HTTP is its own package, ostinato.server, built on this one.

An engine is used through ostinato.runtime.engine, the runtime's public face: load_engine, Engine,
EngineSession and the generation loop (Generation, generate). load_model is the bare model (a dense
reference, profile recording).

Imports the shared core (ostinato.checkpoint, ostinato.plan, ...) and never the compiler, jinja2
or a routing profile reader: the plan file is its only input from the compiler.
"""

from .model import load_model

__all__ = ["load_model"]
