"""Where a benchmark's cells come from (../shared/specs/BENCHMARKS.md, "Sanity gates"; issue 37).

- :func:`code_hash`: a hash of the code a cell runs — every file of the ``edgefl`` package and the
  benchmark's module that runs inside a cell (its ``record_extras`` hook), as they are on disk. It
  is part of the cell cache's key (:class:`benchmarks.runner.Cache`), so a code change that leaves a
  cell's configuration alone never reuses the cell.
- :func:`code_version`: the commit the cells run at, ``+dirty`` when the files the hash covers
  differ from that commit; the runner refuses to run a cell from dirty code unless asked for a
  draft (``--draft``).
- :func:`input_digests`: the files a cell's configuration names (a fleet file) are inputs as much
  as the code is: a record keeps their digests, and the cache reuses or reports a record only while
  they match the files now (a record from before this existed: the files at the commit it ran at).
- :func:`declaration`: a benchmark's settings are declared in its committed ``declared.json``
  (main settings and alternatives, a shared note, and optionally an entry per setting under
  ``settings``); each setting is dated by the last commit that changed its declaration (the
  shared part, or its own entry), and a claim over cells produced at a commit that does not
  contain their setting's declaration is marked.

Cells cached before this module existed carry no code hash: they stay usable for reports, marked
"code hash unknown (pre-provenance)", and are never reused to run a benchmark.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "edgefl"
PRE_PROVENANCE = "code hash unknown (pre-provenance)"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def module_files(record_extras: str | None) -> list[Path]:
    """The source file of the module a cell's ``record_extras`` hook lives in (none without a
    hook)."""
    if not record_extras:
        return []
    spec = importlib.util.find_spec(record_extras.partition(":")[0])
    if spec is None:
        raise ValueError(f"record_extras {record_extras!r}: module not found")
    # a namespace package has no file
    return [] if spec.origin is None else [Path(spec.origin).resolve()]


def code_files(record_extras: str | None = None) -> list[Path]:
    """Every file the code hash covers: the ``edgefl`` package's sources and the hook's module."""
    files = sorted(
        p
        for p in PACKAGE.rglob("*")
        if p.is_file() and p.suffix in (".py", ".json", ".toml") and "__pycache__" not in p.parts
    )
    return files + module_files(record_extras)


@cache
def code_hash(record_extras: str | None = None) -> str:
    """sha256 (16 hex digits) over the covered files' paths (relative to the repository) and
    bytes."""
    h = hashlib.sha256()
    for path in code_files(record_extras):
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@cache
def code_version(record_extras: str | None = None) -> str:
    """``<commit>`` or ``<commit>+dirty`` (the covered files differ from the commit: modified or
    untracked); ``unknown`` outside a git checkout. Results, caches and figures do not count."""
    head = _git("rev-parse", "--short", "HEAD")
    if head is None:
        return "unknown"
    paths = ["edgefl"] + [
        str(p.relative_to(ROOT)) for p in module_files(record_extras) if p.is_relative_to(ROOT)
    ]
    status = _git("status", "--porcelain", "--untracked-files=all", "--", *paths) or ""
    dirty = [line for line in status.splitlines() if line[3:].endswith((".py", ".json", ".toml"))
             and "__pycache__" not in line]
    return head + ("+dirty" if dirty else "")


def is_dirty(version: str) -> bool:
    return version.endswith("+dirty") or version == "unknown"


@cache
def contains(commit: str, ancestor: str) -> bool | None:
    """Whether ``commit`` (``+dirty`` ignored) descends from ``ancestor``; None when git cannot
    tell."""
    commit = commit.removesuffix("+dirty")
    done = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", ancestor, commit],
                          capture_output=True, text=True)
    return {0: True, 1: False}.get(done.returncode)


def declaration(bench_dir: Path) -> dict | None:
    """``declared.json`` of a benchmark with the commit that last changed it (``declared_at``;
    None while it is not committed or differs from the commit) and, per setting it names, the
    commit that last changed that setting's declaration (``declared_at_by_setting``;
    :func:`setting_declaration`): a declaration of one setting made again leaves the cells of
    the others standing."""
    path = Path(bench_dir) / "declared.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    check_declaration(data, path)
    rel = str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else None
    history = (_git("log", "--format=%h", "--", rel) or "").split() if rel else []
    changed = _git("status", "--porcelain", "--", rel) if rel else None
    committed = history[0] if history and not changed else None
    data["declared_at"] = committed
    names = [*data.get("main", []), *data.get("alternatives", []), *data.get("settings", {})]
    data["declared_at_by_setting"] = {
        name: _setting_declared_at(name, data, history, rel) if committed else None
        for name in dict.fromkeys(names)
    }
    return data


def check_declaration(data: dict, path: Path) -> None:
    for key in ("main", "alternatives"):
        if not isinstance(data.get(key, []), list):
            raise ValueError(f"{path}: '{key}' must be a list of setting names")
    settings = data.get("settings", {})
    if not isinstance(settings, dict) or not all(isinstance(v, str) for v in settings.values()):
        raise ValueError(f"{path}: 'settings' must map setting names to their declaration text")


def setting_declaration(name: str, data: dict) -> tuple[str, str | None]:
    """What declares setting ``name``: the file's shared part (every key but ``settings``: the
    main settings, the alternatives, the shared note) and the setting's own entry under
    ``settings``, if it has one. A change to the shared part declares every setting again; a
    change to one setting's entry declares that setting alone again."""
    shared = {k: v for k, v in data.items()
              if k not in ("settings", "declared_at", "declared_at_by_setting")}
    return json.dumps(shared, sort_keys=True), data.get("settings", {}).get(name)


def _setting_declared_at(name: str, data: dict, history: list[str], rel: str) -> str:
    """The oldest commit of the newest unbroken run of ``declared.json``'s versions (``history``:
    newest first) that declare ``name`` as the file does now."""
    now, at = setting_declaration(name, data), history[0]
    for commit in history[1:]:
        blob = _blob_at(commit, rel, str(ROOT))  # each version read once for every setting
        try:
            older = json.loads(blob) if blob is not None else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            older = None
        if not isinstance(older, dict) or setting_declaration(name, older) != now:
            break
        at = commit
    return at


def cell_provenance(record: dict, current_hash: str) -> str:
    """How a cached cell relates to the code now: ``current``, ``other code`` or pre-provenance."""
    if not record.get("code_hash"):
        return PRE_PROVENANCE
    return "current" if record["code_hash"] == current_hash else "other code"


#: run settings that name a file the run reads (relative to the repository, where cells run)
INPUT_FILE_SETTINGS = ("fleet_file",)


def _input_path(value: str) -> Path:
    return Path(value) if Path(value).is_absolute() else ROOT / value


def input_files(config: dict) -> list[Path]:
    """The files a cell's configuration names (:data:`INPUT_FILE_SETTINGS`)."""
    return [_input_path(config[k]) for k in INPUT_FILE_SETTINGS if config.get(k)]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def input_digests(config: dict) -> dict[str, str]:
    """``{setting: sha256 (16 hex digits) of the file's bytes}`` for each file the configuration
    names; a named file that does not exist is an error (the run would fail on it too)."""
    out = {}
    for key in INPUT_FILE_SETTINGS:
        if config.get(key):
            path = _input_path(config[key])
            if not path.is_file():
                raise FileNotFoundError(f"{key} {config[key]!r}: no such file ({path})")
            out[key] = _digest(path.read_bytes())
    return out


@cache
def _blob_at(commit: str, rel: str, root: str) -> bytes | None:
    done = subprocess.run(["git", "-C", root, "show", f"{commit}:{rel}"], capture_output=True)
    return done.stdout if done.returncode == 0 else None


def input_digests_at(commit: str | None, config: dict, root: Path = ROOT) -> dict[str, str] | None:
    """The digests :func:`input_digests` would have given at ``commit`` (a record made before
    records kept them); None when that cannot be known (no commit, a dirty tree, a path outside
    the repository, a file the commit lacks)."""
    if not commit or is_dirty(commit):
        return None
    out = {}
    for key in INPUT_FILE_SETTINGS:
        if config.get(key):
            path = Path(config[key]) if Path(config[key]).is_absolute() else root / config[key]
            if not path.resolve().is_relative_to(Path(root).resolve()):
                return None
            rel = path.resolve().relative_to(Path(root).resolve()).as_posix()
            blob = _blob_at(commit, rel, str(root))
            if blob is None:
                return None
            out[key] = _digest(blob)
    return out


def inputs_match(config: dict, record: dict) -> bool:
    """Whether a cached record was computed from the files the configuration names as they are
    now (always, for a configuration that names none)."""
    want = input_digests(config)
    if not want:
        return True
    have = record.get("inputs")
    if have is None:
        have = input_digests_at(record.get("code"), config)
    return have == want


def uncommitted(path: Path) -> bool:
    """Whether a file differs from the commit (modified or untracked) or lies outside the
    repository, where no commit can say what it was."""
    path = Path(path).resolve()
    if not path.is_relative_to(ROOT):
        return True
    return bool(_git("status", "--porcelain", "--untracked-files=all", "--", str(path)))
