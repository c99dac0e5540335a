"""A file a cell's configuration names (a fleet file) is an input of the cell as much as the code:
the cache reuses or reports a record only while the file is as it was when the record was made,
and the runner refuses to run a cell from such a file that differs from the commit (issue 37's
"a code change that leaves the configuration alone reuses stale cells", for files)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from benchmarks import provenance
from benchmarks.cache import Cache, DirtyCode, run_cells
from benchmarks.cells import Cell
from tests.bench_cases import tiny_cell

FLEET = provenance.ROOT / "benchmarks" / "time_to_accuracy" / "fleet.yaml"


def fleet_cell(path) -> Cell:
    return Cell("fedavg", "synthetic", 0, {**tiny_cell(0).config, "fleet_file": str(path)})


def test_a_record_is_reused_and_reported_only_while_its_fleet_file_is_unchanged(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    shutil.copy(FLEET, fleet)
    cell = fleet_cell(fleet)
    cache = Cache(tmp_path / "cells")
    digests = provenance.input_digests(cell.config)
    assert set(digests) == {"fleet_file"}
    cache.put(cell, {"method": "fedavg", "final_accuracy": 0.5, "inputs": digests})
    assert cache.get(cell)["final_accuracy"] == 0.5 and cache.find(cell) is not None
    # Execute: the fleet changes, the configuration (a path) does not
    fleet.write_text(FLEET.read_text().replace("\n", "\n# edited\n", 1))
    # Assert: the record is stale for a run and for a page alike
    assert cache.get(cell) is None and cache.find(cell) is None
    # a configuration that names no file is unaffected
    plain = tiny_cell(0)
    cache.put(plain, {"method": "fedavg", "final_accuracy": 0.4})
    assert cache.get(plain)["final_accuracy"] == 0.4


def test_a_record_made_before_digests_existed_is_judged_by_the_file_at_its_commit(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    shutil.copy(FLEET, repo / "fleet.yaml")
    git("add", "fleet.yaml")
    git("commit", "-qm", "fleet")
    commit = git("rev-parse", "--short", "HEAD")
    config = {"fleet_file": "fleet.yaml"}
    then = provenance.input_digests_at(commit, config, root=repo)
    assert then == {"fleet_file": provenance._digest(FLEET.read_bytes())}
    # a dirty tree, an unknown commit or a file the commit lacks cannot say what the file was
    assert provenance.input_digests_at(commit + "+dirty", config, root=repo) is None
    assert provenance.input_digests_at(None, config, root=repo) is None
    assert provenance.input_digests_at(commit, {"fleet_file": "other.yaml"}, root=repo) is None


def test_the_runner_refuses_cells_whose_fleet_file_is_not_committed(tmp_path):
    fleet = tmp_path / "fleet.yaml"  # outside the repository: no commit can say what it was
    shutil.copy(FLEET, fleet)
    assert provenance.uncommitted(fleet)
    with pytest.raises(DirtyCode, match="fleet.yaml"):
        run_cells([fleet_cell(fleet)], Cache(tmp_path / "cells"), workers=1)


def test_a_configuration_naming_a_missing_file_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        provenance.input_digests({"fleet_file": str(tmp_path / "absent.yaml")})
