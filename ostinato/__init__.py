"""Ostinato: a placement compiler and runtime for big mixture-of-experts models on a workstation.

This folder is the shared core both sides read: the checkpoint format (checkpoint/), the plan
schema (plan.py), hardware specs, the workload format, routing-profile files, the ISA list, and
the commands that need nothing else (ostinato-make-tiny, ostinato-inspect). The other top-level
folders are mapped into this package by pyproject.toml: compiler/ -> ostinato.compiler (offline),
runtime/ -> ostinato.runtime (online), templates/ -> ostinato.templates, plans/ -> ostinato.plans
(data). Dependencies: compiler -> core <- runtime; never compiler <-> runtime, and the core imports
neither (tests/test_layering.py walks the imports).
"""

__version__ = "0.1.0"
