"""The timing harness of the benchmarks: alternation order, load and command recording, results."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import timing
from benchmarks.timing import Timing, paired_ratio, rotation


def test_rotation_puts_every_variant_in_every_position():
    names = ["a", "b", "c"]
    orders = [rotation(names, r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    for position in range(3):
        assert sorted(o[position] for o in orders) == names


def test_alternate_runs_variants_interleaved_and_records_load(tmp_path, monkeypatch):
    calls: list[str] = []
    loads = iter([[float(i), 0.0, 0.0] for i in range(100)])
    monkeypatch.setattr(timing, "load", lambda: next(loads))
    t = Timing("t", tmp_path)  # takes load 0 at the start
    values = {"a": 2.0, "b": 3.0, "c": 4.0}

    def variant(name):
        def run():
            calls.append(name)
            return {"value": values[name], "extra": name}
        return run

    samples = t.alternate("g", {k: variant(k) for k in values}, repetitions=4, baseline="a")
    # interleaved: every repetition runs each variant once, never two samples of one in a row
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert [s["variant"] for s in samples] == calls
    assert [s["repetition"] for s in samples] == [r for r in range(4) for _ in range(3)]
    # each sample has its own load, taken just before and just after it
    assert [s["load_before"][0] for s in samples] == [1.0 + 2 * i for i in range(12)]
    assert [s["load_after"][0] for s in samples] == [2.0 + 2 * i for i in range(12)]
    assert all(s["extra"] == s["variant"] for s in samples)
    summary = t.summary("g")
    assert summary["b"]["median"] == 3.0 and summary["b"]["n"] == 4
    assert summary["c"]["ratio_to_baseline"]["median"] == pytest.approx(2.0)
    assert "ratio_to_baseline" not in summary["a"]


def test_ratio_pairs_samples_of_the_same_repetition():
    samples = [
        {"repetition": 0, "variant": "a", "value": 1.0},
        {"repetition": 0, "variant": "b", "value": 3.0},
        {"repetition": 1, "variant": "a", "value": 10.0},
        {"repetition": 1, "variant": "b", "value": 20.0},
        {"repetition": 2, "variant": "a", "value": 5.0},
        {"repetition": 2, "variant": "b", "value": None},
    ]
    r = paired_ratio(samples, "b", "a")
    # 3 and 2: paired per repetition, not median(b) / median(a) = 11.5 / 5
    assert r == {"median": 2.5, "min": 2.0, "max": 3.0, "pairs": 2}


def test_a_failing_variant_is_recorded_and_the_others_go_on(tmp_path):
    t = Timing("t", tmp_path)

    def broken():
        raise RuntimeError("no broker")

    samples = t.alternate("g", {"ok": lambda: 1.5, "broken": broken}, repetitions=2, baseline="ok")
    assert [s["value"] for s in samples] == [1.5, None, None, 1.5]
    assert samples[1]["error"] == "RuntimeError: no broker"
    assert t.summary("g")["broken"]["failed"] == 2
    assert t.summary("g")["broken"]["ratio_to_baseline"] is None


def test_bad_arguments_are_refused(tmp_path):
    t = Timing("t", tmp_path)
    with pytest.raises(ValueError, match="baseline"):
        t.alternate("g", {"a": lambda: 1.0}, repetitions=1, baseline="z")
    with pytest.raises(ValueError, match="repetitions"):
        t.alternate("g", {"a": lambda: 1.0}, repetitions=0)


def test_write_records_the_real_command_niceness_machine_and_load(tmp_path):
    """Run in a child started under ``nice``: the page says so because the process is niced,
    not because anyone wrote "nice" into the benchmark."""
    out = tmp_path / "out"
    code = (
        "import sys; from pathlib import Path; from benchmarks.timing import Timing; "
        "t = Timing('demo', Path(sys.argv[1]), unit='ms', scale=1000); "
        "t.alternate('g', {'x': lambda: 0.002, 'y': lambda: 0.004}, 2, baseline='x'); "
        "t.write(notes=['a note'])"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    subprocess.run(["nice", "-n", "7", sys.executable, "-c", code, str(out), "--flag"], check=True,
                   env=env, cwd=os.getcwd())
    res = json.loads((out / "results.json").read_text())
    inv = res["invocation"]
    assert inv["niceness"] >= 7  # inherited niceness adds up
    assert inv["argv"][-2:] == [str(out), "--flag"] and inv["argv"][1] == "-c"
    assert inv["command"].startswith(f"nice -n {inv['niceness']} ")
    assert len(inv["commit"] or "") in (0, 40)
    assert res["machine"]["cores"] == os.cpu_count() and res["machine"]["cpu"]
    assert len(res["load_start"]) == 3 and len(res["load_end"]) == 3
    md = (out / "results.md").read_text()
    assert f"niceness {inv['niceness']}" in md
    assert "| y | 4 |" in md and "**2.00×**" in md
    assert "a note" in md and "Load average (1/5/15 min)" in md


def test_an_unniced_run_does_not_claim_nice(tmp_path, monkeypatch):
    monkeypatch.setattr(timing, "niceness", lambda: 0)
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "benchmarks.x", "--quick"])
    inv = timing.invocation()
    assert inv["command"] == "python -m benchmarks.x --quick"
    assert inv["niceness"] == 0


def test_a_command_built_from_argv_carries_the_real_niceness(monkeypatch):
    monkeypatch.setattr(timing, "niceness", lambda: 10)
    assert timing.command_line("benchmarks.fuzz.run", ["--quick", "a b"]) == (
        "nice -n 10 python -m benchmarks.fuzz.run --quick 'a b'")
    monkeypatch.setattr(timing, "niceness", lambda: 0)
    assert timing.command_line("benchmarks.fuzz.run", []) == "python -m benchmarks.fuzz.run"


def test_a_page_rewritten_from_saved_results_keeps_the_run_s_record(tmp_path):
    t = Timing("t", tmp_path, unit="ms", scale=1000)
    t.alternate("g", {"x": lambda: 0.002, "y": lambda: 0.003}, 2, baseline="x")
    saved = t.write(notes=["first"])
    again = Timing.load_results(tmp_path / "results.json", unit="ms", scale=1000)
    again.write(notes=["second"])
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["finished"] == saved["finished"] and res["load_end"] == saved["load_end"]
    assert res["invocation"] == saved["invocation"] and res["notes"] == ["second"]
    assert "| y | 3 |" in (tmp_path / "results.md").read_text()


def test_a_partial_page_written_mid_run_leaves_the_run_s_end_to_the_final_write(tmp_path):
    t = Timing("t", tmp_path, unit="ms", scale=1000)
    t.alternate("g", {"x": lambda: 0.002}, 1, baseline="x")
    partial = t.write(name="results.partial", final=False)
    assert "finished" not in partial and "load_end" not in partial
    assert "to ?." in (tmp_path / "results.partial.md").read_text()
    t.alternate("h", {"x": lambda: 0.002}, 1, baseline="x")
    final = t.write()
    # the end is stamped by the final write (the partial one used to freeze it at the first group)
    assert final["finished"] and final["load_end"] is not None
    assert json.loads((tmp_path / "results.json").read_text())["finished"] == final["finished"]


def test_the_parallel_page_states_the_bound_the_one_thread_run_sets():
    from benchmarks.scale.parallel_reuse import bound_note

    def group(seq, one, par):
        return {"summary": {"sequential": {"median": seq}, "sequential, 1 thread": {"median": one},
                            "2 workers, reused": {"median": par}}}

    # 2 threads 1.45x one thread: two one-thread workers can be at most 2 x 23.2 / 33.8 faster
    note = bound_note(group(23.2, 33.8, 20.1), 2)
    assert "at most 1.37x" in note and "1.15x faster than the sequential" in note
    assert "not met" in note and "out of reach" in note
    # a machine where threads do not help: the bound is 2x and 1.5x is within it
    assert "within the bound" in bound_note(group(30.0, 30.0, 16.0), 2)
    assert ": met" in bound_note(group(30.0, 30.0, 16.0), 2)
    assert bound_note({"summary": {"sequential": {"median": 1.0}}}, 2) is None
