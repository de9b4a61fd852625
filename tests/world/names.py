"""Google's names pointed at local stand-ins, for a process started by a test or for this one.

- Compute, OAuth, IAM (tests/world/iam_api.py) and IAM credentials: tests/fake_compute.py over
  HTTPS on <compute address>:443.
- Artifact Registry (artifactregistry.googleapis.com): tests/fake_artifact_registry.py over HTTPS
  on <registry address>:443.
- Cloud Storage (www.googleapis.com, storage.googleapis.com): gcp-storage-emulator behind an
  IAM-checking HTTP proxy (tests/world/storage.py) on <storage address>:443 with TLS, and on :80
  plain, since the emulator's resumable-upload answers name http://www.googleapis.com/upload/...
  (../shared/notes/tf-gcs-emulator.md). A VM's token is its own service account's
  (token_for(email)): it gets only the permissions of the roles bound to that account on each
  bucket (by the provider stand-in's setIamPolicy).
- Cloud Billing Catalog (cloudbilling.googleapis.com): tests/world/billing.py over HTTPS on
  <billing address>:443. As in most real projects, the Cloud Billing API starts disabled in the
  world's project (estimates then come from the dated table); tests enable it to see catalog prices.
- Service Usage, Resource Manager and Org Policy (serviceusage, cloudresourcemanager and
  orgpolicy.googleapis.com, what `invoke check` reads): tests/world/project_apis.py over HTTPS on
  <project APIs address>:443. Every API tfcluster needs is on and no organisation policy is set,
  as in a sandbox project; tests switch them.
- Cloud Quotas (cloudquotas.googleapis.com) and Cloud Monitoring (monitoring.googleapis.com), where
  the quotas outside Compute's Quota.metric and their usage are read: tests/world/cloudquotas.py and
  tests/world/monitoring.py over HTTPS on <cloud quotas address>:443 and <monitoring address>:443,
  both answering from the world's quota table (tests/world/quotas.py), on when the project's
  Service Usage says so.
- Vertex AI ({region}-aiplatform.googleapis.com, tests/world/vertex.py) and Cloud Logging
  (logging.googleapis.com, tests/world/cloud_logging.py) over HTTPS on <vertex address>:443 and
  <logging address>:443; a job's replicas are Docker containers on the lab's own network
  (tests/world/vertex_replicas.py), made when the first job starts.
- The public-address lookups (checkip.amazonaws.com, api.ipify.org): tests/world/checkip.py over
  HTTPS on <checkip address>:443, answering the operator's address as the VMs see it.
A started process sees them through a private /etc/hosts (`unshare --mount`, bind mount) and
trusts the test CA through REQUESTS_CA_BUNDLE / SSL_CERT_FILE / CURL_CA_BUNDLE; this process
sees them through a patched name resolution (the same mapping, for in-process tests).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import threading
from pathlib import Path

from tests.fake_artifact_registry import FakeArtifactRegistry, FakeArtifactRegistryServer
from tests.fake_compute import FakeCompute, FakeComputeServer
from tests.world import compute_auth
from tests.world.billing import Catalog, CatalogServer
from tests.world.storage import IamStorageProxy
from tests.world.checkip import CHECKIP_NAMES, CheckIpServer
from tests.world.cloud_logging import LOGGING_NAMES, LoggingServer, LoggingState
from tests.world.cloudquotas import CLOUDQUOTAS_NAMES, CloudQuotas, CloudQuotasServer
from tests.world.monitoring import MONITORING_NAMES, Monitoring, MonitoringServer
from tests.world.oslogin import OSLOGIN_NAMES, OsLogin, OsLoginServer
from tests.world.project_apis import PROJECT_NAMES, ProjectApis, ProjectApisServer
from tests.world.tls import GOOGLE_NAMES, make_certificates, operator_key, service_account_key
from tests.world.vertex import VERTEX_NAMES, Vertex, VertexServer, VertexState

# The access token of a service account: what the metadata server hands an instance that runs as
# it, valid while IAM holds the account (tests/world/compute_auth.py, iam_api.py).
token_for = compute_auth.token_for

COMPUTE_NAMES = ("compute.googleapis.com", "oauth2.googleapis.com", "iamcredentials.googleapis.com",
                 "iam.googleapis.com")
STORAGE_NAMES = ("www.googleapis.com", "storage.googleapis.com")
BILLING_NAMES = ("cloudbilling.googleapis.com",)
ARTIFACTS_NAMES = ("artifactregistry.googleapis.com",)


def _emulator_accepts_empty_objects() -> None:
    """gcp-storage-emulator crashes on a zero-length media upload (handlers/objects.py,
    _media_upload: len(request.data) with data None), where Cloud Storage stores an empty object;
    TensorFlow's makedirs writes its folder markers exactly so. Mend the double, once."""
    from gcp_storage_emulator.handlers import objects

    if getattr(objects._media_upload, "mended", False):
        return
    original = objects._media_upload

    def media_upload(request, response, storage):
        if request.data is None:
            request._data = b""
        return original(request, response, storage)

    media_upload.mended = True
    objects._media_upload = media_upload  # objects.insert looks it up by name on each call.


class GoogleWorld:
    """The stand-ins, their certificates and a service-account key, under ``root``."""

    def __init__(self, root: Path, project: str = "demo-project", compute: FakeCompute | None = None):
        net = int(os.environ.get("TFCLUSTER_TESTLAB_NET", "7"))
        self.compute_address, self.storage_address = f"127.77.{net}.1", f"127.77.{net}.2"
        self.billing_address = f"127.77.{net}.5"
        self.checkip_address = f"127.77.{net}.6"
        self.project_address = f"127.77.{net}.7"
        self.cloudquotas_address, self.monitoring_address = f"127.77.{net}.8", f"127.77.{net}.9"
        self.artifacts_address = f"127.77.{net}.3"
        self.vertex_address, self.logging_address = f"127.77.{net}.11", f"127.77.{net}.12"
        self.oslogin_address = f"127.77.{net}.13"
        self.ca, cert, key = make_certificates(root / "tls", GOOGLE_NAMES + BILLING_NAMES + ARTIFACTS_NAMES
                                               + ("iam.googleapis.com",) + CHECKIP_NAMES + PROJECT_NAMES
                                               + CLOUDQUOTAS_NAMES + MONITORING_NAMES + VERTEX_NAMES + LOGGING_NAMES
                                               + OSLOGIN_NAMES)
        self.artifacts = FakeArtifactRegistryServer(FakeArtifactRegistry(project=project),
                                                    tls=(self.artifacts_address, str(cert), str(key)))
        self.credentials = service_account_key(root / "operator-key.json", project)
        self.compute = FakeComputeServer(compute or FakeCompute(project=project),
                                         tls=(self.compute_address, str(cert), str(key)))
        self.compute.state.jwt_keys.update(operator_key(self.credentials))
        self.artifacts.state.identity = self.compute.state  # One identity system for every API.
        from gcp_storage_emulator.server import create_server

        _emulator_accepts_empty_objects()
        from tests import labnet

        port = labnet.free_ports(1)[0]
        self.storage = create_server("127.0.0.1", port, in_memory=True)
        self.storage.start()
        self.storage_url = f"http://127.0.0.1:{port}"
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self.tls_context = context
        self.storage_proxy = IamStorageProxy(
            [(self.storage_address, 443, context), (self.storage_address, 80, None)], ("127.0.0.1", port),
            identify=lambda token: compute_auth.identify(self.compute.state, token),
            iam_delay=lambda: self.compute.state.iam_delay_seconds)
        self.hosts = root / "hosts"
        self.hosts.write_text("127.0.0.1 localhost\n::1 localhost\n"
                              f"{self.compute_address} {' '.join(COMPUTE_NAMES)}\n"
                              f"{self.storage_address} {' '.join(STORAGE_NAMES)}\n"
                              f"{self.billing_address} {' '.join(BILLING_NAMES)}\n"
                              f"{self.artifacts_address} {' '.join(ARTIFACTS_NAMES)}\n"
                              f"{self.checkip_address} {' '.join(CHECKIP_NAMES)}\n"
                              f"{self.project_address} {' '.join(PROJECT_NAMES)}\n"
                              f"{self.cloudquotas_address} {' '.join(CLOUDQUOTAS_NAMES)}\n"
                              f"{self.monitoring_address} {' '.join(MONITORING_NAMES)}\n"
                              f"{self.vertex_address} {' '.join(VERTEX_NAMES)}\n"
                              f"{self.logging_address} {' '.join(LOGGING_NAMES)}\n"
                              f"{self.oslogin_address} {' '.join(OSLOGIN_NAMES)}\n")
        self.billing = CatalogServer(Catalog(disabled_projects={project}, identity=self.compute.state),
                                     self.billing_address, context)
        self.checkip = CheckIpServer(self.checkip_address, context)
        self.project_apis = ProjectApisServer(ProjectApis(project), self.compute.state, self.billing.catalog,
                                              self.project_address, context)
        # Compute enforces the project's organisation policies at insert (tests/world/oslogin.py).
        self.compute.state.org_policies = self.project_apis.apis.policies
        account = json.loads(self.credentials.read_text())
        self.oslogin = OsLoginServer(OsLogin(operator_email=account["client_email"], operator_id=account["client_id"]),
                                     self.compute.state, self.oslogin_address, context)
        vertex_state = VertexState(project, self.project_apis.apis.project_number)
        self.cloudquotas = CloudQuotasServer(CloudQuotas(), self.compute.state, self.project_apis.enabled,
                                             self.cloudquotas_address, context,
                                             {"aiplatform.googleapis.com": vertex_state.quota_infos})
        self.monitoring = MonitoringServer(Monitoring(), self.compute.state, self.project_apis.enabled,
                                           self.monitoring_address, context)
        self.cloud_logging = LoggingServer(LoggingState(project), self.compute.state, self.project_apis,
                                           self.logging_address, context)
        # tests/world/vertex_replicas.py's runtime, made for the first job.
        self._replicas, self._replicas_lock = None, threading.Lock()
        self.vertex = VertexServer(Vertex(vertex_state, self.compute.state, self.project_apis, self.cloud_logging.state,
                                          lambda: self.replicas(root)), self.vertex_address, context)

    def replicas(self, root: Path):
        """Vertex AI's replicas (Docker on the lab's own network), started with the first job."""
        from tests.world.vertex_replicas import ReplicaRuntime

        with self._replicas_lock:
            if self._replicas is None:
                self._replicas = ReplicaRuntime(self, root, self.vertex.vertex.log)
        return self._replicas

    def trust_store(self, folder: Path) -> Path:
        """A copy of this machine's /etc/ssl that also trusts the test CA: the bundle file
        (Python, curl) and a hashed entry in certs/ (TensorFlow's libcurl reads /etc/ssl/certs)."""
        import shutil
        import subprocess

        shutil.copytree("/etc/ssl", folder, symlinks=True)
        bundle = folder / "certs" / "ca-certificates.crt"
        text = bundle.read_text() if bundle.exists() else ""
        bundle.unlink(missing_ok=True)
        bundle.write_text(text + self.ca.read_text())
        digest = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", str(self.ca)], check=True,
                                capture_output=True, text=True).stdout.strip()
        shutil.copy(self.ca, folder / "certs" / f"{digest}.0")
        return folder

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
                   **dict.fromkeys(STORAGE_NAMES, self.storage_address),
                   **dict.fromkeys(BILLING_NAMES, self.billing_address),
                   **dict.fromkeys(ARTIFACTS_NAMES, self.artifacts_address),
                   **dict.fromkeys(CHECKIP_NAMES, self.checkip_address),
                   **dict.fromkeys(PROJECT_NAMES, self.project_address),
                   **dict.fromkeys(CLOUDQUOTAS_NAMES, self.cloudquotas_address),
                   **dict.fromkeys(MONITORING_NAMES, self.monitoring_address),
                   **dict.fromkeys(VERTEX_NAMES, self.vertex_address),
                   **dict.fromkeys(LOGGING_NAMES, self.logging_address),
                   **dict.fromkeys(OSLOGIN_NAMES, self.oslogin_address)}
        real = socket.getaddrinfo

        def getaddrinfo(host, *args, **kwargs):
            return real(mapping.get(host, host), *args, **kwargs)

        socket.getaddrinfo = getaddrinfo
        try:
            yield
        finally:
            socket.getaddrinfo = real

    def close(self) -> None:
        """All at once: each server's shutdown waits out its serve_forever poll (0.5 s)."""
        if self._replicas is not None:  # Containers and the lab's network first: no replica outlives the world.
            self._replicas.close()
        closers = [self.cloudquotas.close, self.monitoring.close, self.vertex.close, self.cloud_logging.close,
                   self.project_apis.close, self.oslogin.close, self.checkip.close, self.billing.close, self.artifacts.close, self.storage_proxy.close, self.storage.stop,
                   self.compute.close]
        threads = [threading.Thread(target=close) for close in closers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
