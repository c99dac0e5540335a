"""The command lines of docs/deployment.md §4, as a shell script that runs them literally.

Only what cannot run on one test machine is replaced, each replacement named below and required
to match (a doc that changed fails the check instead of being skipped): the copy to the Pi
(``scp``), the interactive editor (``sudoedit``), the passwords the broker printed, and the
follow-mode journal. As root, ``sudo`` is left out and ``sudo -u USER`` becomes
``runuser -u USER --``, as §4 says.

    python -m benchmarks.systemd.docsteps [--root] > steps.sh
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"
COMMAND = re.compile(r"^ {4,}(sudo|sudoedit|git|scp|cd|journalctl)\b")

# (pattern in a doc line, what runs instead, why)
REPLACE = [
    (
        r"^git archive .*",
        ": packed on the host by benchmarks/systemd/run.sh",
        "the host packs the tree",
    ),
    (r"^scp edgefl-src.tar.gz pi@pi-07.lan:", ": copied into ~ by run.sh", "no second machine"),
    (
        r"^sudoedit /etc/edgefl/device.toml.*",
        "sudo sed -i 's#mqtt://broker.lan:1883#mqtt://127.0.0.1:1883#' /etc/edgefl/device.toml",
        "the editor: the broker is this machine",
    ),
    (
        r"^sudoedit /etc/edgefl/server.toml.*",
        "sudo sed -i 's/^rounds = .*/rounds = 3/; s/^min_devices = .*/min_devices = 1/; "
        "s/^fraction = .*/fraction = 1.0/' /etc/edgefl/server.toml",
        "the editor: one device, a short run (the example asks 6 devices and 50 rounds)",
    ),
    (r"'THE-PASSWORD'", '"$(cat ~/pi-07.password)"', "the password the broker printed"),
    (
        r"'THE-SERVER-PASSWORD'",
        '"$(cat ~/edgefl-server.password)"',
        "the password the broker printed",
    ),
    (
        r"(add-device edgefl-server .*?)\s+# prints .*",
        r"\1 > ~/edgefl-server.password",
        "keep what it prints",
    ),
    (r"(add-device pi-07 .*?)\s+# prints .*", r"\1 > ~/pi-07.password", "keep what it prints"),
    (
        r"^sudo journalctl -u edgefl-device -f.*",
        "wait_for_round",
        "follow mode never ends: wait for a round line",
    ),
]


def section_commands() -> tuple[list[str], list[str]]:
    """§4's command lines: the Pi's steps, and the broker-and-server block."""
    text = DOC.read_text().split("\n## 4.", 1)[1].split("\n## 5.", 1)[0]
    pi, server = text.split("**The broker and the server**", 1)
    take = lambda part: [  # noqa: E731
        line.strip() for line in part.splitlines() if COMMAND.match(line)
    ]
    return take(pi), take(server)


def rewrite(lines: list[str], used: set[int]) -> list[str]:
    out = []
    for line in lines:
        for i, (pattern, replacement, _) in enumerate(REPLACE):
            new = re.sub(pattern, replacement, line)
            if new != line:
                used.add(i)
                line = new
        out.append(line)
    return out


def as_root(line: str) -> str:
    line = re.sub(r"\bsudo -u (\S+) ", r"runuser -u \1 -- ", line)
    return re.sub(r"(^|&& |; )sudo ", r"\1", line)


def script(root: bool) -> str:
    pi, server = section_commands()
    used: set[int] = set()
    pi, server = rewrite(pi, used), rewrite(server, used)
    missing = [REPLACE[i][0] for i in range(len(REPLACE)) if i not in used]
    if missing:
        sys.exit(
            f"docs/deployment.md §4 changed: no line matches {missing}; update "
            "benchmarks/systemd/docsteps.py"
        )
    at = next(i for i, line in enumerate(pi) if "/etc/edgefl" in line)  # step 5 begins
    steps = [
        "# §4 steps 2-4 on the Pi",
        *pi[:at],
        "# the broker and the server: 'after steps 2-4 above on that machine with the server's "
        "layer'",
        "sudo /opt/edgefl/venv/bin/pip install '/opt/edgefl/src[server]'",
        *server,
        "cd ~",
        "# §4 steps 5-6 on the Pi",
        *pi[at:],
    ]
    if root:
        steps = [as_root(s) for s in steps]
    return "set -euxo pipefail\n" + "\n".join(steps) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", action="store_true", help="as root: sudo left out, sudo -u → runuser"
    )
    print(script(parser.parse_args().root), end="")
