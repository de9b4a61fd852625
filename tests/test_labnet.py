"""Two suites on one machine get two lab networks (tests/labnet.py)."""

from __future__ import annotations

import os
import subprocess
import sys

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
        third, third_net = claimer()  # The kernel dropped the dead claimer's lock.
        third.kill()
        third.wait(timeout=10)
        assert third_net == first_net
    finally:
        for process in (first, second):
            process.kill()
            process.wait(timeout=10)
