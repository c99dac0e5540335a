import sys
from pathlib import Path

if not __package__:  # `python path/to/benchmarks/foundation` from any directory: the repository on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.foundation import make  # noqa: E402
from benchmarks.runner import main  # noqa: E402

main(make)
