"""Where the bytes of a venv go: disk usage per installed distribution, bytecode, and the rest.

    python benchmarks/pi/sizes.py /var/tmp/edgefl-pi-root/opt/base      # prints one JSON object

Reads the venv's files only (never imports from it), so the host's Python measures an arm64 venv.
Sizes are disk usage (allocated blocks, as `du`), in MiB. Each file is counted once: a file listed
in a distribution's RECORD belongs to it (shared libraries its wheel bundles, such as
numpy.libs/ and pillow.libs/, included); `__pycache__/*.pyc` files belong to the distribution that
owns the folder above them, and also count in `bytecode_mib`; what no RECORD lists (the venv's
bin/, pyvenv.cfg, files written after the install) counts in `other_mib`.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

MIB = 1024 * 1024


def _blocks(path: Path) -> int:
    st = path.lstat()
    return st.st_blocks * 512


def measure(venv: Path) -> dict:
    venv = venv.resolve()
    site = next(iter(sorted(venv.glob("lib/python3*/site-packages"))), None)
    owner: dict[Path, str] = {}
    folders: dict[Path, str] = {}
    if site is not None:
        for dist_info in site.glob("*.dist-info"):
            name = dist_info.name.split("-")[0].lower().replace("_", "-")
            record = dist_info / "RECORD"
            if not record.exists():
                continue
            with record.open(newline="") as f:
                for row in csv.reader(f):
                    if not row:
                        continue
                    path = (site / row[0]).resolve() if not row[0].startswith("/") else Path(row[0])
                    owner[path] = name
                    folders.setdefault(path.parent, name)
    per_dist: dict[str, int] = {}
    bytecode = other = total = 0
    seen: set[tuple[int, int]] = set()
    for root, dirs, files in os.walk(venv):
        for name in files + [d for d in dirs if (Path(root) / d).is_symlink()]:
            path = Path(root) / name
            st = path.lstat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            size = _blocks(path)
            total += size
            resolved = path.resolve() if not path.is_symlink() else path
            dist = owner.get(resolved)
            if path.suffix == ".pyc":
                bytecode += size
                dist = dist or folders.get(path.parent.parent)
            if dist:
                per_dist[dist] = per_dist.get(dist, 0) + size
            else:
                other += size
        for d in dirs:  # directories take blocks too (du counts them)
            p = Path(root) / d
            if not p.is_symlink():
                total += _blocks(p)
    largest = sorted(per_dist.items(), key=lambda kv: -kv[1])
    return {
        "total_mib": round(total / MIB, 1),
        "total_mb": round(total / 1e6, 1),
        "bytecode_mib": round(bytecode / MIB, 1),
        "other_mib": round(other / MIB, 1),
        "packages": len(per_dist),
        "per_distribution_mib": {k: round(v / MIB, 1) for k, v in largest},
    }


if __name__ == "__main__":
    print(json.dumps(measure(Path(sys.argv[1]))))
