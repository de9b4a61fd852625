"""A fake Compute Engine API: a local HTTP server speaking the REST shapes that
google-cloud-compute sends and receives, for the few calls tfcluster makes.

State lives in ``FakeCompute``; tests and the fake terraform change it through
``/_fake/...`` endpoints (as the real control plane would change by itself).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

BASE = "/compute/v1/projects/(?P<project>[^/]+)"


@dataclass
class FakeCompute:
    project: str = "demo-project"
    accelerators: dict = field(default_factory=lambda: {"us-west1-b": ["nvidia-tesla-t4", "nvidia-tesla-v100"]})
    region_quotas: dict = field(default_factory=lambda: {"us-west1": {"NVIDIA_T4_GPUS": (8.0, 0.0),
                                                                      "NVIDIA_V100_GPUS": (4.0, 0.0)}})
    project_quotas: dict = field(default_factory=lambda: {"GPUS_ALL_REGIONS": (16.0, 0.0)})
    # name -> {"zone", "labels", "status", "guest": {path: value}, "metadata": {...}}
    instances: dict = field(default_factory=dict)
    requests: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _error(code: int, message: str) -> tuple[int, dict]:
    return code, {"error": {"code": code, "message": message,
                            "errors": [{"message": message, "domain": "global", "reason": "notFound"}]}}


def route(state: FakeCompute, method: str, path: str, query: dict, body: dict | None,
          headers: dict) -> tuple[int, dict]:
    state.requests.append({"method": method, "path": path, "query": query, "authorization":
                           headers.get("Authorization", "")})
    if path == "/_fake/instances" and method == "POST":
        with state.lock:
            state.instances[body["name"]] = {"status": "RUNNING", "guest": {}, **body}
        return 200, {}
    if path == "/_fake/guest" and method == "POST":
        with state.lock:
            state.instances[body["name"]]["guest"][body["path"]] = body["value"]
        return 200, {}
    if path == "/_fake/delete" and method == "POST":
        with state.lock:
            state.instances.pop(body["name"], None)
        return 200, {}
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/acceleratorTypes", path)
    if match and method == "GET":
        zone = match["zone"]
        items = [{"kind": "compute#acceleratorType", "name": name, "zone": f"projects/{state.project}/zones/{zone}",
                  "maximumCardsPerInstance": 4, "description": name} for name in state.accelerators.get(zone, [])]
        return 200, {"kind": "compute#acceleratorTypeList", "id": f"projects/{state.project}/zones/{zone}/acceleratorTypes",
                     "items": items}
    match = re.fullmatch(BASE + "/regions/(?P<region>[^/]+)", path)
    if match and method == "GET":
        quotas = [{"metric": metric, "limit": limit, "usage": usage}
                  for metric, (limit, usage) in state.region_quotas.get(match["region"], {}).items()]
        return 200, {"kind": "compute#region", "name": match["region"], "status": "UP", "quotas": quotas}
    match = re.fullmatch(BASE, path)
    if match and method == "GET":
        quotas = [{"metric": metric, "limit": limit, "usage": usage}
                  for metric, (limit, usage) in state.project_quotas.items()]
        return 200, {"kind": "compute#project", "name": match["project"], "quotas": quotas}
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)/getGuestAttributes", path)
    if match and method == "GET":
        instance = state.instances.get(match["name"])
        if instance is None:
            return _error(404, f"The resource 'projects/{state.project}/zones/{match['zone']}/instances/"
                               f"{match['name']}' was not found")
        prefix = query.get("queryPath", [""])[0]
        items = [{"namespace": p.split("/")[0], "key": p.split("/", 1)[1], "value": v}
                 for p, v in instance["guest"].items() if p.startswith(prefix)]
        if not items:
            return _error(404, f"The resource 'guestAttributes/{prefix}' was not found")
        return 200, {"kind": "compute#guestAttributes", "queryPath": prefix, "queryValue": {"items": items}}
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/instances", path)
    if match and method == "GET":
        wanted = query.get("filter", [""])[0]
        label = re.fullmatch(r"labels\.([a-z0-9_-]+)=([a-z0-9_-]+)", wanted)
        items = []
        for name, instance in sorted(state.instances.items()):
            if instance.get("zone") != match["zone"]:
                continue
            if label and instance.get("labels", {}).get(label[1]) != label[2]:
                continue
            items.append({"kind": "compute#instance", "name": name, "status": instance["status"],
                          "labels": instance.get("labels", {}), "zone": f"projects/{state.project}/zones/{match['zone']}",
                          "creationTimestamp": instance.get("created", "2026-11-22T05:00:00.000-08:00"),
                          "lastStartTimestamp": instance.get("started", "2026-11-22T05:00:00.000-08:00")})
        return 200, {"kind": "compute#instanceList", "items": items}
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)(?P<verb>/setMetadata|/start)?",
                         path)
    if match and match["name"] not in state.instances and method in ("GET", "POST"):
        return _error(404, f"instance {match['name']} not found")
    if match and method == "GET" and not match["verb"]:
        instance = state.instances[match["name"]]
        metadata = instance.setdefault("metadata", {})
        return 200, {"kind": "compute#instance", "name": match["name"], "status": instance["status"],
                     "labels": instance.get("labels", {}),
                     "creationTimestamp": instance.get("created", "2026-11-22T05:00:00.000-08:00"),
                     "lastStartTimestamp": instance.get("started", "2026-11-22T05:00:00.000-08:00"),
                     "scheduling": {"maxRunDuration": {"seconds": str(instance.get("max_run_seconds", 43200))},
                                    "instanceTerminationAction": "STOP"},
                     "metadata": {"kind": "compute#metadata", "fingerprint": instance.get("fingerprint", "ZmluZ2VyMQ=="),
                                  "items": [{"key": k, "value": v} for k, v in sorted(metadata.items())]}}
    if match and method == "POST" and match["verb"] in ("/setMetadata", "/start"):
        instance = state.instances[match["name"]]
        with state.lock:
            if match["verb"] == "/setMetadata":
                if body.get("fingerprint") != instance.get("fingerprint", "ZmluZ2VyMQ=="):
                    return 412, {"error": {"code": 412, "message": "Supplied fingerprint does not match current "
                                                                   "metadata fingerprint.", "errors": []}}
                instance["metadata"] = {item["key"]: item["value"] for item in body.get("items", [])}
                instance["fingerprint"] = f"ZmluZ2Vy{len(state.requests)}"
            else:
                instance["status"] = "RUNNING"
        operation = {"kind": "compute#operation", "name": f"operation-{len(state.requests)}",
                     "operationType": match["verb"][1:], "status": "DONE", "progress": 100,
                     "targetLink": f"https://compute.googleapis.com{path}",
                     "zone": f"projects/{match['project']}/zones/{match['zone']}"}
        return 200, operation
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)(/wait)?", path)
    if match:
        return 200, {"kind": "compute#operation", "name": match["op"], "status": "DONE", "progress": 100}
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)", path)
    if match and method == "DELETE":
        if match["name"] not in state.instances:
            return _error(404, f"instance {match['name']} not found")
        with state.lock:
            state.instances[match["name"]]["status"] = "STOPPING"
        return 200, {"kind": "compute#operation", "name": "operation-1795300000000-delete", "operationType": "delete",
                     "status": "RUNNING", "targetLink": f"https://compute.googleapis.com{path}",
                     "zone": f"projects/{match['project']}/zones/{match['zone']}"}
    return _error(404, f"fake compute: no route for {method} {path}")


class FakeComputeServer:
    def __init__(self, state: FakeCompute | None = None):
        self.state = state or FakeCompute()
        state_ref = self.state

        class Handler(BaseHTTPRequestHandler):
            def _serve(self):
                parsed = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null") if length else None
                code, payload = route(state_ref, self.command, parsed.path, parse_qs(parsed.query), body,
                                      dict(self.headers))
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
