"""What `down` proves gone in IAM: the VMs' service account and the watchdog's custom role.

Neither bills, but both outlive a destroy that lost track of them (an interrupted apply, a
`terraform state rm`), and each is found by the exact name terraform/iam.tf gives it:
- the service account CLUSTER-vm@PROJECT.iam.gserviceaccount.com: projects.serviceAccounts.get
  answers 404 NOT_FOUND once it is deleted
  (https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts/get);
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


def service_account_email(project: str, cluster: str) -> str:
    return f"{cluster}-vm@{project}.iam.gserviceaccount.com"


def watchdog_role_pattern(cluster: str) -> re.Pattern:
    return re.compile(rf"projects/[^/]+/roles/tfclusterWatchdog_{re.escape(cluster.replace('-', '_'))}_[0-9a-f]{{6}}")


def iam_leftovers(project: str, cluster: str, credentials) -> IamLeftovers:
    """The cluster's service account and custom role if they still exist; never raises for a
    refusal, since `down` must finish: the reason comes back in ``unchecked``."""
    import requests
    from google.auth.transport.requests import AuthorizedSession

    session = AuthorizedSession(credentials)
    email = service_account_email(project, cluster)
    found = []
    try:
        account = session.get(f"{IAM}/projects/{project}/serviceAccounts/{email}", timeout=30)
        if account.status_code == 200:
            found.append(f"service account {email}")
        elif account.status_code != 404:
            return IamLeftovers(found, _reason(account))
        pattern = watchdog_role_pattern(cluster)
        page = ""
        while True:
            listed = session.get(f"{IAM}/projects/{project}/roles", params={"pageToken": page} if page else {},
                                 timeout=30)
            if listed.status_code != 200:
                return IamLeftovers(found, _reason(listed))
            body = listed.json()
            found += [f"custom role {role['name']}" for role in body.get("roles", [])
                      if pattern.fullmatch(role["name"]) and not role.get("deleted")]
            page = body.get("nextPageToken", "")
            if not page:
                return IamLeftovers(found)
    except requests.RequestException as error:
        return IamLeftovers(found, f"IAM did not answer ({type(error).__name__})")


def _reason(response) -> str:
    try:
        error = response.json()["error"]
        return f"IAM answered {response.status_code} {error.get('status', '')}: {error.get('message', '')}".strip()
    except (ValueError, KeyError, TypeError):
        return f"IAM answered {response.status_code}"
