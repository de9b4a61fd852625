"""Google's names pointed at local stand-ins, for a process started by a test or for this one.

- Compute and OAuth: tests/fake_compute.py over HTTPS on <compute address>:443.
- Cloud Storage (www.googleapis.com, storage.googleapis.com): gcp-storage-emulator behind a
  TLS-terminating byte proxy on <storage address>:443, and a plain one on :80, since the
  emulator's resumable-upload answers name http://www.googleapis.com/upload/...
  (../shared/notes/tf-gcs-emulator.md).
A started process sees them through a private /etc/hosts (`unshare --mount`, bind mount) and
trusts the test CA through REQUESTS_CA_BUNDLE / SSL_CERT_FILE / CURL_CA_BUNDLE; this process
sees them through a patched name resolution (the same mapping, for in-process tests).
"""

from __future__ import annotations

import contextlib
import os
import socket
import socketserver
import ssl
import threading
from pathlib import Path

from tests.fake_compute import FakeCompute, FakeComputeServer
from tests.world.tls import make_certificates, service_account_key

COMPUTE_NAMES = ("compute.googleapis.com", "oauth2.googleapis.com")
STORAGE_NAMES = ("www.googleapis.com", "storage.googleapis.com")


class _Forward(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def byte_proxy(listen: tuple[str, int], target: tuple[str, int], context: ssl.SSLContext | None) -> _Forward:
    """Forward every connection on ``listen`` to ``target``, terminating TLS when ``context``."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            client = context.wrap_socket(self.request, server_side=True) if context else self.request
            upstream = socket.create_connection(target, timeout=30)

            def pump(source, sink):
                try:
                    while data := source.recv(65536):
                        sink.sendall(data)
                except OSError:
                    pass
                finally:
                    with contextlib.suppress(OSError):
                        sink.shutdown(socket.SHUT_WR)

            other = threading.Thread(target=pump, args=(upstream, client), daemon=True)
            other.start()
            pump(client, upstream)
            other.join(timeout=60)
            client.close()
            upstream.close()

    server = _Forward(listen, Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class GoogleWorld:
    """The stand-ins, their certificates and a service-account key, under ``root``."""

    def __init__(self, root: Path, project: str = "demo-project", compute: FakeCompute | None = None):
        net = int(os.environ.get("TFCLUSTER_TESTLAB_NET", "7"))
        self.compute_address, self.storage_address = f"127.77.{net}.1", f"127.77.{net}.2"
        self.ca, cert, key = make_certificates(root / "tls")
        self.credentials = service_account_key(root / "operator-key.json", project)
        self.compute = FakeComputeServer(compute or FakeCompute(project=project),
                                         tls=(self.compute_address, str(cert), str(key)))
        from gcp_storage_emulator.server import create_server

        from tfcluster.backends.local import free_ports

        port = free_ports(1)[0]
        self.storage = create_server("127.0.0.1", port, in_memory=True)
        self.storage.start()
        self.storage_url = f"http://127.0.0.1:{port}"
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self.proxies = [byte_proxy((self.storage_address, 443), ("127.0.0.1", port), context),
                        byte_proxy((self.storage_address, 80), ("127.0.0.1", port), None)]
        self.hosts = root / "hosts"
        self.hosts.write_text("127.0.0.1 localhost\n::1 localhost\n"
                              f"{self.compute_address} {' '.join(COMPUTE_NAMES)}\n"
                              f"{self.storage_address} {' '.join(STORAGE_NAMES)}\n")

    def env(self) -> dict[str, str]:
        """What a process started in this world gets: trust in the test CA and the key file."""
        ca = str(self.ca)
        return {"REQUESTS_CA_BUNDLE": ca, "SSL_CERT_FILE": ca, "CURL_CA_BUNDLE": ca,
                "GOOGLE_APPLICATION_CREDENTIALS": str(self.credentials),
                "NO_GCE_CHECK": "True"}  # google-auth must not probe a metadata server on this laptop.

    def prefix(self) -> list[str]:
        """argv prefix: run the command in its own mount namespace with the private hosts file."""
        return ["unshare", "--mount", "--", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"',
                str(self.hosts)]

    @contextlib.contextmanager
    def resolving(self):
        """For code in this process: the same names resolve to the stand-ins."""
        mapping = {**dict.fromkeys(COMPUTE_NAMES, self.compute_address),
                   **dict.fromkeys(STORAGE_NAMES, self.storage_address)}
        real = socket.getaddrinfo

        def getaddrinfo(host, *args, **kwargs):
            return real(mapping.get(host, host), *args, **kwargs)

        socket.getaddrinfo = getaddrinfo
        try:
            yield
        finally:
            socket.getaddrinfo = real

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.shutdown()
            proxy.server_close()
        self.storage.stop()
        self.compute.close()
