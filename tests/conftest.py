import hashlib
import logging
import os
import signal
import sys
import time

import pytest

# One console width for the tests and every process they start, however the suite was started (a
# terminal's own COLUMNS; pytest-xdist's workers inherit COLUMNS=80): a table a test reads is laid
# out the same in a serial and in a parallel run. (200: edgefl.report.console.PLAIN_WIDTH, the
# width of a console that is not a terminal when COLUMNS is unset.)
os.environ["COLUMNS"] = "200"

try:  # tests/base run in a venv of the base install, without torch
    import torch
except ModuleNotFoundError:
    torch = None
else:
    # One intra-op thread: the tests' models are tiny, and two threads of one process on a busy
    # machine (the suite runs a worker per core, beside the processes its tests start) spin-wait
    # for each other. Measured on 2 cores at load 3.7: one conformance test (checkpoint/resume,
    # fedrep) took 198 s of CPU with two threads and 5.6 s with one. (A test's own settings, such
    # as a run's --threads, still apply.)
    torch.set_num_threads(1)


def pytest_configure(config):
    # Started with SIGINT ignored (a background job of a non-interactive shell, nohup), every
    # process the tests start would inherit that: Python then installs no KeyboardInterrupt
    # handler and the tests' Ctrl-C (SIGINT to a server or a simulation) is lost. A handled
    # SIGINT here is the default again in each child after exec.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items):
    # tests/base need only the base install; CI also runs them alone on Python 3.10 without torch
    for item in items:
        if "tests/base/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.base)


# --- in parallel (pytest-xdist) ------------------------------------------------------------------
#: Files whose tests pytest-xdist may hand to different workers one by one: each test stands alone
#: (its own tmp_path, broker and fleet name; nothing process-wide kept between tests). The tests of
#: every other file run in one worker, in file order, as in a serial run (module fixtures built
#: once; tests that share something process- or machine-wide, like Ray's `ray stop`).
SPREAD = {
    "tests/test_conformance.py",
    "tests/test_conformance_checks.py",
    "tests/test_models.py",
}


#: Seconds each test file took in a whole-suite run (setup, call and teardown of its tests),
#: written by `pytest --write-durations tests/durations.json` (with the machine and its load).
DURATIONS = os.path.join(os.path.dirname(__file__), "durations.json")


def pytest_addoption(parser):
    parser.addoption(
        "--write-durations",
        metavar="PATH",
        default=None,
        help="write each test file's seconds in this run to PATH (JSON; tests/durations.json "
        "orders `--dist loadfile`)",
    )


def file_seconds(path: str = DURATIONS) -> dict[str, float]:
    """The committed seconds per test file ({} when there is no such file)."""
    import json

    try:
        with open(path) as f:
            return json.load(f)["files"]
    except (OSError, ValueError, KeyError):
        return {}


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (`make test`), with each test of a SPREAD file a unit of its own, the
    longest units first (by tests/durations.json; a file not in it counts as 1 s). pytest-xdist
    itself hands out the files with the most tests first: a one-test file of 100 s started last
    and the other worker waited for it. (`--dist loadgroup` would say the same with marks, but
    pytest 9.2 drops its groups: pytest-dev/pytest-xdist#1386.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    seconds = file_seconds()

    class FilesAndSpreadTests(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path in SPREAD else path

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the queue is whole at the first assignment
                self.ordered = True
                self.workqueue = type(self.workqueue)(
                    sorted(self.workqueue.items(), key=lambda unit: -self.expected(unit[0]))
                )
            super()._assign_work_unit(node)

        def expected(self, scope: str) -> float:
            path = scope.split("::", 1)[0]
            tests = sum(1 for n in self.collection if n.startswith(path + "::"))
            share = 1 / tests if scope != path and tests else 1.0  # one test of a SPREAD file
            return seconds.get(path, 1.0) * share

    return FilesAndSpreadTests(config, log)


_file_seconds: dict[str, float] = {}
_run: dict = {}


def pytest_runtest_logreport(report):
    """(the controller, under pytest-xdist) every test's setup, call and teardown, by file."""
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


def _write_durations(config) -> None:
    import json
    import platform

    out = config.getoption("--write-durations")
    if not out or getattr(config, "workerinput", None) is not None:
        return
    record = {
        "command": "python -m pytest " + " ".join(config.invocation_params.args),
        "workers": config.getoption("numprocesses", None),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "wall_seconds": round(time.monotonic() - _run["started"], 1),
        "load_before": [round(x, 2) for x in _run["load_before"]],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "files": {
            k: round(v, 2) for k, v in sorted(_file_seconds.items(), key=lambda kv: -kv[1])
        },
    }
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")


# --- time under load -----------------------------------------------------------------------------
# A deadline that is a real parameter of the system under test (a round's deadline, a device's
# "gone after") is written for an idle 2-core machine and passed through `scaled`; everything else
# waits for the event it needs (`wait_until`), with a generous bound that only stops a hang.

# CPU seconds of `_workload` on the 2-core machine the suite's deadlines were written on
REFERENCE_CPU_SECONDS = 0.15
_speed: dict = {}


def _workload() -> None:
    h = hashlib.sha256()
    for i in range(800_000):
        h.update(i.to_bytes(4, "little"))
        h.digest()


def speed_factor(max_age: float = 60.0) -> float:
    """How many times slower than the reference this machine is right now (>= 1).

    Times a small fixed pure-Python workload: its wall time over its CPU time is the share of a
    core a process gets under the current load, its CPU time over `REFERENCE_CPU_SECONDS` how
    slow the CPU itself is. Measured at most every `max_age` seconds (load changes during a run);
    EDGEFL_TEST_SPEED=<factor> sets it instead.
    """
    forced = os.environ.get("EDGEFL_TEST_SPEED")
    if forced:
        return max(1.0, float(forced))
    now = time.monotonic()
    if now - _speed.get("at", -1e9) > max_age:
        wall, cpu = time.perf_counter(), time.process_time()
        _workload()
        wall, cpu = time.perf_counter() - wall, max(time.process_time() - cpu, 1e-3)
        share = max(1.0, wall / cpu)
        slowness = max(1.0, cpu / REFERENCE_CPU_SECONDS)
        factor = min(20.0, share * slowness)  # (20: a bound, so that a hang still ends)
        _speed.update(
            at=time.monotonic(),
            factor=factor,
            wall=wall,
            cpu=cpu,
            top=max(factor, _speed.get("top", 1.0)),
        )
    return _speed["factor"]


def scaled(seconds: float) -> float:
    """`seconds` on the idle reference machine, stretched by the measured `speed_factor`."""
    return round(seconds * speed_factor(), 2)


def wait_until(predicate, what: str = "a condition", timeout: float = 300.0, poll: float = 0.05):
    """Wait for an event: poll `predicate` until it is truthy (returned). `timeout` only bounds a
    hang (it is scaled too), it is no expectation of how long the event takes."""
    bound = scaled(timeout)
    end = time.monotonic() + bound
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {bound:g} s waiting for {what}")
        time.sleep(poll)


def _shared():
    """This module as the tests import it (pytest may import the conftest a second time, as
    `conftest`): one measurement, one summary."""
    import importlib

    try:
        return importlib.import_module("tests.conftest")
    except ImportError:
        return sys.modules[__name__]


@pytest.fixture(scope="session")
def speed() -> float:
    """The speed factor, as `scaled` uses it."""
    return _shared().speed_factor()


def pytest_sessionstart(session):
    _run["started"], _run["load_before"] = time.monotonic(), os.getloadavg()


def pytest_sessionfinish(session):
    """A pytest-xdist worker hands its highest speed factor to the controller; the controller
    (or a serial run) writes --write-durations."""
    _write_durations(session.config)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None and "top" in _shared()._speed:
        workeroutput["speed_factor_top"] = _shared()._speed["top"]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """(pytest-xdist's controller) the workers' highest speed factor counts in the summary."""
    top = getattr(node, "workeroutput", {}).get("speed_factor_top")
    if top:
        m = _shared()._speed
        m["workers_top"] = max(top, m.get("workers_top", 1.0))


def pytest_terminal_summary(terminalreporter):
    shared = _shared()
    if "factor" not in shared._speed:  # no test asked: measured once now, to record the load
        shared.speed_factor()
    m = shared._speed
    if "workers_top" in m and "top" in m:
        m["top"] = max(m["top"], m["workers_top"])
    if "factor" in m:  # (not when EDGEFL_TEST_SPEED sets it)
        terminalreporter.write_line(
            f"speed factor {m['factor']:.2f}, at most {m['top']:.2f} in this run (last workload "
            f"{m['wall']:.3f} s wall, "
            f"{m['cpu']:.3f} s CPU; load {os.getloadavg()[0]:.1f})"
        )


@pytest.fixture
def profile_file(tmp_path):
    """The simulated device profile (edgefl.runtime.fleet.SIMULATED_PROFILE) as a file."""
    import json

    from edgefl.runtime.fleet import SIMULATED_PROFILE

    p = tmp_path / "profile.json"
    p.write_text(json.dumps(SIMULATED_PROFILE))
    return p


@pytest.fixture(autouse=True)
def _quiet_logs(caplog):
    caplog.set_level(logging.WARNING)


#: Options that shrink a method's extra local or server work to test size (the method's code
#: paths stay the same: fewer synthetic samples, fewer fine-tuning epochs, fewer distillation
#: steps), for tests whose assertions do not depend on that work's size.
SMALL_WORK = {
    "fedvtc": {"synthetic_samples": "20", "finetune_epochs": "1"},
    "hierarchyfl": {"distill_steps": "2"},
    "velo": {"cvae_epochs": "2"},
}


def tiny_config(tmp_path, **overrides):
    """A run on the synthetic dataset that takes a second or two."""
    from edgefl.algorithms import get_algorithm
    from edgefl.config import resolve_config

    explicit = {
        "dataset": "synthetic",
        "clients": 3,
        "rounds": 2,
        "train_samples": 600,
        "test_samples": 200,
        "eval_samples": 100,
        "steps": 3,
        "batch_size": 16,
        "out_dir": str(tmp_path),
        "run_name": "run",
        "min_size": 5,
        **overrides,
    }
    algo = get_algorithm(explicit.get("algorithm", "fedavg"))
    defaults = dict(algo.defaults)
    if defaults.get("width", 1.0) > 0.25 or "width" not in defaults:
        explicit.setdefault("width", 0.25)
    return resolve_config(explicit, defaults)
