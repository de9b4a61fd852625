"""SshConnection.run keeps every byte a command printed, whatever the moment it arrived.

paramiko's transport thread feeds a channel's buffers while the caller polls it
(paramiko/channel.py: `_feed` and `_feed_extended` fill `in_buffer`/`in_stderr_buffer`,
`_handle_request` "exit-status" sets `status_event`). OpenSSH sends a command's output, then
its exit status, and the transport handles them in that order. So the output of a fast command
can land after the caller found nothing to read and before it sees the exit status; the CI run
of 2026-11-24 lost a `printf %s "$HOME"` that way ("cannot find the login's home folder:").
A real sshd hits that window once in hundreds of logins, so this test plays the transport's
side at exactly that moment.
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

    def _deliver(self) -> None:
        if self._pending:
            self._out, self._err, self._code = self._pending
            self._pending = None
            self.status_event.set()

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
