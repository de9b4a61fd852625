"""Two commands at once from two shells, on one cluster (tfcluster/holds.py): one proceeds, the other waits
or says in one line who holds the cluster (pid, command, since when); a `train` never starts workers on a
cluster that `down` is removing; clusters of different names proceed side by side.

The first command is held in the middle deterministically, never by timing: an `up` whose host accepts
the TCP connection and never says a word (it waits out the SSH banner deadline), a launcher paused with
SIGSTOP while `down` waits for it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

from tests.conftest import wait_for
from tfcluster.config import Settings
from tfcluster import holds
from tfcluster.state import StateStore

SLEEPER = """
import os, time
print("worker", os.environ["TFCLUSTER_WORKER_INDEX"], "up", flush=True)
time.sleep(600)
"""


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def holder_pid(cli, cluster: str = "default") -> int:
    holder = getattr(holds, "command_holder", lambda store: None)(StateStore(Settings(state_dir=str(cli.state_dir)), cluster))
    return holder.pid if holder else 0


SINCE = r"since \d\d:\d\d:\d\d"


def test_up_and_up_and_down_while_an_up_is_making_the_cluster(cli, tmp_path):
    """An `up` of an ssh cluster whose host never answers holds the cluster for the banner deadline: a
    second `up` says who holds it, and `down` waits for it, then finds nothing left to do."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # Connections complete in the backlog; nothing ever answers on them.
    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    cli.env.update({"INVOKE_TFCLUSTER_BACKEND": "ssh", "INVOKE_TFCLUSTER_HOSTS": f"127.0.0.1:{silent.getsockname()[1]}",
                    "INVOKE_TFCLUSTER_SSH_KEY": str(key), "INVOKE_TFCLUSTER_KNOWN_HOSTS": str(tmp_path / "known")})
    first = cli.popen("up", "--workers", "1")
    try:
        wait_for(lambda: holder_pid(cli) == first.pid, 30, what="the first `up` to hold the cluster")
        line = one_error_line(cli.run("up", "--workers", "1"))
        assert re.fullmatch(rf"error: cluster 'default' is being made by `invoke up` \(pid {first.pid}, {SINCE}\); "
                            r"wait for it to finish \(`invoke status` shows the cluster then\)", line), line
        down = cli.run("down", timeout=120)  # Waits for the first `up`, which fails on the silent host.
        output, _ = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
        silent.close()
    assert first.returncode == 2 and "unreachable" in output, output
    assert down.returncode == 0, down.stdout + down.stderr
    assert re.search(rf"Waiting for `invoke up` \(pid {first.pid}, {SINCE}\) to finish before taking cluster "
                     "'default' down", down.stdout), down.stdout
    assert "Cluster 'default' is not up. Nothing to do." in down.stdout
    assert holder_pid(cli) == 0


def test_train_and_train_then_train_tune_up_and_down_while_down_runs(cli, tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    # Two clusters of different names, made at once: side by side, neither waits for the other.
    side = [cli.popen("up", "--workers", "2"), cli.popen("up", "--workers", "1", "--cluster", "other")]
    for process in side:
        output, _ = process.communicate(timeout=120)
        assert process.returncode == 0 and "Waiting" not in output, output
    assert cli.run("down", "--cluster", "other").returncode == 0

    launcher = cli.popen("train", "--script", str(script))
    try:
        wait_for(lambda: cli.runs() and len(list(cli.runs()[-1].glob("worker-*.attempt1.pid"))) == 2, 120,
                 what="two workers")
        run_id = cli.runs()[-1].name
        runs_before = len(cli.runs())
        line = one_error_line(cli.run("train", "--script", str(script)))
        assert re.fullmatch(rf"error: a run is still active on cluster 'default': {run_id}, held by `invoke train` "
                            rf"\(pid {launcher.pid}, {SINCE}\); watch it with `invoke logs --follow` or end it with "
                            r"`invoke stop`", line), line

        # The launcher paused: `down` stops the run's workers, then waits for the launcher, holding the cluster.
        os.kill(launcher.pid, signal.SIGSTOP)
        down = cli.popen("down")
        wait_for(lambda: holder_pid(cli) == down.pid, 60, what="`down` to hold the cluster")
        held = rf"`invoke down` \(pid {down.pid}, {SINCE}\)"
        line = one_error_line(cli.run("train", "--script", str(script)))
        assert re.fullmatch(rf"error: cluster 'default' is being taken down by {held}; wait for it to finish, then "
                            r"`invoke up`", line), line
        line = one_error_line(cli.run("tune", "--max-trials", "1"))
        assert re.fullmatch(rf"error: cluster 'default' is being taken down by {held}; wait for it to finish, then "
                            r"`invoke up`", line), line
        assert len(cli.runs()) == runs_before  # Neither started a run, nor left a folder.
        line = one_error_line(cli.run("down"))
        assert re.fullmatch(rf"error: cluster 'default' is already being taken down by {held}; it finishes the job "
                            r"\(`invoke status` says when the cluster is gone\)", line), line
        line = one_error_line(cli.run("up", "--workers", "2"))
        assert re.fullmatch(rf"error: cluster 'default' is being taken down by {held}; run `invoke up` again once "
                            r"it is down", line), line
        status = cli.run("status")
        assert status.returncode == 0 and re.search(rf"Held by {held}", status.stdout), status.stdout + status.stderr
        os.kill(launcher.pid, signal.SIGCONT)
        output, _ = down.communicate(timeout=120)
        assert down.returncode == 0 and "Cluster default is down" in output, output
    finally:
        if launcher.poll() is None:
            os.kill(launcher.pid, signal.SIGCONT)
        launcher.communicate(timeout=120)
    assert cli.cluster() is None and holder_pid(cli) == 0
    assert (cli.state_dir / "runs" / "default" / run_id / "run.json").exists()
