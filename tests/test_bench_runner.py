"""The shared benchmark runner: the cell cache, parallel = serial, provenance, the reviewers' check
(claims and gates: tests/test_bench_claims.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from benchmarks import cache as cache_module
from benchmarks import cells as cells_module
from benchmarks import runner
from benchmarks.runner import Cache, Cell, Claim, run_cells
from tests.bench_cases import full_run, tiny_cell


@pytest.mark.slow
def test_cells_are_cached_by_configuration_and_parallel_cells_equal_serial_ones(
    tmp_path, monkeypatch
):
    # Prepare: two cells, run one worker at a time and two at a time into separate caches
    cells = [tiny_cell(0), tiny_cell(1, method="local", algorithm="local")]
    serial = run_cells(cells, Cache(tmp_path / "serial", draft=True), workers=1, log=lambda m: None)
    parallel = run_cells(
        cells, Cache(tmp_path / "parallel", draft=True), workers=2, log=lambda m: None
    )
    # Assert: identical numbers, whichever worker ran a cell
    for s, p in zip(serial, parallel, strict=True):
        assert s["key"] == p["key"]
        assert (
            s["final_accuracy"] == p["final_accuracy"]
            and s["client_accuracy"] == p["client_accuracy"]
        )
        assert s["per_round"] == p["per_round"]
    assert len(list((tmp_path / "serial").glob("*.json"))) == 2
    # Execute again: everything comes from the cache, nothing runs
    monkeypatch.setattr(
        cache_module, "run_cell", lambda *a, **k: pytest.fail("a cached cell ran again")
    )
    again = run_cells(cells, Cache(tmp_path / "serial", draft=True), workers=2, log=lambda m: None)
    assert [r["final_accuracy"] for r in again] == [r["final_accuracy"] for r in serial]
    # a relabelled cell with the same configuration reuses the record under its own label
    relabelled = Cell("renamed", "elsewhere", 0, cells[0].config, role="sweep")
    hit = Cache(tmp_path / "serial", draft=True).get(relabelled)
    assert (
        hit["method"] == "renamed"
        and hit["role"] == "sweep"
        and hit["final_accuracy"] == serial[0]["final_accuracy"]
    )
    # two cells that spell one configuration differently run once and share the record
    monkeypatch.undo()
    spelled = Cell("spelled-out", "synthetic", 0, {**cells[0].config, "options": {}})
    assert spelled.key == cells[0].key and spelled != cells[0]
    logs: list[str] = []
    both = run_cells(
        [cells[0], spelled], Cache(tmp_path / "dedup", draft=True), workers=2, log=logs.append
    )
    assert "1 to run" in logs[0] and len(list((tmp_path / "dedup").glob("*.json"))) == 1
    assert (
        both[0]["final_accuracy"] == both[1]["final_accuracy"]
        and both[1]["method"] == "spelled-out"
    )


def test_the_cache_key_covers_resolved_defaults_and_options():
    from edgefl.algorithms import get_algorithm

    default = get_algorithm("felo").parse_options({}).alpha
    a = tiny_cell(0, algorithm="felo", method="felo")
    explicit_default = Cell(
        "felo", "synthetic", 0, {**a.config, "options": {"alpha": str(default)}}
    )
    other = Cell("felo", "synthetic", 0, {**a.config, "options": {"alpha": str(default * 2)}})
    assert a.key == explicit_default.key  # the default spelled out is the same run
    assert a.key != other.key and a.key != tiny_cell(1, algorithm="felo", method="felo").key


@pytest.mark.slow
def test_record_extras_are_merged_into_the_record_and_cached_under_their_hook(
    tmp_path, monkeypatch
):
    seen = {}

    def hook(out):
        seen["run_dir_exists"] = (out.run_dir / "rounds.jsonl").exists()
        seen["rounds"] = len(out.rounds)
        return {
            "rounds_seen": len(out.rounds),
            "first_round_accuracy": out.rounds[0]["eval"]["mean_accuracy"],
        }

    monkeypatch.setattr(cells_module, "load_hook", lambda spec: hook)
    cell = tiny_cell(0)
    # Execute
    record = runner.run_cell(cell, (), "tests:hook")
    # Assert: the hook saw the live run directory and its rounds; its keys are in the record
    assert seen == {"run_dir_exists": True, "rounds": 2} and record["rounds_seen"] == 2
    assert record["first_round_accuracy"] == record["per_round"][0]["accuracy"]
    assert record["extras_from"] == "tests:hook"
    # a record made with the hook is a hit for the hook, a miss for a benchmark without it (and
    # back)
    Cache(tmp_path, "tests:hook").put(cell, record)
    assert Cache(tmp_path, "tests:hook").get(cell)["rounds_seen"] == 2
    assert Cache(tmp_path).get(cell) is None
    # a hook may not overwrite what the runner measured
    monkeypatch.setattr(cells_module, "load_hook", lambda spec: lambda out: {"final_accuracy": 1.0})
    with pytest.raises(ValueError, match="already has"):
        runner.run_cell(cell, (), "tests:clash")


def test_prepare_runs_once_before_cells_that_still_have_to_run(tmp_path):
    calls = []
    cells = [tiny_cell(0)]

    def make(quick):
        return runner.Benchmark(
            "t",
            "T",
            "tiny",
            cells,
            prepare=lambda: calls.append(len(list((tmp_path / "cells").glob("*.json")))),
        )

    runner.main(make, ["--out", str(tmp_path), "--workers", "1", "--draft"])
    assert calls == [0]  # before the first cell ran
    ran = json.loads((tmp_path / "results.json").read_text())
    ran["machine"]["before"]["date"] = "the day the cells ran"
    (tmp_path / "results.json").write_text(json.dumps(ran))
    runner.main(make, ["--out", str(tmp_path), "--report-only", "--draft"])
    reported = json.loads((tmp_path / "results.json").read_text())
    # a report rewritten from the cache keeps the machine of the run that made the cells, and says
    # which commits its cells come from
    assert reported["machine"] == ran["machine"]
    assert reported["provenance"]["commits"] == {ran["runs"][0]["code"]: 1}
    # everything cached: nothing to prepare; that run made no cell, so its report states no loads
    runner.main(make, ["--out", str(tmp_path), "--workers", "1", "--draft"])
    assert calls == [0]
    runner.main(make, ["--out", str(tmp_path), "--report-only", "--draft"])
    assert json.loads((tmp_path / "results.json").read_text())["machine"]["after"] == {}


def test_only_runs_the_cells_of_the_roles_it_names(tmp_path):
    # a regeneration of grid and bounds that reads its sweeps' cached cells: --only grid,bound
    grid, bound, swept = tiny_cell(0), replace(tiny_cell(1), role="bound"), replace(
        tiny_cell(2), role="sweep")

    def make(quick):
        return runner.Benchmark("t", "T", "tiny", [grid, swept], bounds={"local_iid": [bound]})

    runner.main(make, ["--out", str(tmp_path), "--workers", "1", "--draft", "--only",
                       "grid,bound"])
    cache = Cache(tmp_path / "cells", draft=True)
    assert cache.get(grid) is not None and cache.get(bound) is not None
    assert cache.get(swept) is None
    with pytest.raises(SystemExit):
        runner.main(make, ["--out", str(tmp_path), "--draft", "--only", "grid,bounds"])


@pytest.mark.slow
def test_fedvtc_records_a_sample_grid_from_the_final_generator_and_draws_it(tmp_path):
    from benchmarks import fedvtc
    from benchmarks.fedvtc.extras import SAMPLES_PER_CLASS

    # Prepare: a tiny FedVTC grid cell (seed 0: the one whose samples the page shows)
    config = {**tiny_cell(0).config, "algorithm": "fedvtc", "tiers": ("1", "2"),
              "feature_dim": 980, "options": {"synthetic_samples": "20", "finetune_epochs": "1"}}
    cell = Cell("fedvtc", "synthetic", 0, config)
    # Execute
    record = runner.run_cell(cell, (), "benchmarks.fedvtc.extras:extras")
    page = fedvtc.figures({"runs": [record]}, tmp_path)
    # Assert: every class the prototypes know, SAMPLES_PER_CLASS images each, drawn into one figure
    samples = record["samples"]
    assert (
        samples["shape"][:2] == [len(samples["classes"]), SAMPLES_PER_CLASS]
        and samples["classes"]
    )
    assert samples["shape"][2:] == [28, 28]
    assert (tmp_path / "samples_synthetic.png").stat().st_size > 1000
    assert "samples_synthetic.png" in page


@pytest.mark.slow
def test_fedhenn_records_the_local_split_accuracy_of_every_device(tmp_path):
    # Prepare: a tiny FedHeNN cell on shards of 2 classes, its record made with the benchmark's hook
    config = {**tiny_cell(0).config, "algorithm": "fedhenn", "clients": 3, "partition": "shards",
              "classes_per_client": 2, "public_fraction": 0.1, "options": {"rad_size": "20"}}
    # Execute
    record = runner.run_cell(
        Cell("fedhenn", "synthetic", 0, config), (), "benchmarks.fedhenn.extras:extras"
    )
    # Assert: one local accuracy per device, their mean recorded, each a share
    local = record["client_local_accuracy"]
    assert set(local) == set(record["client_accuracy"]) and len(local) == 3
    assert all(0.0 <= a <= 1.0 for a in local.values())
    assert record["local_accuracy"] == pytest.approx(sum(local.values()) / 3)


def test_an_option_added_later_keys_a_cell_only_when_it_changes_the_computation():
    # Prepare: a FedVTC cell at the defaults, one with the later option set, and the key the cell
    # had before the option existed (its resolved options without it)
    config = {"algorithm": "fedvtc", "dataset": "synthetic", "rounds": 1}
    # the computation from before the options existed
    paper = {"proto_rc_weight": "0", "psi_bn": "average"}
    plain = Cell("fedvtc", "s", 0, {**config, "options": paper})
    proto = Cell("fedvtc", "s", 0, {**config, "options": {**paper, "proto_rc_weight": "10"}})
    keyed_without = runner.resolved_run(plain)["options"]
    # Assert: at the value that reproduces the old computation the option is not in the key; another
    # value is
    assert "proto_rc_weight" not in keyed_without and "psi_bn" not in keyed_without
    assert runner.resolved_run(proto)["options"]["proto_rc_weight"] == 10.0
    assert plain.key != proto.key
    # a later default that differs from the old computation is keyed (every cell re-runs)
    # the method's default (10) is not the old computation: a cell that does not set it is keyed
    # with it
    default = Cell("fedvtc", "s", 0, config)
    assert (
        runner.resolved_run(default)["options"]["proto_rc_weight"] == 10.0
        and default.key != plain.key
    )


# -- provenance (benchmarks/provenance.py) ---------------------------------------------------------
def test_the_cache_is_keyed_by_the_code_hash_and_keeps_pre_provenance_cells_for_reports_only(
    tmp_path,
):
    cell = tiny_cell(0)
    record = full_run(
        cell, 0.8, code="abc1234", code_hash="aaaa", draft=False, finished_at="2026-01-01T00:00:00"
    )
    Cache(tmp_path, code_hash="aaaa").put(cell, record)
    assert Cache(tmp_path, code_hash="aaaa").get(cell)["final_accuracy"] == 0.8
    # other code: a run never reuses it; a report finds it (and marks it, below)
    assert Cache(tmp_path, code_hash="bbbb").get(cell) is None
    assert Cache(tmp_path, code_hash="bbbb").find(cell)["code_hash"] == "aaaa"
    # a cell cached before code hashes existed (<key>.json, no code_hash): reports only
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / f"{cell.key}.json").write_text(json.dumps(full_run(cell, 0.7, code="old+dirty")))
    assert Cache(legacy, code_hash="bbbb").get(cell) is None
    found = Cache(legacy, code_hash="bbbb").find(cell)
    assert found["final_accuracy"] == 0.7
    from benchmarks import provenance

    assert provenance.cell_provenance(found, "bbbb") == provenance.PRE_PROVENANCE
    assert provenance.cell_provenance(record, "bbbb") == "other code"
    # a draft is reused only by a draft
    Cache(tmp_path / "d", code_hash="cccc", draft=True).put(
        cell, {**record, "draft": True, "code_hash": "cccc"}
    )
    assert Cache(tmp_path / "d", code_hash="cccc").get(cell) is None
    assert Cache(tmp_path / "d", code_hash="cccc", draft=True).get(cell) is not None


def test_the_code_hash_follows_the_code(tmp_path, monkeypatch):
    from benchmarks import provenance

    package = tmp_path / "edgefl"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(provenance, "PACKAGE", package)
    provenance.code_hash.cache_clear()
    try:
        first = provenance.code_hash(None)
        provenance.code_hash.cache_clear()
        (package / "a.py").write_text("x = 2\n")
        assert provenance.code_hash(None) != first
    finally:
        provenance.code_hash.cache_clear()


@pytest.mark.parametrize("name", ["hierarchyfl", "fedhenn", "fedvtc", "time_to_accuracy"])
def test_a_benchmarks_code_hash_covers_its_hook_module_not_its_grid_or_page(name):
    import ast
    import importlib

    from benchmarks import provenance

    bench = importlib.import_module(f"benchmarks.{name}").make(False)
    here = provenance.ROOT / "benchmarks" / name
    # Assert: beyond the edgefl package the hash covers the hook's own module only, not the
    # package's __init__ (grid, claims, page text): editing those leaves every cell current
    assert bench.record_extras == f"benchmarks.{name}.extras:extras"
    hashed = provenance.code_files(bench.record_extras)
    assert [p for p in hashed if not p.is_relative_to(provenance.PACKAGE)] == [here / "extras.py"]
    # what the hook runs is in that file: it imports no benchmark module (its package's __init__
    # included) but the runner's RunOutput
    tree = ast.parse((here / "extras.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m.split(".")[0] == "benchmarks"} <= {"benchmarks.cells"}
    # the committed cells, cached under the hook's old name, are still read by the page
    committed = Cache(here / "cells", bench.record_extras)
    assert any(committed.find(c) is not None for c in bench.all_cells())


def test_a_record_cached_under_a_moved_hooks_old_name_is_reported_but_never_reused(tmp_path):
    from benchmarks import provenance

    # Prepare: a record made by a hook under its old name, at the old module's code hash
    cell = tiny_cell(0)
    old, new = "benchmarks.fedvtc:extras", "benchmarks.fedvtc.extras:extras"
    assert cache_module.MOVED_HOOKS[old] == new
    record = full_run(cell, 0.8, code="abc1234", code_hash="aaaa", extras_from=old)
    Cache(tmp_path, old, code_hash="aaaa").put(cell, record)
    now = Cache(tmp_path, new, code_hash="bbbb")
    # Assert: a report finds it (marked other code); a run does not reuse it
    assert now.find(cell)["final_accuracy"] == 0.8
    assert provenance.cell_provenance(now.find(cell), now.code_hash) == "other code"
    assert now.get(cell) is None
    # another hook's cache still misses it
    assert Cache(tmp_path, "benchmarks.fedhenn.extras:extras", code_hash="bbbb").find(cell) is None


def test_cells_from_dirty_code_are_refused_unless_a_draft(tmp_path, monkeypatch):
    from benchmarks import provenance

    monkeypatch.setattr(provenance, "code_version", lambda record_extras=None: "abc1234+dirty")
    monkeypatch.setattr(
        runner, "run_cell", lambda *a, **k: pytest.fail("a cell ran from dirty code")
    )
    with pytest.raises(runner.DirtyCode, match="--draft"):
        run_cells([tiny_cell(0)], Cache(tmp_path, code_hash="h"), workers=1, log=lambda m: None)
    with pytest.raises(SystemExit, match="draft"):
        runner.main(
            lambda quick: runner.Benchmark("t", "T", "tiny", [tiny_cell(0)]),
            ["--out", str(tmp_path), "--workers", "1"],
        )


# -- the reviewer's check --------------------------------------------------------------------------
DECLARED = sorted(d.parent.name for d in runner.BENCHMARKS.glob("*/declared.json"))  # all of them
@pytest.mark.parametrize("name", DECLARED)
def test_every_benchmarks_quick_profile_takes_the_reviewers_cells(name):
    import importlib

    bench = importlib.import_module(f"benchmarks.{name}").make(True)
    claim = next(
        c
        for c in bench.claims
        if c.setting in {x.setting for x in bench.cells} and c.parse()[0] != c.parse()[2]
    )
    a, _, b = claim.parse()
    cells = runner.reviewer_cells(bench, [a, b], claim.setting, [101, 102, 103])
    assert [(c.method, c.seed) for c in cells] == [(m, s) for m in (a, b) for s in (101, 102, 103)]
    template = next(c for c in bench.cells if c.method == a and c.setting == claim.setting)
    # the same run, another seed
    assert cells[0].config == template.config and cells[0].key != template.key
    with pytest.raises(SystemExit, match="settings"):
        runner.reviewer_cells(bench, [a], "no-such-setting", [1])


@pytest.mark.slow
def test_the_reviewers_check_runs_chosen_cells_with_new_seeds_into_its_own_folder(
    tmp_path, capfd, monkeypatch
):
    cells = [tiny_cell(s, method=m, algorithm=m) for s in range(3) for m in ("fedavg", "local")]
    bench = runner.Benchmark(
        "t",
        "T",
        "tiny",
        cells,
        claims=[
            Claim("c", "fedavg > local", "synthetic"),
            Claim("n", "fedavg ≥ local", "synthetic", kind="not worse"),
        ],
    )
    out = tmp_path / "check"
    monkeypatch.chdir(tmp_path)  # any directory
    result = runner.main(
        lambda quick: bench,
        [
            "--cells",
            "fedavg,local",
            "--setting",
            "synthetic",
            "--seeds",
            "7,8,9",
            "--out",
            str(out),
            "--workers",
            "2",
            "--draft",
        ],
    )
    printed = capfd.readouterr().out
    # Assert: its own cells with the reviewer's seeds, a verdict per claim, progress per round
    assert sorted((r["method"], r["seed"]) for r in result["runs"]) == [
        (m, s) for m in ("fedavg", "local") for s in (7, 8, 9)
    ]
    assert {c["id"] for c in result["claims"]} == {"c", "n"}
    assert all(c["verdict"] in runner.VERDICTS + ("not worse", "worse") for c in result["claims"])
    assert (
        "fedavg > local [synthetic]" in printed
        and "round 2/2" in printed
        and "round 3/2" not in printed
    )
    assert json.loads((out / "check.json").read_text())["seeds"] == [7, 8, 9]
    assert len(list((out / "cells").glob("*.json"))) == 6
    # run directories lived there, and are gone
    assert (out / "tmp").is_dir() and not list((out / "tmp").iterdir())
    assert not (runner.BENCHMARKS / "t").exists()


def test_a_benchmark_runs_from_any_directory(tmp_path):
    """As its page says: ``PYTHONPATH=/path/to/repo python -m benchmarks.<name> …`` (no benchmark
    edits sys.path)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(runner.ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.foundation", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "--seeds" in done.stdout


def test_device_class_counts_read_each_devices_shard_past_the_public_carve_out():
    from benchmarks.common import device_class_counts

    # Prepare: shards of 2 classes with 10 % of the training images carved out for the server first
    config = {**tiny_cell(0).config, "clients": 4, "partition": "shards", "classes_per_client": 2,
              "public_fraction": 0.1, "train_samples": 400, "tiers": ("1",)}
    # Execute
    counts = device_class_counts(config)
    # Assert: every device holds exactly its two classes (indexing the whole training set instead of
    # the pool left after the carve-out gave every device a spread over all classes)
    assert len(counts) == 4
    for _, per_class in counts.values():
        assert sum(c > 0 for c in per_class) == 2
    # (with 8 shards for 10 classes the partition uses 8 of them: at most the 360 images left)
    assert 0 < sum(sum(c) for _, c in counts.values()) <= 400 - 40


@pytest.mark.slow
def test_partial_reports_the_cells_that_finished_and_lists_the_missing(tmp_path):
    cells = [tiny_cell(s, method=m, algorithm=m) for s in range(3) for m in ("fedavg", "local")]
    bench = runner.Benchmark("t", "T", "tiny", cells,
                             claims=[Claim("c", "fedavg > local", "synthetic")])
    # seed 2 never ran
    run_cells(cells[:4], Cache(tmp_path / "cells", draft=True), workers=1, log=lambda m: None)
    args = ["--out", str(tmp_path), "--report-only", "--draft"]
    assert runner.main(lambda quick: bench, args) == {}  # without --partial: nothing written
    assert not (tmp_path / "results.json").exists()
    results = runner.main(lambda quick: bench, [*args, "--partial"])
    assert results["missing"] == [c.label for c in cells[4:]]
    assert [r["seed"] for r in results["runs"]] == [0, 0, 1, 1]
    claim = results["claims"][0]
    assert claim["seeds"] == [0, 1] and claim["verdict"] == "not comparable"
    page = (tmp_path / "results.md").read_text()
    assert "**Incomplete: 2 cells of the declared grid did not run**" in page
    assert "`grid:synthetic:fedavg:s2`" in page



def test_the_time_to_accuracy_hook_divides_offline_devices_by_the_fleets_size(tmp_path):
    from types import SimpleNamespace

    from benchmarks.cells import RunOutput
    from benchmarks.time_to_accuracy.extras import extras

    # Prepare: two synchronous rounds of a 20-device fleet, 5 and then 1 device offline
    rounds = [
        {"completed": ["d00"], "failed": [], "simulated_seconds": 10.0 * (i + 1),
         "clock": {"start": 10.0 * i, "offline": [f"d{j:02d}" for j in range(k)]},
         "eval": {"mean_accuracy": 0.5}}
        for i, k in enumerate((5, 1))
    ]
    out = RunOutput(
        cell=tiny_cell(0), config=SimpleNamespace(clients=20), run_dir=tmp_path,
        summary={"simulated_seconds": 20.0, "mean_accuracy": 0.5}, rounds=rounds,
    )
    # Act / Assert: the mean share offline is (5/20 + 1/20) / 2, not a share of 10 devices
    assert extras(out)["offline_at_selection"] == pytest.approx(0.15)


def test_the_pages_check_line_is_one_shell_command_for_method_names_with_spaces():
    # Prepare: the privacy benchmark, whose method names hold spaces ("fedavg ε=∞")
    import shlex

    from benchmarks import privacy
    from benchmarks.pages import reviewer_section

    bench = privacy.make(False)
    # Execute: the page's line, split as a shell splits it
    line = next(x for x in reviewer_section(bench) if "--cells" in x)
    argv = shlex.split(line)
    # Assert: one --cells argument naming methods of the benchmark, in the setting named
    cells = argv[argv.index("--cells") + 1].split(",")
    setting = argv[argv.index("--setting") + 1]
    assert argv[:3] == ["python", "-m", "benchmarks.privacy"]
    assert any(" " in m for m in cells)
    assert all(any(c.method == m and c.setting == setting for c in bench.cells) for m in cells)
