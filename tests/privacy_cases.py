"""What tests/test_privacy*.py share: the tolerance of an empirical standard deviation, and the run
assembly and a budgeted run (4 rounds) of a tiny FedAvg run with privacy options."""

from __future__ import annotations

from tests.conftest import tiny_config

#: Relative tolerance of an empirical standard deviation over n ≥ 200 000 draws: its relative
#: standard error is 1/√(2n) ≤ 0.16 %, so 1 % is over six standard errors.
STD_TOLERANCE = 0.01


def fedavg_assembly(tmp_path, **options):
    from edgefl.algorithms import DeviceRecord
    from edgefl.runtime.setup import assemble

    cfg = tiny_config(tmp_path, options={k: str(v) for k, v in options.items()})
    run = assemble(cfg)
    fleet = {d: DeviceRecord(spec=run.specs[d], num_samples=10) for d in run.ids}
    return run, fleet


def budgeted_run(tmp_path, mode: str, z: float, target: float) -> tuple[dict, list[dict]]:
    """A 4-round run of ``tiny_config`` with ``--dp mode``, noise multiplier ``z`` and each device's
    budget ``target``: its summary and its round records."""
    from edgefl.runtime.simulation import simulate

    budget = {"dp_target_epsilon": str(target), "dp_noise_multiplier": str(z)}
    rounds = []
    cfg = tiny_config(tmp_path, rounds=4, options={"dp": mode, **budget})
    return simulate(cfg, on_round=rounds.append, plots=False), rounds
