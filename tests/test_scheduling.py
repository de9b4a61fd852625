"""The suite side by side (tests/scheduling.py): longest first, and modules that share state stay whole."""

from __future__ import annotations

import ast
from types import SimpleNamespace

from tests.conftest import REPO
from tests.scheduling import LongestFirstScheduling

TESTS = REPO / "tests"


def _shares_state(function: ast.FunctionDef) -> bool:
    """A module- or class-scoped fixture that hands its tests something (a world, a trained model)."""
    for decorator in function.decorator_list:
        if isinstance(decorator, ast.Call) and any(
                keyword.arg == "scope" and getattr(keyword.value, "value", None) in ("module", "class")
                for keyword in decorator.keywords):
            return any(isinstance(node, ast.Yield) or (isinstance(node, ast.Return) and node.value is not None)
                       for node in ast.walk(function))
    return False


def test_a_module_whose_tests_share_a_fixture_runs_whole_in_one_worker():
    """Under xdist each test is its own unit, handed out longest first, so a module's tests may run
    in any order on several workers: a module-scoped fixture's state (a world a test fills, machines
    booted once) would be made again per worker and seen in another order. Such a module is an
    xdist_group: one worker runs it, in file order."""
    loose = []
    for path in sorted(TESTS.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        shares = any(isinstance(node, ast.FunctionDef) and _shares_state(node) for node in ast.walk(tree))
        uses_module_world = "module_world" in path.read_text()
        if (shares or uses_module_world) and "xdist_group" not in path.read_text():
            loose.append(path.name)
    assert loose == []


class _Node:
    """What the scheduler needs of an xdist worker: it records the tests it is sent."""

    def __init__(self, name: str):
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices):
        self.sent += indices

    def shutdown(self):
        self.shutting_down = True


def _scheduler(seconds: dict[str, float], collection: list[str], workers: int):
    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=True, maxschedchunk=None),
                             getvalue=lambda name: [f"{workers}*popen"] if name == "tx" else None)
    scheduler = LongestFirstScheduling(config)
    scheduler.seconds = seconds
    nodes = [_Node(f"gw{i}") for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    return scheduler, nodes


def test_the_longest_tests_start_first_each_with_a_short_one_next():
    seconds = {"t.py::booted": 500, "t.py::spot": 200, "t.py::image": 90, "t.py::a": 1, "t.py::b": 2,
               "t.py::c": 3, "t.py::d": 10}
    collection = ["t.py::a", "t.py::b", "t.py::c", "t.py::d", "t.py::image", "t.py::spot", "t.py::booted"]
    scheduler, nodes = _scheduler(seconds, collection, 2)
    sent = [[collection[i] for i in node.sent] for node in nodes]
    # Each worker starts a long one and holds the shortest left as the one it runs next (a worker
    # runs a test only once it knows the next).
    assert sent == [["t.py::booted", "t.py::a"], ["t.py::spot", "t.py::b"]]
    # The worker that finishes first (the spot one) gets the longest left when it holds a short one.
    scheduler.mark_test_complete(nodes[1], collection.index("t.py::spot"))
    assert [collection[i] for i in nodes[1].sent[2:]] == ["t.py::image"]
    scheduler.mark_test_complete(nodes[1], collection.index("t.py::b"))
    assert [collection[i] for i in nodes[1].sent[3:]] == ["t.py::c"]  # Behind the long image test: short.


def test_a_group_is_one_unit_of_its_tests_seconds():
    seconds = {"g.py::one@grp": 30, "g.py::two@grp": 30, "t.py::alone": 50, "t.py::x": 1}
    collection = ["g.py::one@grp", "g.py::two@grp", "t.py::alone", "t.py::x"]
    _, nodes = _scheduler(seconds, collection, 1)
    # The group's 60 s beat the 50 s test; both of its tests go to the same worker, in file order.
    assert [collection[i] for i in nodes[0].sent][:2] == ["g.py::one@grp", "g.py::two@grp"]
