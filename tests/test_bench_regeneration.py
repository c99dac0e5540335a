"""What regenerating a benchmark's page costs (issue 37): the cells' records keep when, under what
load and in which invocation they ran (outside the cache key), and the page's "Regeneration"
paragraph groups them and estimates the run at 2 workers (benchmarks/regeneration.py)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from benchmarks import runner
from benchmarks.cells import TIME_FORMAT
from benchmarks.index import estimate
from benchmarks.regeneration import (
    measured,
    measured_paragraph,
    own_measured,
    paragraph,
    quick_measured,
    quick_paragraph,
    regeneration,
)
from benchmarks.runner import Cache, run_cells
from tests.bench_cases import full_run, tiny_cell

T0 = datetime.fromisoformat("2026-11-27T10:00:00+00:00")


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime(TIME_FORMAT)


def timed(seed, start_min, wall, cpu=None, method="fedavg", **extra):
    """A record of a cell that started ``start_min`` minutes after T0 and ran ``wall`` seconds."""
    cell = tiny_cell(seed, method=method)
    return full_run(
        cell, 0.5, wall_seconds=wall, finished_at=at(start_min + wall / 60),
        **({"cpu_seconds": cpu} if cpu is not None else {}), **extra,
    )


@pytest.mark.slow
def test_cells_run_by_workers_record_their_times_loads_and_invocation_outside_the_key(tmp_path):
    # Prepare: two cells, keys computed before anything ran
    cells = [tiny_cell(0), tiny_cell(1, method="local", algorithm="local")]
    keys = [c.key for c in cells]
    before = datetime.now().astimezone().replace(microsecond=0)
    # Execute: one invocation, two worker processes
    records = run_cells(cells, Cache(tmp_path, draft=True), workers=2, log=lambda m: None,
                        invocation="inv-1")
    after = datetime.now().astimezone()
    # Assert: each record (in memory and on disk) carries the invocation, its start and end within
    # the call, in order, and the machine's load at both ends; the key and config are unchanged
    for cell, key, record in zip(cells, keys, records, strict=True):
        disk = json.loads(next(tmp_path.glob(f"{key}-*.json")).read_text())
        for r in (record, disk):
            assert r["invocation"] == "inv-1"
            assert r["key"] == key == cell.key
            assert r["config"] == json.loads(json.dumps(cell.full_config()))
            assert "invocation" not in r["config"] and "started_at" not in r["resolved_config"]
            start = datetime.strptime(r["started_at"], TIME_FORMAT)
            end = datetime.strptime(r["finished_at"], TIME_FORMAT)
            assert before <= start <= end <= after
            # the whole cell spans at least its run (one-second resolution of the stamps)
            assert (end - start).total_seconds() >= r["wall_seconds"] - 1
            assert r["load_at_start"] >= 0 and r["load_at_end"] >= 0
            assert r["cpu_seconds"] > 0
    # a call given no invocation makes its own, one for all its cells
    again = run_cells([tiny_cell(2), tiny_cell(3)], Cache(tmp_path / "b", draft=True), workers=2,
                      log=lambda m: None)
    assert again[0]["invocation"] == again[1]["invocation"] != "inv-1"


def test_main_passes_one_invocation_to_every_cell_it_runs(tmp_path, monkeypatch):
    seen: list = []

    class Ran(Exception):
        pass

    def fake_run_cells(todo, cache, **kw):
        seen.append(kw.get("invocation"))
        raise Ran

    monkeypatch.setattr(runner, "run_cells", fake_run_cells)
    bench = runner.Benchmark("t", "T", "tiny", [tiny_cell(0)])
    for _ in range(2):
        with pytest.raises(Ran):
            runner.main(lambda quick: bench, ["--draft", "--out", str(tmp_path)])
    # one id per invocation: set, and another for the next invocation (even in the same process
    # within the same second)
    assert len(seen) == 2 and all(seen) and seen[0] != seen[1]


def test_cells_are_grouped_by_invocation_else_by_commit_with_measured_spans_and_sums():
    # Prepare: one invocation of two cells at 10:00 (new records), and two old records at commit
    # abc that ran an hour apart (no started_at, no load, one without cpu_seconds)
    new = [
        timed(0, 0, 600, cpu=500, code="c1", invocation="inv", started_at=at(0),
              load_at_start=1.5, load_at_end=2.0),
        # started_at half a minute before its run began: 30 s outside the run
        timed(1, 1, 1200, cpu=1000, code="c1", invocation="inv", started_at=at(0.5),
              load_at_start=0.5, load_at_end=3.25),
    ]
    old = [timed(2, 100, 300, cpu=250, code="abc"), timed(3, 160, 240, code="abc")]
    # Execute
    regen = regeneration(new + old)
    # Assert: two groups, ordered by start
    inv, commit = regen["groups"]
    assert (inv["by"], inv["id"], inv["cells"], inv["commits"]) == ("invocation", "inv", 2, ["c1"])
    # span from the earliest started_at (10:00) to the latest finish (10:01 + 20 min)
    assert inv["span_minutes"] == pytest.approx(21)
    assert inv["wall_seconds"] == 1800 and inv["cpu_seconds"] == 1500
    assert inv["load"] == [0.5, 3.25]
    assert inv["outside_run_seconds"] == pytest.approx(0 + 30)
    # old records: start = finish - wall; 11:40 to 12:44
    assert (commit["by"], commit["id"], commit["cells"]) == ("commit", "abc", 2)
    assert commit["span_minutes"] == pytest.approx(64)
    assert commit["wall_seconds"] == 540 and commit["cpu_seconds"] is None
    assert commit["load"] is None and commit["outside_run_seconds"] is None
    # one record lacks cpu_seconds: the estimate falls back on wall seconds
    assert regen["estimate_from"] == "wall_seconds" and regen["cpu_seconds"] is None
    assert regen["estimate_seconds"] == pytest.approx((1800 + 540) / 2)
    assert regen["target_met"] is True
    text = "\n".join(paragraph(regen))
    assert "invocation `inv` at `c1`: 2 cells (one invocation): measured span 21.0 min" in text
    assert "Σ wall 1,800 s; Σ CPU 1,500 s; 1-minute load 0.50 to 3.25" in text
    assert "commit `abc`: 2 cells (cells from separate runs at this commit; the span includes" \
           in text
    assert "measured span 64.0 min" in text and "Σ CPU not known (1 of 2 records" in text
    assert "Σ wall seconds / 2 = 2,340 s / 2 = 19.5 min, from wall times that move with the " \
           "machine's load (1 of 4 records lack cpu_seconds)" in text
    assert "measured 30 s over the 2 cells whose records keep `started_at`" in text
    assert "Target ≤ 60 min: met by this estimate" in text


def test_the_estimate_uses_cpu_seconds_when_every_cell_has_them_and_says_when_it_misses():
    records = [timed(s, 0, 3000, cpu=2600, code="c1") for s in range(3)]
    regen = regeneration(records)
    assert regen["estimate_from"] == "cpu_seconds"
    assert regen["estimate_seconds"] == pytest.approx(3 * 2600 / 2)  # 65 min
    assert regen["target_met"] is False
    text = "\n".join(paragraph(regen))
    assert "Σ CPU seconds / 2 = 7,800 s / 2 = 65.0 min" in text
    assert "Target ≤ 60 min: not met by this estimate" in text
    assert "wall times that move" not in text and "no record here keeps `started_at`" in text


def test_records_without_times_and_shared_keys_are_counted_once_and_without_a_span():
    # Prepare: a pre-provenance record (no finished_at), the same cell reported twice (a sweep
    # value that is also a grid cell), and an empty page
    bare = full_run(tiny_cell(0), 0.5, wall_seconds=100.0, code="old")
    twice = timed(1, 0, 200, code="old")
    relabelled = {**twice, "method": "other", "role": "sweep"}
    # Execute
    regen = regeneration([bare, twice, relabelled])
    # Assert: two cells, the span over the one with a time, said so
    (g,) = regen["groups"]
    assert g["cells"] == 2 and g["cells_with_time"] == 1 and g["wall_seconds"] == 300
    assert g["span_minutes"] == pytest.approx(200 / 60)
    assert "over the 1 cells whose records keep when they finished" in "\n".join(paragraph(regen))
    # no record keeps a time: no span, no crash
    (g,) = regeneration([bare])["groups"]
    assert g["span_minutes"] is None and g["start"] is None
    assert "no measured span" in "\n".join(paragraph(regeneration([bare])))
    # a results.json written before the paragraph existed, or a page without cells: no paragraph
    assert paragraph(None) == [] and paragraph(regeneration([])) == []


def test_the_page_and_results_json_carry_the_regeneration(tmp_path):
    # Prepare: a benchmark of two cached cells from one invocation
    cells = [tiny_cell(0), tiny_cell(1)]
    cache = Cache(tmp_path / "cells", code_hash="h" * 16)
    for i, c in enumerate(cells):
        cache.put(c, {**timed(i, 5 * i, 120, cpu=100, code="c9", invocation="inv-9",
                              started_at=at(5 * i)), "code_hash": "h" * 16})
    bench = runner.Benchmark("t", "T", "tiny", cells)
    # Execute: a report from the cache, running nothing
    runner.main(lambda quick: bench, ["--report-only", "--out", str(tmp_path)])
    # Assert
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["regeneration"]["cells"] == 2
    assert results["regeneration"]["groups"][0]["id"] == "inv-9"
    assert results["regeneration"]["estimate_seconds"] == pytest.approx(100)
    page = (tmp_path / "results.md").read_text()
    code_at = page.index("Code: the hash")
    assert code_at < page.index("Regeneration: the 2 cells") < page.index("## Check it yourself")
    assert "measured span 7.0 min" in page
    # the index's line for it
    line = estimate(results["regeneration"])
    assert line == (" Regeneration at 2 workers estimated at 2 min (Σ CPU seconds / 2; "
                    "target ≤ 60 min met).")



def _regenerated(bench_dir, records, claims, folder="regeneration", **extra):
    folder = bench_dir / folder
    folder.mkdir(parents=True, exist_ok=True)
    machine = {"cpu": "AMD EPYC", "cores": 2, "loadavg_1_5_15": [1.5, 1.0, 0.5]}
    (folder / "results.json").write_text(json.dumps({
        "regeneration": regeneration(records), "claims": claims, "missing": [],
        "machine": {"before": machine, "after": {**machine, "loadavg_1_5_15": [2.5, 2, 1]}},
        **extra}))


def test_a_regeneration_kept_beside_the_page_is_stated_as_measured(tmp_path):
    # Prepare: a whole regeneration from one invocation at a clean commit (two cells over 70
    # minutes), whose second claim's verdict differs from the page's
    def claim(statement, verdict, kind="paper"):
        return {"statement": statement, "setting": "s", "verdict": verdict, "kind": kind}

    page_claims = [claim("a > b", "reproduced"), claim("c > d", "reproduced")]
    there = [claim("a > b", "reproduced"), claim("c > d", "not reproduced")]
    records = [timed(0, 0, 1800, cpu=1700, code="c9", invocation="inv-1", started_at=at(0)),
               timed(1, 40, 1800, cpu=1750, code="c9", invocation="inv-1", started_at=at(40))]
    runs_there = [{"method": "a", "setting": "s", "seed": i, "final_accuracy": 0.5 + i / 100}
                  for i in range(2)]
    page_runs = [{**r, "final_accuracy": 0.5} for r in runs_there]
    _regenerated(tmp_path, records, there, runs=runs_there)
    # Execute
    m = measured(tmp_path, page_claims, page_runs)
    # Assert: its span (70 min: over the hour), its loads, its count and the differing row
    assert m["commit"] == "c9" and m["cells"] == 2
    assert m["span_minutes"] == pytest.approx(70) and m["target_met"] is False
    assert m["cpu_seconds"] == 3450 and m["load_start"][0] == 1.5 and m["load_end"][0] == 2.5
    assert m["reproduced"] == [1, 2]
    assert m["differ"] == [{"statement": "c > d", "setting": "s", "metric": None,
                            "page": "reproduced", "regenerated": "not reproduced"}]
    text = "\n".join(measured_paragraph(m, (2, 2)))
    assert "**70.0 min**" in text and "**not met**, measured" in text
    assert "`c > d` [s] reproduced here, not reproduced there" in text
    assert "Claims reproduced there: 1 of 2 (here 2 of 2)" in text
    # the same runs moved by 0 and +1 point there
    assert m["run_shift"] == pytest.approx({"runs": 2, "mean": 0.5, "sd": 0.5, "max_abs": 1.0})
    assert "The same 2 runs (method, setting, seed) moved by +0.50 ± 0.50 points" in text
    regen = {**regeneration(records), "measured": m}
    assert estimate(regen).startswith(" Regenerated in one run in 70 min, measured on 2 cores "
                                      "(target ≤ 60 min not met; claims reproduced there 1 of 2).")
    # none where the run is not one whole run from clean code, or where there is none
    assert measured(tmp_path / "elsewhere", page_claims) is None
    assert measured_paragraph(None, (0, 0)) == []
    for bad in ([records[0], {**records[1], "invocation": "inv-2"}],  # two runs
                [{**r, "code": "c9+dirty"} for r in records]):  # uncommitted code
        _regenerated(tmp_path, bad, there)
        assert measured(tmp_path, page_claims) is None
    _regenerated(tmp_path, records, there, missing=["grid:s:a:s2"])  # stopped before its end
    assert measured(tmp_path, page_claims) is None
    # a regeneration of another version of the page (two cells where the page now has three)
    _regenerated(tmp_path, records, there)
    assert measured(tmp_path, page_claims, cells=2) is not None
    assert measured(tmp_path, page_claims, cells=3) is None


def test_a_page_written_outside_its_folder_links_back_to_the_folders_files(tmp_path):
    bench_dir = tmp_path / "bench"
    out = bench_dir / "regeneration"
    out.mkdir(parents=True)
    (bench_dir / "declared.json").write_text("{}")
    (out / "accuracy.png").write_bytes(b"")
    text = ("[d](declared.json) [a](accuracy.png) [w](https://x.org/a) [m](missing.md) "
            "[r](declared.json#main)")
    assert runner.relink(text, out, bench_dir) == (
        "[d](../declared.json) [a](accuracy.png) [w](https://x.org/a) [m](missing.md) "
        "[r](../declared.json#main)")
    assert runner.relink(text, bench_dir, bench_dir) == text  # the page in its own folder


def test_a_measured_regeneration_tells_claims_apart_by_their_metric(tmp_path):
    # one claim read on two metrics (per tier): only the tier whose verdict moved differs
    def claim(metric, verdict):
        return {"statement": "h > f", "setting": "s", "metric_a": metric, "metric_b": metric,
                "verdict": verdict, "kind": "paper"}

    records = [timed(0, 0, 60, cpu=50, code="c9", invocation="inv-1", started_at=at(0))]
    _regenerated(tmp_path, records, [claim("per_tier.1", "reproduced"),
                                     claim("per_tier.2", "not reproduced")])
    m = measured(tmp_path, [claim("per_tier.1", "reproduced"), claim("per_tier.2", "reproduced")])
    assert [(d["metric"], d["page"], d["regenerated"]) for d in m["differ"]] == [
        ("per_tier.2", "reproduced", "not reproduced")]
    assert "`h > f` [s, per_tier.2] reproduced here, not reproduced there" in "\n".join(
        measured_paragraph(m, (2, 2)))


def test_a_quick_run_kept_beside_the_page_states_its_time_and_signs(tmp_path):
    # Prepare: a quick run of one invocation at a clean commit (7 minutes) with four claims: one
    # agreeing, one of the other sign, one measured on another metric, one the page does not count
    def claim(statement, mean, metric="final_accuracy", kind="paper", signs=(1, 1)):
        return {"statement": statement, "setting": "s", "metric_a": metric, "metric_b": metric,
                "mean_diff": mean, "sd": 0.01, "signs": list(signs), "kind": kind,
                "verdict": "not reproduced"}

    page = [claim("a > b", 0.05), claim("c > d", 0.02), claim("t < u", -300.0, "time_to_80"),
            claim("e > f", 0.03, kind="implied"), claim("g > h", 0.04)]
    quick = [claim("a > b", 0.01), claim("c > d", -0.01, signs=(-1, 1)),
             claim("t < u", -100.0, "time_to_70"), claim("e > f", 0.03, kind="implied")]
    records = [timed(0, 0, 300, cpu=280, code="c9", invocation="inv-q", started_at=at(0)),
               timed(1, 2, 300, cpu=290, code="c9", invocation="inv-q", started_at=at(2))]
    _regenerated(tmp_path, records, quick, folder="quick", command="python -m b --quick")
    # Execute
    q = quick_measured(tmp_path, page)
    # Assert: 7 minutes (target met); of the four counted claims three are compared, two agree
    assert q["span_minutes"] == pytest.approx(7) and q["target_met"] is True
    assert q["counted"] == 4 and len(q["rows"]) == 3 and q["agree"] == 2
    rows = {r["statement"]: r for r in q["rows"]}
    assert rows["a > b"]["agree"] and not rows["c > d"]["agree"]
    assert rows["t < u"]["other_metric"] and rows["t < u"]["quick_metric"] == "time_to_70"
    text = "\n".join(quick_paragraph(q))
    assert "**7.0 min**" in text and "Target ≤ 10 min: **met**" in text
    assert "**2 of 3** compared (1 of this page's 4 counted claims" in text
    assert "| `c > d` | s | `final_accuracy` | -1.00 ± 1.00 (− +) | +2.00 | no |" in text
    assert "`time_to_80` (quick: `time_to_70`) | -100.00 ± 0.01 (+ +) | -300.00 | yes |" in text
    assert estimate({**regeneration(records), "quick": q}).startswith(
        " Quick profile measured in 7.0 min (target ≤ 10 min met), signs agreeing for 2 of 3")
    # none from dirty code, from two runs, or where there is none
    assert quick_measured(tmp_path / "elsewhere", page) is None and quick_paragraph(None) == []
    for bad in ([records[0], {**records[1], "invocation": "inv-2"}],
                [{**r, "code": "c9+dirty"} for r in records]):
        _regenerated(tmp_path, bad, quick, folder="quick")
        assert quick_measured(tmp_path, page) is None


def test_a_page_whose_own_cells_ran_in_one_invocation_states_that_run_as_measured():
    # Prepare: the page's two cells from one invocation at a clean commit, 70 minutes
    records = [timed(0, 0, 1800, cpu=1700, code="c9", invocation="inv-1", started_at=at(0)),
               timed(1, 40, 1800, cpu=1750, code="c9", invocation="inv-1", started_at=at(40))]
    machine = {"cpu": "AMD EPYC", "cores": 2, "loadavg_1_5_15": [1.5, 1.0, 0.5]}
    results = {"regeneration": regeneration(records), "missing": [],
               "claims": [{"statement": "a > b", "setting": "s", "verdict": "reproduced",
                           "kind": "paper"}],
               "machine": {"before": machine, "after": {**machine, "loadavg_1_5_15": [2.5, 2, 1]}}}
    # Execute
    m = own_measured(results)
    # Assert
    assert m["folder"] is None and m["commit"] == "c9" and m["cells"] == 2
    assert m["span_minutes"] == pytest.approx(70) and m["target_met"] is False
    assert m["reproduced"] == [1, 1]
    text = "\n".join(measured_paragraph(m, (1, 1)))
    assert text.startswith("Measured: this page's 2 cells ran in one invocation at clean `c9`")
    assert "**70.0 min**" in text and "**not met**, measured on this machine" in text
    assert estimate({**results["regeneration"], "measured": m}).startswith(
        " Its cells ran in one invocation in 70 min, measured on 2 cores (target ≤ 60 min not "
        "met).")
    # none from two invocations, from dirty code, or with cells missing
    assert own_measured({**results, "missing": ["grid:s:a:s2"]}) is None
    for bad in ([records[0], {**records[1], "invocation": "inv-2"}],
                [{**r, "code": "c9+dirty"} for r in records]):
        assert own_measured({**results, "regeneration": regeneration(bad)}) is None


def test_a_measured_run_takes_its_loads_from_its_own_machine_block_only():
    # Prepare: one invocation's cells; the page's machine block is of that run, then of another
    # (a report that kept an earlier run's block)
    loads = {"load_at_start": 1.0, "load_at_end": 1.5}
    records = [timed(0, 0, 600, cpu=590, code="c9", invocation="inv-1", started_at=at(0), **loads),
               timed(1, 5, 600, cpu=595, code="c9", invocation="inv-1", started_at=at(5), **loads)]
    machine = {"cpu": "AMD EPYC", "cores": 2, "loadavg_1_5_15": [3.25, 2, 1]}
    results = {"regeneration": regeneration(records), "missing": [], "claims": []}
    for invocation, stated in (("inv-1", "load 3.25 at the start and 3.10 at the end"),
                               ("inv-0", "load 1.00–1.50 at the cells' starts and ends")):
        before = {**machine, "invocation": invocation}
        after = {**before, "loadavg_1_5_15": [3.1, 2, 1]}
        # Execute
        m = own_measured({**results, "machine": {"before": before, "after": after}})
        # Assert: another run's loads are never stated as this run's; the cells' own are
        assert m["cores"] == 2 and m["cpu"] == "AMD EPYC"
        assert stated in "\n".join(measured_paragraph(m, (0, 0)))


def test_sweeps_read_from_earlier_runs_leave_the_claims_cells_run_measured():
    # Prepare: the grid and bounds from one invocation at a clean commit (50 minutes); two sweep
    # cells from an earlier commit, read (they chose the defaults), 1,200 s of wall each
    grid = [timed(0, 0, 1500, cpu=1400, code="c9", invocation="inv-1", started_at=at(0),
                  role="grid"),
            timed(1, 25, 1500, cpu=1450, code="c9", invocation="inv-1", started_at=at(25),
                  role="bound")]
    sweeps = [timed(s, -300, 1200, code="c1", role="sweep", method="sweepy") for s in (2, 3)]
    # a dated machine block of another day: not this run's, so the cells' own loads are stated
    day = {"cpu": "AMD EPYC", "cores": 2, "loadavg_1_5_15": [9.0, 9, 9], "date": "2020-01-01 "
           "00:00:00 UTC"}
    results = {"regeneration": regeneration(grid + sweeps), "missing": [], "claims": [],
               "machine": {"before": day, "after": day}}
    # Execute
    m = own_measured(results)
    # Assert: the run of the claims' cells, with the sweeps' cost if rerun beside it
    assert m["cells"] == 2 and m["span_minutes"] == pytest.approx(50) and m["target_met"]
    assert m["sweeps_read"] == {"cells": 2, "wall_seconds": 2400, "estimate_seconds": 1200}
    assert m["load_start"] is None and m["cpu"] == "AMD EPYC"
    text = "\n".join(measured_paragraph(m, (0, 0)))
    assert text.startswith("Measured: this page's 2 grid and bound cells ran in one invocation")
    assert "the page's 2 sweep cells" in text and "would add about 20 min" in text
    assert "9.00" not in text
    assert estimate({**results["regeneration"], "measured": m}).startswith(
        " Its grid and bounds ran in one invocation in 50 min, measured on 2 cores (target ≤ 60 "
        "min met); its 2 sweep cells are read from earlier runs (about 20 min more if rerun).")
    # a grid cell from another run is not read like a sweep: nothing is measured then
    other = [grid[0], {**grid[1], "invocation": None, "code": "c1"}, *sweeps]
    assert own_measured({**results, "regeneration": regeneration(other)}) is None


def test_a_report_from_cached_cells_keeps_a_machine_block_only_if_it_is_their_runs():
    from benchmarks.regeneration import machine_of

    records = [timed(0, 0, 600, cpu=590, code="c9", invocation="inv-1", started_at=at(0)),
               timed(1, 5, 600, cpu=595, code="c9", invocation="inv-1", started_at=at(5))]
    regen = regeneration(records)
    start, end = (datetime.fromisoformat(regen["groups"][0][k]) for k in ("start", "end"))

    def block(when):
        return {"cpu": "AMD EPYC", "cores": 2, "loadavg_1_5_15": [1.2, 1, 1],
                "date": when.strftime("%Y-%m-%d %H:%M:%S UTC")}

    theirs = {"before": block(start), "after": block(end)}
    assert machine_of(theirs, regen, {}) is theirs
    # an earlier run's block (a day before): no loads are kept, only the machine
    day = timedelta(days=1)
    other = {"before": block(start - day), "after": block(end - day)}
    assert machine_of(other, regen, {}) == {"before": {"cpu": "AMD EPYC", "cores": 2},
                                            "after": {}}
