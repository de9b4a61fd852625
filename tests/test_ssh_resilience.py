"""Hosts that vanish: `status` and `down` still answer in bounded time, and nothing of ours lingers.

Real sshd hosts in network namespaces (tests/hostlab.py); a "vanished" host is one whose link is
cut, so packets are dropped and every connection attempt has to time out (the slow case; a
refused connection fails at once).
"""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.conftest import Cli, wait_for
from tests.hostlab import HostLab, available
from tests.test_ssh_backend import SLEEPER, TF_PORT, wait_for_workers

pytestmark = pytest.mark.skipif(available() is not None, reason=f"test hosts: {available()}")


def make_cli(lab: HostLab, tmp_path, synthetic_data) -> Cli:
    import sys

    cli = Cli(tmp_path / "state", synthetic_data)
    cli.remote = tmp_path / "remote"
    cli.env.update({
        "INVOKE_TFCLUSTER_BACKEND": "ssh",
        "INVOKE_TFCLUSTER_HOSTS": ",".join(h.address for h in lab.hosts),
        "INVOKE_TFCLUSTER_SSH_KEY": str(lab.client_key),
        "INVOKE_TFCLUSTER_KNOWN_HOSTS": str(lab.known_hosts),
        "INVOKE_TFCLUSTER_PYTHON": sys.executable,
        "INVOKE_TFCLUSTER_REMOTE_DIR": str(cli.remote),
        "INVOKE_TFCLUSTER_TF_PORT": str(TF_PORT),
    })
    return cli


@pytest.fixture
def plain_lab(tmp_path):
    """Hosts whose sshd has no ClientAliveInterval (the OpenSSH default)."""
    lab = HostLab(tmp_path / "lab", 3, tag="tv", client_alive=False)
    yield lab
    for host in lab.hosts:
        host.restore_link()
    lab.teardown()


def ours_on(host) -> list[str]:
    """Every process in the host's namespace except its listening sshd: sessions, shells, jobs."""
    found = []
    for pid in host.pids():
        if pid == host.sshd.pid:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode().strip()
            found.append(f"{pid}: {command}")
        except FileNotFoundError:
            continue
    return found


def test_vanished_host_status_and_down_answer_in_bounded_time(plain_lab, tmp_path, synthetic_data):
    cli = make_cli(plain_lab, tmp_path, synthetic_data)
    assert cli.run("up").returncode == 0
    gone = plain_lab.hosts[2]
    gone.cut_link()

    started = time.monotonic()
    status = cli.run("status", timeout=120)
    status_seconds = time.monotonic() - started
    assert status.returncode == 0, status.stderr
    assert status_seconds < 30
    row = next(line for line in status.stdout.splitlines() if "worker-2" in line)
    assert "unreachable" in row
    assert "unreachable" not in next(line for line in status.stdout.splitlines() if "worker-0" in line)

    started = time.monotonic()
    down = cli.run("down", timeout=120)
    down_seconds = time.monotonic() - started
    output = down.stdout + down.stderr
    # Not forgotten while something of it may run on the host that does not answer: exit 2, the record
    # kept, what stays there named; `down` can run again, and --force forgets it.
    assert down.returncode == 2 and cli.cluster() is not None, output
    assert down_seconds < 60
    assert down.stderr.strip().splitlines() == [
        f"error: could not reach worker-2 ({gone.address}); the hosts that answered are clean, and cluster 'default' "
        "is kept: run `invoke down` again when it answers, or `invoke down --force` to forget the cluster (what "
        "stays on each host is named above)"], output
    assert f"could not clean worker-2 ({gone.address})" in down.stdout and "Traceback" not in output
    assert "paramiko" not in output
    # The reachable hosts were cleaned.
    assert not (cli.remote / "default").exists() or not any(
        (cli.remote / "default").glob("runs/*/worker-0"))
    forced = cli.run("down", "--force", timeout=120)
    assert forced.returncode == 0 and cli.cluster() is None, forced.stdout + forced.stderr
    assert f"could not clean worker-2 ({gone.address})" in forced.stdout
    assert "1 could not be cleaned (above)" in forced.stdout


def test_control_shell_does_not_outlive_a_client_behind_a_cut_link(plain_lab, tmp_path, synthetic_data):
    cli = make_cli(plain_lab, tmp_path, synthetic_data)
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    assert cli.run("up").returncode == 0
    launcher = cli.popen("train", "--script", str(script), "--", "20")
    cut = plain_lab.hosts[2]
    try:
        wait_for_workers(cli, plain_lab)
        cut.cut_link()
        output, _ = launcher.communicate(timeout=120)  # Fails fast: worker-2 is unreachable.
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 1, output

    started = time.monotonic()
    down = cli.run("down", timeout=120)
    assert down.returncode == 0 and time.monotonic() - started < 60, down.stdout + down.stderr
    assert f"worker-2 ({cut.address})" in down.stdout + down.stderr

    # The laptop is gone for good: its kernel forgets the connections without telling the host
    # (as after a sleep, a new network, a crash), so no FIN or RST ever arrives once the link heals.
    subprocess.run(["ss", "-K", "dst", cut.address], check=True, capture_output=True)
    cut.restore_link()
    # The launcher's control shell and its sshd session end by themselves once their client is
    # known to be gone; the job itself ended on its own (it sleeps 20 s).
    wait_for(lambda: ours_on(cut) == [], 120, interval=1,
             what=f"no process of ours on {cut.address} (left: {ours_on(cut)})")
