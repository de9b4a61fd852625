"""What every stand-in server shares: Google's JSON answers."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


def send_json(handler: BaseHTTPRequestHandler, code: int, payload) -> None:
    """One JSON answer, as Google's REST front ends send it (application/json; charset=UTF-8)."""
    data = json.dumps(payload).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json; charset=UTF-8")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class JsonGetServer:
    """A GET-only stand-in over HTTPS on ``address``:443: ``handle(path, query, headers)`` gives
    (status, payload) for each request (query parsed, blank values kept)."""

    def __init__(self, address: str, context, handle):
        import threading
        from http.server import ThreadingHTTPServer
        from urllib.parse import parse_qs, urlparse

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                parsed = urlparse(self.path)
                code, payload = handle(parsed.path, parse_qs(parsed.query, keep_blank_values=True), dict(self.headers))
                send_json(self, code, payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((address, 443), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def google_error(service: str, code: int, status: str, message: str, reason: str = "") -> tuple[int, dict]:
    """Google's JSON error (https://cloud.google.com/apis/design/errors): code, message, status, and
    a google.rpc.ErrorInfo naming ``reason`` and the service when there is one."""
    error = {"code": code, "message": message, "status": status}
    if reason:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                             "domain": "googleapis.com", "metadata": {"service": service}}]
    return code, {"error": error}
