"""Bring-your-own hosts over SSH (paramiko), also the transport of the gcp backend.

Safety rules:
- Host keys are pinned in the cluster state at `up`, taken from the user's known_hosts or,
  with an explicit --trust-new-hosts, from first contact (fingerprints printed). Every
  later connection accepts only the pinned key; there is no AutoAddPolicy anywhere.
- Every network operation has a deadline: connect, banner and auth timeouts, TCP
  keepalive, and a timeout on every channel, so a cut link raises HostUnreachable
  instead of blocking the launcher.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import select
import shlex
import socket
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import paramiko

from tfcluster.backends.base import JobFiles, Staged
from tfcluster.errors import ClusterError, ConfigError, HostErrors, HostUnreachable
from tfcluster.state import HostRecord

T = TypeVar("T")

CONNECT_TIMEOUT = 10.0
IO_TIMEOUT = 15.0
KEEPALIVE_SECONDS = 5
TRANSIENT = (socket.timeout, TimeoutError, ConnectionError, EOFError, OSError, paramiko.SSHException)


@dataclass(frozen=True)
class HostAddress:
    # Hostname or IP as the user gave it; also what other workers use to reach this one.
    address: str
    # sshd port.
    port: int = 22

    @property
    def known_hosts_name(self) -> str:
        """How OpenSSH's known_hosts names this host."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    def __str__(self) -> str:
        return self.address if self.port == 22 else f"{self.address}:{self.port}"


def parse_hosts(text: str) -> list[HostAddress]:
    """``"a,b:2222"`` -> HostAddress list; ConfigError names the bad entry."""
    hosts = []
    for item in [part.strip() for part in str(text or "").split(",") if part.strip()]:
        address, _, port_text = item.partition(":")
        if not address or any(ch.isspace() for ch in address):
            raise ConfigError(f"hosts entry {item!r} is not host or host:port")
        port = 22
        if port_text:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ConfigError(f"hosts entry {item!r} has a bad port; use host:PORT with PORT 1-65535")
            port = int(port_text)
        hosts.append(HostAddress(address, port))
    return hosts


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def key_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


def key_from_line(line: str) -> paramiko.PKey:
    key_type, b64 = line.split()[:2]
    return paramiko.PKey.from_type_string(key_type, base64.b64decode(b64))


def in_parallel(items: list[T], action: Callable[[T], object], label: Callable[[T], str],
                what: str) -> list[object]:
    """Run ``action`` on every item at once; one HostErrors naming every failed host."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(items))) as pool:
        futures = [pool.submit(action, item) for item in items]
    results, failures = [], {}
    for item, future in zip(items, futures):
        try:
            results.append(future.result())
        except HostErrors as error:
            failures.update(error.failures)
            results.append(None)
        except HostUnreachable as error:
            failures[label(item)] = f"unreachable ({error.detail})"
            results.append(None)
        except Exception as error:  # noqa: BLE001 - reported per host, never swallowed
            reason = str(error) or type(error).__name__
            prefix = f"{label(item)}: "
            failures[label(item)] = reason[len(prefix):] if reason.startswith(prefix) else reason
            results.append(None)
    if failures:
        raise HostErrors(what, failures)
    return results


def scan_host_key(host: HostAddress, timeout: float = CONNECT_TIMEOUT,
                  preferred: list[str] | None = None) -> paramiko.PKey:
    """The host key the server presents (the SSH handshake only; no authentication)."""
    try:
        sock = socket.create_connection((host.address, host.port), timeout=timeout)
    except OSError as error:
        raise HostUnreachable(str(host), f"cannot connect to port {host.port}: {error}") from None
    transport = paramiko.Transport(sock)
    try:
        if preferred:
            transport.get_security_options().key_types = preferred + [
                kind for kind in transport.get_security_options().key_types if kind not in preferred]
        transport.banner_timeout = timeout
        transport.start_client(timeout=timeout)
        return transport.get_remote_server_key()
    except TRANSIENT as error:
        raise HostUnreachable(str(host), f"SSH handshake failed: {error}") from None
    finally:
        transport.close()


def pin_host_key(host: HostAddress, known_hosts: Path, trust_new: bool,
                 announce: Callable[[str], None]) -> str:
    """The key line to pin for ``host``, checked against known_hosts. Never trusts silently."""
    known = paramiko.HostKeys()
    if known_hosts.exists():
        known.load(str(known_hosts))
    entry = known.lookup(host.known_hosts_name) or {}
    presented = scan_host_key(host, preferred=list(entry.keys()) or None)
    expected = entry.get(presented.get_name())
    if expected is not None:
        if expected.asbytes() != presented.asbytes():
            raise ClusterError(
                f"{host}: host key CHANGED ({presented.get_name()} {fingerprint(presented)} does not match "
                f"{known_hosts}); if the host was rebuilt, remove its old line with "
                f"`ssh-keygen -R {host.known_hosts_name}` and verify the new fingerprint")
        return key_line(presented)
    if not trust_new:
        raise ClusterError(
            f"{host} is not in {known_hosts} (it presents {presented.get_name()} {fingerprint(presented)}); "
            "verify that fingerprint, then add the host with ssh-keyscan or re-run with --trust-new-hosts")
    announce(f"{host}: trusting new host key {presented.get_name()} {fingerprint(presented)}")
    return key_line(presented)


class SshConnection:
    """One authenticated connection to one host, verified against its pinned key."""

    def __init__(self, name: str, host: HostAddress, user: str, key_file: str, pinned_key: str,
                 connect_timeout: float = CONNECT_TIMEOUT, io_timeout: float = IO_TIMEOUT):
        self.name = name
        self.host = host
        self.user = user
        self.key_file = key_file
        self.pinned_key = pinned_key
        self.connect_timeout = connect_timeout
        self.io_timeout = io_timeout
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.RLock()
        # Set once the host stopped answering: later calls fail at once instead of each
        # waiting out its own timeout (a launcher stopping a run must not hang on it).
        self.broken: str | None = None
        # A long-lived /bin/sh for small commands (see shell()).
        self._shell: paramiko.Channel | None = None
        self._shell_lock = threading.Lock()

    def _connect(self) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        key = key_from_line(self.pinned_key)
        client.get_host_keys().add(self.host.known_hosts_name, key.get_name(), key)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        attempts, delay = 3, 0.5
        for attempt in range(1, attempts + 1):
            try:
                sock = socket.create_connection((self.host.address, self.host.port), timeout=self.connect_timeout)
                # Many small request/response round trips: without NODELAY, Nagle plus
                # delayed ACKs add ~40 ms to each (measured: 130 ms per command -> a few ms).
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                client.connect(self.host.address, port=self.host.port, username=self.user, sock=sock,
                               key_filename=self.key_file, timeout=self.connect_timeout,
                               banner_timeout=self.connect_timeout, auth_timeout=self.connect_timeout,
                               channel_timeout=self.connect_timeout, look_for_keys=False,
                               allow_agent=False)
                client.get_transport().set_keepalive(KEEPALIVE_SECONDS)
                return client
            except paramiko.BadHostKeyException as error:
                client.close()
                raise ClusterError(
                    f"{self.name}: host key CHANGED since `invoke up` pinned it "
                    f"(now {fingerprint(error.key)}); refusing to connect. If the host was rebuilt, "
                    "run `invoke down` and `invoke up` again") from None
            except paramiko.AuthenticationException as error:
                client.close()
                raise ClusterError(
                    f"{self.name}: authentication as {self.user!r} with {self.key_file} "
                    f"failed ({error}); check --ssh-user and --ssh-key") from None
            except TRANSIENT as error:
                client.close()
                if attempt == attempts:
                    raise HostUnreachable(self.name, str(error) or type(error).__name__) from None
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def client(self) -> paramiko.SSHClient:
        if self.broken:
            raise HostUnreachable(f"{self.name}", self.broken)
        with self._lock:
            transport = self._client.get_transport() if self._client else None
            if transport is None or not transport.is_active():
                self.close()
                self._client = self._connect()
            return self._client

    def sftp(self) -> paramiko.SFTPClient:
        with self._lock:
            if self._sftp is None or self._sftp.get_channel().closed:
                try:
                    self._sftp = self.client().open_sftp()
                except TRANSIENT as error:
                    self._fail(error)
                self._sftp.get_channel().settimeout(self.io_timeout)
            return self._sftp

    def _fail(self, error: BaseException):
        self.close()
        if isinstance(error, (socket.timeout, TimeoutError)) and not str(error):
            self.broken = f"no answer within {self.io_timeout:.0f}s"
        else:
            self.broken = str(error) or type(error).__name__
        raise HostUnreachable(self.name, self.broken) from None

    def run(self, command: str, timeout: float | None = None,
            sink: io.BufferedIOBase | None = None) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of a shell command, within ``timeout`` seconds.

        stdout goes to ``sink`` when given (for streams such as tar). Never blocks past
        the deadline: a cut link raises HostUnreachable.
        """
        deadline = time.monotonic() + (timeout or self.io_timeout)
        out, err = io.BytesIO(), io.BytesIO()
        try:
            channel = self.client().get_transport().open_session(timeout=self.connect_timeout)
            channel.settimeout(self.io_timeout)
            channel.exec_command(command)
            while True:
                if channel.recv_ready():
                    (sink or out).write(channel.recv(1 << 16))
                elif channel.recv_stderr_ready():
                    err.write(channel.recv_stderr(1 << 16))
                elif channel.exit_status_ready():
                    break
                elif time.monotonic() > deadline:
                    raise socket.timeout(f"no answer to a command within {timeout or self.io_timeout:.0f}s")
                else:
                    # Wakes on data (the pipe) or on the exit status (status_event).
                    readable, _, _ = select.select([channel], [], [], 0.01)
                    if not readable:
                        channel.status_event.wait(0.05)
            code = channel.recv_exit_status()
            channel.close()
        except TRANSIENT as error:
            self._fail(error)
        return code, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")

    def shell(self, command: str, timeout: float | None = None) -> tuple[int, str]:
        """(exit code, stdout+stderr) of a short command, run in one long-lived /bin/sh.

        Each exec channel makes sshd start the login shell, which sources the user's rc
        files (measured here: 120 ms for a pyenv init); status polling runs several small
        commands per second per host, so they share one shell. Commands must not read
        stdin; long or binary-output commands use run().
        """
        marker = f"__tfcluster_{os.urandom(6).hex()}__"
        deadline = time.monotonic() + (timeout or self.io_timeout)
        with self._shell_lock:
            try:
                if self._shell is None or self._shell.closed or self._shell.exit_status_ready():
                    self._shell = self.client().get_transport().open_session(timeout=self.connect_timeout)
                    self._shell.settimeout(0.2)
                    self._shell.exec_command("exec /bin/sh")
                self._shell.sendall(f"{{ {command}\n}} </dev/null 2>&1; printf '\\n{marker} %d\\n' $?\n".encode())
                buffer = b""
                end = f"\n{marker} ".encode()
                while True:
                    at = buffer.find(end)
                    if at >= 0 and buffer.find(b"\n", at + len(end)) >= 0:
                        tail = buffer[at + len(end):].split(b"\n", 1)[0]
                        return int(tail), buffer[:at].decode(errors="replace")
                    if time.monotonic() > deadline:
                        raise socket.timeout(f"no answer within {timeout or self.io_timeout:.0f}s")
                    try:
                        chunk = self._shell.recv(1 << 16)
                    except socket.timeout:
                        continue
                    if not chunk:
                        raise EOFError("the remote shell exited")
                    buffer += chunk
            except TRANSIENT as error:
                self._shell = None
                self._fail(error)

    def close(self) -> None:
        with self._lock:
            if self._shell is not None:
                try:
                    self._shell.close()
                except Exception:  # noqa: BLE001 - closing a dead channel
                    pass
                self._shell = None
            for closable in (self._sftp, self._client):
                try:
                    if closable is not None:
                        closable.close()
                except Exception:  # noqa: BLE001 - closing a dead connection
                    pass
            self._sftp = self._client = None


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

    def port_in_use(self, port: int) -> bool:
        probe = ("import socket,sys\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                 f"try: s.bind(({self.record.address!r},{int(port)}))\nexcept OSError: sys.exit(3)\n")
        code, _, _ = self.connection.run(shlex.join([self.python, "-c", probe]))
        return code == 3


def deterministic_tar(root: Path, members: list[Path], arcroot: str) -> bytes:
    """A gzip tar whose bytes depend only on the files' paths, contents and exec bits."""
    buffer = io.BytesIO()
    import gzip

    # Level 1: shipping is bound by CPU here, and TFRecords of pixels barely compress anyway.
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=1) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(members):
                relative = path.relative_to(root).as_posix()
                info = tarfile.TarInfo(f"{arcroot}/{relative}" if arcroot else relative)
                data = path.read_bytes()
                info.size = len(data)
                info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
                info.mtime = 0
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


IGNORE_DEFAULTS = ("__pycache__", "*.pyc", ".git", ".venv", "venv", ".tfcluster", "*.egg-info",
                   ".pytest_cache", ".ipynb_checkpoints")
IGNORE_FILE = ".tfclusterignore"


def collect_files(root: Path) -> list[Path]:
    """Files under ``root``, minus the default ignores and ``root/.tfclusterignore`` patterns."""
    import fnmatch

    patterns = list(IGNORE_DEFAULTS)
    ignore_file = root / IGNORE_FILE
    if ignore_file.exists():
        patterns += [line.strip() for line in ignore_file.read_text().splitlines()
                     if line.strip() and not line.startswith("#")]

    def ignored(relative: str) -> bool:
        parts = relative.split("/")
        return any(fnmatch.fnmatch(part, pattern) for part in parts for pattern in patterns) or any(
            fnmatch.fnmatch(relative, pattern) for pattern in patterns)

    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        dirnames[:] = [d for d in dirnames if not ignored(f"{rel_dir}/{d}".lstrip("./"))]
        for name in filenames:
            relative = f"{rel_dir}/{name}".lstrip("./") if rel_dir != "." else name
            if not ignored(relative):
                files.append(Path(dirpath) / name)
    return files


class Bundle:
    """Files to ship, named by a hash of their paths, contents and exec bits.

    The hash is computed from the files directly, so an unchanged re-dispatch costs a
    read of the files and no archive; the tar is built once, only if a host needs it.
    """

    def __init__(self, kind: str, root: Path, files: list[Path]):
        self.kind = kind
        self.root = root
        self.files = sorted(files)
        digest = hashlib.sha256()
        for path in self.files:
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(b"x" if os.access(path, os.X_OK) else b"-")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        self.digest = digest.hexdigest()[:20]
        self._payload: bytes | None = None
        self._lock = threading.Lock()

    @property
    def payload(self) -> bytes:
        with self._lock:
            if self._payload is None:
                self._payload = deterministic_tar(self.root, self.files, "")
            return self._payload


def make_bundle(kind: str, root: Path, files: list[Path] | None = None) -> Bundle:
    return Bundle(kind, root, files if files is not None else collect_files(root))


def upload_bundle(host: SshHost, bundle: Bundle) -> tuple[str, bool]:
    """Extract ``bundle`` to <remote_root>/<kind>/<digest> unless it is there already.

    Returns (remote folder, uploaded?). Safe on shared filesystems: each worker extracts
    into its own temp folder and renames it into place; a loser of the race removes its copy.
    """
    target = f"{host.record.remote_root}/{bundle.kind}/{bundle.digest}"
    code, _ = host.connection.shell(shlex.join(["test", "-f", f"{target}/.complete"]))
    if code == 0:
        return target, False
    tmp = f"{target}.tmp-{host.record.name}-{os.getpid()}"
    host.write_file(f"{tmp}.tar.gz", bundle.payload, 0o600)
    q = shlex.quote
    command = (f"rm -rf {q(tmp)} && mkdir -p {q(tmp)} && tar -xzf {q(tmp + '.tar.gz')} -C {q(tmp)} && "
               f"touch {q(tmp + '/.complete')} && rm -f {q(tmp + '.tar.gz')} && "
               f"{{ mv -T {q(tmp)} {q(target)} 2>/dev/null || rm -rf {q(tmp)}; }}")
    code, out = host.connection.shell(command, timeout=120)
    if code != 0:
        raise ClusterError(f"{host.record.name}: unpacking the {bundle.kind} bundle failed: {out.strip()}")
    return target, True


LISTENER = """
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(64)
s.settimeout(1)
end = time.time() + float(sys.argv[3])
while time.time() < end:
    try:
        s.accept()[0].close()
    except OSError:
        pass
"""

CONNECTOR = """
import socket, sys
bad = []
for endpoint in sys.argv[1:]:
    address, port = endpoint.rsplit(":", 1)
    try:
        socket.create_connection((address, int(port)), timeout=3).close()
    except OSError as error:
        bad.append(f"{endpoint} ({error})")
print("; ".join(bad))
sys.exit(1 if bad else 0)
"""


def check_tf_port_mesh(hosts: list[SshHost]) -> None:
    """Every host can open a TCP connection to every other host's TensorFlow port."""
    if len(hosts) < 2:
        return

    def listen(host: SshHost) -> int:
        command = (f"setsid {shlex.join([host.python, '-c', LISTENER, host.record.address, str(host.record.tf_port), '30'])}"
                   " </dev/null >/dev/null 2>&1 & echo $!")
        code, out = host.connection.shell(command)
        if code != 0 or not out.strip().isdigit():
            raise ClusterError(f"could not open a test listener on port {host.record.tf_port}: {out.strip()}")
        return int(out.strip())

    listeners = in_parallel(hosts, listen, lambda h: h.record.name, "starting the TF-port test listeners")
    try:
        # Wait for every listener to be bound before anyone connects.
        deadline = time.monotonic() + 15
        for host in hosts:
            while not host.port_in_use(host.record.tf_port):
                if time.monotonic() > deadline:
                    raise ClusterError(f"{host.record.name}: test listener did not start")
                time.sleep(0.1)

        def connect(host: SshHost) -> None:
            others = [h.record.endpoint for h in hosts if h is not host]
            code, out, _ = host.connection.run(shlex.join([host.python, "-c", CONNECTOR, *others]), timeout=60)
            if code != 0:
                raise ClusterError(f"cannot reach {out.strip()}; open TCP port {host.record.tf_port} "
                                   "between the hosts (firewall or security group)")

        in_parallel(hosts, connect, lambda h: f"{h.record.name} ({h.record.address})",
                    "checking that the hosts reach each other's TensorFlow port")
    finally:
        for host, pid in zip(hosts, listeners):
            try:
                host.signal(pid, 9)
            except HostUnreachable:
                pass


class SshBackend:
    """Workers on the user's own hosts: one worker per host entry, reached over SSH."""

    name = "ssh"

    def __init__(self, store, announce: Callable[[str], None] = print):
        self._store = store
        self._announce = announce
        self._connections: dict[str, SshConnection] = {}

    # ------------------------------------------------------------ up

    def up(self, settings, existing):
        from tfcluster.state import ClusterState

        if existing is not None:
            return existing
        addresses = parse_hosts(settings.hosts)
        if not addresses:
            raise ConfigError("the ssh backend needs hosts: --hosts HOST[:PORT],... "
                              "(or tfcluster.hosts in invoke.yaml)")
        if settings.workers > len(addresses):
            raise ConfigError(f"workers must be between 1 and {len(addresses)}, the number of hosts given "
                              f"(got {settings.workers}); add hosts or lower --workers")
        addresses = addresses[:settings.workers]
        key_file = Path(settings.ssh_key).expanduser()
        if not key_file.is_file():
            raise ConfigError(f"ssh_key {settings.ssh_key} does not exist; pass --ssh-key PATH to the "
                              "private key that logs in to the hosts")
        known_hosts = Path(settings.known_hosts).expanduser()
        keys = in_parallel(addresses, lambda h: pin_host_key(h, known_hosts, settings.trust_new_hosts,
                                                             self._announce),
                           str, "verifying host keys")
        python = settings.python or "python3"
        records = []
        # Several workers may share one address: each gets its own TF port.
        seen: dict[str, int] = {}
        for index, (address, key) in enumerate(zip(addresses, keys)):
            offset = seen.get(address.address, 0)
            seen[address.address] = offset + 1
            records.append(HostRecord(name=f"worker-{index}", address=address.address,
                                      tf_port=settings.tf_port + offset, ssh_port=address.port, host_key=key))
        cluster = ClusterState(name=settings.cluster, backend=self.name, hosts=records,
                               ssh_user=settings.ssh_user, ssh_key=str(key_file), python=python)
        self._resolve_roots(cluster, settings.remote_dir)
        self.preflight(cluster, self.hosts(cluster), need_tensorflow=True)
        if settings.install_watchdog:
            self.install_watchdog(cluster, settings.idle_minutes, settings.idle_action)
            self._announce(f"safety: idle watchdog halts each host after {settings.idle_minutes} idle minutes "
                           "(`invoke idle` changes it); own hosts have no hypervisor deadline; "
                           "`invoke down` stops everything")
        else:
            self._announce("safety: no idle watchdog on these hosts (add one with `invoke up --idle-minutes N`); "
                           "`invoke down` stops everything")
        return cluster

    def _resolve_roots(self, cluster, remote_dir: str) -> None:
        """Log in to every host and fix the absolute folder tfcluster owns there."""

        def resolve_root(record: HostRecord) -> str:
            connection = self._connection(cluster, record)
            code, out, err = connection.run("printf %s \"$HOME\"")
            home = out.strip()
            if code != 0 or not home.startswith("/"):
                raise ClusterError(f"cannot find the login's home folder: {err.strip()}")
            base = remote_dir if remote_dir.startswith("/") else f"{home}/{remote_dir}"
            return f"{base.rstrip('/')}/{cluster.name}"

        roots = in_parallel(cluster.hosts, resolve_root, lambda r: f"{r.name} ({r.address})", "logging in")
        for record, root in zip(cluster.hosts, roots):
            record.remote_root = root

    # ------------------------------------------------------------ hosts

    def _connection(self, cluster, record: HostRecord) -> SshConnection:
        key = f"{record.name}@{record.address}:{record.ssh_port}"
        if key not in self._connections:
            ssh_address = record.ssh_address or record.address
            self._connections[key] = SshConnection(
                f"{record.name} ({ssh_address})", HostAddress(ssh_address, record.ssh_port),
                cluster.ssh_user, cluster.ssh_key, record.host_key)
        return self._connections[key]

    def hosts(self, cluster) -> list[SshHost]:
        return [SshHost(record, self._connection(cluster, record), cluster.python) for record in cluster.hosts]

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()

    # ------------------------------------------------------------ preflight

    def preflight(self, cluster, hosts: list[SshHost], need_tensorflow: bool) -> None:
        modules = "tensorflow, tf_keras" if need_tensorflow else "tensorflow"

        def check(host: SshHost) -> None:
            code, _, err = host.connection.run(
                shlex.join([host.python, "-c", f"import {modules}"]), timeout=120)
            if code != 0:
                last = (err.strip().splitlines() or ["not found"])[-1]
                raise ClusterError(f"`{host.python} -c 'import {modules}'` failed ({last}); install them "
                                   "there (pip install tensorflow tf_keras) or set --python to an "
                                   "interpreter that has them")
            if host.port_in_use(host.record.tf_port):
                raise ClusterError(f"TensorFlow port {host.record.tf_port} is already in use; free it "
                                   "or choose another with --tf-port")

        in_parallel(hosts, check, lambda h: f"{h.record.name} ({h.record.address})", "preflight")
        check_tf_port_mesh(hosts)

    # ------------------------------------------------------------ staging

    def stage(self, cluster, hosts: list[SshHost], run_id: str, payload) -> Staged:
        from tfcluster.backends.local import PROJECT_ROOT

        if payload.script is None:
            code = make_bundle("code", PROJECT_ROOT, collect_files(PROJECT_ROOT / "trainer"))
            # collect_files gives paths under trainer/; keep them relative to the project root.
            argv = [payload.python, "-u", "-m", "trainer.task"]
        elif payload.project is not None:
            code = make_bundle("code", payload.project)
            argv = [payload.python, "-u", "{run_root}/code/" + payload.script.relative_to(payload.project).as_posix()]
        else:
            code = make_bundle("code", payload.script.parent, [payload.script])
            argv = [payload.python, "-u", "{run_root}/code/" + payload.script.name]
        data = make_bundle("data", payload.data_dir) if payload.data_dir is not None else None

        def stage_one(host: SshHost) -> bool:
            code_dir, code_new = upload_bundle(host, code)
            links = [f"ln -sfn {shlex.quote(code_dir)} {shlex.quote(host.run_root(run_id) + '/code')}"]
            data_new = False
            if data is not None:
                data_dir, data_new = upload_bundle(host, data)
                links.append(f"ln -sfn {shlex.quote(data_dir)} {shlex.quote(host.run_root(run_id) + '/data')}")
            links.insert(0, shlex.join(["mkdir", "-p", host.run_root(run_id) + "/output"]))
            status, out = host.connection.shell(" && ".join(links))
            if status != 0:
                raise ClusterError(f"linking code and data into the run folder failed: {out.strip()}")
            return code_new or data_new

        uploaded = in_parallel(hosts, stage_one, lambda h: f"{h.record.name} ({h.record.address})",
                               "uploading code and data")
        env = {"PYTHONPATH": "{run_root}/code"}
        if data is not None:
            env["TFCLUSTER_DATA_DIR"] = "{run_root}/data"
        return Staged(argv=argv + list(payload.args), env=env,
                      uploaded={h.record.name: bool(u) for h, u in zip(hosts, uploaded)})

    # ------------------------------------------------------------ retries and results

    def before_retry(self, hosts: list[SshHost], run_id: str) -> None:
        """tf_keras restores every worker from <backup>/chief, which only the chief's host has.

        Each task keeps its host across attempts, so copying the chief's backup to the
        other hosts' run folders before a restart lets every worker resume the same epoch.
        """
        chief, others = hosts[0], hosts[1:]
        relative = "output/checkpoints/chief"
        sink = io.BytesIO()
        code, _, _ = chief.connection.run(
            f"cd {shlex.quote(chief.run_root(run_id))} && test -d {relative} && tar -czf - {relative}",
            timeout=300, sink=sink)
        if code != 0 or not others:
            return  # No checkpoint yet: every worker starts from epoch 1 together.
        archive = sink.getvalue()

        def copy(host: SshHost) -> None:
            root = host.run_root(run_id)
            host.write_file(f"{root}/checkpoint.tar.gz", archive, 0o600)
            status, _, err = host.connection.run(
                f"cd {shlex.quote(root)} && rm -rf {relative} && tar -xzf checkpoint.tar.gz && rm -f checkpoint.tar.gz")
            if status != 0:
                raise ClusterError(f"copying the chief's checkpoint failed: {err.strip()}")

        in_parallel(others, copy, lambda h: f"{h.record.name} ({h.record.address})",
                    "copying the chief's checkpoint")

    def collect(self, hosts: list[SshHost], run_id: str, local_run_dir: Path, succeeded: bool) -> str | None:
        local_run_dir.mkdir(parents=True, exist_ok=True)

        def fetch_log(host: SshHost) -> None:
            data = host.read_file(f"{host.run_root(run_id)}/{host.record.name}.log")
            if data is not None:
                (local_run_dir / f"{host.record.name}.log").write_bytes(data)

        try:
            in_parallel(hosts, fetch_log, lambda h: h.record.name, "fetching logs")
        except HostErrors as error:
            # Best effort: a lost host must not hide the run's own outcome.
            self._announce(f"some logs stay on their hosts: {error}")
        if not succeeded:
            return None
        chief = hosts[0]
        sink = io.BytesIO()
        code, _, err = chief.connection.run(
            f"cd {shlex.quote(chief.run_root(run_id))} && tar -czf - --exclude=output/checkpoints output",
            timeout=600, sink=sink)
        if code != 0:
            raise ClusterError(f"{chief.record.name}: fetching the model failed: {err.strip()}")
        sink.seek(0)
        with tarfile.open(fileobj=sink, mode="r:gz") as tar:
            tar.extractall(local_run_dir, filter="data")
        return str(local_run_dir / "output" / "model")

    # ------------------------------------------------------------ idle watchdog

    def _watchdog_dir(self, host: SshHost) -> str:
        # One folder per host: hosts may share a filesystem.
        return f"{host.record.remote_root}/watchdog/{host.record.name}"

    def install_watchdog(self, cluster, idle_minutes: int, action: str) -> None:
        """Ship startup/watchdog.py to every host and keep it running under a restart loop.

        Own hosts have no hypervisor deadline and may lack systemd, so a small shell loop
        restarts the watchdog if it ever exits. Its action on these hosts is `shutdown -h`.
        """
        from tfcluster.backends.local import PROJECT_ROOT

        if action != "stop":
            raise ConfigError("idle_action delete needs the gcp backend (it deletes the VM through the "
                              "Compute API); on your own hosts use stop")
        source = (PROJECT_ROOT / "startup" / "watchdog.py").read_bytes()

        def install(host: SshHost) -> None:
            folder = self._watchdog_dir(host)
            host.write_file(f"{folder}/watchdog.py", source, 0o755)
            self._write_idle_config(host, idle_minutes, action)
            q = shlex.quote
            loop = (f"export TFCLUSTER_WATCHDOG={q(cluster.cluster_id)}; while :; do "
                    f"{q(host.python)} {q(folder + '/watchdog.py')} --config {q(folder + '/config.json')} "
                    f"--state-dir {q(folder + '/state')} --poll-seconds 30; sleep 5; done")
            code, out = host.connection.shell(
                f"if [ -f {q(folder + '/supervisor.pid')} ] && kill -0 $(cat {q(folder + '/supervisor.pid')}) "
                f"2>/dev/null; then exit 0; fi; mkdir -p {q(folder + '/state')}; "
                f"setsid sh -c {q(loop)} </dev/null >>{q(folder + '/watchdog.log')} 2>&1 & "
                f"echo $! > {q(folder + '/supervisor.pid')}")
            if code != 0:
                raise ClusterError(f"could not start the idle watchdog: {out.strip()}")

        in_parallel(self.hosts(cluster), install, lambda h: f"{h.record.name} ({h.record.address})",
                    "installing the idle watchdog")

    def _write_idle_config(self, host: SshHost, idle_minutes: int, action: str) -> None:
        config = json.dumps({"idle_minutes": idle_minutes, "action": action, "probes": "jobs_and_ssh"})
        host.write_file(f"{self._watchdog_dir(host)}/config.json", config.encode(), 0o644)

    def set_idle(self, cluster, idle_minutes: int, action: str) -> None:
        """Change the watchdog's settings on every host; it reads them on its next poll."""
        def update(host: SshHost) -> None:
            if host.file_size(f"{self._watchdog_dir(host)}/watchdog.py") == 0:
                raise ClusterError("no idle watchdog here; install it with `invoke down` and "
                                   "`invoke up --idle-minutes N`")
            self._write_idle_config(host, idle_minutes, action)

        in_parallel(self.hosts(cluster), update, lambda h: f"{h.record.name} ({h.record.address})",
                    "changing the idle watchdog")

    def watchdog_status(self, cluster) -> dict[str, dict | None]:
        """Per worker name: the watchdog's last status (None where none is installed)."""
        def read(host: SshHost) -> dict | None:
            raw = host.read_file(f"{self._watchdog_dir(host)}/state/status.json")
            return json.loads(raw) if raw else None

        hosts = self.hosts(cluster)
        return dict(zip([h.record.name for h in hosts],
                        in_parallel(hosts, read, lambda h: h.record.name, "reading watchdog status")))

    def hypervisor_deadlines(self, cluster) -> dict[str, float | None]:
        """Own hosts have no hypervisor deadline."""
        return {record.name: None for record in cluster.hosts}

    def refresh(self, cluster, settings) -> None:
        """`up` on an existing cluster: restore the configured idle settings (undoing `idle --off`)."""
        try:
            statuses = self.watchdog_status(cluster)
        except HostErrors:
            return
        if any(status is not None for status in statuses.values()):
            self.set_idle(cluster, settings.idle_minutes, settings.idle_action)

    def stop_watchdog(self, cluster) -> None:
        def stop(host: SshHost) -> None:
            pid_file = shlex.quote(f"{self._watchdog_dir(host)}/supervisor.pid")
            host.connection.shell(f"[ -f {pid_file} ] && kill -s 9 -- -$(cat {pid_file}) 2>/dev/null; "
                                  f"rm -f {pid_file}; true")

        in_parallel(self.hosts(cluster), stop, lambda h: f"{h.record.name} ({h.record.address})",
                    "stopping the idle watchdog")

    # ------------------------------------------------------------ down

    def _cluster_pids(self, host: SshHost, cluster) -> list[str]:
        marker = f"TFCLUSTER_CLUSTER_ID={cluster.cluster_id}"
        code, out, _ = host.connection.run(
            f"grep -l -a -x -z {shlex.quote(marker)} /proc/[0-9]*/environ 2>/dev/null; true")
        pids = [line.split("/")[2] for line in out.split() if line.startswith("/proc/")]
        return [pid for pid in pids if pid.isdigit()]

    def leftover_processes(self, cluster) -> list[str]:
        found = in_parallel(self.hosts(cluster), lambda h: [f"{h.record.name}: pid {p}" for p in self._cluster_pids(h, cluster)],
                            lambda h: h.record.name, "checking for leftover processes")
        return [item for items in found for item in items]

    def kill_leftovers(self, cluster) -> None:
        def kill(host: SshHost) -> None:
            pids = self._cluster_pids(host, cluster)
            if pids:
                host.connection.run(shlex.join(["kill", "-9", *pids]) + " 2>/dev/null; true")

        in_parallel(self.hosts(cluster), kill, lambda h: h.record.name, "killing leftover processes")

    def teardown(self, cluster, keep: bool) -> None:
        self.stop_watchdog(cluster)
        if keep:
            return

        def clean(host: SshHost) -> None:
            root = host.record.remote_root
            # Only ever the folder `up` created for this cluster: absolute, ends with its name.
            if not root.startswith("/") or not root.rstrip("/").endswith(f"/{cluster.name}") or root.count("/") < 3:
                raise ClusterError(f"refusing to delete suspicious folder {root!r}")
            host.connection.run(shlex.join(["rm", "-rf", "--", root]), timeout=120)

        in_parallel(self.hosts(cluster), clean, lambda h: f"{h.record.name} ({h.record.address})",
                    "removing run folders")
