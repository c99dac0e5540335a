"""How a run ends: the final result never lacks a number it could have (a device that misses the
final evaluation counts with its last per-round one, marked), offline devices are not asked,
final models come back checked, and Ctrl-C leaves a complete record marked interrupted."""

import json
from pathlib import Path

import numpy as np
import pytest

from edgefl.errors import RunInterrupted
from edgefl.report.recorder import result_text, summary_markdown
from edgefl.runtime.ending import ModelArrays, save_final_models
from edgefl.runtime.exchange import LoopSettings
from edgefl.runtime.loop import RoundLoop
from edgefl.runtime.simulation import simulate
from edgefl.wire import Payload
from tests.commands import flags
from tests.conftest import tiny_config
from tests.test_loop import _fleet


def _misses_the_final_evaluation(handler):
    def handle(env):
        if env.kind == "evaluate" and env.payload.meta.get("split") == "test":
            raise ConnectionError("unplugged before the final evaluation")
        return handler(env)
    return handle


def test_a_device_that_misses_the_final_evaluation_counts_with_its_last_round_marked(tmp_path):
    algo, ctx, transport = _fleet(tmp_path)
    transport.connect("d01", _misses_the_final_evaluation(transport.handlers["d01"]))
    records = []
    final = RoundLoop(
        algo.server(ctx, None), ctx, transport, LoopSettings(rounds=3), on_round=records.append
    ).run()
    # every round is evaluated, the last one too: the evaluation after round 3 is d01's last
    assert [r["round"] for r in records if "eval" in r] == [1, 2, 3]
    assert final["accuracy_from_round"] == {"d01": 3} and final["measured_by"] == "mixed"
    assert final["client_accuracy"]["d01"] == records[2]["eval"]["client_accuracy"]["d01"]
    assert set(final["client_accuracy"]) == {"d00", "d01", "d02"} and final["unmeasured"] == []
    assert final["mean_accuracy"] == pytest.approx(np.mean(list(final["client_accuracy"].values())))
    assert "d01" in final["eval_failed"] and final["final_answered"] == 2


def test_when_nobody_answers_the_final_evaluation_the_last_rounds_stand_in_and_nan_never_shows(
    tmp_path,
):
    algo, ctx, transport = _fleet(tmp_path)
    for d in ("d00", "d01", "d02"):
        transport.connect(d, _misses_the_final_evaluation(transport.handlers[d]))
    final = RoundLoop(algo.server(ctx, None), ctx, transport, LoopSettings(rounds=2)).run()
    assert final["measured_by"] == "last-round" and final["accuracy_from_round"] == {
        "d00": 2,
        "d01": 2,
        "d02": 2,
    }
    assert final["mean_accuracy"] is not None and final["mean_accuracy"] == final["mean_accuracy"]
    # never evaluated at all (eval_every 0): no number, and no "nan" either
    algo, ctx, transport = _fleet(tmp_path / "b")
    for d in ("d00", "d01", "d02"):
        transport.connect(d, _misses_the_final_evaluation(transport.handlers[d]))
    final = RoundLoop(
        algo.server(ctx, None), ctx, transport, LoopSettings(rounds=2, eval_every=0)
    ).run()
    assert final["mean_accuracy"] is None and final["unmeasured"] == ["d00", "d01", "d02"]
    summary = {
        "algorithm": "fedavg",
        "rounds": 2,
        "wall_seconds": 1.0,
        "bytes_up_per_round": [1],
        "bytes_down_per_round": [1],
        **{
            k: final[k]
            for k in (
                "mean_accuracy",
                "tier_accuracy",
                "client_accuracy",
                "accuracy_from_round",
                "unmeasured",
            )
        },
    }
    for text in (result_text(summary), summary_markdown(summary)):
        assert "nan" not in text.lower() and (
            "not measured" in text or "no accuracy measured" in text
        )


def test_a_device_offline_by_its_last_will_is_not_asked_until_it_is_back(tmp_path):
    algo, ctx, transport = _fleet(tmp_path)
    offline = {"d02"}
    records = []

    def on_round(r):
        records.append(r)
        if r["round"] == 2:
            offline.clear()  # d02 registered again

    loop = RoundLoop(
        algo.server(ctx, None),
        ctx,
        transport,
        LoopSettings(rounds=3),
        on_round=on_round,
        available=lambda d: d not in offline,
    )
    final = loop.run()
    assert [r["selected"] for r in records] == [
        ["d00", "d01"],
        ["d00", "d01"],
        ["d00", "d01", "d02"],
    ]
    assert records[0]["eval"]["eval_failed"] == {"d02": "not asked: offline (its Last Will)"}
    assert all(r["failed"] == {} for r in records)  # nobody waited on
    assert (
        set(final["client_accuracy"]) == {"d00", "d01", "d02"}
        and final["measured_by"] == "final-evaluation"
    )


def test_the_final_evaluation_takes_its_own_sample_limit_and_says_it_runs(tmp_path):
    algo, ctx, transport = _fleet(tmp_path)
    agent = transport.handlers["d00"].__self__
    assert agent.evaluate("test", 10)["samples"] == 10 and agent.evaluate("test")["samples"] == 100
    events = []
    final = RoundLoop(
        algo.server(ctx, None),
        ctx,
        transport,
        LoopSettings(rounds=1, final_samples=10),
        on_event=lambda name, info: events.append((name, info)),
    ).run()
    assert events[0] == ("final_evaluation", {"devices": 3, "deadline": None, "samples": 10})
    assert events[1][0] == "final_evaluation_done" and events[1][1]["answered"] == 3
    # accuracies over 10 samples are tenths
    assert all(abs(10 * a - round(10 * a)) < 1e-9 for a in final["client_accuracy"].values())


def test_final_models_come_back_checked_against_their_spec(tmp_path):
    import torch

    algo, ctx, transport = _fleet(tmp_path)
    honest = transport.handlers["d02"]

    def wrong_shape(env):
        reply = honest(env)
        if env.kind == "finish" and reply.payload.arrays:
            arrays = dict(reply.payload.arrays)
            name = next(iter(arrays))
            arrays[name] = np.zeros((1,), np.float32)
            return env.reply("done", Payload(arrays, {}), algorithm=reply.algorithm)
        return reply

    transport.connect("d02", wrong_shape)
    loop = RoundLoop(algo.server(ctx, None), ctx, transport, LoopSettings(rounds=1),
                     collect_models=ModelArrays(lambda d: ctx.fleet[d].spec))
    final = loop.run()
    assert sorted(loop.final_models) == ["d00", "d01"]
    assert (
        "final model" in final["finish_failed"]["d02"] and "shape" in final["finish_failed"]["d02"]
    )
    written = save_final_models(
        tmp_path / "run", loop.final_models, {d: r.spec for d, r in ctx.fleet.items()}, "synthetic"
    )
    assert written == ["d00", "d01"]
    from edgefl.export.checkpoint import load_device_model

    model = load_device_model(tmp_path / "run", "d00")
    held = transport.handlers["d00"].__self__.half.model.state_dict()
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, held[k])


def test_ctrl_c_in_a_simulation_leaves_a_complete_record_marked_interrupted(tmp_path):
    cfg = tiny_config(tmp_path, rounds=4, eval_every=1)

    def interrupt(r):
        if r["round"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(RunInterrupted) as caught:
        simulate(cfg, on_round=interrupt)
    run = Path(caught.value.summary["run_dir"])
    summary = json.loads((run / "summary.json").read_text())
    assert (
        summary["interrupted"] is True
        and summary["rounds_completed"] == 2
        and summary["measured_by"] == "last-round"
    )
    assert summary["mean_accuracy"] is not None and set(
        summary["accuracy_from_round"].values()
    ) == {2}
    assert [json.loads(x)["round"] for x in (run / "rounds.jsonl").read_text().splitlines()] == [
        1,
        2,
    ]
    assert (run / "accuracy.png").exists() and (run / "bytes.png").exists()
    assert sorted(p.name for p in (run / "models").iterdir()) == [
        "d00.safetensors",
        "d01.safetensors",
        "d02.safetensors",
    ]
    assert "Interrupted" in (
        run / "summary.md"
    ).read_text() and "interrupted after round 2 of 4" in str(caught.value)


def test_ctrl_c_on_the_simulate_command_writes_the_record_and_exits_130(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    cmd = [
        sys.executable,
        "-m",
        "edgefl.cli.main",
        "simulate",
        *flags(dataset="synthetic", clients=3, rounds=200, train_samples=600, test_samples=200,
               eval_samples=100, steps=3, batch_size=16, width=0.25, out=tmp_path, run_name="r"),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rounds = tmp_path / "r" / "rounds.jsonl"
    try:
        end = time.monotonic() + 300
        while not (rounds.exists() and len(rounds.read_text().splitlines()) >= 2):
            assert proc.poll() is None and time.monotonic() < end, (
                proc.stderr.read() if proc.poll() is not None else "no round 2 in 300 s"
            )
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-3000:]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    done = summary["rounds_completed"]
    assert (
        summary["interrupted"] is True
        and 2 <= done < 200
        and len(rounds.read_text().splitlines()) == done
    )
    assert f"interrupted after round {done} of 200" in " ".join(stderr.split())
    assert "interrupted interrupted" not in " ".join(stderr.split())  # said once
    assert (tmp_path / "r" / "accuracy.png").exists() and len(
        list((tmp_path / "r" / "models").iterdir())
    ) == 3


def test_a_second_ctrl_c_while_the_record_is_written_exits_at_once():
    import signal
    import subprocess
    import sys

    code = (
        "import time\nfrom edgefl.runtime.interrupt import second_interrupt_exits\n"
        "with second_interrupt_exits():\n    print('writing', flush=True)\n    time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted again: exiting now" in stderr


def test_plots_count_rounds_in_whole_numbers_from_1(tmp_path):
    import matplotlib.pyplot as plt

    from edgefl.report.plots import _accuracy_points, _integer_rounds, plot_run

    rounds = [
        {"round": r, "eval": {"mean_accuracy": 0.5, "tier_accuracy": {"a": 0.5}}} for r in (1, 2)
    ]
    summary = {"rounds": 3, "mean_accuracy": 0.6, "tier_accuracy": {"a": 0.6}}
    xs, _, means = _accuracy_points(rounds, summary)
    assert xs == [1, 2, 3] and means == [0.5, 0.5, 0.6]
    # a round nobody answered is no point (None), and an interrupted run has no final point
    rounds.append({"round": 3, "eval": {"mean_accuracy": None, "tier_accuracy": {}}})
    xs, _, means = _accuracy_points(rounds, {**summary, "interrupted": True, "rounds_completed": 3})
    assert xs == [1, 2, 3] and means[-1] is None
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [0.1, 0.2, 0.3])
    _integer_rounds(ax)
    fig.canvas.draw()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    plt.close(fig)
    assert ticks and all(float(t).is_integer() for t in ticks)
    run = tmp_path / "run"
    run.mkdir()
    (run / "rounds.jsonl").write_text(
        "".join(
            json.dumps({**r, "bytes_up_total": 1, "bytes_down_total": 2}) + "\n" for r in rounds
        )
    )
    (run / "summary.json").write_text(json.dumps(summary))
    assert [p.name for p in plot_run(run)] == ["accuracy.png", "bytes.png"]


def test_under_local_differential_privacy_no_final_model_leaves_a_device(tmp_path):
    from edgefl.privacy.seam import PrivateDevice
    from edgefl.runtime.setup import resolve_method

    algo, ctx, transport = _fleet(tmp_path)
    method = resolve_method("fedavg", {"dp": "local", "dp_target_epsilon": "50"})
    assert method.privacy.on_device
    for d in ("d00", "d01", "d02"):
        agent = transport.handlers[d].__self__
        agent.half = PrivateDevice(agent.half, method.privacy, method.release, 2)
    loop = RoundLoop(algo.server(ctx, None), ctx, transport, LoopSettings(rounds=1),
                     collect_models=ModelArrays(lambda d: ctx.fleet[d].spec))
    final = loop.run()
    # asked, and answered without the model
    assert loop.final_models == {} and final["finish_failed"] == {}
