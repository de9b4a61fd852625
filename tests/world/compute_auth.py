"""Who is calling Compute, and may they: the bearer token, and the IAM bindings that exist.

- Every request needs a valid access token: none is 401 with reason "required" ("Login Required."),
  an unknown one 401 reason "authError" ("Invalid Credentials")
  (https://cloud.google.com/compute/docs/api/how-tos/authorization; the JSON error reference
  https://cloud.google.com/apis/design/errors#http_mapping).
- ``state.tokens`` maps a token to its principal: the operator's (owner of the project: every
  permission, less ``state.missing_permissions``), or a VM's service account, which holds only
  what the bindings on an instance grant it (instances.setIamPolicy, as iam.tf's
  google_compute_instance_iam_member makes them): terraform/ grants nothing project-wide.
- Over a rate limit, or with the API disabled, Compute refuses before anything else (rate_limited,
  service_disabled; sources in their docstrings and tests/fake_compute.py's).
- A role's permissions: the custom roles created through iam.googleapis.com (tests/world/iam_api.py),
  or the predefined ones below (https://cloud.google.com/compute/docs/access/iam).
"""

from __future__ import annotations

import re

BASE = "/compute/v1/projects/(?P<project>[^/]+)"
OPERATOR = "user:operator@example.com"
# The token oauth2.googleapis.com hands the operator's key (tests/fake_compute.py, /token).
OPERATOR_TOKEN = "ya29.test-world"
PREDEFINED = {
    "roles/compute.viewer": {"compute.instances.get", "compute.instances.list", "compute.instances.getGuestAttributes",
                             "compute.zoneOperations.get", "compute.zoneOperations.list"},
    "roles/compute.instanceAdmin.v1": {"compute.instances.get", "compute.instances.list", "compute.instances.delete",
                                       "compute.instances.start", "compute.instances.stop",
                                       "compute.instances.setMetadata", "compute.instances.getGuestAttributes",
                                       "compute.zoneOperations.get"},
}
# The permission an instance method needs (each method's "IAM Permissions" in the API reference).
INSTANCE_METHODS = [
    ("GET", "", "compute.instances.get"), ("DELETE", "", "compute.instances.delete"),
    ("POST", "/setMetadata", "compute.instances.setMetadata"), ("POST", "/start", "compute.instances.start"),
    ("POST", "/stop", "compute.instances.stop"), ("POST", "/setScheduling", "compute.instances.setScheduling"),
    ("GET", "/getGuestAttributes", "compute.instances.getGuestAttributes"),
    ("GET", "/getIamPolicy", "compute.instances.getIamPolicy"),
    ("POST", "/setIamPolicy", "compute.instances.setIamPolicy"),
]


def _refuse(code: int, reason: str, message: str) -> tuple[int, dict]:
    return code, {"error": {"code": code, "message": message, "status": "UNAUTHENTICATED" if code == 401 else
                            "PERMISSION_DENIED", "errors": [{"message": message, "domain": "global",
                                                             "reason": reason}]}}


def role_permissions(state, role: str) -> set[str]:
    return set(state.custom_roles.get(role, PREDEFINED.get(role, set())))


def check(state, method: str, path: str, headers: dict) -> tuple[int, dict] | None:
    """None when the caller may make this request, else Compute's refusal."""
    token = headers.get("Authorization", "").removeprefix("Bearer ").strip()
    if not token:
        return _refuse(401, "required", "Login Required.")
    principal = state.tokens.get(token)
    if principal is None:
        return _refuse(401, "authError", "Invalid Credentials")
    if principal == OPERATOR:
        return None
    match = re.fullmatch(BASE + r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)(?P<verb>/\w+)?", path)
    if match is None:  # Operations and lists: what a VM's calls need to follow up, nothing more.
        return None if "/operations/" in path else _denied(principal, "compute.instances.list", path)
    permission = next((p for verb, suffix, p in INSTANCE_METHODS
                       if verb == method and suffix == (match["verb"] or "")), None)
    instance = state.instances.get(match["name"])
    bindings = (instance or {}).get("iam_bindings", [])
    granted = set().union(*(role_permissions(state, b["role"]) for b in bindings if principal in b.get("members", [])))
    if permission is None or permission not in granted:
        return _denied(principal, permission or f"{method} {match['verb']}", path)
    return None


def _denied(principal: str, permission: str, path: str) -> tuple[int, dict]:
    return _refuse(403, "forbidden", f"Required '{permission}' permission for "
                                     f"'{path.removeprefix('/compute/v1/')}'")


def rate_limited(status: int) -> tuple[int, dict]:
    """Compute's answer to a call over a rate limit: "you receive a 403 error with the reason
    rateLimitExceeded" (https://cloud.google.com/compute/docs/api-rate-limits); newer front ends
    answer 429 RESOURCE_EXHAUSTED (https://cloud.google.com/apis/design/errors#handling_errors)."""
    if status == 403:
        return 403, {"error": {"code": 403, "message": "Rate Limit Exceeded", "errors": [
            {"message": "Rate Limit Exceeded", "domain": "usageLimits", "reason": "rateLimitExceeded"}]}}
    return 429, {"error": {"code": 429, "message": "Quota exceeded for quota metric 'Read requests' and limit "
                           "'Read requests per minute' of service 'compute.googleapis.com'.",
                           "status": "RESOURCE_EXHAUSTED", "errors": [{"message": "Rate Limit Exceeded",
                                                                       "domain": "usageLimits",
                                                                       "reason": "rateLimitExceeded"}]}}


def service_disabled(project: str) -> tuple[int, dict]:
    message = (f"Compute Engine API has not been used in project {project} before or it is disabled. Enable it "
               f"by visiting https://console.developers.google.com/apis/api/compute.googleapis.com/overview?"
               f"project={project} then retry.")
    return 403, {"error": {"code": 403, "message": message, "status": "PERMISSION_DENIED",
                           "errors": [{"message": message, "domain": "usageLimits", "reason": "accessNotConfigured"}],
                           "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "SERVICE_DISABLED",
                                        "domain": "googleapis.com",
                                        "metadata": {"service": "compute.googleapis.com", "consumer": f"projects/{project}"}}]}}
