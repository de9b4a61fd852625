"""The idle watchdog on your own hosts: install it, change its settings, read its status, stop it.

The watchdog itself is the package startup/tfcluster_watchdog (standard library only); here it runs under a
small shell restart loop, since own hosts may lack systemd. Its action there is `shutdown -h`.
"""

from __future__ import annotations

import json
import shlex

from tfcluster.backends.group import in_parallel
from tfcluster.backends.ssh.host import SshHost
from tfcluster.errors import ClusterError, ConfigError

# The package, run as `python3 <folder>/tfcluster_watchdog` (its __main__.py).
PACKAGE = "tfcluster_watchdog"
WATCHDOG_SOURCE = f"startup/{PACKAGE}"


def _label(host: SshHost) -> str:
    return f"{host.record.name} ({host.record.address})"


def watchdog_dir(host: SshHost) -> str:
    # One folder per host: hosts may share a filesystem.
    return f"{host.record.remote_root}/watchdog/{host.record.name}"


def install(hosts: list[SshHost], cluster_id: str, sources: dict[str, bytes], idle_minutes: int, action: str) -> None:
    """Ship the watchdog package (``sources``: file name -> content) to every host and keep it
    running under a restart loop."""
    if action != "stop":
        raise ConfigError("idle_action delete needs the gcp backend (it deletes the VM through the "
                          "Compute API); on your own hosts use stop")

    def install_one(host: SshHost) -> None:
        folder = watchdog_dir(host)
        for name, source in sources.items():
            host.write_file(f"{folder}/{PACKAGE}/{name}", source, 0o644)
        write_settings(host, idle_minutes, action)
        q = shlex.quote
        loop = (f"export TFCLUSTER_WATCHDOG={q(cluster_id)}; while :; do "
                f"{q(host.python)} {q(folder + '/' + PACKAGE)} --config {q(folder + '/config.json')} "
                f"--state-dir {q(folder + '/state')} --poll-seconds 30; sleep 5; done")
        code, out = host.connection.shell(
            f"if [ -f {q(folder + '/supervisor.pid')} ] && kill -0 $(cat {q(folder + '/supervisor.pid')}) "
            f"2>/dev/null; then exit 0; fi; mkdir -p {q(folder + '/state')}; "
            f"setsid sh -c {q(loop)} </dev/null >>{q(folder + '/watchdog.log')} 2>&1 & "
            f"echo $! > {q(folder + '/supervisor.pid')}")
        if code != 0:
            raise ClusterError(f"could not start the idle watchdog: {out.strip()}")

    in_parallel(hosts, install_one, _label, "installing the idle watchdog")


def _config(host: SshHost) -> dict:
    raw = host.read_file(f"{watchdog_dir(host)}/config.json")
    return json.loads(raw) if raw else {}


def write_settings(host: SshHost, idle_minutes: int, action: str) -> None:
    """The idle settings; the run's stall_minutes, if one set it, stays."""
    config = {**_config(host), "idle_minutes": idle_minutes, "action": action, "probes": "jobs_and_ssh"}
    host.write_file(f"{watchdog_dir(host)}/config.json", json.dumps(config).encode(), 0o644)


def set_stall_minutes(hosts: list[SshHost], stall_minutes: float | None) -> None:
    """The run's --stall-minutes (None: the default rule) where a watchdog is installed; it reads
    its config on its next poll."""
    def update(host: SshHost) -> None:
        config = _config(host)
        if config:  # No watchdog here (up --idle-minutes 0): nothing reads it.
            config["stall_minutes"] = stall_minutes
            host.write_file(f"{watchdog_dir(host)}/config.json", json.dumps(config).encode(), 0o644)

    in_parallel(hosts, update, _label, "setting the stall limit")


def change_settings(hosts: list[SshHost], idle_minutes: int, action: str) -> None:
    """Change the watchdog's settings on every host; it reads them on its next poll."""
    def update(host: SshHost) -> None:
        if host.file_size(f"{watchdog_dir(host)}/{PACKAGE}/__main__.py") == 0:
            raise ClusterError("no idle watchdog here; install it with `invoke down` and "
                               "`invoke up --idle-minutes N`")
        write_settings(host, idle_minutes, action)

    in_parallel(hosts, update, _label, "changing the idle watchdog")


def read_status(hosts: list[SshHost]) -> dict[str, dict | None]:
    """Per worker name: the watchdog's last status (None where none is installed)."""
    def read(host: SshHost) -> dict | None:
        raw = host.read_file(f"{watchdog_dir(host)}/state/status.json")
        return json.loads(raw) if raw else None

    return dict(zip([h.record.name for h in hosts],
                    in_parallel(hosts, read, lambda h: h.record.name, "reading watchdog status")))


def stop(hosts: list[SshHost]) -> None:
    def stop_one(host: SshHost) -> None:
        pid_file = shlex.quote(f"{watchdog_dir(host)}/supervisor.pid")
        host.connection.shell(f"[ -f {pid_file} ] && kill -s 9 -- -$(cat {pid_file}) 2>/dev/null; "
                              f"rm -f {pid_file}; true")

    in_parallel(hosts, stop_one, _label, "stopping the idle watchdog")
