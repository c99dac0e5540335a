"""A benchmark's declaration dated per setting (benchmarks/provenance.py): each setting by the
last commit that changed its declaration, so declaring one setting again leaves the cells of the
others standing, while a change to the shared part declares every setting again."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

from benchmarks import provenance, runner
from benchmarks.runner import Claim
from tests.bench_cases import full_run, tiny_cell


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.org")
    _git(tmp_path, "config", "user.name", "t")
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    (tmp_path / "bench").mkdir()
    return tmp_path


def commit(repo, declared: dict) -> str:
    (repo / "bench" / "declared.json").write_text(json.dumps(declared))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "declare")
    return _git(repo, "rev-parse", "--short", "HEAD")


def test_each_setting_is_dated_by_its_own_declaration(repo):
    # Prepare: a, b and c declared at c1; b's own entry declared again at c2
    first = {"main": ["a", "b", "c"], "note": "shared", "settings": {"a": "A", "b": "B"}}
    c1 = commit(repo, first)
    c2 = commit(repo, {**first, "settings": {"a": "A", "b": "B, 24 rounds"}})
    # Execute
    decl = provenance.declaration(repo / "bench")
    # Assert: b moved, a (its entry unchanged) and c (no entry: the shared part) did not
    assert decl["declared_at"] == c2
    assert decl["declared_at_by_setting"] == {"a": c1, "b": c2, "c": c1}
    # a change to the shared part declares every setting again
    c3 = commit(repo, {**first, "note": "shared, reworded", "settings": {"a": "A", "b": "B2"}})
    assert provenance.declaration(repo / "bench")["declared_at_by_setting"] == {
        "a": c3, "b": c3, "c": c3}
    # and an uncommitted change dates nothing
    (repo / "bench" / "declared.json").write_text(json.dumps(first))
    assert set(provenance.declaration(repo / "bench")["declared_at_by_setting"].values()) == {
        None}


def test_a_claim_is_marked_only_where_its_own_settings_cells_predate_their_declaration(repo):
    # Prepare: cells of settings a and b run at c1; then b alone is declared again at c2
    first = {"main": ["a", "b"], "settings": {"a": "A", "b": "B"}}
    c1 = commit(repo, first)
    commit(repo, {**first, "settings": {"a": "A", "b": "B again"}})
    cells = [dataclasses.replace(tiny_cell(s, method=m, algorithm=m), setting=setting)
             for setting in ("a", "b") for s in range(3) for m in ("fedavg", "local")]
    records = {c: full_run(c, 0.8 + 0.01 * c.seed if c.method == "fedavg" else 0.5, code=c1)
               for c in cells}
    claims = [Claim(f"gain-{x}", "fedavg > local", x) for x in ("a", "b")]
    bench = runner.Benchmark("t", "T", "tiny", cells, claims=claims)
    # Execute
    results = runner.build_results(bench, records, {}, {}, "cmd", bench_dir=repo / "bench")
    # Assert: b's claim is marked, a's is not (on the page too: † after b's statement alone)
    by_setting = {c["setting"]: c for c in results["claims"]}
    assert not by_setting["a"]["before_declaration"]
    assert by_setting["b"]["before_declaration"]
    rows = [line for line in runner.results_markdown(bench, results).splitlines()
            if line.startswith("| `fedavg > local`")]
    assert [("†" in line, "| a |" in line) for line in rows] == [(False, True), (True, False)]


def test_the_page_dates_each_setting_and_shows_its_entry(repo):
    first = {"main": ["a", "b"], "settings": {"a": "A", "b": "B"}}
    c1 = commit(repo, first)
    c2 = commit(repo, {**first, "settings": {"a": "A", "b": "B again"}})
    cells = [tiny_cell(0)]
    bench = runner.Benchmark("t", "T", "tiny", cells)
    results = runner.build_results(bench, {cells[0]: full_run(cells[0], 0.5, code=c1)}, {}, {},
                                   "cmd", bench_dir=repo / "bench")
    page = runner.results_markdown(bench, results)
    assert f"a at `{c1}`, b at `{c2}`" in page
    assert "Setting `b`: B again" in page
