"""The public-address lookups `up` makes for the SSH firewall rule (tfcluster/backends/gcp/backend.py
detect_operator_cidr): checkip.amazonaws.com and api.ipify.org, over HTTPS on the world's names.

What they answer, from their own pages: "https://api.ipify.org" returns "your public IP address"
as plain text (https://www.ipify.org, API usage); checkip.amazonaws.com answers the caller's IPv4
address as one line of text. Both report the address the request *arrived from*: behind a NAT
that is the router's, and behind an HTTPS proxy the proxy's, never the laptop's. So this server
answers ``public`` when it is set (the address the lab's VMs see the operator as), else the
connection's own source address. Unhappy path: ``down`` names the services that answer 503, as
an outage does; the product then tries the next one.
"""

from __future__ import annotations

from tests.world.http import QuietHandler, TlsServer

CHECKIP_NAMES = ("checkip.amazonaws.com", "api.ipify.org")


class CheckIpServer(TlsServer):
    def __init__(self, address: str, context):
        # The operator's address as the internet sees it, or None for the connection's source.
        self.public: str | None = None
        # Services that are down (answer 503), by host name.
        self.down: set[str] = set()
        # Host names asked, in order, for the tests to read.
        self.asked: list[str] = []
        server_ref = self

        class Handler(QuietHandler):
            def do_GET(self):
                host = self.headers.get("Host", "").split(":")[0]
                server_ref.asked.append(host)
                if host in server_ref.down:
                    code, body = 503, b"Service Unavailable"
                else:
                    code, body = 200, f"{server_ref.public or self.client_address[0]}\n".encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(address, context, Handler)
