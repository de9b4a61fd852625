"""Two suites on one machine get two lab networks (tests/labnet.py)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys

import pytest

from tests import labnet
from tests.conftest import REPO

CLAIM = "from tests import labnet; print(labnet.claim(), flush=True); import sys; sys.stdin.read()"


def claimer() -> tuple[subprocess.Popen, int]:
    env = {key: value for key, value in os.environ.items() if key != labnet.VARIABLE}
    process = subprocess.Popen([sys.executable, "-c", CLAIM], cwd=REPO, env=env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    return process, int(process.stdout.readline())


def test_concurrent_suites_claim_distinct_networks_and_a_dead_one_frees_its_number():
    ours = int(os.environ[labnet.VARIABLE])
    first, first_net = claimer()
    second, second_net = claimer()
    try:
        assert len({ours, first_net, second_net}) == 3
        assert labnet.WORLD_OCTET not in (first_net, second_net)
        first.kill()
        first.wait(timeout=10)
        # The kernel dropped the dead claimer's lock: its number can be taken again. (Asked of the
        # lock itself: a claim() here could get a lower number another suite freed meanwhile.)
        with open(labnet.LOCKS / f"{first_net}.lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(lock, fcntl.LOCK_UN)
        with open(labnet.LOCKS / f"{second_net}.lock") as lock, pytest.raises(BlockingIOError):
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # The live one still holds its own.
    finally:
        for process in (first, second):
            process.kill()
            process.wait(timeout=10)


REPORT = "TFCLUSTER_TEST_LAB_REPORT"


@pytest.mark.parametrize("probe", ["first", "second"])
def test_this_process_holds_the_lock_of_its_own_number(probe):
    """Every test process, xdist worker or not, holds the flock of the number it uses. (Also the
    probe the next test runs in two xdist workers: it then reports which worker has which number.)"""
    ours = labnet.number()
    with open(labnet.LOCKS / f"{ours}.lock") as lock, pytest.raises(BlockingIOError):
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # Held, by this process.
    if os.environ.get(REPORT):
        with open(os.environ[REPORT], "a") as report:
            report.write(f"{os.environ.get('PYTEST_XDIST_WORKER', '-')} {ours} {probe}\n")


def test_two_xdist_workers_hold_two_numbers(tmp_path):
    """xdist workers inherit the controller's environment, number included: each drops it and
    claims its own, so no two workers share a bridge, a /24, world addresses or ports."""
    report = tmp_path / "report.txt"
    env = {**os.environ, REPORT: str(report)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q",
         f"--junitxml={tmp_path / 'junit.xml'}", "tests/test_labnet.py::test_this_process_holds_the_lock_of_its_own_number"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    workers = dict(line.split()[:2] for line in report.read_text().splitlines())
    assert sorted(workers) == ["gw0", "gw1"], report.read_text()
    numbers = {int(number) for number in workers.values()}
    assert len(numbers) == 2 and labnet.number() not in numbers, report.read_text()
    assert {labnet.port_block(n)[0] for n in numbers} & {labnet.port_block()[0]} == set()
