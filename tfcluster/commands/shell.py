"""`invoke ssh [worker-N]` and `invoke exec [--worker N | --all] -- CMD`: a shell, or one command, on a
worker's host, as SkyPilot's `ssh <cluster>` and `sky exec` give.

Both reach a host the way every other command does: its address and port as `up` recorded them, the
cluster's own key and login, and the host key `up` pinned, never another (a changed key is refused
with the words `down` uses). exec runs in the worker's folder (its run folder of the latest run, else
the cluster's folder on the host) and prints each line prefixed by the worker, as the logs are; on
local clusters the "host" is this machine, and the folder is the run's. Vertex AI's workers are a
managed job's containers: there is no shell to open.

May import: backends (their hosts and the ssh connection's key checks), state, ui, errors.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tfcluster import ui
from tfcluster.commands.common import backend_for_cluster, console, require_cluster
from tfcluster.config import Settings
from tfcluster.errors import ClusterError, ConfigError
from tfcluster.state import ClusterState, HostRecord, StateStore

# How long one exec may run on a host before it is named as not finished.
EXEC_SECONDS = 3600.0


def _no_shell(cluster: ClusterState) -> None:
    if cluster.backend == "vertex":
        raise ConfigError("a Vertex AI cluster's workers are a managed job's containers, with no shell to open; "
                          "see what they print with `invoke logs`, or use --backend gcp for VMs you can log in to")


def _worker_index(cluster: ClusterState, worker: str | int | None) -> int:
    """worker-N, N, or None (the chief, worker-0)."""
    if worker is None:
        return 0
    match = re.fullmatch(r"(?:worker-)?(\d+)", str(worker).strip())
    index = int(match.group(1)) if match else -1
    if not 0 <= index < cluster.workers:
        raise ConfigError(f"worker must be worker-0 to worker-{cluster.workers - 1} (or 0 to {cluster.workers - 1}) on "
                          f"cluster '{cluster.name}' (got {worker!r})")
    return index


def _folder(store: StateStore, cluster: ClusterState, host) -> str:
    """The worker's folder: its run folder of the latest run, else the cluster's tfcluster folder."""
    run = store.latest_run()
    if run is not None:
        return host.run_root(run.run_id)
    return host.record.remote_root or str(store.root)


def run_on_workers(settings: Settings, command: str, worker: str | int | None, every: bool) -> None:
    """`exec`: ``command`` (a shell command line) on one worker or all; ClusterError naming each that failed."""
    if not command.strip():
        raise ConfigError("exec needs a command after `--`, e.g. invoke exec --all -- nvidia-smi")
    if every and worker is not None:
        raise ConfigError("--all runs on every worker; drop --worker, or drop --all")
    store = StateStore(settings)
    cluster = require_cluster(store)
    _no_shell(cluster)
    hosts = backend_for_cluster(store, cluster).hosts(cluster)
    if not every:
        hosts = [hosts[_worker_index(cluster, worker)]]

    def one(host):
        folder = _folder(store, cluster, host)
        return host.run_command(["sh", "-c", f"cd {shlex.quote(folder)} 2>/dev/null || cd; {command}"],
                                timeout=EXEC_SECONDS)

    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        results = list(pool.map(one, hosts))
    width = max(9, *(len(host.record.name) + 1 for host in hosts))  # As the logs align their prefix.
    for host, result in zip(hosts, results):
        index = cluster.hosts.index(host.record)
        for line in result.output.splitlines():
            console.print(ui.prefixed(index, host.record.name, line, width), soft_wrap=True)
    failed = [f"{host.record.name} (exit {result.code}: {result.last_line})" for host, result in zip(hosts, results)
              if result.code != 0]
    if failed:
        raise ClusterError(f"the command failed on {len(failed)} of {len(hosts)} worker(s): {'; '.join(failed)}")


def open_shell(settings: Settings, worker: str | None, command: str = "") -> int:
    """`ssh`: OpenSSH's client to the worker's host with the cluster's key and only its pinned host key;
    a shell in the worker's folder (or ``command`` there). Returns the client's exit code."""
    store = StateStore(settings)
    cluster = require_cluster(store)
    _no_shell(cluster)
    index = _worker_index(cluster, worker)
    host = backend_for_cluster(store, cluster).hosts(cluster)[index]
    folder = _folder(store, cluster, host)
    if cluster.backend == "local":  # This machine: a shell in the run's folder.
        shell = os.environ.get("SHELL") or "/bin/sh"
        argv = [shell, "-c", command] if command else [shell]
        return subprocess.call(argv, cwd=folder if Path(folder).is_dir() else str(store.root))
    record = host.record
    _check_pinned_key(record)
    known = store.root / "known_hosts" / f"{cluster.name}"
    known.parent.mkdir(parents=True, exist_ok=True)
    known.write_text(f"{_known_name(record)} {record.host_key}\n")
    known.chmod(0o600)
    remote = f"cd {shlex.quote(folder)} 2>/dev/null || cd; " + (command or 'exec "${SHELL:-/bin/sh}" -l')
    argv = ["ssh", "-i", cluster.ssh_key, "-p", str(record.ssh_port), "-o", "IdentitiesOnly=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", *([] if command else ["-t"]), f"{cluster.ssh_user}@{_ssh_address(record)}", remote]
    try:
        return subprocess.call(argv)
    except FileNotFoundError:
        raise ClusterError("the ssh client is not installed here; install OpenSSH's client (apt install "
                           "openssh-client), or run one command with `invoke exec`") from None


def _ssh_address(record: HostRecord) -> str:
    return record.ssh_address or record.address


def _known_name(record: HostRecord) -> str:
    address = _ssh_address(record)
    return address if record.ssh_port == 22 else f"[{address}]:{record.ssh_port}"


def _check_pinned_key(record: HostRecord) -> None:
    """The host's key now against the one `up` pinned: a changed key is refused before OpenSSH runs."""
    from tfcluster.backends.ssh.connection import HostAddress, HostKeyChanged, fingerprint, key_line, scan_host_key

    key = scan_host_key(HostAddress(_ssh_address(record), record.ssh_port), preferred=[record.host_key.split()[0]])
    if key_line(key) != record.host_key:
        raise HostKeyChanged(record.name, fingerprint(key))  # down's words: the fix is `down --force`.

