"""Who may start a cluster's workers: a launcher's lease, `down`'s hold, and a user's stop request.

    <state_dir>/runs/<cluster>/<run_id>/stop.json      who stopped the run (`stop`, `down`), read by its launcher
    <state_dir>/runs/<cluster>/<run_id>/launcher.lock  held (flock) by the run's launcher while it lives
    <state_dir>/locks/<cluster>.lock                   shared by every launcher of the cluster, exclusive for `down`
    <state_dir>/locks/<cluster>.command                held (flock) by the one `up` or `down` of the cluster, holding
                                                       who it is (Holder): the other says so in one line, or waits
    <state_dir>/locks/<cluster>.admit                  taken for an instant by a launcher: one launcher at a time
    clusters/<cluster>.json's `waiting`                 an `up` waiting for capacity: its pid, which `down` signals

Two commands at once from two shells, on one cluster:
- `up` + `up`, `down` + `down`, `up` while `down` runs: the second says who holds the cluster and exits;
- `down` while `up` runs: waits for it (an `up` waiting for capacity is asked to stop at once);
- `train`/`tune` + `train`/`tune`: the second says which launcher holds the cluster (its pid, since when);
- `train`/`tune` while `down` (or `up`) runs: refused, naming it; a launcher that was already staging
  sees `down`'s stop request before it starts anything (tfcluster/commands/train.py).
Clusters of different names share nothing here: they proceed side by side.

A flock is dropped by the kernel when its process dies, however it dies: a killed launcher holds nothing.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import signal
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from tfcluster.errors import ClusterError
from tfcluster.state import StateStore, write_json


@dataclass
class StopRequest:
    """A user's command that stopped a run, for its launcher to honour: written before any worker is
    signalled, so a launcher that sees its workers die finds it and does not retry."""

    # The command, as the launcher's last line names it: "`invoke stop`", "`invoke down`".
    by: str
    # When it was asked (epoch seconds), and the asking process and machine.
    at: float
    pid: int = 0
    host: str = ""

    def describe(self) -> str:
        where = f"pid {self.pid}" + ("" if self.host in ("", socket.gethostname()) else f" on {self.host}")
        return f"{self.by} ({where}, at {time.strftime('%H:%M:%S', time.localtime(self.at))})"


def request_stop(store: StateStore, run_id: str, by: str) -> StopRequest:
    """Record that ``by`` stops ``run_id``; the first request stands (a later `down` after `stop`)."""
    found = stop_request(store, run_id)
    if found is not None:
        return found
    request = StopRequest(by=by, at=time.time(), pid=os.getpid(), host=socket.gethostname())
    write_json(store.run_dir(run_id) / "stop.json", dataclasses.asdict(request))
    return request


def stop_request(store: StateStore, run_id: str) -> StopRequest | None:
    try:
        return StopRequest(**json.loads((store.run_dir(run_id) / "stop.json").read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def clear_stop_request(store: StateStore, run_id: str) -> None:
    (store.run_dir(run_id) / "stop.json").unlink(missing_ok=True)


def _open_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a+")


@dataclass
class Holder:
    """Who holds a cluster: written into the lock file its holder keeps locked."""

    # The command, as a user would type it: "`invoke up`", "`invoke down`", "`invoke train`".
    command: str
    pid: int
    host: str
    # When it took the cluster (epoch seconds).
    since: float

    def describe(self) -> str:
        where = f"pid {self.pid}" + ("" if self.host in ("", socket.gethostname()) else f" on {self.host}")
        return f"{self.command} ({where}, since {time.strftime('%H:%M:%S', time.localtime(self.since))})"

    @classmethod
    def me(cls, command: str) -> "Holder":
        return cls(command=command, pid=os.getpid(), host=socket.gethostname(), since=time.time())


def _write_holder(handle, holder: Holder) -> None:
    handle.seek(0)
    handle.truncate(0)
    json.dump(dataclasses.asdict(holder), handle)
    handle.flush()


def _held_by(path: Path) -> Holder | None:
    """The live holder recorded in the lock file ``path``, or None when nobody holds it. A holder that
    died dropped its flock (the kernel does, however it died) and is not reported."""
    try:
        handle = open(path)
    except FileNotFoundError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None  # Nobody holds it (closing the file drops our own shared lock).
        except BlockingIOError:
            pass
        try:
            return Holder(**json.loads(handle.read() or "{}"))
        except (ValueError, TypeError):
            return Holder(command="another command", pid=0, host="", since=time.time())  # Still writing it.


class CommandHold:
    """The hold of the one `up` or `down` of a cluster at a time (the file ``locks/<cluster>.command``):
    an exclusive flock, with the holder written inside for the others to name."""

    def __init__(self, store: StateStore, command: str):
        self.path = store.root / "locks" / f"{store.cluster_name}.command"
        self.command = command
        self._handle = None

    def try_acquire(self) -> Holder | None:
        """None once this process holds the cluster; else who holds it. A reader that looks for an
        instant (``_held_by``) is not a holder: tried again a few times."""
        handle = _open_lock(self.path)
        for _ in range(20):
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _held_by(self.path)
                if holder is None:
                    time.sleep(0.01)
                    continue
                handle.close()
                return holder
            _write_holder(handle, Holder.me(self.command))
            self._handle = handle
            return None
        handle.close()
        return Holder(command="another command", pid=0, host="", since=time.time())

    def release(self) -> None:
        if self._handle is not None:
            self._handle.truncate(0)
            self._handle.close()
            self._handle = None


def command_holder(store: StateStore) -> Holder | None:
    """The `up` or `down` that holds the cluster now, or None."""
    return _held_by(store.root / "locks" / f"{store.cluster_name}.command")


def cluster_holder(store: StateStore) -> Holder | None:
    """Who holds the cluster now: its `up` or `down`, else a live launcher of it, else None."""
    holder = command_holder(store)
    if holder is not None:
        return holder
    for _, info in live_launchers(store):
        return Holder(command=info.get("command", "`invoke train`"), pid=int(info.get("pid") or 0),
                      host=info.get("host", ""), since=float(info.get("started_at") or time.time()))
    return None


def refuse_while_held(store: StateStore) -> None:
    """The one line for a launcher started while `up` or `down` holds the cluster (nothing may start on
    what `down` removes), naming the holder; nothing when neither holds it."""
    lifecycle = command_holder(store)
    if lifecycle is not None and "down" in lifecycle.command:
        raise ClusterError(f"cluster '{store.cluster_name}' is being taken down by {lifecycle.describe()}; wait for it "
                           "to finish, then `invoke up`")
    if lifecycle is not None:
        raise ClusterError(f"cluster '{store.cluster_name}' is held by {lifecycle.describe()}; wait for it to finish, "
                           "then run this again")


class LauncherLease:
    """A launcher's hold on its cluster, from before it starts anything until it can start nothing more.

    Two flocks, which the kernel drops when the process dies however it dies: a shared one on the
    cluster's lock (`down` takes it exclusive, so it waits for every launcher and no launcher starts
    while it tears down), and an exclusive one on the run's ``launcher.lock`` holding its pid (so
    `stop` and `status` know whether a launcher is attached to the run)."""

    def __init__(self, store: StateStore, run_id: str, command: str = "`invoke train`"):
        """``command``: what the lease names to a second command (`invoke train`, `invoke tune`)."""
        self.store, self.run_id, self.command = store, run_id, command
        self._cluster = self._run = None

    def __enter__(self) -> "LauncherLease":
        name = self.store.cluster_name
        self._cluster = _open_lock(self.store.lock_file)
        try:
            fcntl.flock(self._cluster, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            self._cluster.close()
            holder = command_holder(self.store)
            by = holder.describe() if holder else "`invoke down`"
            raise ClusterError(f"cluster '{name}' is being taken down by {by}; wait for it to finish, then "
                               "`invoke up`") from None
        # One launcher at a time is let in: it looks for another and takes its own run's lock under
        # the admission lock, so two launchers started at once cannot both see none.
        admit = _open_lock(self.store.root / "locks" / f"{name}.admit")
        try:
            fcntl.flock(admit, fcntl.LOCK_EX)
            refuse_while_held(self.store)
            for run_id, info in live_launchers(self.store):
                if run_id != self.run_id:
                    other = Holder(info.get("command", "`invoke train`"), int(info.get("pid") or 0),
                                   info.get("host", ""), float(info.get("started_at") or 0))
                    raise ClusterError(f"a run is still active on cluster '{name}': {run_id}, held by "
                                       f"{other.describe()}; watch it with `invoke logs --follow` or end it with "
                                       "`invoke stop`")
            self._run = _open_lock(self.store.run_dir(self.run_id) / "launcher.lock")
            fcntl.flock(self._run, fcntl.LOCK_EX)  # Held for an instant at most by a reader.
            self._run.truncate(0)
            json.dump({"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time(),
                       "command": self.command}, self._run)
            self._run.flush()
        except BaseException:
            self.__exit__()
            raise
        finally:
            admit.close()
        return self

    def __exit__(self, *exc) -> None:
        for handle in (self._run, self._cluster):
            if handle is not None:
                handle.close()  # Closing the last descriptor drops the flock.
        self._cluster = self._run = None
        # A launcher refused before its run was recorded (a preflight, a stop request) leaves no run
        # folder behind: `runs` and `logs` would show a run that never was.
        run_dir = self.store.run_dir(self.run_id)
        if not (run_dir / "run.json").exists():
            shutil.rmtree(run_dir, ignore_errors=True)


def attached_launcher(store: StateStore, run_id: str) -> dict | None:
    """The run's live launcher ({pid, host, started_at}), or None when none holds the run."""
    path = store.run_dir(run_id) / "launcher.lock"
    if not path.exists():
        return None
    with open(path) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return json.loads(handle.read() or "{}") or {"pid": 0, "host": ""}
            except ValueError:
                return {"pid": 0, "host": ""}
        return None  # Nobody holds it (closing the file drops our own shared lock).


def live_launchers(store: StateStore) -> list[tuple[str, dict]]:
    """(run id, launcher) of every run of the cluster whose launcher lives."""
    if not store.runs_dir.is_dir():
        return []
    found = []
    for path in sorted(store.runs_dir.iterdir()):
        info = attached_launcher(store, path.name) if (path / "launcher.lock").exists() else None
        if info is not None:
            found.append((path.name, info))
    return found


class ClusterHold:
    """`down`'s exclusive hold on the cluster: acquired once no launcher of it lives, kept until the
    cluster is gone, so no launcher can start while it tears down."""

    def __init__(self, store: StateStore):
        self._handle = _open_lock(store.lock_file)

    def try_acquire(self) -> bool:
        try:
            fcntl.flock(self._handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        self._handle.close()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie has ended; its parent merely has not reaped it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def end_waiting_up(store: StateStore, waiting: dict, by: str, timeout: float = 600.0) -> bool:
    """An `up` that waits for capacity (ClusterState.waiting: tfcluster/backends/gcp/zones/capacity.py) is asked to
    stop (SIGTERM) and waited for: it removes what it made and exits between two tries, never inside one.
    True when there was one. One on another machine is an error naming it."""
    pid = int(waiting.get("pid") or 0)
    if not pid or pid == os.getpid() or not _alive(pid) and waiting.get("host") in ("", socket.gethostname()):
        return False
    if waiting.get("host") not in ("", socket.gethostname()):
        raise ClusterError(f"`invoke up` (pid {pid} on {waiting['host']}) is waiting for capacity for cluster "
                           f"'{store.cluster_name}'; end it there (Ctrl-C), then run {by} again")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            raise ClusterError(f"`invoke up` (pid {pid}) did not stop waiting for capacity within {timeout:.0f} s; "
                               f"end it (Ctrl-C or kill {pid}), then run {by} again")
        time.sleep(0.2)
    return True
