"""The ``edgefl`` command-line interface (Typer)."""
