"""Shared fixtures: an isolated state dir per test, the invoke CLI, and process hygiene."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import labnet  # noqa: E402

labnet.claim()  # Before any lab module reads it: this process's own network number.
# The per-user state folder (tfcluster/config.py user_state_dir) of everything this suite starts that
# does not name its own: one of this test process, never the machine's user's, nor another suite's.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="tfcluster-tests-state-")

from tfcluster.backends.local import processes_with_env  # noqa: E402


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` (pyproject.toml), longest unit first (tests/scheduling.py)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.scheduling import LongestFirstScheduling

    return LongestFirstScheduling(config, log)


def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory) -> Path:
    """The built-in shapes set, generated once per session."""
    out = tmp_path_factory.mktemp("data") / "shapes"
    subprocess.run([sys.executable, "-m", "trainer.create_tfrecords", "--synthetic", "--out", str(out)],
                   check=True, cwd=REPO, capture_output=True)
    return out


class Cli:
    """Runs `invoke` like a user would, against one isolated state directory."""

    def __init__(self, state_dir: Path, data_dir: Path | None):
        self.state_dir = state_dir
        self.env = {**os.environ, "INVOKE_TFCLUSTER_STATE_DIR": str(state_dir),
                    "COLUMNS": "200", "TF_CPP_MIN_LOG_LEVEL": "2",
                    # Local clusters listen in this lab's own ports (tests/labnet.py: TensorFlow binds
                    # every address, so labs running side by side cannot share the kernel's picks).
                    "INVOKE_TFCLUSTER_LOCAL_PORTS": labnet.cluster_ports()}
        if data_dir is not None:
            self.env["INVOKE_TFCLUSTER_DATA_DIR"] = str(data_dir)
        # Runs the CLI in another world (tests/world: Google's names on local stand-ins).
        self.prefix: list[str] = []

    def enter(self, world) -> None:
        self.prefix = world.prefix()
        self.env.update(world.env())

    def argv(self, *args: str, python_flags: tuple[str, ...] = ()) -> list[str]:
        return [*self.prefix, sys.executable, *python_flags, "-m", "invoke", *args]

    def run(self, *args: str, timeout: float = 300, python_flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        """``python_flags``: for the CLI's own interpreter only (`-X importtime`), not its children."""
        return subprocess.run(self.argv(*args, python_flags=python_flags), cwd=REPO, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*args), cwd=REPO, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def cluster(self, name: str = "default") -> dict | None:
        path = self.state_dir / "clusters" / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def runs(self, cluster: str = "default") -> list[Path]:
        root = self.state_dir / "runs" / cluster
        return sorted(root.iterdir(), key=lambda p: p.stat().st_mtime) if root.exists() else []

    def latest_run(self) -> tuple[Path, dict]:
        run_dir = self.runs()[-1]
        return run_dir, json.loads((run_dir / "run.json").read_text())


@pytest.fixture
def cli(tmp_path, synthetic_data):
    cli = Cli(tmp_path / "state", synthetic_data)
    cluster_ids = []
    yield cli
    # Teardown: `down`, then kill anything still carrying a cluster id this test created.
    for path in (cli.state_dir / "clusters").glob("*.json") if (cli.state_dir / "clusters").exists() else []:
        cluster_ids.append(json.loads(path.read_text())["cluster_id"])
        cli.run("down", "--cluster", path.stem, timeout=60)
    for cluster_id in cluster_ids:
        for pid, _ in processes_with_env(f"TFCLUSTER_CLUSTER_ID={cluster_id}"):
            os.kill(pid, signal.SIGKILL)


def stop_while_attached(cli, launcher, *command: str) -> tuple[str, str, bool, int]:
    """Run ``command`` (`stop` or `down`) from a second shell while ``launcher`` is attached; returns its
    output, the launcher's, whether the launcher had exited when the command printed its ✓, and the
    command's pid."""
    stopper = cli.popen(*command)
    exited_at_tick = None
    lines = []
    for line in stopper.stdout:
        lines.append(line)
        if "✓" in line and exited_at_tick is None:
            exited_at_tick = launcher.poll() is not None
    stopper.wait(timeout=120)
    output, _ = launcher.communicate(timeout=60)
    assert stopper.returncode == 0, "".join(lines)
    return "".join(lines), output, bool(exited_at_tick), stopper.pid


def assert_stopped_by(output: str, run_id: str, command: str, pid: int, retried_before: int = 0) -> None:
    """The launcher's last line names who stopped the run, and nothing was retried after the stop
    (``retried_before``: the retries the test caused itself before it)."""
    assert output.count("↻ Retrying") == retried_before, output[-3000:]
    assert re.fullmatch(rf"error: run {run_id} was stopped by `invoke {command}` \(pid {pid}, at \d\d:\d\d:\d\d\); "
                        "it is not retried, and no worker is left running", output.strip().splitlines()[-1]), \
        output[-3000:]


def run_on_terminal(argv: list[str], env: dict, on_output=lambda screen: None, timeout: float = 300) -> tuple[int, str]:
    """Run ``argv`` on a pseudo-terminal, as from a user's shell (rich draws its live lines, prompts ask);
    ``on_output(screen so far)`` may return bytes to type. Returns the exit code and the screen."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(argv, cwd=REPO, env={**env, "TERM": "xterm"}, stdin=terminal, stdout=terminal,
                               stderr=terminal, start_new_session=True)
    os.close(terminal)
    screen, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 1)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # The terminal closed: the process exited.
                break
            if not chunk:
                break
            screen += chunk
            typed = on_output(screen)
            if typed:
                os.write(controller, typed)
        code = process.wait(timeout=max(1, deadline - time.monotonic()))
        return code, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode(errors="replace"))  # Colours, cursor moves.
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        os.close(controller)


def events_of(log_text: str) -> list[dict]:
    from trainer import events

    return [e for e in (events.parse(line) for line in log_text.splitlines()) if e]


@pytest.fixture
def world(tmp_path, monkeypatch):
    """Google's names on local stand-ins (tests/world), for this process and the CLIs it starts."""
    from tests.world.names import GoogleWorld

    google = GoogleWorld(tmp_path / "world")
    for key, value in google.env().items():
        monkeypatch.setenv(key, value)
    with google.resolving():
        yield google
    google.close()


@pytest.fixture(scope="module")
def module_world(tmp_path_factory):
    """One world for a module's tests that send it requests directly (in this process only)."""
    from tests.world.names import GoogleWorld

    google = GoogleWorld(tmp_path_factory.mktemp("world"))
    with google.resolving():
        yield google
    google.close()


@pytest.fixture(autouse=True)
def _world_keeps_to_google(request):
    """A test fails when a stand-in saw a request, or gave an answer, outside Google's discovery
    documents (tests/world/discovery.py): the world has invented something, or the product sent
    what Google refuses, whatever the product then made of it. A test that plants one reads it
    with ``discovery.take_violations()`` first."""
    from tests.world import discovery

    discovery.take_violations()  # What a previous test's background threads left.
    yield
    found = discovery.take_violations()
    if found:
        pytest.fail("the world left Google's description:\n  " + "\n  ".join(found[:20]), pytrace=False)
