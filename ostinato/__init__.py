"""Ostinato: a placement compiler and runtime for big mixture-of-experts models on a workstation.

The code lives in the repository's top-level folders, mapped into this package by pyproject.toml:
compiler/ -> ostinato.compiler (offline), runtime/ -> ostinato.runtime (online),
templates/ -> ostinato.templates, plans/ -> ostinato.plans (data).
"""

__version__ = "0.1.0"
