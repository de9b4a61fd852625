"""A fake GCE metadata server: the paths the watchdog and the boot script read, and guest attributes.

Behaviour modelled, from Google's documentation:
- https://cloud.google.com/compute/docs/metadata/querying-metadata : every request must carry
  `Metadata-Flavor: Google` (else 403), a request carrying `X-Forwarded-For` is refused (403, the
  server does not answer proxied requests), an unknown key is 404, and every answer carries
  `Metadata-Flavor: Google` back.
- https://cloud.google.com/compute/docs/metadata/manage-guest-attributes : the guest writes
  `instance/guest-attributes/NAMESPACE/KEY` with PUT and reads it back with GET; values survive a
  stop/start of the VM (they live with the instance, not the guest), so this server keeps them
  across container restarts.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GUEST = "instance/guest-attributes/"


@dataclass(frozen=True)
class GuestWrite:
    # time.monotonic() on this side when the PUT arrived (orders writes of different keys).
    at: float
    # Key under guest-attributes, e.g. "tfcluster/ready".
    key: str
    # The value written.
    value: str


def token_answer(access_token: str) -> str:
    """instance/service-accounts/default/token's body
    (https://cloud.google.com/compute/docs/access/authenticate-workloads#applications)."""
    return json.dumps({"access_token": access_token, "expires_in": 3599, "token_type": "Bearer"})


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A client that hangs up mid-answer (curl timing out at a halt) is not a server error."""
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class FakeMetadataServer:
    def __init__(self, values: dict[str, str], bind: tuple[str, int] = ("127.0.0.1", 0)):
        # Path under /computeMetadata/v1/ -> value, e.g. "instance/name": "demo-0".
        self.values = dict(values)
        # The latest value of each guest attribute, e.g. "tfcluster/ready": "n1:ok".
        self.guest_attributes: dict[str, str] = {}
        # Every guest-attribute write in arrival order (a boot's sequence of states).
        self.writes: list[GuestWrite] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _check(self) -> str | None:
                if self.headers.get("Metadata-Flavor") != "Google":
                    self._reply(403, b"Missing Metadata-Flavor:Google header")
                    return None
                if self.headers.get("X-Forwarded-For") is not None:
                    self._reply(403, b"Forbidden: X-Forwarded-For")
                    return None
                return self.path.split("?", 1)[0].removeprefix("/computeMetadata/v1/")

            def _reply(self, code: int, data: bytes) -> None:
                self.send_response(code)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", "application/text")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                path = self._check()
                if path is None:
                    return
                if path.startswith("oslogin/") and "?" in self.path:  # OS Login's paths take a query.
                    path += "?" + self.path.split("?", 1)[1]
                value = server.read(self.client_address[0], path)
                if value is None:
                    self._reply(404, b"Not Found")
                    return
                self._reply(200, value.encode())

            def do_PUT(self):
                path = self._check()
                if path is None:
                    return
                if not path.startswith(GUEST) or path.count("/") != 3:
                    # Only NAMESPACE/KEY under guest-attributes is writable by the guest.
                    self._reply(403, b"Forbidden")
                    return
                length = int(self.headers.get("Content-Length") or 0)
                value = self.rfile.read(length).decode()
                if not server.write(self.client_address[0], path.removeprefix(GUEST), value):
                    self._reply(404, b"Not Found")
                    return
                self._reply(200, b"")

            def log_message(self, *args):
                pass

        self.server = _QuietServer(bind, Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def read(self, client: str, path: str) -> str | None:
        """The value at ``path`` for the machine at address ``client`` (None: 404). One machine
        here; a server for many answers each by its address, as Google's does."""
        with self._lock:
            if path.startswith(GUEST):
                return self.guest_attributes.get(path.removeprefix(GUEST))
            return self.values.get(path)

    def write(self, client: str, key: str, value: str) -> bool:
        """A guest attribute write from ``client``; False when no machine is there."""
        with self._lock:
            self.guest_attributes[key] = value
            self.writes.append(GuestWrite(time.monotonic(), key, value))
        return True

    @property
    def host(self) -> str:
        address, port = self.server.server_address[:2]
        return f"{address}:{port}"

    def status(self) -> dict | None:
        raw = self.guest_attributes.get("tfcluster/watchdog")
        return json.loads(raw) if raw else None

    def history(self, key: str) -> list[GuestWrite]:
        """Every write of one guest attribute, oldest first."""
        with self._lock:
            return [write for write in self.writes if write.key == key]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
