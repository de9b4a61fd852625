"""How the operator logs in to the VMs: the cluster's key in instance metadata, or OS Login.

- metadata: terraform/instances.tf puts `USER:KEY` in ssh-keys and sets enable-oslogin=false; the
  guest agent makes the account (https://cloud.google.com/compute/docs/connect/add-ssh-keys).
- oslogin: the VMs set enable-oslogin=TRUE and the cluster's public key goes into the operator's
  login profile with an expiry, users.importSshPublicKey with expirationTimeUsec
  (https://cloud.google.com/compute/docs/oslogin/rest/v1/users/importSshPublicKey); the login is the
  profile's primary POSIX username, users.getLoginProfile
  (https://cloud.google.com/compute/docs/oslogin/rest/v1/users/getLoginProfile); `down` deletes the
  key, users.sshPublicKeys.delete
  (https://cloud.google.com/compute/docs/oslogin/rest/v1/users.sshPublicKeys/delete), and a key left
  by a killed run expires with the VMs' own hypervisor deadline. OS Login ignores metadata keys
  ("Set up OS Login", https://cloud.google.com/compute/docs/oslogin/set-up-oslogin).
- auto: OS Login when the project requires it, by an enforced compute.requireOsLogin or
  compute.managed.requireOsLogin ("Requests that set enable-oslogin to false in VM or project
  metadata are rejected", https://cloud.google.com/compute/docs/oslogin/manage-oslogin-in-an-org)
  or by enable-oslogin=TRUE in the project's metadata; else metadata.
The IAM OS Login needs ("Set up OS Login", #configure_users): roles/compute.osAdminLogin or
roles/compute.osLogin on the VMs (their permissions compute.instances.osAdminLogin/osLogin),
roles/iam.serviceAccountUser on a VM's service account, and for an account from outside the
project's organisation roles/compute.osLoginExternalUser on the organisation
(compute.oslogin.updateExternalUser; manage-oslogin-in-an-org#external-user).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from tfcluster.backends.base import Finding
from tfcluster.errors import ClusterError

MODES = ("auto", "oslogin", "metadata")
OSLOGIN = "https://oslogin.googleapis.com/v1"
REQUIRE = ("compute.requireOsLogin", "compute.managed.requireOsLogin")
LOGIN_ROLES = {"compute.instances.osAdminLogin": "roles/compute.osAdminLogin",
               "compute.instances.osLogin": "roles/compute.osLogin"}
ACT_AS, EXTERNAL = "iam.serviceAccounts.actAs", "compute.oslogin.updateExternalUser"
RECORD = "oslogin.json"  # In the cluster's workdir: whose profile holds which key, for `down`.


class Refused(Exception):
    """A Google API answered an error (or none): its status (0: unreachable) and Google's words."""

    def __init__(self, status: int, status_name: str, message: str):
        super().__init__(message)
        self.status, self.status_name, self.message = status, status_name, message

    def why(self) -> str:
        return f"{self.status} {self.status_name}: {self.message}"[:200] if self.status else self.message[:200]


class Api:
    """JSON over HTTPS with the operator's credentials, each error answer a Refused."""

    def __init__(self, credentials):
        from google.auth.transport.requests import AuthorizedSession

        self.session = AuthorizedSession(credentials)

    def call(self, method: str, url: str, **kwargs) -> dict:
        from google.auth.exceptions import TransportError
        from requests import RequestException

        try:
            response = self.session.request(method, url, timeout=30, **kwargs)
            payload = response.json() if response.content else {}
        except (RequestException, TransportError, OSError, ValueError) as error:
            raise Refused(0, "", f"{url.split('/')[2]}: {type(error).__name__}") from None
        if response.status_code >= 400:
            error = (payload.get("error") if isinstance(payload, dict) else None) or {}
            error = error if isinstance(error, dict) else {"message": str(error)}
            raise Refused(response.status_code, str(error.get("status", "")), str(error.get("message", "")))
        return payload


@dataclass(frozen=True)
class Identity:
    mode: str  # "oslogin" or "metadata".
    why: str  # What decided it, for check's line and up's plan.

    @property
    def os_login(self) -> bool:
        return self.mode == "oslogin"

    def plan_words(self) -> str:
        if self.os_login:
            return (f"ssh: OS Login ({self.why}): the cluster's key goes into your login profile until the VMs' "
                    "deadline, and `down` deletes it")
        return f"ssh: the cluster's key in the VMs' metadata ({self.why})"


def choose(google, settings) -> Identity:
    """The mode --ssh-identity asks for; for auto, what the project's policies and metadata require."""
    if settings.ssh_identity != "auto":
        return Identity(settings.ssh_identity, f"--ssh-identity {settings.ssh_identity}")
    for name in REQUIRE:
        url = f"https://orgpolicy.googleapis.com/v2/projects/{settings.project}/policies/{name}:getEffectivePolicy"
        try:
            rules = (google.call("GET", url).get("spec") or {}).get("rules", [])
        except Refused:
            continue  # Unreadable: check's constraint lines say so.
        if any(rule.get("enforce") for rule in rules):
            return Identity("oslogin", f"constraints/{name} is enforced")
    try:
        project = google.call("GET", f"https://compute.googleapis.com/compute/v1/projects/{settings.project}")
        items = (project.get("commonInstanceMetadata") or {}).get("items") or []
        if any(i.get("key") == "enable-oslogin" and str(i.get("value", "")).upper() == "TRUE" for i in items):
            return Identity("oslogin", "the project's metadata sets enable-oslogin=TRUE")
    except Refused:
        pass
    return Identity("metadata", "no organisation policy or project metadata requires OS Login")


def operator_email(credentials, google) -> str | None:
    """The account OS Login knows the operator by: a key file's service account, else the token's e-mail."""
    email = getattr(credentials, "service_account_email", None)
    if email and email != "default":
        return email
    try:
        return google.call("GET", "https://oauth2.googleapis.com/tokeninfo",
                           params={"access_token": credentials.token}).get("email")
    except Refused:
        return None


def reconciled(findings: list[Finding], identity: Identity) -> list[Finding]:
    """In OS Login mode an enforced requireOsLogin constraint is what the cluster does anyway: ✓."""
    if not identity.os_login:
        return [Finding(f.subject, f.holds, f.detail.replace("; ask your organisation's admin", "; use --ssh-identity "
                                                             "oslogin (or auto), or ask your organisation's admin"))
                if f.holds is False and f.subject.removeprefix("constraints/") in REQUIRE else f for f in findings]
    return [Finding(f.subject, True, "enforced: the VMs log in through OS Login (enable-oslogin=TRUE)")
            if f.holds is False and f.subject.removeprefix("constraints/") in REQUIRE else f for f in findings]


def findings(credentials, settings, accounts: list[str]) -> tuple[Identity, list[Finding]]:
    """In OS Login mode, the choice's line and one line per missing piece of IAM (none in metadata mode)."""
    google = Api(credentials)
    identity = choose(google, settings)
    if not identity.os_login:
        return identity, []
    lines = [Finding("ssh identity", True, f"OS Login ({identity.why})")]
    email = operator_email(credentials, google) or "your account"
    wanted = [*LOGIN_ROLES, ACT_AS, EXTERNAL]
    url = f"https://cloudresourcemanager.googleapis.com/v1/projects/{settings.project}:testIamPermissions"
    try:
        held = set(google.call("POST", url, json={"permissions": wanted}).get("permissions", []))
    except Refused as error:
        return identity, lines + [Finding("OS Login IAM", None, f"cannot test it ({error.why()})")]
    if not held & set(LOGIN_ROLES):
        lines.append(Finding("OS Login role", False, f"{email} has neither roles/compute.osAdminLogin nor "
                             f"roles/compute.osLogin on the VMs: ask a project owner for roles/compute.osAdminLogin "
                             f"in project {settings.project}"))
    if ACT_AS not in held:
        lines.append(Finding("OS Login service accounts", False, f"{email} lacks roles/iam.serviceAccountUser on the "
                             f"VMs' service accounts ({', '.join(accounts)}): ask a project owner for it in project "
                             f"{settings.project}"))
    outside = _outside(google, settings.project, email)
    if outside is None:
        lines.append(Finding("OS Login external user", None, f"cannot tell whether {email} is in the project's "
                             "organisation; if not, its admin must grant roles/compute.osLoginExternalUser"))
    elif outside and EXTERNAL not in held:
        lines.append(Finding("OS Login external user", False, f"{email} is not in the organisation of project "
                             f"{settings.project}: ask the organisation's admin for roles/compute.osLoginExternalUser "
                             "on the organisation"))
    if all(line.holds for line in lines):
        lines.append(Finding("OS Login IAM", True, f"{email} may log in to the VMs and act as their service accounts"))
    return identity, lines


def _outside(google, project: str, email: str) -> bool | None:
    """Whether ``email`` is from outside ``project``'s organisation (None: cannot tell). A project
    with no organisation has no outside. Resource Manager v1 projects.getAncestry and
    organizations.get (its displayName is the organisation's domain,
    https://cloud.google.com/resource-manager/reference/rest/v1/organizations)."""
    def organisation(of: str) -> str | None:
        ancestry = google.call("POST", f"https://cloudresourcemanager.googleapis.com/v1/projects/{of}:getAncestry", json={})
        return next((a["resourceId"]["id"] for a in ancestry.get("ancestor", [])
                     if a.get("resourceId", {}).get("type") == "organization"), "")

    try:
        home = organisation(project)
        if not home:
            return False
        domain = email.rsplit("@", 1)[-1]
        if domain.endswith(".iam.gserviceaccount.com"):
            owner = domain.removesuffix(".iam.gserviceaccount.com")
            return owner != project and organisation(owner) != home
        org = google.call("GET", f"https://cloudresourcemanager.googleapis.com/v1/organizations/{home}")
        return org.get("displayName", "").lower() != domain.lower()
    except Refused:
        return None


def import_key(workdir: Path, project: str, public_key: str, hours: int) -> str:
    """The cluster's key into the operator's profile, expiring with the VMs' deadline (+1 hour);
    returns the profile's POSIX username. Recorded in ``workdir`` so that `down` deletes it."""
    from tfcluster.backends.gcp.cloud.compute import default_credentials

    credentials = default_credentials()
    google = Api(credentials)
    email = operator_email(credentials, google)
    if not email:
        raise ClusterError("OS Login needs your account's e-mail, which Google did not tell; log in again with "
                           "`gcloud auth application-default login`")
    expires = int((time.time() + (hours + 1) * 3600) * 1_000_000)
    try:
        google.call("POST", f"{OSLOGIN}/users/{email}:importSshPublicKey", params={"projectId": project},
                    json={"key": public_key, "expirationTimeUsec": str(expires)})
        profile = google.call("GET", f"{OSLOGIN}/users/{email}/loginProfile", params={"projectId": project})
    except Refused as error:
        raise ClusterError(f"OS Login refused the cluster's key for {email} ({error.why()}); `invoke check` names "
                           "the IAM OS Login needs") from None
    accounts = profile.get("posixAccounts") or []
    primary = next((a for a in accounts if a.get("primary")), accounts[0] if accounts else None)
    key = next((k for k in (profile.get("sshPublicKeys") or {}).values() if k.get("key", "").split()[:2]
                == public_key.split()[:2]), None)
    if primary is None or key is None:
        raise ClusterError(f"OS Login shows no POSIX account or no imported key for {email}; run `invoke up` again")
    (workdir / RECORD).write_text(json.dumps({"email": email, "fingerprint": key["fingerprint"],
                                              "username": primary["username"], "expires_usec": expires}))
    return primary["username"]


def renew_key(workdir: Path, hours: int) -> None:
    """A restart (`up` on a cluster, a preempted VM back): the key expires with the new deadline
    (+1 hour), users.sshPublicKeys.patch with updateMask=expirationTimeUsec
    (https://cloud.google.com/compute/docs/oslogin/rest/v1/users.sshPublicKeys/patch)."""
    from tfcluster.backends.gcp.cloud.compute import default_credentials

    record_file = workdir / RECORD
    if not record_file.exists():
        return
    record = json.loads(record_file.read_text())
    expires = int((time.time() + (hours + 1) * 3600) * 1_000_000)
    try:
        Api(default_credentials()).call("PATCH", f"{OSLOGIN}/users/{record['email']}/sshPublicKeys/"
                                        f"{record['fingerprint']}", params={"updateMask": "expirationTimeUsec"},
                                        json={"expirationTimeUsec": str(expires)})
    except Refused as error:
        raise ClusterError(f"OS Login refused to renew the cluster's key for {record['email']} ({error.why()}); "
                           "run `invoke down`, then `invoke up`") from None
    record_file.write_text(json.dumps({**record, "expires_usec": expires}))


def forget_key(workdir: Path, announce) -> None:
    """`down`: delete the cluster's key from the profile; a refusal is said, never raised (the key
    expires by itself)."""
    from tfcluster.backends.gcp.cloud.compute import default_credentials

    record_file = workdir / RECORD
    if not record_file.exists():
        return
    record = json.loads(record_file.read_text())
    name = f"users/{record['email']}/sshPublicKeys/{record['fingerprint']}"
    try:
        Api(default_credentials()).call("DELETE", f"{OSLOGIN}/{name}")
    except Refused as error:
        if error.status != 404:
            until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(record["expires_usec"] / 1e6))
            announce(f"could not delete the cluster's key from your OS Login profile ({error.why()}); it expires "
                     f"at {until}: `gcloud compute os-login ssh-keys remove --key {record['fingerprint']}`")
            return
    record_file.unlink()
    announce(f"deleted the cluster's key from your OS Login profile ({name})")
