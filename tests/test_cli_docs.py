"""cli/ holds the CLI's reference and shell completion scripts generated from the Typer app
(`make cli-docs`); they must say what the code says."""

import os
import subprocess
import sys
from pathlib import Path

from edgefl.cli.reference import render

ROOT = Path(__file__).resolve().parents[1]


def test_cli_folder_matches_the_typer_app():
    stale = []
    for rel, text in render().items():
        path = ROOT / "cli" / rel
        if not path.is_file() or path.read_text() != text:
            stale.append(f"cli/{rel}")
    assert not stale, (
        f"{', '.join(stale)} differ from the code: run `make cli-docs` and commit the result"
    )


def test_the_reference_names_every_command_and_option():
    text = render()["README.md"]
    for command in (
        "edgefl simulate",
        "edgefl server start",
        "edgefl device register",
        "edgefl broker add-device",
        "edgefl train",
        "edgefl infer",
        "edgefl deploy",
        "edgefl fleet status",
        "edgefl export",
    ):
        assert f"## `{command}`" in text, command
    assert "--print-config" in text and "--password-file" in text


def _complete(words: str, cword: int) -> list[str]:
    env = {
        **os.environ,
        "_EDGEFL_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(cword),
        "PYTHONPATH": str(ROOT),
    }
    code = "import sys; from edgefl.cli.main import main; sys.argv[0] = 'edgefl'; main()"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_completion_protocol_the_scripts_use_answers():
    assert _complete("edgefl sim", 1) == ["simulate"]
    assert "--password-file" in _complete("edgefl train --pass", 2)
    assert "start" in _complete("edgefl server ", 2)


def test_the_bash_script_completes_in_bash(tmp_path):
    import shutil

    bash = shutil.which("bash")
    assert bash is not None
    # `edgefl` on PATH, as an installed command is: this interpreter running the app from this tree
    (tmp_path / "edgefl").write_text(
        f"#!/bin/sh\nexec {sys.executable} -c 'import sys; from edgefl.cli.main import main; "
        'sys.argv[0] = "edgefl"; main()\' "$@"\n'
    )
    (tmp_path / "edgefl").chmod(0o755)
    script = ROOT / "cli" / "completion" / "edgefl.bash"
    line = (
        f"source {script}; COMP_WORDS=(edgefl server st); COMP_CWORD=2; _edgefl_completion "
        'edgefl; echo "${COMPREPLY[@]}"'
    )
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([bash, "-c", line], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == ["start"], out.stderr
