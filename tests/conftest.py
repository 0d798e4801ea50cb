import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# Tests sit in one folder per room (tests/README.md) and import helpers from one another across
# rooms (`from test_detach import live`); every room's folder is on sys.path, as the one tests/
# folder was, so a file imports the same whether run alone or in the suite. Names stay unique.
for _room in sorted(Path(__file__).resolve().parent.iterdir()):
    if _room.is_dir() and any(_room.glob("test_*.py")) and str(_room) not in sys.path:
        sys.path.append(str(_room))


@pytest.fixture(autouse=True, scope="session")
def private_live_dir():
    """Supervisors the tests start register in a live directory of this test session, not
    in the user's own (`ddptop ls` on the same machine stays clean)."""
    import os
    import shutil
    import tempfile

    before = os.environ.get("DDPTOP_LIVE_DIR")
    path = tempfile.mkdtemp(prefix="dtl", dir="/tmp")  # short: socket paths are limited
    os.environ["DDPTOP_LIVE_DIR"] = path
    yield Path(path)
    if before is None:
        os.environ.pop("DDPTOP_LIVE_DIR", None)
    else:
        os.environ["DDPTOP_LIVE_DIR"] = before
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def one_cpu_thread_a_rank():
    """Ranks the tests start run torch on one CPU thread, as torchrun sets it with two or more
    ranks a node: with one rank neither torchrun nor ddptop sets it (torch's own count, two
    threads on the 2-core CI VM), and two test workers' ranks then fight for the same cores."""
    import os

    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = before or "1"
    yield
    if before is None:
        os.environ.pop("OMP_NUM_THREADS", None)


@pytest.fixture
def ddptop_cmd() -> list[str]:
    """The CLI as a user runs it (a subprocess, so exit codes and stdout are real)."""
    return [sys.executable, "-m", "ddptop"]


def pytest_sessionfinish(session, exitstatus):  # noqa: ARG001
    """Say which processes the suite left behind (a run must never leave any)."""
    import psutil

    left = [p for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline())]
    if left:
        print("\nprocesses left behind by the tests:")
        for p in left:
            try:
                print(f"  {p.pid} {' '.join(p.cmdline())[:200]}")
            except psutil.Error:
                pass


def pytest_collection_modifyitems(config, items):  # noqa: ARG001
    """Real end-to-end runs (torchrun, gloo, a loaded 2-core CI box) get two more tries:
    CI has caught races of the machine (torchrun's own failure report missing once, gloo
    aborting a rank in teardown) that no code change here made. The gloo abort ("terminate
    called without an active exception", SIGABRT after the script's last line, barrier and
    destroy_process_group included) hits plain torchrun too: 2026-11-26, the plain run of
    tests/scripts/no_optimizer.py in test_script_truth aborted so, 1 in ~8 loaded runs, as did
    ddptop's run of replicate_composable.py. A rerun shows as `R` in the output and a test that
    fails three times still fails. Unit tests get no second try."""
    for item in items:
        if item.get_closest_marker("e2e") is not None:
            item.add_marker(pytest.mark.flaky(reruns=2, reruns_delay=1))


_RERUN_SAID: list[tuple[str, list[str]]] = []  # (test, the `E` lines of its failed try)


def pytest_runtest_logreport(report):
    """A test that passed on a rerun still failed once: keep what its failed try said (the run's
    summary names reruns only; CI showed `RERUN ...busy_host...` and no way to tell why)."""
    if report.outcome == "rerun" and report.longrepr is not None:
        lines = [ln for ln in str(report.longreprtext).splitlines() if ln.startswith("E ")]
        _RERUN_SAID.append((report.nodeid, lines[:6] or str(report.longreprtext).splitlines()[-3:]))


def pytest_terminal_summary(terminalreporter):
    if _RERUN_SAID:
        terminalreporter.section("what each rerun test's failed try said")
        for nodeid, lines in _RERUN_SAID:
            terminalreporter.write_line(nodeid)
            for line in lines:
                terminalreporter.write_line("    " + line[:400])
