"""``python -m edgefl.data.fetch fashion-mnist``: make sure a dataset is on disk, print its dir."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from edgefl.data.acquire import ensure_fashion_mnist
from edgefl.errors import DataNotFoundError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgefl.data.fetch", description=__doc__)
    parser.add_argument("dataset", choices=["fashion-mnist"])
    parser.add_argument("--data-dir", type=Path, help="look and download here only")
    parser.add_argument("--no-apt", action="store_true", help="never run apt-get")
    parser.add_argument(
        "--no-download", action="store_true", help="never download with torchvision"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # to stderr: stdout is the result
    try:
        directory = ensure_fashion_mnist(
            args.data_dir, allow_apt=not args.no_apt, allow_download=not args.no_download
        )
    except DataNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(directory)  # the Makefile reads the directory from stdout
    return 0


if __name__ == "__main__":
    sys.exit(main())
