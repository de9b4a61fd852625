"""IAM's service accounts and custom roles (iam.googleapis.com, REST v1), served by the Compute
stand-in's server (the world points iam.googleapis.com at it: tests/world/names.py).

From the IAM reference (https://cloud.google.com/iam/docs/reference/rest):
- projects.serviceAccounts.create {accountId, serviceAccount} makes ACCOUNT@PROJECT.iam.gserviceaccount.com;
  an existing id answers 409 ALREADY_EXISTS; get/delete by email, 404 NOT_FOUND when missing;
  list pages through the project's accounts. An account's access token (what a VM running as it
  gets from its metadata server) is valid from create to delete (compute_auth.token_for).
- projects.roles.create {roleId, role: {title, description, includedPermissions, stage}} makes
  projects/P/roles/ID; delete marks it deleted, and the id stays reserved: "you can't create a new
  role with the same ID until the deletion process is complete" (up to 44 days,
  https://cloud.google.com/iam/docs/creating-custom-roles#deleting-custom-role), answered 400
  FAILED_PRECONDITION here as for an existing id 409 ALREADY_EXISTS; until then it can be undeleted
  (projects.roles.undelete, for 7 days), and projects.roles.patch changes a live one.
Compute reads the custom roles' permissions from ``state.custom_roles`` (compute_auth.py).
IAM is eventually consistent ("changes ... can take time to propagate": a new service account
may not be found at once, https://cloud.google.com/iam/docs/overview#consistency): for
``state.iam_delay_seconds`` after its creation an account's get answers 404 as for an unknown one
(the "404s sometimes due to eventual consistency" of magic-modules #6053) and Compute refuses it
as an instance's identity, worded as Compute words a service account it cannot find ("The
resource '...' of type 'serviceAccount' was not found.",
github.com/GoogleCloudPlatform/terraform-google-managed-instance-group/issues/40).
"""

from __future__ import annotations

import re
import time

from tests.world.compute_auth import iam_shows, token_for


def _error(code: int, status: str, message: str) -> tuple[int, dict]:
    return code, {"error": {"code": code, "status": status, "message": message}}


def create_account(state, project: str, account_id: str, fields: dict) -> dict:
    """A new service account ACCOUNT@PROJECT.iam.gserviceaccount.com, and the access token its
    VMs get from their metadata server (compute_auth.token_for), which Google now resolves to it."""
    email = f"{account_id}@{project}.iam.gserviceaccount.com"
    accounts = state.service_accounts
    accounts[email] = {"name": f"projects/{project}/serviceAccounts/{email}", "email": email,
                       "uniqueId": str(100000000000000000000 + len(accounts)), **fields}
    state.tokens[token_for(email)] = f"serviceAccount:{email}"
    state.account_visible_at[email] = time.monotonic() + state.iam_delay_seconds
    return accounts[email]


def unseen(state, email: str) -> bool:
    """A service account made less than the world's IAM delay ago (the module docstring)."""
    return not iam_shows(state, email)


def unseen_account(state, body: dict) -> tuple[int, dict] | None:
    """Compute's refusal of an instance whose service account it does not see yet."""
    email = (((body.get("serviceAccounts") or [{}])[0]) or {}).get("email")
    if not email or not unseen(state, email):
        return None
    message = f"The resource '{email}' of type 'serviceAccount' was not found."
    return 400, {"error": {"code": 400, "message": message,
                           "errors": [{"message": message, "domain": "global", "reason": "invalid"}]}}


def route(state, method: str, path: str, body: dict | None, query: dict | None = None) -> tuple[int, dict] | None:
    match = re.fullmatch(r"/v1/projects/(?P<project>[^/]+)/serviceAccounts(?:/(?P<email>[^/]+))?", path)
    if match:
        accounts = state.service_accounts
        if method == "POST" and not match["email"]:
            email = f"{body['accountId']}@{match['project']}.iam.gserviceaccount.com"
            if email in accounts:
                return _error(409, "ALREADY_EXISTS", f"Service account {body['accountId']} already exists within project "
                                                     f"projects/{match['project']}.")
            return 200, create_account(state, match["project"], body["accountId"], body.get("serviceAccount") or {})
        if method == "GET" and not match["email"]:
            # projects.serviceAccounts.list: every account of the project, a page at a time
            # (pageSize, default 20, at most 100; nextPageToken while more remain):
            # https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts/list.
            listed = sorted(e for e in accounts if iam_shows(state, e))
            size = min(int((query or {}).get("pageSize", ["20"])[0]), 100)
            start = int((query or {}).get("pageToken", ["0"])[0] or 0)
            page = {"accounts": [accounts[e] for e in listed[start:start + size]]}
            if start + size < len(listed):
                page["nextPageToken"] = str(start + size)
            return 200, page
        if match["email"] not in accounts or (method == "GET" and unseen(state, match["email"])):
            return _error(404, "NOT_FOUND", f"Unknown service account {match['email']}")
        if method == "DELETE":
            accounts.pop(match["email"])
            state.tokens.pop(token_for(match["email"]), None)  # Its applications lose access.
            return 200, {}
        return 200, accounts[match["email"]]
    match = re.fullmatch(r"/v1/projects/(?P<project>[^/]+)/roles(?:/(?P<id>[^/:]+))?(?P<verb>:undelete)?", path)
    if match:
        roles = state.custom_roles
        if method == "POST" and not match["id"]:
            name = f"projects/{match['project']}/roles/{body['roleId']}"
            if name in state.deleted_roles:
                return _error(400, "FAILED_PRECONDITION", f"A role ({name}) with this ID was recently deleted.")
            if name in roles:
                return _error(409, "ALREADY_EXISTS", f"A role ({name}) with this ID already exists.")
            roles[name] = set(body["role"].get("includedPermissions", []))
            return 200, {"name": name, **body["role"]}
        if method == "GET" and not match["id"]:
            # projects.roles.list: the project's custom roles, deleted ones only with showDeleted
            # (https://cloud.google.com/iam/docs/reference/rest/v1/projects.roles/list).
            # A page at a time: pageSize "default is 300, and the maximum is 1,000" (same page).
            shown = [{"name": n, "includedPermissions": sorted(p)} for n, p in sorted(roles.items())]
            if (query or {}).get("showDeleted", [""])[0] == "true":
                shown += [{"name": n, "deleted": True} for n in sorted(state.deleted_roles)]
            size = min(int((query or {}).get("pageSize", ["300"])[0] or 300), 1000)
            start = int((query or {}).get("pageToken", ["0"])[0] or 0)
            page = {"roles": shown[start:start + size]}
            if start + size < len(shown):
                page["nextPageToken"] = str(start + size)
            return 200, page
        name = f"projects/{match['project']}/roles/{match['id']}"
        if match["verb"]:
            # projects.roles.undelete: "Undeletes a custom Role" (IAM v1 reference), as it was before its
            # delete. A role is undeletable for 7 days after it (creating-custom-roles#deleting-custom-role);
            # the world's deletes are all younger. Undeleting a live role is not modelled (nothing asks it).
            if name not in state.deleted_roles:
                return _error(404, "NOT_FOUND", f"The role named {name} was not found.")
            state.deleted_roles.discard(name)
            roles[name] = state.deleted_role_permissions.pop(name, set())
            return 200, {"name": name, "includedPermissions": sorted(roles[name]), "deleted": False}
        if name in state.deleted_roles and method == "GET":
            # A deleted role stays readable, marked deleted, until it is purged
            # (https://cloud.google.com/iam/docs/creating-custom-roles#deleting-custom-role).
            return 200, {"name": name, "deleted": True}
        if name not in roles:
            return _error(404, "NOT_FOUND", f"The role named {name} was not found.")
        if method == "DELETE":
            state.deleted_role_permissions[name] = roles.pop(name)
            state.deleted_roles.add(name)
            return 200, {"name": name, "deleted": True}
        if method == "PATCH":  # projects.roles.patch: the fields given (no updateMask: all of them).
            roles[name] = set((body or {}).get("includedPermissions", roles[name]))
        return 200, {"name": name, "includedPermissions": sorted(roles[name])}
    return None
