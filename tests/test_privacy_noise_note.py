"""Central DP states the noise it will add before the first round (z, C, n and what they make,
computed), warns where that noise outweighs the clip, and names DP noise as the likely cause when
a run ends because its model diverged (issue 37: at 10 devices DP-FedAvg ran into nan)."""

from __future__ import annotations

import logging
import math

import pytest

from edgefl.errors import AllDevicesFailed
from edgefl.privacy.accountant import calibrate_noise
from tests.commands import flags, run_ok, tiny_run
from tests.conftest import tiny_config
from tests.privacy_cases import fedavg_assembly

SEAM = "edgefl.privacy.seam"


def model_weights(run) -> int:
    """The float weights of the run's global model, counted from the model itself."""
    from edgefl.models import build_model

    state = build_model(run.specs["d00"]).state_dict()
    return sum(t.numel() for t in state.values() if t.is_floating_point())


def server_of(run, fleet):
    from edgefl.runtime.setup import build_server

    return build_server(run.method, run.server_context(fleet))


def test_central_dp_warns_at_setup_with_the_noise_it_will_add(tmp_path, caplog):
    # Prepare: 3 devices, a budget of ε = 8 over the tiny run's 2 rounds, C = 0.5
    run, fleet = fedavg_assembly(tmp_path, dp="central", dp_target_epsilon=8, dp_clip=0.5)
    z, d, n, clip = calibrate_noise(8, 1e-5, 2), model_weights(run), 3, 0.5
    # Execute
    with caplog.at_level(logging.INFO, logger=SEAM):
        server = server_of(run, fleet)
    # Assert: one warning, every number computed as the mechanism computes it
    notes = [r for r in caplog.records if r.name == SEAM and "central DP" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.WARNING
    text = notes[0].getMessage()
    assert server.noise_multiplier == pytest.approx(z)
    norm = z * clip * math.sqrt(d) / n
    for part in (f"z = {z:.3g} (ε = 8 at δ = 1e-05 over 2 rounds)", "C = 0.5",
                 "n = 3 devices a round", f"std z·C/n = {z * clip / n:.3g}",
                 f"{d:,} weights ({z / n:.3g}× C)", f"z·C·√d/n ≈ {norm:.3g}, {norm / clip:.3g}× C",
                 f"about {math.ceil(z * math.sqrt(d)):,} devices a round"):
        assert part in text
    assert norm / clip > 1  # why it is a warning: the noise outweighs any mean update


def test_noise_below_the_clip_is_stated_without_a_warning(tmp_path, caplog):
    # Prepare: a noise multiplier so small that its norm on the mean stays under C
    run, fleet = fedavg_assembly(tmp_path, dp="central", dp_noise_multiplier=1e-4, dp_clip=1)
    d = model_weights(run)
    # Execute
    with caplog.at_level(logging.INFO, logger=SEAM):
        server_of(run, fleet)
    # Assert: stated at INFO, with the given multiplier and its (small) ratio, no advice
    notes = [r for r in caplog.records if r.name == SEAM and "central DP" in r.getMessage()]
    assert [r.levelno for r in notes] == [logging.INFO]
    text = notes[0].getMessage()
    assert "z = 0.0001 (given)" in text and f"{1e-4 * math.sqrt(d) / 3:.3g}× C" in text
    assert "devices a round, or" not in text


def test_a_run_that_diverges_under_central_dp_names_dp_noise_as_the_cause(tmp_path):
    from edgefl.runtime.simulation import simulate

    # Prepare: noise so large that the global model's weights reach 1e20 (finite in float32) and
    # every device's next loss is not finite
    options = {"dp": "central", "dp_noise_multiplier": "1e21", "dp_clip": "1"}
    cfg = tiny_config(tmp_path, rounds=3, options=options)
    # Execute / Assert: the run ends at round 2, and its message names the noise with its numbers
    with pytest.raises(AllDevicesFailed, match=r"^round 2: all 3 devices failed") as stop:
        simulate(cfg, plots=False)
    assert "non-finite" in str(stop.value)
    assert "likely cause: DP noise diverged the global model (central DP: noise multiplier " \
           "z = 1e+21 (given), clip C = 1, n = 3 devices a round" in str(stop.value)


def test_a_global_model_made_non_finite_by_the_noise_ends_the_run_naming_it(tmp_path, caplog):
    from edgefl.runtime.simulation import simulate

    # Prepare: noise past float32's range: the noisy global model is infinite
    options = {"dp": "central", "dp_noise_multiplier": "1e60", "dp_clip": "1"}
    cfg = tiny_config(tmp_path, rounds=2, options=options)
    # Execute: logged when it happens, named when the devices then fail
    with caplog.at_level(logging.ERROR, logger=SEAM), pytest.raises(AllDevicesFailed) as stop:
        simulate(cfg, plots=False)
    # Assert
    assert any("round 1: the global model is non-finite after central DP's noise; likely cause: "
               "DP noise" in r.getMessage() for r in caplog.records if r.name == SEAM)
    assert str(stop.value).startswith("round 2: all 3 devices failed")
    assert "likely cause: DP noise diverged the global model" in str(stop.value)
    assert "the global model was non-finite after the noise of round 1" in str(stop.value)


def test_the_cli_prints_the_warning(tmp_path):
    # Execute: edgefl simulate with central DP on 2 devices, in its own process (the CLI's log
    # handler, not pytest's)
    done = run_ok("simulate", *tiny_run(tmp_path, "r", steps=1), *flags(clients=2, rounds=1),
                  "-o", "dp=central", "-o", "dp_target_epsilon=8", "-o", "dp_clip=1")
    # Assert: stderr carries the computed noise
    z = calibrate_noise(8, 1e-5, 1)
    assert "central DP: noise multiplier" in done.stderr and f"z = {z:.3g}" in done.stderr
    assert "n = 2 devices a round" in done.stderr and "devices a round, or" in done.stderr
