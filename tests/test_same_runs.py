import json

from benchmarks.same_runs import main


def _record(key, final, curve, code, **extra):
    return {"key": key, "method": "m", "setting": "s", "seed": 0, "final_accuracy": final,
            "client_accuracy": {"d0": final}, "code_hash": code, "finished_at": code,
            "per_round": [{"round": r, "accuracy": a} for r, a in curve], **extra}


def _put(folder, record):
    folder.mkdir(exist_ok=True)
    (folder / f"{record['key']}-{record['code_hash']}.json").write_text(json.dumps(record))


def test_the_same_runs_but_for_a_new_last_point_are_the_same_and_a_changed_one_is_named(
    tmp_path, capsys
):
    old, new = tmp_path / "old", tmp_path / "new"
    legacy = {"resolved_config": {"rounds": 3, "eval_samples": 500, "test_samples": 2000}}
    # the old code closed its curve with the final evaluation (round 3 = the final accuracy)
    _put(old, _record("a", 0.7, [(1, 0.5), (2, 0.6), (3, 0.7)], "c0de0", **legacy))
    _put(new, _record("a", 0.7, [(1, 0.5), (2, 0.6), (3, 0.68)], "c0de1", final_point_marked=True))
    assert main([str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "**1 of 1**" in out and "| s:m:s0 | 70.000 → 70.000 | same | same (2) | 3 | — |" in out
    # a run whose training changed: named, and the exit status says so
    _put(old, _record("b", 0.7, [(1, 0.5), (2, 0.6)], "c0de0"))
    _put(new, _record("b", 0.71, [(1, 0.5), (2, 0.61)], "c0de1", final_point_marked=True))
    assert main([str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "**1 of 2**" in out and "70.000 → 71.000 **differs**" in out and "**differs** (2)" in out
