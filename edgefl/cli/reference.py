"""The CLI's reference and shell completion scripts, generated from the Typer app (``make
cli-docs``).

    python -m edgefl.cli.reference cli          # writes cli/README.md and cli/completion/*

The reference is Typer's own Markdown (``typer edgefl.cli.main utils docs``); the completion scripts
are Typer's for bash, zsh and fish, bound to the ``edgefl`` command. ``tests/test_cli_docs.py``
renders both again and fails when the files in ``cli/`` differ from what the code says.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROG = "edgefl"

#: Completion script file per shell, and how to load it.
COMPLETIONS = {
    "bash": (
        "edgefl.bash",
        "source cli/completion/edgefl.bash   # or copy it to /etc/bash_completion.d/edgefl",
    ),
    "zsh": (
        "_edgefl",
        "copy cli/completion/_edgefl into a directory of your $fpath, then: autoload -U compinit "
        "&& compinit",
    ),
    "fish": ("edgefl.fish", "cp cli/completion/edgefl.fish ~/.config/fish/completions/"),
}

HEADER = (
    "<!-- Generated from the Typer app by `make cli-docs` (python -m edgefl.cli.reference cli); "
    "do not edit:\n"
    "     tests/test_cli_docs.py fails when this file and the code disagree. -->\n"
    "\n"
)


def reference_markdown() -> str:
    """Typer's Markdown reference of every ``edgefl`` command."""
    import typer
    from typer.cli import get_docs_for_click

    from edgefl.cli.main import app

    command = typer.main.get_command(app)
    ctx = typer.Context(command, info_name=PROG)
    docs = get_docs_for_click(obj=command, ctx=ctx, name=PROG, title=f"`{PROG}` command reference")
    shells = "\n".join(f"* {shell}: `{how}`" for shell, (_, how) in COMPLETIONS.items())
    completion = (
        "\n\n## Shell completion\n\nThe scripts in `cli/completion/` complete commands and "
        f"options:\n\n{shells}\n"
    )
    return HEADER + docs.strip() + completion


def completion_script(shell: str) -> str:
    from typer._completion_shared import get_completion_script

    from edgefl.cli.main import COMPLETE_VAR

    return (
        get_completion_script(prog_name=PROG, complete_var=COMPLETE_VAR, shell=shell).strip() + "\n"
    )


def render() -> dict[str, str]:
    """Every generated file, by its path under ``cli/``."""
    files = {"README.md": reference_markdown()}
    for shell, (name, _) in COMPLETIONS.items():
        files[f"completion/{name}"] = completion_script(shell)
    return files


def write(directory: Path) -> list[Path]:
    written = []
    for rel, text in render().items():
        path = Path(directory) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1] if len(sys.argv) > 1 else "cli")):
        print(path)
