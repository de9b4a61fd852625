"""The embedded local cluster: worker processes on this machine, on free loopback ports."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
from pathlib import Path

import trainer
from tfcluster.backends.base import Backend, CommandResult, JobFiles, Payload, Staged
from tfcluster.config import Settings
from tfcluster.ports import LOOPBACK, free_ports, port_range
from tfcluster.errors import ClusterError
from tfcluster.state import ClusterState, HostRecord, StateStore

PROJECT_ROOT = Path(trainer.__file__).resolve().parent.parent


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name, or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rfind(")") + 2:].split()


def _live(pid: int) -> bool:
    fields = _proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _live_group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _proc_stat(int(entry.name))
            if fields and fields[0] not in ("Z", "X") and fields[2] == str(pgid):
                members.append(int(entry.name))
    return members


def processes_with_env(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of live processes whose environment holds ``marker``."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if _live(int(entry.name)):
            found.append((int(entry.name), cmdline.strip()))
    return found


class LocalHost:
    """A worker slot on this machine."""

    def __init__(self, record: HostRecord, store: StateStore):
        self.record = record
        self._store = store

    def run_root(self, run_id: str) -> str:
        return str(self._store.run_dir(run_id))

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(data)
        tmp.chmod(mode)
        os.replace(tmp, target)

    def read_file(self, path: str, offset: int = 0) -> bytes | None:
        try:
            with open(path, "rb") as handle:
                handle.seek(offset)
                return handle.read()
        except FileNotFoundError:
            return None

    def file_size(self, path: str) -> int:
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            return 0

    def start_detached(self, script: str) -> None:
        # setsid makes the wrapper a session and group leader, so stop can signal the
        # whole group; the trailing & lets `sh -c` exit at once, so init reaps the job.
        command = f"setsid sh {shlex.quote(script)} </dev/null >/dev/null 2>&1 &"
        subprocess.run(["sh", "-c", command], check=True, start_new_session=True)

    def signal(self, pid: int, signum: int, group: bool = False) -> None:
        try:
            if group:
                os.killpg(pid, signum)
            else:
                os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def alive(self, pid: int, group: bool = False) -> bool:
        return bool(_live_group_members(pid)) if group else _live(pid)

    def job_status(self, pid_path: str, pgid_path: str, exit_path: str) -> JobFiles:
        def read_int(path: str) -> int | None:
            try:
                return int(Path(path).read_text().strip())
            except (FileNotFoundError, ValueError):
                return None

        exit_code, pid, pgid = read_int(exit_path), read_int(pid_path), read_int(pgid_path)
        return JobFiles(exit_code=exit_code, pid=pid, pgid=pgid,
                        pid_alive=pid is not None and _live(pid),
                        group_alive=pgid is not None and bool(_live_group_members(pgid)))

    def run_command(self, argv: list[str], timeout: float = 60) -> CommandResult:
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            return CommandResult(127, "", f"{argv[0]}: not found")
        except subprocess.TimeoutExpired:
            return CommandResult(124, "", f"{shlex.join(argv)} did not finish within {timeout:g} s")
        return CommandResult(result.returncode, result.stdout, result.stderr)

    def port_in_use(self, port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.record.address, port))
            except OSError:
                return True
        return False


class LocalBackend(Backend):
    """Workers as processes on this machine, on free loopback ports."""

    name = "local"

    def __init__(self, store: StateStore | None = None):
        self._store = store

    def up(self, settings: Settings, existing: ClusterState | None) -> ClusterState:
        if existing is not None:
            return existing
        ports = free_ports(settings.workers, within=port_range(settings.local_ports))
        hosts = [HostRecord(name=f"worker-{i}", address=LOOPBACK, tf_port=port)
                 for i, port in enumerate(ports)]
        return ClusterState(name=settings.cluster, backend=self.name, hosts=hosts)

    def hosts(self, cluster: ClusterState) -> list[LocalHost]:
        return [LocalHost(record, self._store) for record in cluster.hosts]

    def leftover_processes(self, cluster: ClusterState) -> list[str]:
        return [f"pid {pid}: {cmd[:120]}"
                for pid, cmd in processes_with_env(f"TFCLUSTER_CLUSTER_ID={cluster.cluster_id}")]

    def kill_leftovers(self, cluster: ClusterState) -> None:
        for pid, _ in processes_with_env(f"TFCLUSTER_CLUSTER_ID={cluster.cluster_id}"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def preflight(self, cluster: ClusterState, hosts: list[LocalHost], need_tensorflow: bool,
                  image: str = "") -> None:
        if image:
            from tfcluster.backends import docker

            docker.preflight(hosts, image, docker.required_modules(need_tensorflow), cluster.cluster_id)
        busy = [f"{host.record.name} ({host.record.endpoint})" for host in hosts
                if host.port_in_use(host.record.tf_port)]
        if busy:
            raise ClusterError(f"TensorFlow port already in use on {', '.join(busy)}; "
                               "free it, or pick new ports with `invoke down && invoke up`")

    def stage(self, cluster: ClusterState, hosts: list[LocalHost], run_id: str, payload: Payload) -> Staged:
        # Same machine: run the code in place, nothing to copy.
        if payload.script is None:
            argv = [payload.python, "-u", "-m", "trainer.task"]
        else:
            argv = [payload.python, "-u", str(payload.script.resolve())]
        # What a container must see at the same path (`train --image`): the code, the data.
        code = [str(PROJECT_ROOT)] + ([] if payload.script is None else [str(payload.script.resolve().parent)])
        # tfcluster/workerpath holds the sitecustomize that lets a stalled worker dump its stacks.
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT / "tfcluster" / "workerpath"),
                                                           str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
        if payload.data_dir is not None:
            env["TFCLUSTER_DATA_DIR"] = str(payload.data_dir.resolve())
            code.append(env["TFCLUSTER_DATA_DIR"])
        return Staged(argv=argv + list(payload.args), env=env, uploaded={h.record.name: False for h in hosts},
                      mounts=code)

    def before_retry(self, hosts: list[LocalHost], run_id: str) -> None:
        """All local workers share one run folder, so the chief's backup is already visible."""

    def collect(self, hosts: list[LocalHost], run_id: str, local_run_dir: Path, succeeded: bool) -> str | None:
        model = local_run_dir / "output" / "model"
        return str(model) if succeeded and model.exists() else None

    def teardown(self, cluster: ClusterState, keep: bool, delete_bucket: bool = False) -> None:
        """Nothing outside the state folder was created."""
