"""The demo's page cuts the whole make demo around its rounds from the run's own files."""

from __future__ import annotations

import os

from benchmarks.demo.record import around_rounds


def test_the_time_before_the_first_round_and_after_the_last_comes_from_the_run_files(tmp_path):
    (tmp_path / "started-at").write_text("1000\n")  # make's start, as the Makefile writes it
    records = tmp_path / "rounds.jsonl"
    records.write_text("{}\n")
    os.utime(records, (1090.0, 1090.0))  # the last round recorded 90 s after the start
    assert around_rounds(tmp_path, rounds=80.0, seconds=100.0) == {
        "before_rounds": 10.0, "after_rounds": 10.0}
    (tmp_path / "started-at").unlink()  # a run not made by make demo: nothing to say
    assert around_rounds(tmp_path, rounds=80.0, seconds=100.0) is None
