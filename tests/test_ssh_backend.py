"""The ssh backend on real OpenSSH hosts, each in its own network namespace (tests/hostlab.py)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Cli, assert_stopped_by, events_of, stop_while_attached, wait_for
from tests import probe_package
from tests.hostlab import SUBNET, HostLab, available

pytestmark = pytest.mark.skipif(available() is not None, reason=f"test hosts: {available()}")

TF_PORT = 23456


# What root's ~/.bashrc (`eval "$(pyenv init -)"`) wrote to stderr on a CI machine when two logins
# rehashed pyenv at once (https://github.com/pyenv/pyenv/issues/3482): before every command, exit 0.
PYENV_RACE = ["rm: cannot remove '/root/.pyenv/shims/tmp.blmqdLd5Bi': No such file or directory",
              "pyenv: cannot rehash: /root/.pyenv/shims isn't writable"]


def noisy_login(folder: Path) -> dict[str, str]:
    """/etc files for a lab whose root login's shell writes PYENV_RACE to stderr, then runs bash."""
    shell = folder / "noisy-login-shell"
    shell.parent.mkdir(parents=True, exist_ok=True)
    shell.write_text("#!/bin/sh\nprintf '%s\\n' " + " ".join(shlex.quote(line) for line in PYENV_RACE)
                     + " >&2\nexec /bin/bash \"$@\"\n")
    shell.chmod(0o755)
    passwd = [f"root:x:0:0:root:/root:{shell}" if line.startswith("root:") else line
              for line in Path("/etc/passwd").read_text().splitlines()]
    return {"passwd": "\n".join(passwd) + "\n"}


@pytest.fixture
def lab(tmp_path, request):
    """Three hosts; `@pytest.mark.parametrize("lab", ["noisy login"], indirect=True)`: their login's
    shell writes to stderr before every command (noisy_login)."""
    etc = noisy_login(tmp_path / "login") if getattr(request, "param", None) == "noisy login" else None
    lab = HostLab(tmp_path / "lab", 3, etc=etc)
    yield lab
    for host in lab.hosts:
        host.restore_link()
    lab.teardown()


@pytest.fixture
def ssh_cli(lab, tmp_path, synthetic_data):
    cli = Cli(tmp_path / "state", synthetic_data)
    remote = tmp_path / "remote"
    cli.env.update({
        "INVOKE_TFCLUSTER_BACKEND": "ssh",
        "INVOKE_TFCLUSTER_HOSTS": ",".join(h.address for h in lab.hosts),
        "INVOKE_TFCLUSTER_SSH_KEY": str(lab.client_key),
        "INVOKE_TFCLUSTER_KNOWN_HOSTS": str(lab.known_hosts),
        "INVOKE_TFCLUSTER_PYTHON": sys.executable,  # The hosts share this machine's filesystem.
        "INVOKE_TFCLUSTER_REMOTE_DIR": str(remote),
        "INVOKE_TFCLUSTER_TF_PORT": str(TF_PORT),
    })
    cli.remote = remote
    yield cli
    if cli.cluster() is not None:
        cli.run("down", timeout=120)


def worker_processes(lab: HostLab) -> dict[str, list[int]]:
    """Processes inside each namespace other than its sshd and that sshd's sessions' shells."""
    found = {}
    for host in lab.hosts:
        pids = []
        for pid in host.pids():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except FileNotFoundError:
                continue
            if "sshd" not in cmdline and "unshare" not in cmdline:
                pids.append(pid)
        found[host.address] = pids
    return found


def remote_run_root(cli, run_id: str, worker: int) -> Path:
    return cli.remote / "default" / "runs" / run_id / f"worker-{worker}"


def wait_for_workers(cli, lab, count: int = 3) -> str:
    """Poll until every worker of the latest run has recorded its PID and runs; returns the run id."""
    def started():
        runs = cli.runs()
        if not runs:
            return None
        run_id = runs[-1].name
        pid_files = [remote_run_root(cli, run_id, i) / f"worker-{i}.attempt1.pid" for i in range(count)]
        return run_id if all(p.exists() and p.read_text().strip() for p in pid_files) else None

    return wait_for(started, 90, what=f"{count} workers to start")


def test_three_hosts_train_and_the_model_comes_back(ssh_cli, lab, tmp_path):
    up = ssh_cli.run("up")
    assert up.returncode == 0, up.stdout + up.stderr
    state = ssh_cli.cluster()
    assert [h["address"] for h in state["hosts"]] == [h.address for h in lab.hosts]
    assert all(h["host_key"] == lab.hosts[i].host_key_public for i, h in enumerate(state["hosts"]))

    # With a requirements file (issue 47): a package only a local index has, installed on each host first.
    wanted, script = probe_requirements(tmp_path)
    try:
        result = ssh_cli.run("train", "--requirements", str(wanted), "--", "--epochs", "2")
        assert result.returncode == 0, result.stdout + result.stderr
        run_dir, run = ssh_cli.latest_run()
        assert_requirements_installed_once(ssh_cli, result.stdout, wanted, script)
    finally:  # The hosts run this suite's own interpreter.
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", "tfcluster-probe"], capture_output=True)
    assert run["summary"]["replicas_in_sync"] == 3

    # Each worker ran on its own host and joined the cluster at the namespace addresses.
    endpoints = [f"{h.address}:{TF_PORT}" for h in lab.hosts]
    hostnames = set()
    for index in range(3):
        strategy = [e for e in events_of((run_dir / f"worker-{index}.log").read_text())
                    if e["event"] == "strategy"][0]
        assert strategy["replicas_in_sync"] == 3
        assert strategy["cluster_spec"] == {"chief": endpoints[:1], "worker": endpoints[1:]}
        hostnames.add(strategy["hostname"])
    assert hostnames == {h.hostname for h in lab.hosts}

    # The chief's model came back; the other hosts hold no model.
    model = run_dir / "output" / "model"
    assert (model / "model.keras").is_file() and (model / "saved_model.pb").is_file()  # At the root: Vertex's.
    assert run["summary"]["keras_path"] == str(model / "model.keras")
    for index in (1, 2):  # Their AIP_MODEL_DIR exists (the wrapper makes it before the program starts), empty.
        model_dir = remote_run_root(ssh_cli, run["run_id"], index) / "output" / "model"
        assert model_dir.is_dir() and not any(model_dir.iterdir())

    # A command on every host, and OpenSSH's client on one, with the cluster's key and pinned host keys (issue 47).
    ran = ssh_cli.run("exec", "--all", "--", "hostname")
    assert ran.returncode == 0 and ran.stdout.splitlines() == [
        f"worker-{i} │ {host.hostname}" for i, host in enumerate(lab.hosts)], ran.stdout + ran.stderr
    shell = ssh_cli.run("ssh", "worker-2", "--", "hostname; pwd")  # In the worker's folder of the latest run.
    latest = ssh_cli.latest_run()[1]["run_id"]
    assert shell.returncode == 0 and shell.stdout.splitlines() == [
        lab.hosts[2].hostname, str(remote_run_root(ssh_cli, latest, 2))], shell.stdout + shell.stderr

    # Unchanged code and data: the second dispatch uploads nothing.
    again = ssh_cli.run("train", "--dry-run")
    assert again.returncode == 0 and f"{SUBNET}.12:23456" in again.stdout
    assert worker_processes(lab) == {h.address: [] for h in lab.hosts}

    down = ssh_cli.run("down", timeout=120)
    assert down.returncode == 0, down.stderr
    assert not (ssh_cli.remote / "default").exists()
    assert worker_processes(lab) == {h.address: [] for h in lab.hosts}


def probe_requirements(folder: Path) -> tuple[Path, Path]:
    """A requirements file asking for a package only a local index has, and a script that imports it."""
    wanted = probe_package.requirements_file(folder / "requirements.txt", probe_package.local_index(folder / "index"))
    script = folder / "probe.py"
    script.write_text(probe_package.SCRIPT)
    return wanted, script


def assert_requirements_installed_once(cli, first_run: str, wanted: Path, script: Path) -> None:
    """`train --requirements` (issue 47): the first run installed it on each of the three hosts; a
    second run installs nothing, and its workers import the package; a file pip cannot satisfy names
    every host with pip's own last line, before anything starts."""
    digest = hashlib.sha256(wanted.read_bytes()).hexdigest()[:16]

    def said(stdout: str) -> list[str]:
        return [line for line in stdout.splitlines() if line.startswith("Requirements on")]

    assert said(first_run) == [f"Requirements on worker-{i}: installed (sha256 {digest})" for i in range(3)], first_run
    again = cli.run("train", "--script", str(script), "--requirements", str(wanted))
    assert again.returncode == 0, again.stdout + again.stderr
    assert said(again.stdout) == [f"Requirements on worker-{i}: unchanged (sha256 {digest}), nothing installed"
                                  for i in range(3)], again.stdout
    assert all(f"worker-{i} │ probe 1.0" in again.stdout for i in range(3)), again.stdout
    impossible = probe_package.requirements_file(wanted.parent / "newer.txt", wanted.parent / "index", version="9.9")
    refused = cli.run("train", "--script", str(script), "--requirements", str(impossible))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith("error: pip could not install --requirements ") and all(
        f"worker-{i} ({SUBNET}.{10 + i}): ERROR: No matching distribution found for tfcluster-probe==9.9"
        in refused.stderr for i in range(3)), refused.stderr


@pytest.mark.parametrize("lab", ["noisy login"], indirect=True)
def test_a_login_whose_shell_writes_to_stderr_trains_and_goes_down(ssh_cli, lab):
    """Hosts whose login prints to stderr before every command (a user's ~/.bashrc, pyenv racing):
    only stdout is read as data, so `down` does not take those words for containers still there."""
    said = lab.hosts[0].exec("ssh", "-i", str(lab.client_key), "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={lab.known_hosts}",
                             f"root@{lab.hosts[0].address}", "true")
    assert said.returncode == 0 and said.stderr.splitlines()[-2:] == PYENV_RACE, said.stderr  # The world is noisy.
    # `down` asks Docker on every host (the hosts share this machine's daemon): it must answer, or
    # the listing is empty whatever the login writes.
    assert lab.hosts[0].exec("docker", "version").returncode == 0, "the Docker daemon must run (.ci/run starts it)"
    assert ssh_cli.run("up").returncode == 0
    trained = ssh_cli.run("train", "--", "--epochs", "1")
    assert trained.returncode == 0, trained.stdout + trained.stderr
    status = ssh_cli.run("status")
    assert status.returncode == 0 and "pyenv" not in status.stdout + status.stderr
    down = ssh_cli.run("down", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "no worker process is left, nor any container" in down.stdout
    assert ssh_cli.cluster() is None and worker_processes(lab) == {h.address: [] for h in lab.hosts}


SLEEPER = """
import os, signal, sys, time
import tfcluster  # The progress helper, shipped beside the code.
print("worker", os.environ["TFCLUSTER_WORKER_INDEX"], "on", os.uname().nodename, flush=True)
# The bundled trainer's rule for a script's own rate, from the replicas the launcher counted.
print("replicas", os.environ["TFCLUSTER_REPLICAS"], "sgd rate", round(tfcluster.scaled_learning_rate(0.1, "sgd"), 6),
      "adam rate", round(tfcluster.scaled_learning_rate(1e-3, "adam"), 6), flush=True)
tfcluster.progress(1)
os.kill(os.getpid(), signal.SIGUSR1)  # What a stalled run's launcher sends: the stacks go to the log.
time.sleep(float(sys.argv[1]))
print("finished", flush=True)
"""


def test_job_survives_the_launcher_and_reattaches(ssh_cli, lab, tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    assert ssh_cli.run("up").returncode == 0
    launcher = ssh_cli.popen("train", "--script", str(script), "--", "6")
    wait_for_workers(ssh_cli, lab)
    launcher.send_signal(signal.SIGKILL)  # The laptop is gone.
    launcher.wait(timeout=10)
    status = ssh_cli.run("status")
    assert "running" in status.stdout
    follow = ssh_cli.run("logs", "--follow", timeout=120)
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert follow.stdout.count("finished") == 3 and "succeeded" in follow.stdout
    for index, host in enumerate(lab.hosts):
        assert f"worker {index} on {host.hostname}" in follow.stdout
    assert follow.stdout.count("replicas 3 sgd rate 0.3 adam rate 0.001732") == 3, follow.stdout[-3000:]
    # The sitecustomize shipped beside the code turned SIGUSR1 into a stack dump (not a kill), and
    # `import tfcluster` found the helper (tfcluster/stall.py).
    run_id = ssh_cli.latest_run()[1]["run_id"]
    for index in range(3):
        log = (remote_run_root(ssh_cli, run_id, index) / f"worker-{index}.log").read_text()
        assert [e["step"] for e in events_of(log) if e["event"] == "progress"] == [1], log[-2000:]
        assert re.search(r'^  File ".*sleeper\.py", line 9 in <module>$', log, re.M), log[-2000:]


def test_cut_link_fails_fast_and_names_the_host(ssh_cli, lab, tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    assert ssh_cli.run("up").returncode == 0
    launcher = ssh_cli.popen("train", "--script", str(script), "--", "600")
    try:
        wait_for_workers(ssh_cli, lab)
        lab.hosts[2].cut_link()
        cut_at = time.monotonic()
        output, _ = launcher.communicate(timeout=90)
        elapsed = time.monotonic() - cut_at
    finally:
        if launcher.poll() is None:
            launcher.kill()
        lab.hosts[2].restore_link()
    assert launcher.returncode == 1, output
    assert elapsed < 60
    assert f"worker-2 (worker:1 on {SUBNET}.12:23456) is unreachable: no answer within" in output
    # The reachable hosts were stopped.
    remaining = worker_processes(lab)
    assert remaining[lab.hosts[0].address] == [] and remaining[lab.hosts[1].address] == []


def test_killed_remote_worker_then_retry_resumes_and_down_wins_mid_epoch(ssh_cli, lab):
    """A killed worker: every worker restarts and resumes from the chief's backup. Then `down` from
    another shell, mid-epoch, while this `train --retries 2` is attached: no third attempt, the
    launcher's one line names `invoke down` and it exits 1, and down's ✓ comes after it exited."""
    assert ssh_cli.run("up").returncode == 0
    launcher = ssh_cli.popen("train", "--retries", "2", "--", "--epochs", "4")
    try:
        run_dir = wait_for(lambda: ssh_cli.runs() and ssh_cli.runs()[-1], 60, what="run folder")
        run_id = run_dir.name
        chief_log = remote_run_root(ssh_cli, run_id, 0) / "worker-0.log"

        def chief_events(attempt: int) -> list[dict]:
            text = chief_log.read_text() if chief_log.exists() else ""
            parts = text.split(" attempt 2 on")
            return events_of(parts[attempt - 1]) if len(parts) >= attempt else []

        wait_for(lambda: any(e["event"] == "epoch_end" for e in chief_events(1)), 180, what="the chief's first epoch")
        pid = int((remote_run_root(ssh_cli, run_id, 2) / "worker-2.attempt1.pid").read_text())
        assert pid in worker_processes(lab)[lab.hosts[2].address]
        os.kill(pid, signal.SIGKILL)

        def mid_epoch() -> bool:  # Attempt 2 resumed and stepped into its epoch.
            found = chief_events(2)
            begun = [i for i, e in enumerate(found) if e["event"] == "epoch_begin"]
            return bool(begun) and any(e["event"] == "step" for e in found[begun[0]:])

        wait_for(mid_epoch, 180, what="attempt 2 in the middle of an epoch")
        # Read before down removes the run folders from the hosts.
        finished = max(e["epoch"] for e in chief_events(1) if e["event"] == "epoch_end")
        worker_2 = (remote_run_root(ssh_cli, run_id, 2) / "worker-2.log").read_text().split(" attempt 2 on")[1]
        resumed = [e["epoch"] for e in events_of(worker_2) if e["event"] == "epoch_begin"]
        said, output, exited, stopper = stop_while_attached(ssh_cli, launcher, "down")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=10)
    assert launcher.returncode == 1, output[-4000:]
    assert f"worker-2 (worker:1 on {SUBNET}.12:23456) was killed by SIGKILL" in output
    assert "Retrying: attempt 2 of 3" in output and "attempt 3" not in output, output[-4000:]
    assert_stopped_by(output, run_id, "down", stopper, retried_before=1)
    assert exited, f"down printed its ✓ before the launcher exited:\n{said}"
    assert "verified that no worker process is left" in said, said
    assert worker_processes(lab) == {h.address: [] for h in lab.hosts}
    run = json.loads((run_dir / "run.json").read_text())
    assert run["outcome"] == "stopped" and run["attempts"] == 2, run
    # Worker 2 resumed with the chief from the backup: nothing redone.
    assert resumed[:1] == [finished + 1] and finished >= 1, (resumed, finished)
    assert run["summary"]["resumed_at"]["2"] == finished + 1, run["summary"]


def _nothing_started(cli, lab):
    assert cli.cluster() is None
    assert worker_processes(lab) == {h.address: [] for h in lab.hosts}
    assert not cli.remote.exists() or not any((cli.remote).rglob("*.sh"))


def test_unreachable_host_at_up(ssh_cli, lab):
    lab.hosts[1].cut_link()
    result = ssh_cli.run("up", timeout=120)
    assert result.returncode == 2
    assert f"{SUBNET}.11: unreachable" in result.stderr and "Traceback" not in result.stderr
    _nothing_started(ssh_cli, lab)


def test_wrong_client_key(ssh_cli, lab, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    ssh_cli.env["INVOKE_TFCLUSTER_SSH_KEY"] = str(other)
    result = ssh_cli.run("up")
    assert result.returncode == 2
    assert "authentication as 'root'" in result.stderr and "check --ssh-user and --ssh-key" in result.stderr
    for host in lab.hosts:
        assert host.address in result.stderr
    _nothing_started(ssh_cli, lab)


def test_host_keys_are_verified_never_trusted_silently(ssh_cli, lab, tmp_path):
    # Not in known_hosts: refused with the fingerprint, unless --trust-new-hosts.
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    ssh_cli.env["INVOKE_TFCLUSTER_KNOWN_HOSTS"] = str(empty)
    refused = ssh_cli.run("up")
    assert refused.returncode == 2 and "is not in" in refused.stderr and "SHA256:" in refused.stderr
    _nothing_started(ssh_cli, lab)

    # A known_hosts entry that does not match: refused as a changed key.
    wrong = tmp_path / "wrong_known_hosts"
    lines = lab.known_hosts.read_text().splitlines()
    lines[0] = f"{lab.hosts[0].address} {lab.hosts[1].host_key_public}"
    wrong.write_text("\n".join(lines) + "\n")
    ssh_cli.env["INVOKE_TFCLUSTER_KNOWN_HOSTS"] = str(wrong)
    changed = ssh_cli.run("up")
    assert changed.returncode == 2 and f"{SUBNET}.10: host key CHANGED" in changed.stderr
    _nothing_started(ssh_cli, lab)

    # Explicit trust on first contact prints the fingerprints and pins them.
    ssh_cli.env["INVOKE_TFCLUSTER_KNOWN_HOSTS"] = str(empty)
    trusted = ssh_cli.run("up", "--trust-new-hosts")
    assert trusted.returncode == 0, trusted.stderr
    assert trusted.stdout.count("trusting new host key ssh-ed25519 SHA256:") == 3

    # The host is rebuilt with a new key: every later command refuses to talk to it.
    host = lab.hosts[2]
    key = lab.root / "h2" / "ssh_host_ed25519_key"
    for path in (key, Path(f"{key}.pub")):
        path.unlink()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    host.sshd.kill()
    host.sshd.wait()
    host.sshd = subprocess.Popen(
        ["ip", "netns", "exec", host.netns, "/usr/sbin/sshd", "-D", "-f", str(lab.root / "h2" / "sshd_config"),
         "-E", str(lab.root / "h2" / "rebuilt-sshd.log")])  # Every login from now on (none may come).
    lab._wait_for_port(host)
    refused = ssh_cli.run("train", "--", "--epochs", "1")
    assert refused.returncode == 2
    assert f"preflight failed on 1 host(s): worker-2 ({SUBNET}.12): host key CHANGED since `invoke up` " \
        "pinned it" in refused.stderr
    assert worker_processes(lab) == {h.address: [] for h in lab.hosts}
    # So does `ssh` (issue 47), before OpenSSH is run, in the same words; the others still open.
    shell = ssh_cli.run("ssh", "worker-2", "--", "hostname")
    assert shell.returncode == 2 and shell.stderr.startswith("error: worker-2: host key CHANGED since `invoke up` "
                                                             "pinned it (now SHA256:"), shell.stderr
    assert ssh_cli.run("ssh", "--", "hostname").stdout.strip() == lab.hosts[0].hostname

    # tfcluster issue 46, the rebuilt host. `status` shows the cluster, that host marked; plain `down` cleans
    # what it can verify, keeps the cluster and says to use --force; `down --force` forgets it, naming what
    # may be left on that host, and never connects there (a login leaves a session process in its namespace).
    status = ssh_cli.run("status")
    assert status.returncode == 0, status.stdout + status.stderr
    row = next(line for line in status.stdout.splitlines() if "worker-2" in line)
    assert "host key CHANGED since `invoke up` pinned it" in row and "SHA256:" in row, status.stdout
    assert "CHANGED" not in next(line for line in status.stdout.splitlines() if "worker-0" in line)
    down = ssh_cli.run("down")
    assert down.returncode == 2 and ssh_cli.cluster() is not None, down.stdout + down.stderr
    assert down.stderr.strip().splitlines() == [
        f"error: the host key of worker-2 ({SUBNET}.12) CHANGED since `invoke up` pinned it, so tfcluster will not "
        "connect there; the hosts it could verify are clean, and cluster 'default' is kept: if the host was "
        "rebuilt, run `invoke down --force` to forget the cluster (what may be left on each host is named above)"]
    forced = ssh_cli.run("down", "--force")
    assert forced.returncode == 0 and ssh_cli.cluster() is None, forced.stdout + forced.stderr
    assert f"could not clean worker-2 ({SUBNET}.12): host key CHANGED since `invoke up` pinned it" in forced.stdout
    assert "Traceback" not in forced.stdout + forced.stderr + down.stderr + status.stderr
    assert "1 could not be cleaned (above)" in forced.stdout
    logins = (lab.root / "h2" / "rebuilt-sshd.log").read_text()
    assert "Accepted" not in logins and "[preauth]" in logins, logins  # Handshakes only, no login.


def test_tf_port_taken_fails_preflight(ssh_cli, lab):
    host = lab.hosts[1]
    squatter = subprocess.Popen(["ip", "netns", "exec", host.netns, sys.executable, "-m", "http.server",
                                 str(TF_PORT), "--bind", host.address],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        probe = f"import socket; socket.create_connection(('{host.address}', {TF_PORT}), 1)"
        wait_for(lambda: host.exec(sys.executable, "-c", probe).returncode == 0, 20, what="the squatter")
        result = ssh_cli.run("up")
    finally:
        squatter.kill()
        squatter.wait()
    assert result.returncode == 2
    assert f"worker-1 ({SUBNET}.11): TensorFlow port 23456 is already in use" in result.stderr
    _nothing_started(ssh_cli, lab)


def test_watchdog_on_own_hosts_installs_changes_and_goes_with_down(ssh_cli, lab):
    # 30 minutes: far longer than the test, so it never halts this machine.
    up = ssh_cli.run("up", "--idle-minutes", "30")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "safety: idle watchdog halts each host after 30 idle minutes" in up.stdout
    config = ssh_cli.remote / "default" / "watchdog" / "worker-1" / "config.json"
    status_file = ssh_cli.remote / "default" / "watchdog" / "worker-1" / "state" / "status.json"
    assert json.loads(config.read_text())["idle_minutes"] == 30
    wait_for(status_file.exists, 30, what="the watchdog's first status")

    def supervisors():
        found = []
        for host in lab.hosts:
            for pid in host.pids():
                try:
                    if b"TFCLUSTER_WATCHDOG=" in Path(f"/proc/{pid}/environ").read_bytes():
                        found.append(pid)
                except OSError:
                    pass
        return found

    assert supervisors()
    status = ssh_cli.run("status")
    assert "Idle shutdown" in status.stdout and "none (own host)" in status.stdout
    assert ssh_cli.run("idle", "--minutes", "45").returncode == 0
    assert json.loads(config.read_text())["idle_minutes"] == 45
    assert ssh_cli.run("idle", "--off").returncode == 0
    assert json.loads(config.read_text())["idle_minutes"] == 0
    assert ssh_cli.run("up").returncode == 0  # The next `up` restores the configured minutes.
    assert json.loads(config.read_text())["idle_minutes"] == 30
    down = ssh_cli.run("down", timeout=120)
    assert down.returncode == 0, down.stderr
    wait_for(lambda: not supervisors(), 10, what="the watchdog to stop")
