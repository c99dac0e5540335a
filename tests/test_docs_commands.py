"""Every `edgefl …` command the documents show names a command the CLI has, with options that
command takes: a step an operator copies from the README or docs/ must not fail on a renamed
command or flag. (What the commands then do is the business of the tests of each command.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import typer

from edgefl.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted(ROOT.glob("devices/*.md")),
    *sorted(ROOT.glob("benchmarks/*/README.md")),
]
#: `edgefl` as a program (optionally with a path: ~/edgefl/bin/edgefl, .venv/bin/edgefl) and what
#: follows it up to the end of the command
COMMAND = re.compile(r"(?:^|[\s(;&|$])(?:[~\w./-]*/)?edgefl((?: +[^#|;&]*)?)")


def code_of(text: str) -> list[tuple[int, str]]:
    """(line number, code) for every line of a fenced block (its comment cut off) and every inline
    code span, with a backslash-continued line joined to the next."""
    out, fenced = [], False
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        n, line = i + 1, lines[i]
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            out.append((n, re.sub(r"(^|\s)#.*$", "", line)))  # not its shell comment
        else:
            out += [(n, span) for span in re.findall(r"`([^`]+)`", line)]
        i += 1
    return out


def commands(text: str) -> list[tuple[int, list[str]]]:
    found = []
    for n, code in code_of(text):
        for m in COMMAND.finditer(code):
            try:
                words = shlex.split(m.group(1))
            except ValueError:  # an unbalanced quote in a span cut from a longer line
                words = m.group(1).split()
            found.append((n, words))
    return found


def unknown(words: list[str]) -> str | None:
    """What in ``edgefl WORDS`` the CLI does not know (None: every subcommand and option)."""
    cmd, i = typer.main.get_command(app), 0
    while hasattr(cmd, "commands") and i < len(words) and not words[i].startswith("-"):
        if words[i] in ("...", "…"):
            return None  # "edgefl broker ..." names the group
        sub = cmd.commands.get(words[i])
        if sub is None:
            return f"no command {words[i]!r}"
        cmd, i = sub, i + 1
    if hasattr(cmd, "commands"):
        return None  # a group on its own, or with --help
    options = {"--help"}
    for p in cmd.params:
        options.update(p.opts)
        options.update(p.secondary_opts)
    for w in words[i:]:
        if w.startswith("--") and w.split("=", 1)[0] not in options:
            return f"no option {w.split('=', 1)[0]}"
    return None


def test_the_documents_show_commands():
    # the check below is not vacuous: the README and docs/ hold dozens of commands
    assert sum(len(commands(p.read_text())) for p in DOCUMENTS) >= 50


def test_every_documented_command_and_option_exists():
    bad = []
    for path in DOCUMENTS:
        for n, words in commands(path.read_text()):
            why = unknown(words)
            if why:
                bad.append(f"{path.relative_to(ROOT)}:{n}: edgefl {' '.join(words)}: {why}")
    assert not bad, "\n".join(bad)


def test_a_renamed_flag_or_command_is_caught():
    text = "```\nedgefl simulate --algorithm velo --rounnds 3\nedgefl fleet stauts\n```\n"
    found = [unknown(words) for _, words in commands(text)]
    assert found == ["no option --rounnds", "no command 'stauts'"]
