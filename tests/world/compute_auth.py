"""Who is calling, and may they: the bearer token, its scopes, and the IAM bindings in effect.
One identity system for every stand-in (Compute, IAM, Artifact Registry, Billing, the project
APIs and the storage door all ask ``identify``).

- Every request needs a valid access token: none is 401 with reason "required" ("Login Required."),
  an unknown or expired one 401 reason "authError" ("Invalid Credentials")
  (https://cloud.google.com/compute/docs/api/how-tos/authorization; the JSON error reference
  https://cloud.google.com/apis/design/errors#http_mapping).
- A token carries OAuth scopes, and a method takes a token with any one of its discovery
  `scopes` (tests/world/discovery.py), else 403 "Request had insufficient authentication scopes."
  (``scope_refusal``); tokens expire (``issue_token``, the JWTs' `exp`).
- ``state.tokens`` maps a token to its principal: the operator's (owner of the project: every
  permission, less ``state.missing_permissions``), or a VM's service account, which holds only
  what the bindings on an instance grant it (instances.setIamPolicy, as iam.tf's
  google_compute_instance_iam_member makes them): terraform/ grants nothing project-wide.
  A request on an instance is allowed when a binding of THAT instance's policy names the caller's
  own principal with a role holding the method's permission; a binding for another member, or on
  another instance, grants the caller nothing ("you can grant roles on individual instances";
  https://cloud.google.com/compute/docs/access/iam,
  https://cloud.google.com/compute/docs/access/granting-access-to-resources,
  https://cloud.google.com/compute/docs/reference/rest/v1/instances/setIamPolicy), and a refusal is
  403 PERMISSION_DENIED naming the permission.
- A service account's token is ``token_for(email)``: what the metadata server of an instance that
  runs as that account hands its guest (tests/world/names.py, the metadata worlds), valid while the
  account exists: IAM (tests/world/iam_api.py) issues it at projects.serviceAccounts.create and
  revokes it at delete, since a deleted account's applications lose access
  (https://cloud.google.com/iam/docs/service-accounts-delete-undelete).
- Over a rate limit, or with the API disabled, Compute refuses before anything else (rate_limited,
  service_disabled; sources in their docstrings and tests/fake_compute.py's).
- A role's permissions: the custom roles created through iam.googleapis.com (tests/world/iam_api.py),
  or the predefined ones below (https://cloud.google.com/compute/docs/access/iam).
"""

from __future__ import annotations

import re
import time

BASE = "/compute/v1/projects/(?P<project>[^/]+)"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
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


def token_for(email: str) -> str:
    """The access token of service account ``email``: one per account, so that each VM's calls are
    its own principal's (``state.tokens`` resolves it while the account exists)."""
    return f"ya29.sa-{email}"


def account_of(record: dict | None) -> str | None:
    """The service account an instance runs as: serviceAccounts[0].email of the body it was
    inserted with (https://cloud.google.com/compute/docs/reference/rest/v1/instances, serviceAccounts:
    "only one service account per VM instance is supported"), None without one."""
    accounts = ((record or {}).get("body") or {}).get("serviceAccounts") or []
    return accounts[0].get("email") if accounts else None


def _refuse(code: int, reason: str, message: str) -> tuple[int, dict]:
    return code, {"error": {"code": code, "message": message, "status": "UNAUTHENTICATED" if code == 401 else
                            "PERMISSION_DENIED", "errors": [{"message": message, "domain": "global",
                                                             "reason": reason}]}}


def role_permissions(state, role: str) -> set[str]:
    return set(state.custom_roles.get(role, PREDEFINED.get(role, set())))


def bearer(headers: dict) -> str:
    # Header names are case-insensitive (RFC 9110); google-auth sends "authorization".
    value = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
    return value.removeprefix("Bearer ").strip()


def identify(state, token: str) -> tuple[str, set[str]] | None:
    """(principal, OAuth scopes) of a token Google knows now, else None (unknown, expired, or an
    account IAM does not yet show). Tokens oauth2.googleapis.com issued carry the scopes granted
    and expire (``state.issued``); a service account's token carries the scopes of the instance
    that runs as it (the metadata server hands a VM a token with its instance's serviceAccounts[].
    scopes: https://cloud.google.com/compute/docs/access/service-accounts#accesscopesiam);
    a self-signed JWT its `scope` claim, or all of an API with an `aud` claim, until its `exp`."""
    issued = state.issued.get(token)
    if issued is not None:
        who, scopes, expires = issued
        return (who, scopes) if time.time() < expires else None
    who = state.tokens.get(token)
    if who is not None:
        if who.startswith("serviceAccount:"):
            email = who.split(":", 1)[1]
            if not iam_shows(state, email):
                return None
            return who, instance_scopes(state, email)
        return who, {CLOUD_PLATFORM}
    return _signed_by_a_known_key(state, token)


def principal(state, headers: dict) -> tuple[str | None, tuple[int, dict] | None]:
    """(who holds the bearer token, None), or (None, Google's 401) when there is none or it is
    unknown or expired: 401 "Invalid Credentials" (reason authError) everywhere."""
    token = bearer(headers)
    if not token:
        return None, _refuse(401, "required", "Login Required.")
    known = identify(state, token)
    if known is None:
        return None, _refuse(401, "authError", "Invalid Credentials")
    return known[0], None


def iam_shows(state, email: str) -> bool:
    """A new service account is usable once IAM has propagated it (``state.iam_delay_seconds``
    after create: "it might take some time before the service account is available",
    https://cloud.google.com/iam/docs/service-accounts-create#creating; the provider waits for it,
    magic-modules #14447; tests/world/iam_api.py's ``unseen``)."""
    return time.monotonic() >= state.account_visible_at.get(email, 0.0)


def instance_scopes(state, email: str) -> set[str]:
    """The access scopes of the instances that run as ``email`` (the URLs instances.insert took);
    cloud-platform for an account no instance runs as (a token got another way)."""
    records = [r for r in state.instances.values() if account_of(r) == email]
    if not records:
        return {CLOUD_PLATFORM}
    return set().union(*(set(((r.get("body") or {}).get("serviceAccounts") or [{}])[0].get("scopes") or [])
                         for r in records))


def scope_refusal(state, headers: dict, call) -> tuple[int, dict] | None:
    """Google's 403 when the token's scopes cover none of the method's (its discovery `scopes`):
    "Request had insufficient authentication scopes.", reason insufficientPermissions, ErrorInfo
    ACCESS_TOKEN_SCOPE_INSUFFICIENT (the body Google sends, e.g. analogdotnow/Analog#296;
    DataBiosphere/leonardo#332 for Compute; https://cloud.google.com/compute/docs/access/service-accounts#accesscopesiam:
    "the access scopes ... and the IAM roles ... both" must allow the call)."""
    known = identify(state, bearer(headers))
    if known is None or not call.scopes or known[1] & set(call.scopes):
        return None
    return insufficient_scopes(call)


def insufficient_scopes(call) -> tuple[int, dict]:
    service = call.api.doc.get("rootUrl", "").removeprefix("https://").rstrip("/")
    parts = call.id.split(".")
    method = f"{parts[0]}.{call.api.doc.get('version', 'v1')}.{''.join(p[:1].upper() + p[1:] for p in parts[1:-1])}" \
             f"Service.{parts[-1][:1].upper()}{parts[-1][1:]}"
    message = "Request had insufficient authentication scopes."
    return 403, {"error": {"code": 403, "message": message, "status": "PERMISSION_DENIED",
                           "errors": [{"message": "Insufficient Permission", "domain": "global",
                                       "reason": "insufficientPermissions"}],
                           "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                        "reason": "ACCESS_TOKEN_SCOPE_INSUFFICIENT", "domain": "googleapis.com",
                                        "metadata": {"service": service, "method": method}}]}}


def esf_refusal(state, headers: dict, call) -> tuple[int, dict] | None:
    """What the newer front ends (Artifact Registry, Cloud Billing) answer a request whose token
    is missing, unknown or expired: 401 UNAUTHENTICATED with their text (e.g.
    googleapis/google-cloud-python issues quoting "Request had invalid authentication
    credentials. Expected OAuth 2 access token, ..."); then the scope check."""
    token = bearer(headers)
    if not token:
        return 401, {"error": {"code": 401, "status": "UNAUTHENTICATED",
                               "message": "Request is missing required authentication credential. Expected OAuth 2 "
                                          "access token, login cookie or other valid authentication credential."}}
    if identify(state, token) is None:
        return 401, {"error": {"code": 401, "status": "UNAUTHENTICATED",
                               "message": "Request had invalid authentication credentials. Expected OAuth 2 access "
                                          "token, login cookie or other valid authentication credential. See "
                                          "https://developers.google.com/identity/sign-in/web/devconsole-project."}}
    return scope_refusal(state, headers, call) if call is not None else None


def asserted_scopes(assertion: str) -> set[str]:
    """The `scope` claim of a JWT-bearer grant's assertion (what google-auth asks /token for)."""
    import base64
    import json

    try:
        claims = assertion.split(".")[1]
        return set(str(json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4))).get("scope", "")).split())
    except (IndexError, ValueError):
        return set()


def issue_token(state, who: str, scopes: set[str]) -> dict:
    """oauth2.googleapis.com/token's answer: a new access token for ``who`` with ``scopes``, valid
    ``state.token_lifetime`` seconds (Google's default is an hour; expires_in says so, and the
    google-auth clients refresh before it: google/auth/credentials.py, `expired`)."""
    import secrets

    token = f"ya29.issued-{secrets.token_urlsafe(12)}"
    state.issued[token] = (who, set(scopes), time.time() + state.token_lifetime)
    return {"access_token": token, "expires_in": int(state.token_lifetime), "token_type": "Bearer",
            "scope": " ".join(sorted(scopes))}


def check(state, method: str, path: str, headers: dict) -> tuple[int, dict] | None:
    """None when the caller may make this request, else Compute's refusal (IAM: the bindings that
    have taken effect, ``effective_bindings``)."""
    caller, refused = principal(state, headers)
    if refused:
        return refused
    if caller == OPERATOR:
        return None
    match = re.fullmatch(BASE + r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)(?P<verb>/\w+)?", path)
    if match is None:  # Operations and lists: what a VM's calls need to follow up, nothing more.
        return None if "/operations/" in path else _denied(caller, "compute.instances.list", path)
    permission = next((p for verb, suffix, p in INSTANCE_METHODS
                       if verb == method and suffix == (match["verb"] or "")), None)
    instance = state.instances.get(match["name"])
    bindings = effective_bindings(state, instance or {})
    granted = set().union(*(role_permissions(state, b["role"]) for b in bindings if caller in b.get("members", [])))
    if permission is None or permission not in granted:
        return _denied(caller, permission or f"{method} {match['verb']}", path)
    return None


def effective_bindings(state, instance: dict) -> list[dict]:
    """The instance's IAM bindings as IAM enforces them now: a policy set by setIamPolicy takes
    effect ``state.iam_delay_seconds`` later ("typically ... within 2 minutes", up to 7,
    https://cloud.google.com/iam/docs/access-change-propagation); until then the one before."""
    if "iam_history" not in instance:  # Bindings a test wrote straight into the record: in effect.
        return instance.get("iam_bindings", [])
    now = time.monotonic()
    versions = [bindings for at, bindings in instance["iam_history"] if at <= now]
    return versions[-1] if versions else []


def _signed_by_a_known_key(state, token: str) -> tuple[str, set[str]] | None:
    """A self-signed JWT: google-auth's service-account credentials send one instead of an access
    token (google/oauth2/service_account.py, _create_self_signed_jwt; "Addendum: Service account
    authorization without OAuth", https://developers.google.com/identity/protocols/oauth2/service-account).
    Google accepts it when the key it names signed it: ``state.jwt_keys`` is key id -> (principal,
    public key)."""
    import base64
    import json

    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        header = json.loads(base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4)))
        signature = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4))
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        principal, public_key = state.jwt_keys[header.get("kid")]
        public_key.verify(signature, f"{parts[0]}.{parts[1]}".encode(), padding.PKCS1v15(), hashes.SHA256())
    except (ValueError, KeyError, InvalidSignature):
        return None
    if time.time() >= float(claims.get("exp", 0)):
        return None  # Expired: google-auth makes a new one before (service_account.py, _jwt refresh).
    # With scopes the JWT says which; with only an audience it is good for that whole API.
    scopes = set(str(claims.get("scope", "")).split()) or {CLOUD_PLATFORM}
    return principal, scopes


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
