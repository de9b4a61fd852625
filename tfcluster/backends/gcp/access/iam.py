"""What `down` proves gone in IAM: the VMs' service accounts and the watchdog's custom role.

None bills, but each outlives a destroy that lost track of it (an interrupted apply, a
`terraform state rm`), and each is found by the name terraform/iam.tf gives it:
- one service account per VM, CLUSTER-vm-INDEX@PROJECT.iam.gserviceaccount.com (and CLUSTER-vm@,
  the one account of clusters made before VMs had their own): projects.serviceAccounts.list, every
  page, lists the project's accounts, and a deleted one is no longer listed
  (https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts/list). Listing
  rather than a get per index finds an account whatever the cluster's size was when it was made;
- the custom role tfclusterWatchdog_CLUSTER_<6 hex> (iam.tf: the cluster name with "-" as "_", then
  random_id.suffix.hex, three bytes): projects.roles.list leaves out deleted roles unless
  showDeleted is set, and a deleted role stays readable with `deleted: true` for 7 days
  (https://cloud.google.com/iam/docs/reference/rest/v1/projects.roles/list,
  https://cloud.google.com/iam/docs/creating-custom-roles#deleting-custom-role).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

IAM = "https://iam.googleapis.com/v1"


@dataclass(frozen=True)
class IamLeftovers:
    # One phrase per IAM resource of the cluster that still exists ("service account X").
    found: list[str]
    # Why IAM could not be read (a refusal or an outage), or None when both lists were read.
    unchecked: str | None = None


def service_account_email(project: str, cluster: str, index: int | str) -> str:
    """VM ``index``'s own service account (terraform/iam.tf, google_service_account.vm[index]);
    an index of "N" names them all in a message."""
    return f"{cluster}-vm-{index}@{project}.iam.gserviceaccount.com"


def service_account_pattern(project: str, cluster: str) -> re.Pattern:
    """Every VM account of the cluster, and the single account of clusters made before per-VM ones."""
    return re.compile(rf"{re.escape(cluster)}-vm(?:-[0-9]+)?@{re.escape(project)}\.iam\.gserviceaccount\.com")


def watchdog_role_pattern(cluster: str) -> re.Pattern:
    return re.compile(rf"projects/[^/]+/roles/tfclusterWatchdog_{re.escape(cluster.replace('-', '_'))}_[0-9a-f]{{6}}")


def iam_leftovers(project: str, cluster: str, credentials) -> IamLeftovers:
    """The cluster's service accounts and custom role if they still exist; never raises for a
    refusal, since `down` must finish: the reason comes back in ``unchecked``."""
    import requests
    from google.auth.transport.requests import AuthorizedSession

    session = AuthorizedSession(credentials)
    found = []
    try:
        accounts = service_account_pattern(project, cluster)
        for page in _pages(session, f"{IAM}/projects/{project}/serviceAccounts"):
            if isinstance(page, str):
                return IamLeftovers(found, page)
            found += [f"service account {account['email']}" for account in page.get("accounts", [])
                      if accounts.fullmatch(account.get("email", ""))]
        pattern = watchdog_role_pattern(cluster)
        for page in _pages(session, f"{IAM}/projects/{project}/roles"):
            if isinstance(page, str):
                return IamLeftovers(found, page)
            found += [f"custom role {role['name']}" for role in page.get("roles", [])
                      if pattern.fullmatch(role["name"]) and not role.get("deleted")]
        return IamLeftovers(found)
    except requests.RequestException as error:
        return IamLeftovers(found, f"IAM did not answer ({type(error).__name__})")


def _pages(session, url: str):
    """Each page of an IAM list (pageToken / nextPageToken), or the reason it could not be read."""
    page = ""
    while True:
        listed = session.get(url, params={"pageToken": page} if page else {}, timeout=30)
        if listed.status_code != 200:
            yield _reason(listed)
            return
        body = listed.json()
        yield body
        page = body.get("nextPageToken", "")
        if not page:
            return


def _reason(response) -> str:
    try:
        error = response.json()["error"]
        return f"IAM answered {response.status_code} {error.get('status', '')}: {error.get('message', '')}".strip()
    except (ValueError, KeyError, TypeError):
        return f"IAM answered {response.status_code}"
