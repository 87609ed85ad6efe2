"""Command-line entry points: one module per ostinato-* command, each with main(argv) -> exit code."""
