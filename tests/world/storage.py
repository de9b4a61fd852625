"""Cloud Storage's front door in the test world: an HTTP proxy before gcp-storage-emulator that
checks each request's permission for the caller's identity, as Google's IAM would.

Identities are told apart by their bearer token (what a real front end resolves to a principal):
tokens listed in ``restricted`` belong to a principal with only those permissions (the VMs'
service account, with the roles terraform/ grants it: tests/world/iam.py); any other token is
the operator, who owns the project. A denied request gets Google's 403 shape
(https://cloud.google.com/storage/docs/json_api/v1/status-codes#403-forbidden).
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from tests.world.iam import needed

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def is_object_write(method: str, path: str) -> bool:
    """An upload (media, multipart or resumable: POST/PUT under /upload/storage/v1/b/B/o), or a
    change or deletion of an object (https://cloud.google.com/storage/docs/json_api/v1/objects)."""
    if path.startswith("/upload/storage/v1/b/"):
        return method in ("POST", "PUT")
    return method in ("DELETE", "PATCH", "PUT") and "/o/" in path and path.startswith("/storage/v1/b/")


class IamStorageProxy:
    def __init__(self, listens: list[tuple[str, int, ssl.SSLContext | None]], upstream: tuple[str, int],
                 restricted: dict[str, set[str]]):
        # Bearer token -> the permissions of that principal (all others: the project owner).
        self.restricted = restricted
        # (method, path, token, allowed) of every request, for the tests to read.
        self.log: list[tuple[str, str, str, bool]] = []
        # Object writes passed on so far, and the number after which further writes are held
        # (None: never), so a test can kill a writer mid-upload: a held write waits for
        # ``release`` and is then refused with a 503 instead of reaching the emulator, as a
        # request whose sender died before it was complete never reaches Cloud Storage.
        self.writes_passed = 0
        self.hold_writes_after: int | None = None
        self.holding = threading.Event()
        self.release = threading.Event()
        self._writes_lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # Keep-alive, and 100-continue for curl's uploads.

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return chunks
                        chunks += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
                self.send_response(status)
                for key, value in headers:
                    if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _serve(self):
                body = self._body()
                path = urlsplit(self.path).path
                token = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
                permissions = needed(self.command, path)
                allowed = token not in proxy.restricted or (
                    permissions is not None and permissions <= proxy.restricted[token])
                proxy.log.append((self.command, path, token, allowed))
                if not allowed:
                    missing = sorted((permissions or {"(unknown request)"}) - proxy.restricted[token])
                    message = (f"tfcluster-vm@demo-project.iam.gserviceaccount.com does not have {missing[0]} "
                               "access to the Google Cloud Storage bucket. Permission "
                               f"'{missing[0]}' denied on resource (or it may not exist).")
                    payload = json.dumps({"error": {"code": 403, "message": message, "errors": [
                        {"message": message, "domain": "global", "reason": "forbidden"}]}}).encode()
                    self._reply(403, [("Content-Type", "application/json; charset=UTF-8")], payload)
                    return
                if is_object_write(self.command, path) and not proxy._pass_write():
                    proxy.holding.set()
                    proxy.release.wait(timeout=300)
                    try:
                        self._reply(503, [("Content-Type", "text/plain")], b"held by the test")
                    except OSError:
                        pass  # The writer is gone, as intended.
                    return
                connection = http.client.HTTPConnection(*upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in HOP_BY_HOP and k.lower() not in ("expect", "content-length")}
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                self._reply(response.status, response.getheaders(), data)
                connection.close()

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _serve

            def log_message(self, *args):
                pass

        self.handler = Handler
        self.servers = []
        for address, port, context in listens:
            self.listen(address, port, context)

    def _pass_write(self) -> bool:
        """Counts an object write that goes through; False when it must be held instead."""
        with self._writes_lock:
            if self.hold_writes_after is not None and self.writes_passed >= self.hold_writes_after:
                return False
            self.writes_passed += 1
            return True

    def listen(self, address: str, port: int, context: ssl.SSLContext | None) -> None:
        """One more door (for example on the test hosts' bridge, for TensorFlow on the hosts)."""
        server = ThreadingHTTPServer((address, port), self.handler)
        server.daemon_threads = True
        if context is not None:
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self.servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
