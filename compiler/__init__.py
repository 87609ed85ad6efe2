"""Offline side: the compile passes (memory model, placement, cost model, codegen, plan writing),
profile reports, merges and imports, host calibration (ostinato-compile, ostinato-profile,
ostinato-calibrate).

Imports the shared core (ostinato.checkpoint, ostinato.plan, ostinato.hardware, ...) and never the
runtime: what it hands the runtime is the plan file.
"""
