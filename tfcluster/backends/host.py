"""What the launcher sees of one worker's machine: ``WorkerHost`` (the written interface every backend's
hosts implement), what a short command on it did (``CommandResult``) and a worker wrapper's status files
(``JobFiles``). Its own module so that backends/base.py and backends/docker.py both import it, and
neither imports the other back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tfcluster.state import HostRecord


@dataclass(frozen=True)
class CommandResult:
    """What a short command on a host did. Only stdout is data: a login's shell start-up may write
    to stderr before any command runs (pyenv's rehash racing another login prints "pyenv: cannot
    rehash: ... isn't writable", https://github.com/pyenv/pyenv/issues/3482), so stderr only ever
    goes into a message."""

    # Its exit code: 127 when the program is not installed there, 124 when it did not finish in time.
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """Both streams, for a message."""
        return self.stdout + self.stderr

    @property
    def last_line(self) -> str:
        """The last line it printed on either stream (where a failing tool puts its reason), for a
        one-line error."""
        lines = [line.strip() for line in self.output.splitlines() if line.strip()]
        return lines[-1] if lines else "no output"


@dataclass
class JobFiles:
    """A worker wrapper's status files and liveness, as read from its host."""

    # Contents of the .exit, .pid and .pgid files (None: not written yet).
    exit_code: int | None
    pid: int | None
    pgid: int | None
    # Whether the program, and any member of the wrapper's process group, still run.
    pid_alive: bool
    group_alive: bool


class WorkerHost(Protocol):
    """One worker slot's machine, as the launcher needs it. Paths are on that machine."""

    record: HostRecord

    def run_root(self, run_id: str) -> str:
        """Folder (on the host) that holds this run's scripts, logs and status files."""

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Create or replace ``path``, making parent folders."""

    def read_file(self, path: str, offset: int = 0) -> bytes | None:
        """Bytes of ``path`` from ``offset``, or None when it does not exist."""

    def file_size(self, path: str) -> int:
        """Size of ``path`` in bytes; 0 when it does not exist."""

    def start_detached(self, script: str) -> None:
        """Run ``sh script`` in its own session so it outlives the launcher."""

    def signal(self, pid: int, signum: int, group: bool = False) -> None:
        """Send ``signum`` to a process (or its process group); a gone process is not an error."""

    def alive(self, pid: int, group: bool = False) -> bool:
        """Whether the process (or any live member of the group) still runs."""

    def port_in_use(self, port: int) -> bool:
        """Whether something already listens on ``port`` at this worker's address."""

    def job_status(self, pid_path: str, pgid_path: str, exit_path: str) -> JobFiles:
        """The status files of one worker attempt and whether its processes live."""

    def run_command(self, argv: list[str], timeout: float = 60) -> CommandResult:
        """What a short command on the host (e.g. docker) did."""
