"""A fake Artifact Registry API (artifactregistry.googleapis.com, REST v1): the calls `invoke down`
makes with google-cloud-artifact-registry's REST transport, the provider stand-in's
repositories.create and delete (tests/world/provider/google_other.py), and a control door.

Behaviours modelled, with their sources (https://cloud.google.com/artifact-registry/docs/reference/rest):
- repositories.get returns a Repository whose `sizeBytes` is "the size, in bytes, of all artifact
  storage in this repository" (int64, so a JSON string); a missing repository answers 404
  NOT_FOUND in Google's error shape (https://cloud.google.com/apis/design/errors).
- repositories.dockerImages.list pages with pageSize / pageToken / nextPageToken; each DockerImage
  has name, uri, tags, imageSizeBytes, uploadTime, mediaType, updateTime.
- repositories.delete "deletes a repository and all of its contents" (projects.locations.
  repositories/delete): there is no refusal for a non-empty repository, unlike a bucket; its
  operation is done with a google.protobuf.Empty response and no metadata (the discovery document).
- repositories.create returns a long-running operation; an id that exists answers 409
  ALREADY_EXISTS (projects.locations.repositories/create).
- repositories.getIamPolicy (GET REPOSITORY:getIamPolicy) and setIamPolicy (POST
  REPOSITORY:setIamPolicy with {"policy"}) read and replace the repository's whole policy
  (https://cloud.google.com/artifact-registry/docs/reference/rest/v1/projects.locations.repositories/getIamPolicy,
  .../setIamPolicy); a repository without one answers an empty policy with its etag; a missing
  repository answers 404. Deleting a repository deletes its policy.
- A project that has not enabled the API answers 403 PERMISSION_DENIED with a google.rpc.ErrorInfo
  whose reason is SERVICE_DISABLED (as tests/fake_compute.py does for Compute).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlparse

from tests.world import compute_auth, discovery
from tests.world.http import WorldServer, send_json

REPOSITORY = r"/v1/(?P<repo>projects/(?P<project>[^/]+)/locations/[^/]+/repositories/[^/]+)"
NOW = "2026-11-22T20:00:00Z"


@dataclass
class FakeArtifactRegistry:
    project: str = "demo-project"
    # "projects/P/locations/L/repositories/R" -> list of DockerImage dicts (REST field names).
    repositories: dict = field(default_factory=dict)
    # The project has not enabled the Artifact Registry API: every call answers 403 SERVICE_DISABLED.
    service_disabled: bool = False
    # (method, path) of every API request, for the tests to read.
    requests: list = field(default_factory=list)
    # Repository name -> its IAM bindings [{"role", "members"}], as setIamPolicy left them.
    policies: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Google's identity system (the Compute stand-in's state, tests/world/compute_auth.py): who a
    # token is, and its scopes; None lets every request through (a registry tested alone).
    identity: object = None

    def add_image(self, repository: str, package: str, tag: str, size: int) -> None:
        digest = f"sha256:{abs(hash((package, tag))):064x}"[:71]
        host = repository.split("/")[3] + "-docker.pkg.dev"
        uri = f"{host}/{repository.split('/')[1]}/{repository.split('/')[-1]}/{package}@{digest}"
        with self.lock:
            self.repositories[repository].append({
                "name": f"{repository}/dockerImages/{package}@{digest}", "uri": uri, "tags": [tag],
                "imageSizeBytes": str(size), "uploadTime": NOW, "updateTime": NOW,
                "mediaType": "application/vnd.docker.distribution.manifest.v2+json"})


def _error(code: int, status: str, message: str) -> tuple[int, dict]:
    return code, {"error": {"code": code, "message": message, "status": status}}


def route(state: FakeArtifactRegistry, method: str, path: str, query: dict,
          body: dict | None = None) -> tuple[int, dict]:
    state.requests.append((method, path))
    if state.service_disabled:
        return 403, {"error": {
            "code": 403, "status": "PERMISSION_DENIED",
            "message": f"Artifact Registry API has not been used in project {state.project} before or it is "
                       "disabled. Enable it by visiting https://console.developers.google.com/apis/api/"
                       f"artifactregistry.googleapis.com/overview?project={state.project} then retry.",
            "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "SERVICE_DISABLED",
                         "domain": "googleapis.com", "metadata": {"service": "artifactregistry.googleapis.com",
                                                                  "consumer": f"projects/{state.project}"}}]}}
    parent = re.fullmatch(r"/v1/(?P<parent>projects/[^/]+/locations/[^/]+)/repositories", path)
    if method == "POST" and parent:
        # repositories.create: a long-running operation; an existing id answers 409 ALREADY_EXISTS.
        name = f"{parent['parent']}/repositories/{(query.get('repositoryId') or [''])[0]}"
        with state.lock:
            if name in state.repositories:
                return _error(409, "ALREADY_EXISTS", "the repository already exists")
            state.repositories[name] = []
        return 200, {"name": f"{parent['parent']}/operations/create-{name.rsplit('/', 1)[1]}", "done": True,
                     "response": {"name": name}}
    iam = re.fullmatch(REPOSITORY + r":(?P<verb>getIamPolicy|setIamPolicy)", path)
    if iam:
        with state.lock:
            if iam["repo"] not in state.repositories:
                return _error(404, "NOT_FOUND", "Requested entity was not found.")
            if iam["verb"] == "setIamPolicy" and method == "POST":
                state.policies[iam["repo"]] = (body or {}).get("policy", {}).get("bindings", [])
            return 200, {"version": 1, "etag": "BwY=", "bindings": state.policies.get(iam["repo"], [])}
    match = re.fullmatch(REPOSITORY + r"(?P<images>/dockerImages)?", path)
    if method == "DELETE" and match and not match["images"]:
        with state.lock:  # "deletes a repository and all of its contents"
            if state.repositories.pop(match["repo"], None) is None:
                return _error(404, "NOT_FOUND", "Requested entity was not found.")
            state.policies.pop(match["repo"], None)
        # artifactregistry.v1's discovery document, repositories.delete: "The returned Operation will finish
        # once the repository has been deleted. It will not have any Operation metadata and will return a
        # google.protobuf.Empty response." (Operation.name: "a resource name ending with operations/{unique_id}".)
        location = match["repo"].split("/repositories/")[0]
        return 200, {"name": f"{location}/operations/delete-{match['repo'].rsplit('/', 1)[1]}", "done": True,
                     "response": {"@type": "type.googleapis.com/google.protobuf.Empty"}}
    if method != "GET" or match is None:
        return _error(404, "NOT_FOUND", f"fake Artifact Registry does not serve {method} {path}")
    with state.lock:
        images = list(state.repositories.get(match["repo"], [])) if match["repo"] in state.repositories else None
    if images is None:
        return _error(404, "NOT_FOUND", "Requested entity was not found.")
    if match["images"]:
        size = int((query.get("pageSize") or ["0"])[0]) or 100
        start = int((query.get("pageToken") or ["0"])[0] or 0)
        page = {"dockerImages": images[start:start + size]}
        if start + size < len(images):
            page["nextPageToken"] = str(start + size)
        return 200, page
    return 200, {"name": match["repo"], "format": "DOCKER", "mode": "STANDARD_REPOSITORY",
                 "sizeBytes": str(sum(int(image["imageSizeBytes"]) for image in images)),
                 "createTime": NOW, "updateTime": NOW}


class FakeArtifactRegistryServer:
    """The API over HTTPS on ``tls`` (address, certfile, keyfile) port 443, where the test world
    points artifactregistry.googleapis.com, and a plain-HTTP control door on a loopback port:
    POST /_fake/repositories {"name"} creates, POST /_fake/delete {"name"} deletes with contents."""

    def __init__(self, state: FakeArtifactRegistry, tls: tuple[str, str, str]):
        self.state = state
        state_ref = state

        class Handler(BaseHTTPRequestHandler):
            def _serve(self):
                parsed = urlparse(self.path)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if parsed.path.startswith("/_fake/"):
                    name = json.loads(raw)["name"]
                    with state_ref.lock:
                        existed = name in state_ref.repositories
                        if parsed.path == "/_fake/repositories":
                            state_ref.repositories.setdefault(name, [])
                        else:
                            state_ref.repositories.pop(name, None)
                    code, payload = 200, {"existed": existed}
                else:  # Under artifactregistry.v1's discovery document (tests/world/discovery.py).
                    query, body = parse_qs(parsed.query), json.loads(raw) if raw else None
                    code, payload = discovery.serve(
                        "artifactregistry.v1", self.command, parsed.path, query, body,
                        lambda call: (state_ref.identity is not None and compute_auth.esf_refusal(
                            state_ref.identity, dict(self.headers), call))
                        or route(state_ref, self.command, parsed.path, query, body))
                send_json(self, code, payload)

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, *args):
                pass

        import ssl

        self.control = WorldServer(("127.0.0.1", 0), Handler)
        address, certfile, keyfile = tls
        secure = WorldServer((address, 443), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certfile, keyfile)
        secure.socket = context.wrap_socket(secure.socket, server_side=True)
        self.servers = [self.control, secure]
        for server in self.servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.control.server_address[1]}"

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
