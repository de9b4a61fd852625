"""Artifact Registry's Docker endpoints (REGION-docker.pkg.dev) in the test world.

Docker resolves a registry's name and trusts its certificate in the daemon, not in the CLI, so
the world must change around a daemon: `PrivateDaemon` is a second dockerd started in its own
network namespace (and, through `ip netns exec`, mount namespace), with a private /etc/hosts (the
registry names -> addresses on a veth pair to this namespace) and a private /etc/docker whose
certs.d/<name>/ca.crt is the test CA (tests/world/tls.py). The laptop's CLI
reaches it through DOCKER_HOST; a test VM (tests/hostlab.py) reaches it because its sshd's mount
namespace gets the daemon's socket bound over /run/docker.sock (`use_daemon`).

Behind the names:
- `TlsRegistry`: Debian's docker-registry with TLS on ADDRESS:443, accepting pushes, as Artifact
  Registry does once `gcloud auth configure-docker` gave Docker credentials (the credentials
  themselves are not modelled).
- `TokenRegistry`: docker-registry with token authentication, as Artifact Registry signs in: /v2/
  answers 401 with a Bearer challenge, and its token endpoint exchanges Basic credentials whose
  user is `oauth2accesstoken` and whose password is a Google access token
  (https://cloud.google.com/artifact-registry/docs/docker/authentication, "Access token") for a
  registry token (Docker's token protocol: https://distribution.github.io/distribution/spec/auth/token/).
  A pull needs artifactregistry.repositories.downloadArtifacts (roles/artifactregistry.reader,
  or writer) on the repository, a push uploadArtifacts (writer), granted to the token's principal
  in the repository's IAM policy (the Artifact Registry stand-in's, which terraform's binding
  writes) or owned by the project's operator; anything else is refused with Artifact Registry's
  403 DENIED "Permission ... denied on resource ... (or it may not exist)". docker-registry
  itself checks the token's signature and scope (its `auth: token` configuration); the token
  endpoint is on port 5001 of the same name, since docker-registry owns /v2/ on 443 (Google
  serves it at /v2/token; Docker follows whatever realm the challenge names).
- `DenyingRegistry`: what Artifact Registry answers a Docker client without credentials: /v2/
  answers 401 with a Bearer challenge whose realm is https://REGION-docker.pkg.dev/v2/token
  (seen in docker/setup-buildx-action#79), the anonymous token is granted, and the upload is
  refused with 403 DENIED "Unauthenticated request. Unauthenticated requests do not have
  permission "artifactregistry.repositories.uploadArtifacts" on resource ... (or it may not
  exist)" (GoogleCloudPlatform/generative-ai#693).
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.conftest import wait_for
from tests.world.http import send_json


class PrivateDaemon:
    """A dockerd of its own, in its own network namespace (a dockerd rewrites the links of the
    namespace it runs in: one started with --bridge=none in the root namespace deletes the
    shared daemon's docker0), joined to this one by a veth pair: SUBNET.1 (and any address of
    ``names``) on this side, SUBNET.2 on its side. ``names`` maps registry names to addresses on
    this side, trusted with ``ca``: its own /etc/hosts and /etc/docker (certs.d) are bind mounts in
    its own mount namespace."""

    def __init__(self, root: Path, names: dict[str, str], ca: Path, subnet: str, tag: str):
        root.mkdir(parents=True, exist_ok=True)
        self.netns, self.veth, self.subnet = f"{tag}_ns", f"{tag}_v", subnet
        self.etc = Path("/etc/netns") / self.netns
        self._network_down()  # Leftovers of a killed session.
        self.etc.mkdir(parents=True)
        (self.etc / "hosts").write_text("127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in names.items()))
        for name in names:
            (self.etc / "docker" / "certs.d" / name).mkdir(parents=True)
            shutil.copy(ca, self.etc / "docker" / "certs.d" / name / "ca.crt")
        for argv in (["ip", "netns", "add", self.netns],
                     ["ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns],
                     *[["ip", "addr", "add", f"{a}/24", "dev", self.veth] for a in [f"{subnet}.1", *names.values()]],
                     ["ip", "link", "set", self.veth, "up"],
                     ["ip", "-n", self.netns, "addr", "add", f"{subnet}.2/24", "dev", "eth0"],
                     ["ip", "-n", self.netns, "link", "set", "eth0", "up"],
                     ["ip", "-n", self.netns, "link", "set", "lo", "up"]):
            subprocess.run(argv, check=True, capture_output=True)
        # Unix socket paths must stay under 108 bytes: a short folder for the socket and exec root.
        self.run_dir = Path(tempfile.mkdtemp(prefix="tfc-dockerd-", dir="/tmp"))
        self.data = root / "data"
        self.socket = self.run_dir / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.log = open(root / "dockerd.log", "w")
        # nsenter, not `ip netns exec`: that one remounts /sys, hiding the cgroups dockerd needs.
        self.process = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.netns}", "--", "unshare", "--mount", "--propagation", "private",
             "--", "sh", "-c", 'mount --bind "$0" /etc/hosts && mount --bind "$1" /etc/docker && shift && exec "$@"',
             str(self.etc / "hosts"), str(self.etc / "docker"), "dockerd", "--data-root", str(self.data), "--exec-root",
             str(self.run_dir / "x"), "--pidfile", str(self.run_dir / "pid"), "-H", self.host,
             # As the CI's daemon: no iptables (facts.md); no bridge: it runs no container.
             "--iptables=false", "--ip-masq=false", "--bridge=none", "--storage-driver=vfs"],
            stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: self.docker("version").returncode == 0 or self.process.poll() is not None, 60,
                     what="a private dockerd")
            if self.process.poll() is not None:
                raise RuntimeError(f"private dockerd exited: {(root / 'dockerd.log').read_text()[-2000:]}")
        except BaseException:
            self.stop()
            raise

    def docker(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "--host", self.host, *argv], capture_output=True, text=True)

    def _network_down(self) -> None:
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True)
        shutil.rmtree(self.etc, ignore_errors=True)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)
        self.log.close()
        self._network_down()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        shutil.rmtree(self.data, ignore_errors=True)


def use_daemon(lab, daemon: PrivateDaemon) -> None:
    """Each test host's docker CLI talks to ``daemon``: its socket over /run/docker.sock in the
    mount namespace of the host's sshd (`ip netns exec` made it a slave of the root one, so the
    bind does not leak out), which every login session inherits."""
    for host in lab.hosts:
        subprocess.run(["nsenter", "--target", str(host.sshd.pid), "--mount", "--", "mount", "--bind",
                        str(daemon.socket), "/run/docker.sock"], check=True, capture_output=True)


def _https_server(address: str, port: int, handler, cert: Path, key: Path) -> ThreadingHTTPServer:
    """``handler`` over HTTPS on address:port with the world's certificate, served from a thread."""
    server = ThreadingHTTPServer((address, port), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class TlsRegistry:
    """docker-registry serving HTTPS on ``address``:443 with ``cert``/``key``, storing under ``root``;
    ``auth`` is the `auth:` section of its configuration (none: it takes any push and pull)."""

    def __init__(self, root: Path, address: str, cert: Path, key: Path, auth: str = ""):
        self.storage = root / "storage"
        root.mkdir(parents=True, exist_ok=True)
        config = root / "registry.yml"
        config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {self.storage}\n"
                          f"http:\n  addr: {address}:443\n  tls:\n    certificate: {cert}\n    key: {key}\n{auth}")
        self.process = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=open(root / "registry.log", "w"),
                                        stderr=subprocess.STDOUT)
        def answers() -> bool:
            import socket

            try:
                with socket.create_connection((address, 443), timeout=0.5):
                    return True
            except OSError:
                return False

        wait_for(answers, 20, what="docker-registry")

    def tags(self, repository: str) -> list[str]:
        folder = self.storage / "docker/registry/v2/repositories" / repository / "_manifests/tags"
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)


class DenyingRegistry:
    """Artifact Registry's answers to a Docker client that has no credentials (see the module doc)."""

    def __init__(self, name: str, address: str, cert: Path, key: Path):
        self.requests: list[tuple[str, str]] = []
        requests = self.requests

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self, code: int, body: dict, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                for key_, value in (headers or {}).items():
                    self.send_header(key_, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Docker-Distribution-Api-Version", "registry/2.0")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _serve(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                requests.append((self.command, self.path))
                path = self.path.split("?")[0]
                if path == "/v2/token":
                    self._answer(200, {"token": "anonymous", "expires_in": 3600})
                elif path == "/v2/" and not self.headers.get("Authorization"):
                    self._answer(401, {"errors": [{"code": "UNAUTHORIZED", "message": "Unauthorized access."}]},
                                 {"WWW-Authenticate": f'Bearer realm="https://{name}/v2/token",service="{name}"'})
                elif path == "/v2/":
                    self._answer(200, {})
                else:
                    parts = path.split("/")  # /v2/PROJECT/REPO/IMAGE/...
                    resource = f"projects/{parts[2]}/locations/{name.split('-docker')[0]}/repositories/{parts[3]}"
                    self._answer(403, {"errors": [{"code": "DENIED", "message": (
                        "Unauthenticated request. Unauthenticated requests do not have permission "
                        f'"artifactregistry.repositories.uploadArtifacts" on resource "{resource}" '
                        "(or it may not exist)")}]})

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = _serve

            def log_message(self, *args):
                pass

        self.server = _https_server(address, 443, Handler, cert, key)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class TokenRegistry(TlsRegistry):
    """docker-registry with Artifact Registry's sign-in (see the module doc) on ``name``/``address``.

    ``principal_of(token)`` answers whose a Google access token is (None: unknown); ``roles_of(member,
    repository)`` the roles that member holds on projects/P/locations/L/repositories/R;
    ``owner`` holds every permission (the project's operator). ``denied`` holds members an IAM deny
    policy keeps from every Artifact Registry permission whatever their roles
    (https://cloud.google.com/iam/docs/deny-overview)."""

    def __init__(self, root: Path, name: str, address: str, cert: Path, key: Path, principal_of, roles_of,
                 owner: str):
        import base64
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID

        root.mkdir(parents=True, exist_ok=True)
        self.refusals: list[str] = []
        self.denied: set[str] = set()
        denied = self.denied
        # The token signer: a key and its self-signed certificate, the registry's only trusted root.
        signer = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tfcluster test token signer")])
        now = datetime.datetime.now(datetime.timezone.utc)
        certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                       .public_key(signer.public_key()).serial_number(x509.random_serial_number())
                       .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=7))
                       .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                       .sign(signer, hashes.SHA256()))
        (root / "token-root.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        x5c = base64.b64encode(certificate.public_bytes(serialization.Encoding.DER)).decode()
        issuer, realm = "tfcluster-test-token-issuer", f"https://{name}:5001/v2/token"
        auth = (f"auth:\n  token:\n    realm: {realm}\n    service: {name}\n    issuer: {issuer}\n"
                f"    rootcertbundle: {root / 'token-root.pem'}\n")
        refusals = self.refusals
        location = name.removesuffix("-docker.pkg.dev")

        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        def sign(claims: dict) -> str:
            from cryptography.hazmat.primitives.asymmetric import padding

            header = b64(json.dumps({"typ": "JWT", "alg": "RS256", "x5c": [x5c]}).encode())
            body = b64(json.dumps(claims).encode())
            signature = signer.sign(f"{header}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
            return f"{header}.{body}.{b64(signature)}"

        # permission -> the predefined roles that hold it (https://cloud.google.com/artifact-registry/docs/access-control#roles).
        holders = {"downloadArtifacts": {"roles/artifactregistry.reader", "roles/artifactregistry.writer",
                                         "roles/artifactregistry.repoAdmin", "roles/artifactregistry.admin"},
                   "uploadArtifacts": {"roles/artifactregistry.writer", "roles/artifactregistry.repoAdmin",
                                       "roles/artifactregistry.admin"}}

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, code: int, body: dict) -> None:
                send_json(self, code, body)

            def do_GET(self):
                from urllib.parse import parse_qs, urlparse

                query = parse_qs(urlparse(self.path).query)
                basic = self.headers.get("Authorization", "")
                try:
                    user, token = base64.b64decode(basic.removeprefix("Basic ")).decode().split(":", 1)
                except ValueError:
                    user, token = "", ""
                member = principal_of(token) if user == "oauth2accesstoken" else None
                if member is None:
                    refusals.append(f"unauthenticated ({user or 'no credentials'})")
                    self._answer(401, {"errors": [{"code": "UNAUTHORIZED", "message": "Unauthorized access."}]})
                    return
                access = []
                for scope in query.get("scope", []):  # repository:PROJECT/REPO/IMAGE:pull,push
                    kind, path, actions = scope.split(":")
                    project, repo = path.split("/")[:2]
                    resource = f"projects/{project}/locations/{location}/repositories/{repo}"
                    roles = set(roles_of(member, resource))
                    for action in actions.split(","):
                        permission = "uploadArtifacts" if action == "push" else "downloadArtifacts"
                        if member in denied or (member != owner and not roles & holders[permission]):
                            message = (f'Permission "artifactregistry.repositories.{permission}" denied on resource '
                                       f'"{resource}" (or it may not exist)')
                            refusals.append(f"{member}: {message}")
                            self._answer(403, {"errors": [{"code": "DENIED", "message": message}]})
                            return
                    access.append({"type": kind, "name": path, "actions": actions.split(",")})
                issued = int(time.time())
                jwt = sign({"iss": issuer, "sub": member, "aud": name, "iat": issued, "nbf": issued - 60,
                            "exp": issued + 3600, "jti": os.urandom(8).hex(), "access": access})
                self._answer(200, {"token": jwt, "access_token": jwt, "expires_in": 3600})

            def log_message(self, *args):
                pass

        self.server = _https_server(address, 5001, Handler, cert, key)
        super().__init__(root, address, cert, key, auth)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        super().stop()
