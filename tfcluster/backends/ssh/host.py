"""SshHost: one worker slot on a remote host, the launcher's WorkerHost over SSH."""

from __future__ import annotations

import os
import shlex

from tfcluster.backends.base import CommandResult, JobFiles
from tfcluster.backends.ssh.connection import TRANSIENT, SshConnection
from tfcluster.errors import ClusterError
from tfcluster.state import HostRecord

# Shell snippets: POSIX sh only, no ps/pgrep (minimal images may lack procps). dash's kill
# wants `kill -s N -- -PGID`: `kill -9 -- -PGID` and `kill -s 9 -PGID` are errors there.
_LIVENESS = (
    # tfc_alive PID: the process exists and is not a zombie.
    # (2>/dev/null before <: dash opens redirections left to right.)
    'tfc_alive() { read -r l 2>/dev/null < /proc/$1/stat || return 1; s=${l##*) }; '
    'case $s in Z*|X*) return 1;; esac; return 0; }; '
    # tfc_group_alive PGID: some live process is in that process group.
    'tfc_group_alive() { g=$1; for f in /proc/[0-9]*/stat; do read -r l 2>/dev/null < "$f" || continue; '
    's=${l##*) }; set -- $s; [ "$3" = "$g" ] && [ "$1" != Z ] && return 0; done; return 1; }; ')


class SshHost:
    """A worker slot on a remote host (WorkerHost over SSH)."""

    def __init__(self, record: HostRecord, connection: SshConnection, python: str):
        self.record = record
        self.connection = connection
        self.python = python

    def run_root(self, run_id: str) -> str:
        # One folder per run and worker: hosts may share a filesystem.
        return f"{self.record.remote_root}/runs/{run_id}/{self.record.name}"

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        sftp = self.connection.sftp()
        # Unique per writer: hosts may share a filesystem and write the same path at once.
        tmp = f"{path}.tmp-{self.record.name}-{os.urandom(4).hex()}"
        try:
            try:
                handle = sftp.open(tmp, "wb")
            except FileNotFoundError:
                self.mkdirs(os.path.dirname(path))
                handle = sftp.open(tmp, "wb")
            with handle:
                handle.set_pipelined(True)  # Do not wait for an ack per 32 KiB packet.
                handle.write(data)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except TRANSIENT as error:
            self._sftp_error(error, f"writing {path}")

    def _sftp_error(self, error: BaseException, what: str):
        """An SFTP status (no such file, permission denied) is the host answering: say so.
        Anything else means the link is gone."""
        if type(error) in (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                           FileExistsError) or (type(error) is OSError and error.errno):
            raise ClusterError(f"{self.record.name}: {what} failed: {error}") from None
        self.connection._fail(error)

    def read_file(self, path: str, offset: int = 0) -> bytes | None:
        sftp = self.connection.sftp()
        try:
            with sftp.open(path, "rb") as handle:
                handle.seek(offset)
                return handle.read()
        except FileNotFoundError:
            return None
        except TRANSIENT as error:
            self._sftp_error(error, f"reading {path}")

    def file_size(self, path: str) -> int:
        try:
            return self.connection.sftp().stat(path).st_size or 0
        except FileNotFoundError:
            return 0
        except TRANSIENT as error:
            self.connection._fail(error)

    def mkdirs(self, path: str) -> None:
        code, out = self.connection.shell(shlex.join(["mkdir", "-p", path]))
        if code != 0:
            raise ClusterError(f"{self.record.name}: cannot create {path}: {out.strip()}")

    def start_detached(self, script: str) -> None:
        # No pty: the job survives the SSH session. setsid: its own session and group.
        command = f"setsid sh {shlex.quote(script)} </dev/null >/dev/null 2>&1 &"
        code, out = self.connection.shell(command)
        if code != 0:
            raise ClusterError(f"{self.record.name}: could not start {script}: {out.strip()}")

    def signal(self, pid: int, signum: int, group: bool = False) -> None:
        target = f"-{pid}" if group else str(pid)
        self.connection.shell(f"kill -s {int(signum)} -- {target} 2>/dev/null; true")

    def alive(self, pid: int, group: bool = False) -> bool:
        test = "tfc_group_alive" if group else "tfc_alive"
        code, _ = self.connection.shell(f"{_LIVENESS}{test} {int(pid)}")
        return code == 0

    def job_status(self, pid_path: str, pgid_path: str, exit_path: str) -> JobFiles:
        """The wrapper's status files and liveness, in one round trip."""
        q = shlex.quote
        script = (f"{_LIVENESS}e=; p=; g=; read -r e 2>/dev/null < {q(exit_path)}; "
                  f"read -r p 2>/dev/null < {q(pid_path)}; read -r g 2>/dev/null < {q(pgid_path)}; "
                  "pa=0; [ -n \"$p\" ] && tfc_alive \"$p\" && pa=1; "
                  "ga=0; [ -n \"$g\" ] && tfc_group_alive \"$g\" && ga=1; "
                  "printf '%s %s %s %s %s\\n' \"${e:--}\" \"${p:--}\" \"${g:--}\" $pa $ga")
        _, out = self.connection.shell(script)
        lines = out.strip().splitlines() or [""]
        fields = (lines[-1].split() + ["-"] * 5)[:5]
        exit_code, pid, pgid = (int(v) if v.lstrip("-").isdigit() else None for v in fields[:3])
        return JobFiles(exit_code=exit_code, pid=pid, pgid=pgid,
                        pid_alive=fields[3] == "1", group_alive=fields[4] == "1")

    def run_command(self, argv: list[str], timeout: float = 60) -> CommandResult:
        return CommandResult(*self.connection.run(shlex.join(argv) + " </dev/null", timeout=timeout))

    def port_in_use(self, port: int) -> bool:
        probe = ("import socket,sys\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                 f"try: s.bind(({self.record.address!r},{int(port)}))\nexcept OSError: sys.exit(3)\n")
        code, _, _ = self.connection.run(shlex.join([self.python, "-c", probe]))
        return code == 3
