"""Investigations of the overhead benchmark's CPU (see ../ANALYSIS.md)."""


def workload_parser(doc: str | None):
    """The command line of an investigation that runs the echo workload over Mosquitto:
    ``--devices``, ``--floats`` (float32 values per message), ``--rounds``."""
    import argparse

    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=10)
    ap.add_argument("--floats", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=150)
    return ap
