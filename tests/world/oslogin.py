"""OS Login (oslogin.googleapis.com, REST v1), checked against its discovery document
(oslogin.v1.json, tests/world/discovery.py), and what the metadata server tells a VM's guest
environment about it.

From the OS Login pages and the reference (https://cloud.google.com/compute/docs/oslogin/rest):
- users.importSshPublicKey, POST v1/users/{user}:importSshPublicKey?projectId=P, body SshPublicKey
  {key, expirationTimeUsec}: "Adds an SSH public key and returns the profile information. Default
  POSIX account information is set when no username and UID exist as part of the login profile."
  Answer {"loginProfile": LoginProfile}. The key is keyed by its SHA-256 fingerprint (SshPublicKey.
  fingerprint); gcloud's --ttl becomes expirationTimeUsec (shared/notes/google-descriptions.md).
- users.getLoginProfile, GET v1/users/{user}/loginProfile?projectId=P: {name, posixAccounts,
  sshPublicKeys: {fingerprint: SshPublicKey}}.
- users.sshPublicKeys.delete, DELETE v1/users/{user}/sshPublicKeys/{fingerprint}: {} (Empty); an
  unknown fingerprint is 404 NOT_FOUND. users.sshPublicKeys.patch (?updateMask=expirationTimeUsec)
  changes the fields the mask names and answers the key.
- POSIX usernames: a user's is the e-mail with every character that is not a letter or digit as
  "_" (user@example.com -> user_example_com, GoogleCloudPlatform/compute-image-packages#692); a
  service account's is "sa_" + its unique ID, and a user from outside the organisation's "ext_" +
  that form (hashicorp/packer-plugin-googlecompute#254).
- A caller manages only its own profile: another user's is refused 403 PERMISSION_DENIED "The
  caller does not have permission" (Google's generic text for PERMISSION_DENIED,
  https://cloud.google.com/apis/design/errors). An account from outside the project's organisation
  needs roles/compute.osLoginExternalUser on the organisation (its permission
  compute.oslogin.updateExternalUser; "Manage OS Login in an organization", #external-user): without
  it the import is refused the same way. Doubt, recorded: Google's pages do not quote the text of
  that refusal; the generic one is used.
The metadata server's oslogin/ paths (the guest environment's, GoogleCloudPlatform/guest-oslogin
src/oslogin_utils.cc): users?username=U -> {"loginProfiles": [profile]} (404 for an unknown
user), users?pagesize=N -> every profile, and authorize?email=E&policy=login|adminLogin ->
{"success": bool}: login needs compute.instances.osLogin or osAdminLogin on the instance (and, for
an external account, compute.oslogin.updateExternalUser), adminLogin needs osAdminLogin
(https://cloud.google.com/compute/docs/oslogin/set-up-oslogin#configure_users).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field

from tests.world import compute_auth, discovery
from tests.world.http import JsonServer

OSLOGIN_NAMES = ("oslogin.googleapis.com",)
LOGIN, ADMIN, EXTERNAL = ("compute.instances.osLogin", "compute.instances.osAdminLogin",
                          "compute.oslogin.updateExternalUser")


@dataclass
class OsLogin:
    # The e-mail OS Login knows the world's operator by: the account of its key file.
    operator_email: str = ""
    # That account's unique ID (the key file's client_id), for its "sa_" username.
    operator_id: str = ""
    # Accounts from outside the project's organisation.
    external: set = field(default_factory=set)
    # e-mail -> {"uid": int, "keys": {fingerprint: SshPublicKey}}; a profile is made at its first import.
    profiles: dict = field(default_factory=dict)
    # Every call, (method, path), for the tests to read.
    requests: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def username(self, email: str) -> str:
        if email == self.operator_email and email.endswith(".iam.gserviceaccount.com"):
            return f"sa_{self.operator_id}"
        plain = re.sub(r"[^A-Za-z0-9]", "_", email)
        return f"ext_{plain}" if email in self.external else plain

    def profile(self, email: str) -> dict:
        """LoginProfile as the reference shapes it (posixAccounts once a key was imported)."""
        found = self.profiles.get(email)
        body = {"name": email, "sshPublicKeys": dict(found["keys"]) if found else {}}
        if found:
            name = self.username(email)
            body["posixAccounts"] = [{"primary": True, "username": name, "uid": str(found["uid"]),
                                      "gid": str(found["uid"]), "homeDirectory": f"/home/{name}",
                                      "operatingSystemType": "LINUX", "accountId": "demo-project",
                                      "name": f"users/{email}/projects/demo-project"}]
        return body

    def live_keys(self, email: str) -> list[str]:
        """The profile's keys that have not expired (the guest skips expired ones: ParseJsonToSshKeys)."""
        now = int(time.time() * 1_000_000)
        keys = (self.profiles.get(email) or {}).get("keys", {}).values()
        return [k["key"] for k in keys if not k.get("expirationTimeUsec") or int(k["expirationTimeUsec"]) > now]


def fingerprint(key: str) -> str:
    parts = key.split()
    try:
        return hashlib.sha256(base64.b64decode(parts[1])).hexdigest()
    except (IndexError, ValueError):
        return ""


def _error(code: int, status: str, message: str) -> tuple[int, dict]:
    return code, {"error": {"code": code, "status": status, "message": message}}


def caller_email(state: OsLogin, compute, headers: dict) -> tuple[str | None, tuple[int, dict] | None]:
    principal, refused = compute_auth.principal(compute, headers)
    if refused:
        return None, refused
    if principal == compute_auth.OPERATOR:
        return state.operator_email, None
    return principal.split(":", 1)[1], None


class OsLoginServer(JsonServer):
    """users.* on ``address``:443, each request under oslogin.v1's contract."""

    def __init__(self, state: OsLogin, compute, address: str, context):
        self.state, self.compute = state, compute
        server = self

        def handle(method, path, query, body, headers):
            return discovery.serve("oslogin.v1", method, path, query, body,
                                   lambda call: compute_auth.scope_refusal(compute, headers, call)
                                   or server.route(method, path, query, body, headers))

        super().__init__(address, context, handle)

    def route(self, method: str, path: str, query: dict, body, headers: dict) -> tuple[int, dict]:
        state = self.state
        with state.lock:
            state.requests.append((method, path))
        email, refused = caller_email(state, self.compute, headers)
        if refused:
            return refused
        match = re.fullmatch(r"/v1/users/(?P<user>[^/:]+)(?P<rest>.*)", path)
        if match is None:
            return _error(404, "NOT_FOUND", "Method not found.")
        if match["user"] != email:
            return _error(403, "PERMISSION_DENIED", "The caller does not have permission")
        missing = self.compute.missing_permissions if email == state.operator_email else set()
        rest = match["rest"]
        with state.lock:
            if method == "GET" and rest == "/loginProfile":
                return 200, state.profile(email)
            if method == "POST" and rest == ":importSshPublicKey":
                if email in state.external and EXTERNAL in missing:
                    return _error(403, "PERMISSION_DENIED", "The caller does not have permission")
                key = str((body or {}).get("key", "")).strip()
                print_ = fingerprint(key)
                if not print_:
                    return _error(400, "INVALID_ARGUMENT", "Invalid SSH key.")
                profile = state.profiles.setdefault(email, {"uid": 1000 + 7 * len(state.profiles) + 1001, "keys": {}})
                entry = {"key": key, "fingerprint": print_, "name": f"users/{email}/sshPublicKeys/{print_}"}
                if (body or {}).get("expirationTimeUsec"):
                    entry["expirationTimeUsec"] = str(body["expirationTimeUsec"])
                profile["keys"][print_] = entry
                return 200, {"loginProfile": state.profile(email)}
            keyed = re.fullmatch(r"/sshPublicKeys/(?P<fp>[^/]+)", rest)
            if keyed and method in ("GET", "DELETE", "PATCH"):
                keys = (state.profiles.get(email) or {}).get("keys", {})
                if keyed["fp"] not in keys:
                    return _error(404, "NOT_FOUND", "Requested entity was not found.")
                if method == "GET":
                    return 200, dict(keys[keyed["fp"]])
                if method == "PATCH":  # users.sshPublicKeys.patch: the fields updateMask names.
                    for name in (query.get("updateMask", [""])[0] or "key,expirationTimeUsec").split(","):
                        if name in ("key", "expirationTimeUsec") and name in (body or {}):
                            keys[keyed["fp"]][name] = str(body[name])
                    return 200, dict(keys[keyed["fp"]])
                del keys[keyed["fp"]]
                return 200, {}
        return _error(404, "NOT_FOUND", "Method not found.")


def guest_answer(state: OsLogin, compute, instance: dict | None, path: str, query: dict) -> str | None:
    """The metadata server's oslogin/ answers for the instance ``instance`` (its record), or None (404)."""
    if path == "oslogin/users":
        with state.lock:
            if "username" in query:
                email = next((e for e in state.profiles if state.username(e) == query["username"]), None)
                return None if email is None else json.dumps({"loginProfiles": [state.profile(email)]})
            return json.dumps({"loginProfiles": [state.profile(e) for e in state.profiles], "nextPageToken": "0"})
    if path == "oslogin/authorize":
        email, policy = query.get("email", ""), query.get("policy", "")
        return json.dumps({"success": may_log_in(state, compute, instance, email, policy)})
    return None


def may_log_in(state: OsLogin, compute, instance: dict | None, email: str, policy: str) -> bool:
    """Whether ``email`` may log in (policy login) or administer (adminLogin) on the instance: its
    roles, as the operator's are the project's less Compute's ``missing_permissions``."""
    if email != state.operator_email or instance is None:
        return False
    missing = compute.missing_permissions
    if email in state.external and EXTERNAL in missing:
        return False
    if policy == "adminLogin":
        return ADMIN not in missing
    return policy == "login" and not {LOGIN, ADMIN} <= missing


REQUIRE = ("compute.requireOsLogin", "compute.managed.requireOsLogin")


def insert_refusal(state, project: str, body: dict) -> tuple[int, dict] | None:
    """Compute's refusal of an instance whose metadata sets enable-oslogin to false while the
    project's effective policy enforces compute.requireOsLogin or compute.managed.requireOsLogin:
    "Requests that set enable-oslogin to false in VM or project metadata are rejected" ("Manage OS
    Login in an organization"; https://cloud.google.com/compute/docs/access/managed-constraints for
    the managed form). Worded as Compute words a constraint it enforces at insert, 412
    conditionNotMet "Constraint constraints/compute.requireShieldedVm violated for project
    projects/P. ... See https://cloud.google.com/resource-manager/docs/organization-policy/org-policy-constraints
    for more information." (fortinet/fortigate-terraform-deploy#34). Doubt, recorded: the sentence
    Compute puts between those two for requireOsLogin is quoted nowhere we could read; none is
    invented."""
    items = (body.get("metadata") or {}).get("items") or []
    value = next((str(i.get("value", "")) for i in items if i.get("key") == "enable-oslogin"), None)
    if value is None or value.strip().upper() not in ("FALSE", "0", "N", "NO", "OFF"):
        return None
    enforced = next((name for name in REQUIRE if any(rule.get("enforce") for rule in state.org_policies.get(name, []))),
                    None)
    if enforced is None:
        return None
    message = (f"Constraint constraints/{enforced} violated for project projects/{project}. See "
               "https://cloud.google.com/resource-manager/docs/organization-policy/org-policy-constraints for more "
               "information.")
    return 412, {"error": {"code": 412, "message": message,
                           "errors": [{"message": message, "domain": "global", "reason": "conditionNotMet"}]}}
