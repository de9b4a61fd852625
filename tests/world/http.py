"""What every stand-in server shares: HTTPS on the world's names, and Google's JSON answers."""

from __future__ import annotations

import json
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

# A client gone mid-answer: its process was killed (the crash sweep SIGKILLs commands between a request
# and its answer, tests/test_crash_sweep.py) or it hung up.
GONE = (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError)


class WorldServer(ThreadingHTTPServer):
    """Every stand-in's HTTP server: a thread per request, none keeping the test alive. An answer whose
    sender is gone is lost, as Google's is; it is no error of the world's, so socketserver's traceback
    for it is not printed. Any other error in a handler still is."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], GONE):
            return
        super().handle_error(request, client_address)


def send_json(handler: BaseHTTPRequestHandler, code: int, payload) -> None:
    """One JSON answer, as Google's REST front ends send it (application/json; charset=UTF-8)."""
    data = json.dumps(payload).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json; charset=UTF-8")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def json_body(handler: BaseHTTPRequestHandler) -> tuple[object, tuple[int, dict] | None]:
    """A request's JSON body (None when it has none), or Google's 400 for one that does not parse."""
    length = int(handler.headers.get("Content-Length") or 0)
    try:
        return (json.loads(handler.rfile.read(length) or b"null") if length else None), None
    except ValueError:
        return None, (400, {"error": {"code": 400, "status": "INVALID_ARGUMENT",
                                      "message": "Invalid JSON payload received."}})


class QuietHandler(BaseHTTPRequestHandler):
    """A stand-in's request handler: no access log on the test's stderr."""

    def log_message(self, *args):
        pass


class TlsServer:
    """``handler`` (a QuietHandler class) served over HTTPS on ``address``:443 with ``context``
    (the world's CA signs the names that resolve to ``address``), in a thread until close()."""

    def __init__(self, address: str, context, handler: type[BaseHTTPRequestHandler]):
        self.server = WorldServer((address, 443), handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class JsonGetServer(TlsServer):
    """A GET-only stand-in: ``handle(path, query, headers)`` gives (status, payload) for each
    request (query parsed, blank values kept)."""

    def __init__(self, address: str, context, handle):
        class Handler(QuietHandler):
            def do_GET(self):
                parsed = urlparse(self.path)
                code, payload = handle(parsed.path, parse_qs(parsed.query, keep_blank_values=True), dict(self.headers))
                send_json(self, code, payload)

        super().__init__(address, context, Handler)


class JsonServer(TlsServer):
    """A REST stand-in for GET, POST, PATCH and DELETE: ``handle(method, path, query, body, headers)``
    gives (status, payload) for each request (body: its JSON, None when it has none; headers
    lowercased). A body that is not JSON gets Google's 400."""

    def __init__(self, address: str, context, handle):
        class Handler(QuietHandler):
            def _serve(self):
                parsed = urlparse(self.path)
                body, bad = json_body(self)
                code, payload = bad or handle(self.command, parsed.path, parse_qs(parsed.query), body,
                                              {k.lower(): v for k, v in self.headers.items()})
                send_json(self, code, payload)

            do_GET = do_POST = do_PATCH = do_DELETE = _serve

        super().__init__(address, context, Handler)


def google_error(service: str, code: int, status: str, message: str, reason: str = "") -> tuple[int, dict]:
    """Google's JSON error (https://cloud.google.com/apis/design/errors): code, message, status, and
    a google.rpc.ErrorInfo naming ``reason`` and the service when there is one."""
    error = {"code": code, "message": message, "status": status}
    if reason:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                             "domain": "googleapis.com", "metadata": {"service": service}}]
    return code, {"error": error}
