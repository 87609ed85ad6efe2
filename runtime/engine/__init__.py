"""The placement engine: a plan run as planned (hot/cold/upload executors, decode step, sessions)."""
