"""Longest first: the order in which pytest-xdist hands the suite's tests to its workers.

A parallel run ends when its last worker ends. Most of this suite's time is a few long tests
(the booted cluster, the Spot recoveries, the image builds) that mostly wait, beside hundreds of
short ones. Handed out in file order, a long test that starts late ends the run late; so each
worker that asks for work gets the longest unit left, and a worker that will be busy for a
while gets the shortest one as its next (an xdist worker holds the test after the one it runs,
so that one is committed early: better a short one).

Units are xdist's `--dist loadgroup` ones: a test alone, or every test of one `xdist_group`
(tests sharing an expensive module fixture, or a daemon-wide resource). A unit's expected
seconds are its tests' in `tests/durations.json`, measured by CI (`.ci/report.py --write`
rewrites it from a junit report); a test missing from it counts as `UNKNOWN_SECONDS`.
"""

from __future__ import annotations

import json
from pathlib import Path

from xdist.scheduler import LoadGroupScheduling

DURATIONS = Path(__file__).resolve().parent / "durations.json"
UNKNOWN_SECONDS = 2.0
# A worker about to run a unit this long gets the shortest unit as its next one.
LONG_SECONDS = 30.0


def test_id(nodeid: str) -> str:
    """A node id without the "@group" xdist's loadgroup appends to a grouped test's."""
    at, bracket = nodeid.rfind("@"), nodeid.rfind("]")
    return nodeid[:at] if at > bracket else nodeid


def expected_seconds() -> dict[str, float]:
    try:
        return {nodeid: float(seconds) for nodeid, seconds in json.loads(DURATIONS.read_text()).items()}
    except (FileNotFoundError, ValueError):
        return {}


class LongestFirstScheduling(LoadGroupScheduling):
    """`--dist loadgroup`, with each unit chosen by its expected seconds instead of file order."""

    def __init__(self, config, log=None):
        super().__init__(config, log)
        self.seconds = expected_seconds()

    def unit_seconds(self, work_unit: dict[str, bool]) -> float:
        return sum(self.seconds.get(test_id(nodeid), UNKNOWN_SECONDS) for nodeid, done in work_unit.items() if not done)

    def _assign_work_unit(self, node) -> None:
        held = self.assigned_work.get(node, {})
        holding = sum(self.unit_seconds(unit) for unit in held.values())
        units = sorted(self.workqueue, key=lambda scope: self.unit_seconds(self.workqueue[scope]))
        scope = units[0] if holding >= LONG_SECONDS else units[-1]
        # The parent pops the queue's first unit: put the chosen one there.
        self.workqueue.move_to_end(scope, last=False)
        super()._assign_work_unit(node)

    def _reschedule(self, node) -> None:
        # As the parent, but a worker gets more only when it holds a single test: the one it must
        # run next (a worker starts a test only once it knows the one after it). The parent tops up
        # at three, committing two tests to a worker that may be busy with a long one.
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 1:
            return
        self._assign_work_unit(node)
