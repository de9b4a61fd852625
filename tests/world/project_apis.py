"""The project-level APIs `invoke check` reads, over HTTPS on the world's names:
serviceusage.googleapis.com, cloudresourcemanager.googleapis.com and orgpolicy.googleapis.com.

Who calls is the bearer token, as Compute judges it (tests/world/compute_auth.py: none is 401,
an unknown one 401). From each method's reference:
- Service Usage services.batchGet, GET /v1/projects/P/services:batchGet?names=projects/P/services/S
  (repeated, at most 30) answers {"services": [{"name": "projects/NUMBER/services/S", "parent",
  "state": "ENABLED"|"DISABLED"}]}; needs serviceusage.services.get
  (https://cloud.google.com/service-usage/docs/reference/rest/v1/services/batchGet).
  Which services are on: ``disabled`` here, Compute's own ``service_disabled`` switch (so the
  two never disagree) and the Billing catalog's disabled projects.
- Resource Manager projects.testIamPermissions, POST /v1/projects/P:testIamPermissions
  {"permissions": [...]} answers {"permissions": the subset the caller holds}, or {} when none;
  it never refuses for a missing permission (that is what it reports). The operator holds
  everything but Compute's ``missing_permissions``; a VM's service account holds no project role
  (https://cloud.google.com/resource-manager/reference/rest/v1/projects/testIamPermissions).
- Resource Manager v1 projects.getEffectiveOrgPolicy (legacy constraints only; ProjectApisServer.v1_policy).
- Org Policy v2 projects.policies.getEffectivePolicy, GET /v2/projects/P/policies/C:getEffectivePolicy,
  answers the merged Policy {"name", "spec": {"rules": [{"enforce": true} | {"allowAll": true} |
  {"denyAll": true} | {"values": {"allowedValues", "deniedValues"}}]}}; needs orgpolicy.policies.get
  (https://cloud.google.com/resource-manager/docs/reference/orgpolicy/rest/v2/projects.policies/getEffectivePolicy).
  With no policy set anywhere the spec has no rules: the constraint's default (not enforced, allow all).
- A disabled API answers 403 PERMISSION_DENIED with an ErrorInfo reason SERVICE_DISABLED
  (https://cloud.google.com/apis/design/errors); a missing permission 403 PERMISSION_DENIED with
  reason IAM_PERMISSION_DENIED.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlparse

from tests.world import compute_auth, discovery
from tests.world.http import QuietHandler, TlsServer, send_json

PROJECT_NAMES = ("serviceusage.googleapis.com", "cloudresourcemanager.googleapis.com", "orgpolicy.googleapis.com")


@dataclass
class ProjectApis:
    project: str
    project_number: str = "123456789012"
    # Services switched off in the project, beyond Compute's and Billing's own switches.
    disabled: set = field(default_factory=set)
    # Effective organisation policies: constraint name (e.g. "compute.requireOsLogin") -> rules.
    policies: dict = field(default_factory=dict)
    # Host names asked, with the path, for the tests to read.
    requests: list = field(default_factory=list)
    # The organisation each project is in (project ID -> organisation ID; none by default, as a
    # project made without one), and each organisation's domain (ID -> displayName).
    ancestry: dict = field(default_factory=dict)
    organizations: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _error(code: int, status: str, message: str, reason: str = "", service: str = "") -> tuple[int, dict]:
    error = {"code": code, "status": status, "message": message}
    if reason:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                             "domain": "googleapis.com", "metadata": {"service": service}}]
    return code, {"error": error}


def _disabled(service: str, project: str) -> tuple[int, dict]:
    return _error(403, "PERMISSION_DENIED", f"{service} API has not been used in project {project} before or it is "
                  f"disabled. Enable it by visiting https://console.developers.google.com/apis/api/{service}/"
                  f"overview?project={project} then retry.", "SERVICE_DISABLED", service)


class ProjectApisServer(TlsServer):
    """The three APIs on ``address``:443, told apart by the Host header."""

    def __init__(self, apis: ProjectApis, compute, billing, address: str, context):
        self.apis, self.compute, self.billing = apis, compute, billing
        server_ref = self

        class Handler(QuietHandler):
            def _serve(self):
                parsed = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null") if length else None
                host = self.headers.get("Host", "").split(":")[0]
                query = parse_qs(parsed.query)
                code, payload = discovery.serve(
                    server_ref.document(host, parsed.path), self.command, parsed.path, query, body,
                    lambda call: compute_auth.scope_refusal(server_ref.compute, dict(self.headers), call)
                    or server_ref.route(host, self.command, parsed.path, query, body, dict(self.headers)))
                send_json(self, code, payload)

            do_GET = do_POST = _serve

        super().__init__(address, context, Handler)

    @staticmethod
    def document(host: str, path: str) -> str:
        """The discovery document of the API a request is for (tests/world/discovery.py)."""
        api = host.split(".", 1)[0]
        return {"serviceusage": "serviceusage.v1", "orgpolicy": "orgpolicy.v2"}.get(
            api, f"cloudresourcemanager.{path.split('/')[1]}")

    def enabled(self, service: str) -> bool:
        if service == "compute.googleapis.com":
            return not self.compute.service_disabled
        if service == "cloudbilling.googleapis.com":
            return self.apis.project not in self.billing.disabled_projects
        return service not in self.apis.disabled

    def route(self, host: str, method: str, path: str, query: dict, body, headers: dict) -> tuple[int, dict]:
        apis = self.apis
        with apis.lock:
            apis.requests.append((host, path))
        principal, refused = compute_auth.principal(self.compute, headers)
        if refused:
            return refused
        holds = (lambda permission: permission not in self.compute.missing_permissions
                 if principal == compute_auth.OPERATOR else False)
        if not self.enabled(host):
            return _disabled(host, apis.project)
        if host == "serviceusage.googleapis.com":
            match = re.fullmatch(r"/v1/projects/(?P<project>[^/]+)/services:batchGet", path)
            if method == "GET" and match:
                if not holds("serviceusage.services.get"):
                    return _error(403, "PERMISSION_DENIED", "Permission denied to get service "
                                  f"[{query.get('names', ['?'])[0]}]", "IAM_PERMISSION_DENIED", host)
                names = [name.rsplit("/", 1)[-1] for name in query.get("names", [])]
                if len(names) > 30:
                    return _error(400, "INVALID_ARGUMENT", "at most 30 names may be given")
                return 200, {"services": [
                    {"name": f"projects/{apis.project_number}/services/{name}", "parent": f"projects/{apis.project_number}",
                     "state": "ENABLED" if self.enabled(name) else "DISABLED"} for name in names]}
        if host == "cloudresourcemanager.googleapis.com":
            if method == "POST" and re.fullmatch(rf"/v1/projects/{re.escape(apis.project)}:testIamPermissions", path):
                granted = [p for p in (body or {}).get("permissions", []) if holds(p)]
                return 200, ({"permissions": granted} if granted else {})
            if method == "POST" and re.fullmatch(rf"/v1/projects/{re.escape(apis.project)}:getEffectiveOrgPolicy", path):
                return self.v1_policy((body or {}).get("constraint", ""), holds)
            found = self.ancestry_or_organization(method, path)
            if found is not None:
                return found
        if host == "orgpolicy.googleapis.com":
            match = re.fullmatch(r"/v2/projects/(?P<project>[^/]+)/policies/(?P<name>[^/:]+):getEffectivePolicy", path)
            if method == "GET" and match:
                if not holds("orgpolicy.policies.get"):
                    return _error(403, "PERMISSION_DENIED", f"Permission 'orgpolicy.policies.get' denied on "
                                  f"resource '{path[4:]}'", "IAM_PERMISSION_DENIED", host)
                return 200, {"name": f"projects/{apis.project_number}/policies/{match['name']}",
                             "spec": {"rules": apis.policies.get(match["name"], [])}}
        return _error(404, "NOT_FOUND", f"stand-in: no route for {method} {host}{path}")

    def ancestry_or_organization(self, method: str, path: str) -> tuple[int, dict] | None:
        """Resource Manager v1 projects.getAncestry ({"ancestor": [{"resourceId": {"type", "id"}}]},
        the project first, its organisation last) and organizations.get ({"name", "displayName": the
        domain, "lifecycleState"}); a project or organisation the caller cannot see is 403 "The caller
        does not have permission" (https://cloud.google.com/resource-manager/reference/rest/v1/projects/getAncestry,
        .../v1/organizations/get)."""
        apis = self.apis
        match = re.fullmatch(r"/v1/projects/(?P<project>[^/:]+):getAncestry", path)
        if method == "POST" and match:
            if match["project"] != apis.project and match["project"] not in apis.ancestry:
                return _error(403, "PERMISSION_DENIED", "The caller does not have permission")
            org = apis.ancestry.get(match["project"])
            return 200, {"ancestor": [{"resourceId": {"type": "project", "id": match["project"]}}]
                         + ([{"resourceId": {"type": "organization", "id": org}}] if org else [])}
        match = re.fullmatch(r"/v1/organizations/(?P<org>[^/:]+)", path)
        if method == "GET" and match:
            if match["org"] not in apis.organizations:
                return _error(403, "PERMISSION_DENIED", "The caller does not have permission")
            return 200, {"name": f"organizations/{match['org']}", "displayName": apis.organizations[match["org"]],
                         "lifecycleState": "ACTIVE"}
        return None

    def v1_policy(self, constraint: str, holds) -> tuple[int, dict]:
        """Resource Manager v1 projects.getEffectiveOrgPolicy: the same effective policies as v2, in
        v1's OrgPolicy shape (booleanPolicy.enforced; listPolicy allValues / allowedValues /
        deniedValues), legacy constraints only: managed ones (compute.managed.*) exist in v2 alone
        (https://cloud.google.com/resource-manager/reference/rest/v1/projects/getEffectiveOrgPolicy,
        https://cloud.google.com/compute/docs/access/managed-constraints). Needs orgpolicy.policy.get."""
        name = constraint.removeprefix("constraints/")
        if not holds("orgpolicy.policy.get"):
            return _error(403, "PERMISSION_DENIED", "The caller does not have permission", "IAM_PERMISSION_DENIED",
                          "cloudresourcemanager.googleapis.com")
        if not constraint.startswith("constraints/") or ".managed." in name:
            return _error(400, "INVALID_ARGUMENT", f"Request contains an invalid argument: constraint '{constraint}'.")
        policy = {"constraint": constraint}
        for rule in self.apis.policies.get(name, []):
            if "enforce" in rule:
                policy["booleanPolicy"] = {"enforced": bool(rule["enforce"])}
            elif rule.get("allowAll") or rule.get("denyAll"):
                policy["listPolicy"] = {"allValues": "ALLOW" if rule.get("allowAll") else "DENY"}
            elif rule.get("values"):
                policy["listPolicy"] = {k: v for k, v in rule["values"].items() if k in ("allowedValues", "deniedValues")}
        return 200, policy
