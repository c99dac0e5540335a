"""A thin CLI (issue #38): every function in edgefl/cli of cyclomatic complexity at most 10, no
command module importing another (what they share is in cli/common.py), and the broker/TLS/fleet
options declared once (cli/common.py's option_groups), the same on every command."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup

import edgefl.cli

CLI = Path(edgefl.cli.__file__).parent
#: Modules that assemble commands rather than being one: the app, and its generated reference.
ASSEMBLY = {"main", "reference"}
CONNECTION = [
    "--broker",
    "--fleet",
    "--username",
    "--password",
    "--password-file",
    "--ca-file",
    "--cert-file",
    "--key-file",
]


def test_cli_functions_are_simple():
    pytest.importorskip("ruff")
    found = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "C901", "--config",
         "lint.mccabe.max-complexity=10", "--output-format", "concise", str(CLI)],
        capture_output=True, text=True,
    )
    assert found.returncode == 0, found.stdout + found.stderr


def cli_imports(path: Path) -> set[str]:
    """The edgefl.cli modules ``path`` imports (at the top or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "edgefl.cli":
            found |= {f"edgefl.cli.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("edgefl.cli."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("edgefl.cli.")}
    return found


def test_no_command_module_imports_another():
    modules = sorted(p for p in CLI.glob("*.py") if p.stem not in ASSEMBLY | {"__init__"})
    assert len(modules) >= 10
    wrong = {p.stem: sorted(cli_imports(p) - {"edgefl.cli.common"}) for p in modules}
    assert {k: v for k, v in wrong.items() if v} == {}
    assert cli_imports(CLI / "common.py") == set()


def test_the_check_sees_an_import_of_a_command_module(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f():\n    from edgefl.cli.simulate import device_entry\n    from edgefl.cli import "
        "server\n"
    )
    assert cli_imports(bad) == {"edgefl.cli.simulate", "edgefl.cli.server"}


def commands(group: TyperGroup, prefix: str = "edgefl"):
    for name, command in group.commands.items():
        if isinstance(command, TyperGroup):
            yield from commands(command, f"{prefix} {name}")
        else:
            yield f"{prefix} {name}", command


def test_every_command_that_talks_to_the_broker_takes_the_same_options():
    from edgefl.cli.main import app

    taking = {}
    for name, command in commands(typer.main.get_command(app)):
        options = {o: p for p in command.params for o in p.opts}
        if "--ca-file" in options:
            taking[name] = [
                (o, options[o].envvar, options[o].default, options[o].help) for o in CONNECTION
            ]
    broker_commands = {
        "edgefl device register",
        "edgefl device agent",
        "edgefl server start",
        "edgefl fleet status",
        "edgefl dashboard",
        "edgefl deploy",
        "edgefl train",
    }
    assert set(taking) == broker_commands
    shared = [taking[name] for name in sorted(broker_commands)]
    assert all(declared == shared[0] for declared in shared)
    assert shared[0][0][1:3] == ("EDGEFL_BROKER", "mqtt://127.0.0.1:1883")
