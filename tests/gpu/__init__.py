"""The GPU checks (a package: its conftest must not shadow tests/conftest.py, which tests import)."""
