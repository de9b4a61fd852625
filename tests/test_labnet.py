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
