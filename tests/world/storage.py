"""Cloud Storage's front door in the test world: an HTTP proxy before gcp-storage-emulator that
checks each request's identity, scopes and permission, as Google's front end and IAM would.

Identities are told apart by their bearer token, resolved as every Google API resolves it
(tests/world/compute_auth.py, ``identify``): the operator, who owns the project, or a VM's own
service account. A request without a token is refused with 401 (a private bucket:
https://cloud.google.com/storage/docs/json_api/v1/status-codes#401-unauthorized, reason
"required"); an unknown or expired one with 401 "Invalid Credentials" (reason authError, same
page). A token whose scopes cover none of the method's (storage.v1.json's `scopes`; for the XML
API, the devstorage scopes of a read or a write) gets 403 "Request had insufficient authentication
scopes." A service account's permissions are those of the roles bound to it in the policy of the
bucket the request names (buckets.getIamPolicy / setIamPolicy, GET and PUT /storage/v1/b/B/iam,
kept here since the emulator has no IAM), as IAM enforces it: a policy takes effect after the
world's IAM delay (https://cloud.google.com/iam/docs/access-change-propagation), and a grant on one
bucket gives nothing on another. A denied request gets Google's 403 shape
(https://cloud.google.com/storage/docs/json_api/v1/status-codes#403-forbidden).
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlsplit

from tests.world import discovery
from tests.world.compute_auth import OPERATOR, insufficient_scopes
from tests.world.http import WorldServer
from tests.world.iam import needed, permissions_of

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def is_object_write(method: str, path: str) -> bool:
    """An upload (media, multipart or resumable: POST/PUT under /upload/storage/v1/b/B/o), or a
    change or deletion of an object (https://cloud.google.com/storage/docs/json_api/v1/objects)."""
    if path.startswith("/upload/storage/v1/b/"):
        return method in ("POST", "PUT")
    return method in ("DELETE", "PATCH", "PUT") and "/o/" in path and path.startswith("/storage/v1/b/")


def written_object(method: str, target: str, body: bytes) -> str | None:
    """The object a write names, or None for the rest of a resumable upload (a PUT with its
    upload_id: the object was named by the POST that began it). Names come from the path
    (objects/patch, update, delete), the `name` query parameter (media and resumable uploads), or
    the JSON metadata part of a multipart upload's body
    (https://cloud.google.com/storage/docs/uploading-objects#uploading-an-object)."""
    parts = urlsplit(target)
    query = parse_qs(parts.query)
    if not parts.path.startswith("/upload/"):
        return unquote(parts.path.split("/o/", 1)[1])
    if "upload_id" in query:
        return None
    if "name" in query:
        return query["name"][0]
    found = re.search(rb'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', body)
    return json.loads(b'"' + found[1] + b'"') if found else None


def kept_labels(upstream: tuple[str, int], headers: dict, body: bytes, created: bytes) -> bytes:
    """buckets.insert stores the labels of the bucket resource it is given, as Google does ("labels: User-provided
    labels, in key/value pairs", https://cloud.google.com/storage/docs/json_api/v1/buckets#resource, supplied
    whole in the insert's body: https://cloud.google.com/storage/docs/json_api/v1/buckets/insert);
    gcp-storage-emulator keeps only the name on insert (handlers/buckets.py insert) and labels only on
    buckets.patch, so they are patched in before the answer goes back. A bucket found by its labels (an
    orphan a killed `terraform apply` made, tfcluster issue 46) is found here as in Google."""
    labels = json.loads(body or b"{}").get("labels")
    if not labels:
        return created
    name = json.loads(created)["name"]
    connection = http.client.HTTPConnection(*upstream, timeout=60)
    try:
        connection.request("PATCH", f"/storage/v1/b/{name}", body=json.dumps({"labels": labels}).encode(),
                           headers={**headers, "Content-Type": "application/json"})
        patched = connection.getresponse()
        data = patched.read()
        return data if patched.status == 200 else created
    finally:
        connection.close()


def contract(method: str, target: str, body: bytes):
    """(call, refusal) of a JSON API request under storage.v1's discovery document
    (tests/world/discovery.py); (None, None) for what the document does not describe: the XML
    API's object paths, a resumable upload's later requests (its upload_id), a media download's
    /download prefix is the JSON API's objects.get. A JSON body is checked; upload bodies (media,
    multipart) are the object's bytes. Answers that are not JSON, or are media, are not checked."""
    parts = urlsplit(target)
    path, query = parts.path.removeprefix("/download"), parse_qs(parts.query, keep_blank_values=True)
    if not path.startswith(("/storage/v1/", "/upload/storage/v1/", "/resumable/upload/storage/v1/")):
        return None, None
    if "upload_id" in query:
        return None, None
    document = None
    if body and not path.startswith(("/upload/", "/resumable/")) and method in ("POST", "PUT", "PATCH"):
        document = json.loads(body)
    call, refused = discovery.check("storage.v1", method, path, query, document)
    if call is not None and "media" in query.get("alt", []):
        return None, refused
    return call, refused


# The scopes that let a token use the XML API (https://cloud.google.com/storage/docs/oauth-scopes):
# reads with any devstorage scope, writes with read_write or full_control; cloud-platform for both.
READ_SCOPES = ["https://www.googleapis.com/auth/devstorage.read_only", "https://www.googleapis.com/auth/cloud-platform",
               "https://www.googleapis.com/auth/cloud-platform.read-only"]
WRITE_SCOPES = ["https://www.googleapis.com/auth/devstorage.read_write",
                "https://www.googleapis.com/auth/devstorage.full_control", "https://www.googleapis.com/auth/cloud-platform"]


def xml_scopes(method: str) -> list[str]:
    return READ_SCOPES + WRITE_SCOPES if method in ("GET", "HEAD") else WRITE_SCOPES


def whole_list(target: str) -> str:
    """objects.list as the emulator is asked it: every item (it does not page); the door pages."""
    from urllib.parse import urlencode

    parts = urlsplit(target)
    query = [(k, v) for k, values in parse_qs(parts.query, keep_blank_values=True).items() for v in values
             if k not in ("pageToken", "maxResults")]
    return parts.path + ("?" + urlencode(query) if query else "")


def one_page(answer: dict, query: dict, limit: int) -> dict:
    """objects.list a page at a time: "maxResults: Maximum combined number of entries in items[]
    and prefixes[] to return in a single page of responses ... The service uses this parameter or
    1,000 items, whichever is smaller", and nextPageToken while more remain
    (https://cloud.google.com/storage/docs/json_api/v1/objects/list). Prefixes ride on the first page."""
    size = min(int((query.get("maxResults") or ["1000"])[0] or 1000), 1000, limit)
    token = (query.get("pageToken") or [""])[0]
    start = int(token) if token.isdigit() else 0
    items = answer.get("items") or []
    page = {**answer, "items": items[start:start + size]}
    if start:
        page.pop("prefixes", None)
    if start + size < len(items):
        page["nextPageToken"] = str(start + size)
    return page


def encoded_links(answer: dict) -> dict:
    """The emulator's object links as Cloud Storage writes them: its mediaLink and selfLink carry
    the object name raw, where Google's encode it as one path segment ("/" as %2F: "the JSON API
    requires that object names in the URL path are percent-encoded",
    https://cloud.google.com/storage/docs/request-endpoints#encoding), and clients follow the
    mediaLink as it is (google-cloud-storage's Blob.download_to_filename)."""
    from urllib.parse import quote

    for item in [answer, *(answer.get("items") or [])] if isinstance(answer, dict) else []:
        if isinstance(item, dict) and item.get("kind") == "storage#object" and item.get("name"):
            raw, encoded = f"/o/{item['name']}", f"/o/{quote(item['name'], safe='')}"
            for key in ("mediaLink", "selfLink"):
                if isinstance(item.get(key), str) and raw in item[key]:
                    item[key] = item[key].replace(raw, encoded, 1)
    return answer


class IamStorageProxy:
    def __init__(self, listens: list[tuple[str, int, ssl.SSLContext | None]], upstream: tuple[str, int],
                 identify: Callable[[str], tuple[str, set[str]] | None], iam_delay: Callable[[], float] = lambda: 0.0):
        # Bearer token -> (member, OAuth scopes), e.g. "serviceAccount:x@p.iam.gserviceaccount.com",
        # or None for a token Google does not know (compute_auth.identify).
        self.identify = identify
        self.iam_delay = iam_delay
        # Bucket -> its IAM bindings [{"role", "members"}], as setIamPolicy left them (read back at once).
        self.policies: dict[str, list[dict]] = {}
        # Bucket -> [(time it takes effect, bindings)]: what IAM enforces (``granted``).
        self.enforced: dict[str, list[tuple[float, list[dict]]]] = {}
        # (method, path, token, allowed) of every request, for the tests to read.
        self.log: list[tuple[str, str, str, bool]] = []
        # (token, object name) of every object write IAM allowed, so a test can say whose
        # identity wrote each object.
        self.object_writes: list[tuple[str, str]] = []
        # Permissions the project owner's token (the operator) lacks, as when a project's admin
        # grants Compute but not Storage: its requests that need one answer 403 as IAM does.
        self.owner_missing: set[str] = set()
        # The most objects one objects.list page holds (Google's default and cap: 1000); lowered
        # by a test that must see every page read.
        self.page_limit = 1000
        # Object writes passed on so far, and the number after which further writes are held
        # (None: never), so a test can kill a writer mid-upload: a held write waits for
        # ``release`` and is then refused with a 503 instead of reaching the emulator, as a
        # request whose sender died before it was complete never reaches Cloud Storage.
        self.writes_passed = 0
        self.hold_writes_after: int | None = None
        self.holding = threading.Event()
        self.release = threading.Event()
        self._writes_lock = threading.Lock()
        # Client addresses whose reads of objects under data/ go unanswered: the request is read,
        # then its connection stays open with no reply, as when the path to Cloud Storage stops
        # passing packets mid-read; TensorFlow's GCS client waits out its own request timeouts and
        # retries (tsl/platform/cloud/gcs_file_system.cc, retrying_utils.cc) into the same silence.
        # Until ``reads_release`` is set; then the connection is dropped.
        self.hold_reads_from: set[str] = set()
        self.reads_held = 0
        self.reads_release = threading.Event()
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

            def _json(self, status: int, payload: dict) -> None:
                self._reply(status, [("Content-Type", "application/json; charset=UTF-8")], json.dumps(payload).encode())

            def _serve(self):
                body = self._body()
                path = urlsplit(self.path).path
                token = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
                known = proxy.identify(token) if token else None
                if known is None:
                    proxy.log.append((self.command, path, token, False))
                    message, reason = ("Invalid Credentials", "authError") if token else (
                        "Anonymous caller does not have storage.objects.get access to the Google Cloud Storage "
                        "object.", "required")
                    self._json(401, {"error": {"code": 401, "message": message, "errors": [
                        {"message": message, "domain": "global", "reason": reason,
                         "locationType": "header", "location": "Authorization"}]}})
                    return
                member, scopes = known
                owner = member == OPERATOR
                call, refused = contract(self.command, self.path, body)
                if refused is None and not scopes & set(call.scopes if call else xml_scopes(self.command)):
                    refused = insufficient_scopes(call) if call else insufficient_scopes(
                        discovery.check("storage.v1", "GET", "/storage/v1/b/b/o/o", {}, None)[0])
                if refused is not None:
                    proxy.log.append((self.command, path, token, False))
                    self._json(*refused)
                    return
                iam = re.fullmatch(r"/storage/v1/b/([^/]+)/iam", path)
                if iam and owner and self.command in ("GET", "PUT"):
                    proxy.log.append((self.command, path, token, True))
                    if self.command == "PUT":
                        proxy.policies[iam[1]] = json.loads(body).get("bindings", [])
                        proxy.enforced.setdefault(iam[1], []).append((time.monotonic() + proxy.iam_delay(),
                                                                      proxy.policies[iam[1]]))
                    policy = {"kind": "storage#policy", "resourceId": f"projects/_/buckets/{iam[1]}",
                              "version": 1, "etag": "CAE=", "bindings": proxy.policies.get(iam[1], [])}
                    call.api.check_response(call, 200, policy)
                    self._json(200, policy)
                    return
                permissions = needed(self.command, path)
                granted = proxy.granted(member, path)
                if owner:
                    granted = {p for p in (permissions or set()) if p not in proxy.owner_missing}
                allowed = permissions is not None and permissions <= granted if not owner \
                    else not (permissions or set()) & proxy.owner_missing
                proxy.log.append((self.command, path, token, allowed))
                if not allowed:
                    missing = sorted((permissions or {"(unknown request)"}) - granted)
                    who = member.split(":", 1)[1]
                    message = (f"{who} does not have {missing[0]} "
                               "access to the Google Cloud Storage bucket. Permission "
                               f"'{missing[0]}' denied on resource (or it may not exist).")
                    payload = json.dumps({"error": {"code": 403, "message": message, "errors": [
                        {"message": message, "domain": "global", "reason": "forbidden"}]}}).encode()
                    self._reply(403, [("Content-Type", "application/json; charset=UTF-8")], payload)
                    return
                if (self.command == "GET" and self.client_address[0] in proxy.hold_reads_from
                        and "/data/" in unquote(path)):
                    proxy.reads_held += 1
                    proxy.reads_release.wait(timeout=900)
                    self.close_connection = True  # Dropped without a reply.
                    return
                if is_object_write(self.command, path):
                    name = written_object(self.command, self.path, body)
                    if name is not None:
                        proxy.object_writes.append((token, name))
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
                listing = call is not None and call.id == "storage.objects.list"
                connection.request(self.command, whole_list(self.path) if listing else self.path, body=body,
                                   headers=headers)
                response = connection.getresponse()
                data = response.read()
                if call is not None and call.id == "storage.buckets.insert" and response.status == 200:
                    data = kept_labels(upstream, headers, body, data)
                if call is not None and "json" in (response.getheader("Content-Type") or "") and data.strip():
                    answer = encoded_links(json.loads(data))
                    if listing and response.status == 200:
                        answer = one_page(answer, call.query, proxy.page_limit)
                    call.api.check_response(call, response.status, answer)
                    data = json.dumps(answer).encode()
                gone = re.fullmatch(r"/storage/v1/b/([^/]+)", path)
                if gone and self.command == "DELETE" and response.status < 300:
                    proxy.policies.pop(gone[1], None)  # A policy belongs to its bucket.
                    proxy.enforced.pop(gone[1], None)
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

    def granted(self, member: str, path: str) -> set[str]:
        """The permissions ``member`` holds on the bucket ``path`` names (JSON or XML API), by the
        policy IAM enforces now."""
        match = re.match(r"/(?:upload/|download/)?storage/v1/b/([^/]+)", path) or re.match(r"/([^/]+)/", path)
        if match is None:
            return set()
        if match[1] in self.enforced:
            now = time.monotonic()
            versions = [bindings for at, bindings in self.enforced[match[1]] if at <= now]
            bindings = versions[-1] if versions else []
        else:  # A policy a test wrote straight into ``policies``: in effect.
            bindings = self.policies.get(match[1], [])
        roles = [b["role"] for b in bindings if member in b.get("members", [])]
        return permissions_of(roles)

    def listen(self, address: str, port: int, context: ssl.SSLContext | None) -> None:
        """One more door (for example on the test hosts' bridge, for TensorFlow on the hosts)."""
        server = WorldServer((address, port), self.handler)
        if context is not None:
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self.servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
