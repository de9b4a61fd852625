"""SSH connections with pinned host keys and a deadline on every network operation.

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
import logging
import os
import select
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import paramiko

from tfcluster.errors import ClusterError, ConfigError, HostUnreachable

# paramiko's transport thread logs tracebacks (a banner timeout, a reset link) through the
# "paramiko" logger, which Python's last-resort handler would print on the terminal. Every
# failure already reaches the user as one HostUnreachable line, so its records go nowhere.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

CONNECT_TIMEOUT = 10.0
IO_TIMEOUT = 15.0
KEEPALIVE_SECONDS = 5
# The control shell (see SshConnection.shell) exits on its own after this long without a
# command, so it cannot outlive a client that vanished behind a cut link: sshd on most hosts
# never checks that its client is alive (ClientAliveInterval defaults to 0).
SHELL_IDLE_SECONDS = 60
# The client opens a fresh shell past this much idleness rather than race the shell's exit.
SHELL_REUSE_SECONDS = SHELL_IDLE_SECONDS - 20
# Runs as the control shell. sshd starts it as a session and group leader; a watcher in the
# same group hangs the whole group up once the stamp file, which every command refreshes, is
# older than the idle limit. When the client closes the channel, the inner shell reads EOF and
# the group ends at once (no watcher left behind). POSIX sh; `date -r` is in GNU and busybox.
CONTROL_SHELL = (
    'stamp=$(mktemp "${TMPDIR:-/tmp}/tfcluster-shell.XXXXXX") || exit 1; export TFC_STAMP=$stamp; main=$$; '
    '( while sleep 5; do age=$(( $(date +%s) - $(date -r "$stamp" +%s 2>/dev/null || echo 0) )); '
    f'if [ "$age" -gt {SHELL_IDLE_SECONDS} ]; then rm -f "$stamp"; kill -s HUP -- -$main; exit; fi; done '
    ') </dev/null >/dev/null 2>&1 & '
    '/bin/sh; rm -f "$stamp"; kill $! 2>/dev/null; kill -s KILL -- -$main 2>/dev/null')
TRANSIENT = (socket.timeout, TimeoutError, ConnectionError, EOFError, OSError, paramiko.SSHException)


class HostKeyChanged(ClusterError):
    """The host presents another key than the one `up` pinned: nothing is sent to it, no login tried.
    A rebuilt host; or someone in between. Either way only the user can tell, so the cluster can be
    forgotten (`down --force`) but never cleaned there by us."""

    def __init__(self, name: str, presented: str):
        self.host, self.presented = name, presented
        self.detail = f"host key CHANGED since `invoke up` pinned it (now {presented}); not connected"
        super().__init__(f"{name}: host key CHANGED since `invoke up` pinned it (now {presented}); refusing to "
                         "connect. If the host was rebuilt, `invoke down --force` forgets the cluster without "
                         "connecting to it (naming what may be left there), then `invoke up` pins the new key")


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
        # The key the host presented instead of the pinned one, once seen (the connection is then broken).
        self.key_changed: str | None = None
        # A long-lived /bin/sh for small commands (see shell()).
        self._shell: paramiko.Channel | None = None
        self._shell_used_at = 0.0
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
                raise HostKeyChanged(self.name, fingerprint(error.key)) from None
            except paramiko.AuthenticationException as error:
                client.close()
                raise ClusterError(
                    f"{self.name}: authentication as {self.user!r} with {self.key_file} "
                    f"failed ({error}); check --ssh-user and --ssh-key") from None
            except TRANSIENT as error:
                client.close()
                # A timeout already waited the full connect deadline: one is enough. Quick
                # failures (refused, reset: sshd restarting) are worth a retry with backoff.
                timed_out = isinstance(error, (socket.timeout, TimeoutError))
                if attempt == attempts or timed_out:
                    detail = (f"no answer within {self.connect_timeout:.0f}s" if timed_out and not str(error)
                              else str(error) or type(error).__name__)
                    raise HostUnreachable(self.name, detail) from None
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _raise_broken(self) -> None:
        """The first failure again: a changed key stays that refusal (its fix is `down --force`)."""
        if self.key_changed is not None:
            raise HostKeyChanged(self.name, self.key_changed)
        raise HostUnreachable(f"{self.name}", self.broken)

    def client(self) -> paramiko.SSHClient:
        if self.broken:
            self._raise_broken()
        with self._lock:
            if self.broken:  # Another thread found the host gone while this one waited.
                self._raise_broken()
            transport = self._client.get_transport() if self._client else None
            if transport is None or not transport.is_active():
                self.close()
                try:
                    self._client = self._connect()
                except (HostUnreachable, HostKeyChanged) as error:
                    # Later calls fail at once instead of each waiting out the connect deadline, and
                    # a host whose key changed is never offered a login by this process.
                    self.broken = error.detail
                    self.key_changed = error.presented if isinstance(error, HostKeyChanged) else None
                    raise
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
                elif channel.exit_status_ready() and (channel.eof_received or channel.closed):
                    # Both: OpenSSH may send the exit status before the last output (it reports
                    # the child's exit as soon as it reaps it), so output is complete at EOF.
                    break
                elif time.monotonic() > deadline:
                    raise socket.timeout(f"no answer to a command within {timeout or self.io_timeout:.0f}s")
                else:
                    # Wakes on data (the pipe) or on the exit status (status_event).
                    readable, _, _ = select.select([channel], [], [], 0.01)
                    if not readable:
                        channel.status_event.wait(0.05)
            # Output that arrived between the checks above is waiting in the channel: read it,
            # or a fast command's answer is lost.
            while channel.recv_ready():
                (sink or out).write(channel.recv(1 << 16))
            while channel.recv_stderr_ready():
                err.write(channel.recv_stderr(1 << 16))
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
                stale = time.monotonic() - self._shell_used_at > SHELL_REUSE_SECONDS
                if self._shell is not None and stale:
                    self._shell.close()  # About to hang itself up: don't race it.
                if self._shell is None or self._shell.closed or self._shell.exit_status_ready():
                    self._shell = self.client().get_transport().open_session(timeout=self.connect_timeout)
                    self._shell.settimeout(0.2)
                    self._shell.exec_command(f"exec /bin/sh -c {shlex.quote(CONTROL_SHELL)}")
                self._shell_used_at = time.monotonic()
                self._shell.sendall(f": >\"$TFC_STAMP\"; {{ {command}\n}} </dev/null 2>&1; "
                                    f"printf '\\n{marker} %d\\n' $?\n".encode())
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
