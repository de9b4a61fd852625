"""Clusters are found from any folder: the state lives in the per-user state folder by default, the
installed `tfcluster` command works from any folder, `status --all` lists every cluster, `down` of an
unknown name lists the ones that exist, and a project's old `.tfcluster` moves there with one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO
from tfcluster.config import Settings, user_state_dir


def test_the_per_user_state_folder_follows_xdg_and_a_set_folder_wins(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    assert user_state_dir() == tmp_path / "home" / ".local" / "state" / "tfcluster"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")  # The spec: a relative path is ignored.
    assert user_state_dir() == tmp_path / "home" / ".local" / "state" / "tfcluster"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert Settings().state_path == tmp_path / "xdg" / "tfcluster"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert user_state_dir() == tmp_path / "home" / "Library" / "Application Support" / "tfcluster"
    monkeypatch.chdir(tmp_path)
    assert Settings(state_dir=".tfcluster").state_path == tmp_path / ".tfcluster"  # A project's own, when set.


@pytest.fixture
def homes(tmp_path):
    """A user whose HOME is a temporary folder, with no state folder set; a clone's tasks.py and
    invoke.yaml in one folder, and another folder with nothing in it."""
    clone, elsewhere, home = tmp_path / "clone", tmp_path / "elsewhere", tmp_path / "home"
    for folder in (clone, elsewhere, home):
        folder.mkdir()
    for name in ("tasks.py", "invoke.yaml"):  # What `invoke` reads in a clone (the code comes from REPO).
        shutil.copy(REPO / name, clone / name)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("INVOKE_TFCLUSTER_") and key != "XDG_STATE_HOME"}
    env.update(HOME=str(home), PYTHONPATH=str(REPO), COLUMNS="200")
    yield clone, elsewhere, env
    state = home / ".local" / "state" / "tfcluster"
    for record in state.glob("clusters/*.json"):  # Nothing of this test may outlive it.
        subprocess.run([sys.executable, "-m", "invoke", "down", "--cluster", record.stem], cwd=clone, env=env,
                       capture_output=True, timeout=60)


def tfcluster_command() -> list[str]:
    """The installed `tfcluster` command, as pip makes it from pyproject.toml's [project.scripts]: its
    target called the way the console script calls it (no install into the shared venv)."""
    target = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["tfcluster"]
    module, function = target.split(":")
    return [sys.executable, "-c", f"import sys; from {module} import {function}; sys.argv[0] = 'tfcluster'; "
                                  f"sys.exit({function}())"]


def run(argv: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_a_cluster_made_in_the_clone_is_seen_and_taken_down_from_any_folder(homes):
    clone, elsewhere, env = homes
    invoke = [sys.executable, "-m", "invoke"]
    up = run([*invoke, "up", "--workers", "1"], clone, env)
    assert up.returncode == 0, up.stdout + up.stderr
    state = Path(env["HOME"]) / ".local" / "state" / "tfcluster"
    assert (state / "clusters" / "default.json").exists() and not (clone / ".tfcluster").exists()
    assert run([*invoke, "up", "--workers", "2", "--cluster", "second"], clone, env).returncode == 0

    tfcluster = tfcluster_command()
    status = run([*tfcluster, "status"], elsewhere, env)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "Cluster default (local)" in status.stdout
    every = run([*tfcluster, "status", "--all"], elsewhere, env)
    assert every.returncode == 0, every.stdout + every.stderr
    rows = {line.split("│")[1].strip(): line for line in every.stdout.splitlines() if line.count("│") > 5}
    assert set(rows) >= {"default", "second"}, every.stdout
    assert "local" in rows["second"] and " 2 " in rows["second"] and "no prices" in rows["second"], every.stdout

    unknown = run([*tfcluster, "down", "--cluster", "nope"], elsewhere, env)
    assert unknown.returncode == 2 and unknown.stderr.strip().splitlines() == [
        f"error: no cluster 'nope' in {state}; the clusters there are default (local, 1 worker), second (local, "
        "2 workers): take one down with --cluster NAME"], unknown.stderr
    for name in ("default", "second"):
        down = run([*tfcluster, "down", "--cluster", name], elsewhere, env)
        assert down.returncode == 0 and f"Cluster {name} is down" in down.stdout, down.stdout + down.stderr
    assert not list(state.glob("clusters/*.json"))
    assert "Nothing to do." in run([*tfcluster, "down"], elsewhere, env).stdout  # None left: nothing to list.


def test_a_projects_old_state_folder_moves_to_the_per_user_one_with_one_line(homes):
    clone, elsewhere, env = homes
    old = elsewhere / ".tfcluster"  # What `invoke up` made there before the per-user folder.
    made = run([sys.executable, "-m", "invoke", "up", "--workers", "1", "--cluster", "old"], clone,
               {**env, "INVOKE_TFCLUSTER_STATE_DIR": str(old)})
    assert made.returncode == 0, made.stdout + made.stderr
    (old / "runs" / "old" / "old-1").mkdir(parents=True)
    (old / "runs" / "old" / "old-1" / "worker-0.log").write_text("a log\n")
    status = run([*tfcluster_command(), "status", "--cluster", "old"], elsewhere, env)
    assert status.returncode == 0, status.stdout + status.stderr
    state = Path(env["HOME"]) / ".local" / "state" / "tfcluster"
    moved = [line for line in status.stdout.splitlines() if "moved" in line]
    assert moved == [f"! moved {old} to {state}, the per-user state folder that every folder now shares (a link "
                      "stays in its place); to keep a project's own folder, set state_dir: .tfcluster"], status.stdout
    assert "Cluster old (local)" in status.stdout
    assert old.is_symlink() and (state / "runs" / "old" / "old-1" / "worker-0.log").read_text() == "a log\n"
    assert json.loads((state / "clusters" / "old.json").read_text())["name"] == "old"
    again = run([*tfcluster_command(), "status", "--cluster", "old"], elsewhere, env)
    assert "moved" not in again.stdout  # Once.


WRITER = """
import sys, time
from pathlib import Path
from tfcluster.config import Settings
from tfcluster.state import ClusterState, HostRecord, StateStore
store = StateStore(Settings(state_dir=sys.argv[1]), "big")
states = [ClusterState(name="big", backend="ssh", hosts=[HostRecord(f"worker-{i}", f"10.0.{n}.{i % 250}", 2222, host_key="k" * 200)
                                                          for i in range(6000)], cluster_id=str(n)) for n in (1, 2)]
n = 0
while True:
    store.save_cluster(states[n % 2])
    n += 1
    if n == 1:
        print("written", flush=True)
"""


def test_a_state_write_killed_at_any_moment_leaves_the_old_or_the_new_record_whole(tmp_path):
    """SIGKILL lands while the cluster record (a few MB here, so that each write takes a while) is being
    written, over and over: the next command finds one of the two records whole, never a cut one, and no
    temporary file a reader would take for a cluster."""
    import random
    import signal

    from tfcluster.state import StateStore

    rng = random.Random(46)
    store = StateStore(Settings(state_dir=str(tmp_path)), "big")
    for attempt in range(12):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                                  text=True)
        assert writer.stdout.readline().strip() == "written"
        time.sleep(rng.uniform(0.0, 0.3))  # Not a synchronisation: where the kill lands, seeded.
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
        loaded = store.load_cluster()  # A half-written record raises here (json.decoder.JSONDecodeError).
        assert loaded is not None and loaded.cluster_id in ("1", "2") and loaded.workers == 6000, attempt
        assert StateStore.cluster_names(tmp_path) == ["big"]
