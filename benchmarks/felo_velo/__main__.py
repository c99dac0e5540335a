import sys
from pathlib import Path

if not __package__:  # `python path/to/benchmarks/felo_velo` from any directory: the repository on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.felo_velo import make  # noqa: E402
from benchmarks.runner import main  # noqa: E402

main(make)
