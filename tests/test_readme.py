"""The README fits on a screen or two, and its layout section names what the tree holds."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def layout_entries() -> set[str]:
    block = README.split("## Layout", 1)[1].split("```")[1]
    return {line.split()[0].rstrip("/") for line in block.strip().splitlines() if line.strip()}


def test_readme_fits_in_150_lines():
    assert len(README.splitlines()) <= 150


def test_layout_names_every_subpackage_and_top_level_folder():
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    folders = {p.split("/")[0] for p in tracked if "/" in p and not p.startswith(".")}
    subpackages = {
        f"edgefl/{p.split('/')[1]}"
        for p in tracked
        if re.fullmatch(r"edgefl/[^/]+/__init__\.py", p)
    }
    listed = layout_entries()
    expected = (folders - {"edgefl"}) | subpackages
    assert expected <= listed, f"the README's layout misses {sorted(expected - listed)}"
    assert listed <= expected, (
        f"the README's layout names what the tree lacks: {sorted(listed - expected)}"
    )
