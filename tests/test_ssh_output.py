"""SshConnection.run keeps every byte a command printed, whatever the moment it arrived.

paramiko's transport thread feeds a channel's buffers while the caller polls it
(paramiko/channel.py: `_feed` and `_feed_extended` fill `in_buffer`/`in_stderr_buffer`,
`_handle_request` "exit-status" sets `status_event`, `_handle_eof` sets `eof_received`). OpenSSH
reports a command's exit status when it reaps the child, which can be before the last output
leaves the child's pipe (serverloop/session.c); only EOF says the output is complete. The CI runs
of 2026-11-24 and 25 lost a `printf %s "$HOME"` that way ("cannot find the login's home folder:").
A real sshd hits those windows once in hundreds of logins, so these tests play the transport's
side at exactly those moments.
"""

from __future__ import annotations

import threading

from tfcluster.backends.ssh.connection import SshConnection


class ChannelFedBetweenChecks:
    """A paramiko Channel whose transport delivers stdout, stderr and the exit status at once,
    right after the caller's first look at both buffers found them empty."""

    def __init__(self, stdout: bytes, stderr: bytes, code: int):
        self._pending = (stdout, stderr, code)
        self._out, self._err = b"", b""
        self._code: int | None = None
        self.status_event = threading.Event()
        self.closed = False
        self.eof_received = False

    def _deliver(self) -> None:
        if self._pending:
            self._out, self._err, self._code = self._pending
            self._pending = None
            self.status_event.set()
            self.eof_received = True

    def settimeout(self, _seconds): pass

    def exec_command(self, _command): pass

    def recv_ready(self) -> bool:
        return bool(self._out)

    def recv(self, size: int) -> bytes:
        chunk, self._out = self._out[:size], self._out[size:]
        return chunk

    def recv_stderr_ready(self) -> bool:
        ready = bool(self._err)
        self._deliver()  # The transport thread runs just after this look.
        return ready

    def recv_stderr(self, size: int) -> bytes:
        chunk, self._err = self._err[:size], self._err[size:]
        return chunk

    def exit_status_ready(self) -> bool:
        return self.status_event.is_set()

    def recv_exit_status(self) -> int:
        return self._code

    def fileno(self):  # select() is only reached when nothing at all has arrived.
        raise AssertionError("the test channel delivers before anything would wait")

    def close(self):
        self.closed = True


class Transport:
    def __init__(self, channel): self.channel = channel

    def open_session(self, timeout=None): return self.channel


class Client:
    def __init__(self, channel): self.transport = Transport(channel)

    def get_transport(self): return self.transport


def test_output_that_arrives_with_the_exit_status_is_kept(monkeypatch):
    channel = ChannelFedBetweenChecks(b"/home/tfcluster", b"a warning\n", 0)
    connection = SshConnection("worker-1 (10.0.0.2)", None, "tfcluster", "/dev/null", "")
    monkeypatch.setattr(connection, "client", lambda: Client(channel))
    assert connection.run('printf %s "$HOME"') == (0, "/home/tfcluster", "a warning\n")
    assert channel.closed


class StatusBeforeOutput(ChannelFedBetweenChecks):
    """OpenSSH's other order: the exit status first; the output and EOF a moment later."""

    def __init__(self, stdout: bytes, code: int):
        super().__init__(stdout, b"", code)
        self._pending = None
        self._later = stdout
        self._code = code
        self.status_event.set()
        self.looks = 0

    def recv_stderr_ready(self) -> bool:
        self.looks += 1
        if self.looks == 3:  # The output arrives after the caller saw the status twice.
            self._out, self._later, self.eof_received = self._later, b"", True
        return False

    def fileno(self):
        import os

        reader, writer = os.pipe()
        os.write(writer, b"x")  # Readable at once: select() returns, as paramiko's pipe does on data.
        self._pipes = getattr(self, "_pipes", []) + [reader, writer]
        return reader


def test_output_that_arrives_after_the_exit_status_is_kept(monkeypatch):
    channel = StatusBeforeOutput(b"/home/tfcluster", 0)
    connection = SshConnection("worker-0 (10.0.0.2)", None, "tfcluster", "/dev/null", "")
    monkeypatch.setattr(connection, "client", lambda: Client(channel))
    assert connection.run('printf %s "$HOME"') == (0, "/home/tfcluster", "")
