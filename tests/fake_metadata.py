"""A fake GCE metadata server: the paths the watchdog reads, and guest-attribute PUTs."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeMetadataServer:
    def __init__(self, values: dict[str, str], bind: tuple[str, int] = ("127.0.0.1", 0)):
        # Path under /computeMetadata/v1/ -> value, e.g. "instance/name": "demo-0".
        self.values = dict(values)
        self.guest_attributes: dict[str, str] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _check(self) -> str | None:
                if self.headers.get("Metadata-Flavor") != "Google":
                    self.send_error(403, "Missing Metadata-Flavor:Google header")
                    return None
                return self.path.split("?", 1)[0].removeprefix("/computeMetadata/v1/")

            def do_GET(self):
                path = self._check()
                if path is None:
                    return
                if path not in server.values:
                    self.send_error(404)
                    return
                data = server.values[path].encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):
                path = self._check()
                if path is None:
                    return
                length = int(self.headers.get("Content-Length") or 0)
                server.guest_attributes[path.removeprefix("instance/guest-attributes/")] = \
                    self.rfile.read(length).decode()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(bind, Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def host(self) -> str:
        address, port = self.server.server_address[:2]
        return f"{address}:{port}"

    def status(self) -> dict | None:
        raw = self.guest_attributes.get("tfcluster/watchdog")
        return json.loads(raw) if raw else None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
