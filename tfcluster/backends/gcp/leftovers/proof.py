"""`down`'s proof, after everything is destroyed: nothing of the cluster is left that bills by the hour
(asked of the Compute API, by the cluster's label and network), nor its VMs' service accounts and
custom role (asked of IAM). It does not take terraform's word for it: a resource a killed command made
and no state names, or one a user made in the cluster's network, would outlive a clean destroy."""

from __future__ import annotations

from typing import Callable

from tfcluster.backends.gcp.access.iam import iam_leftovers, service_account_email
from tfcluster.backends.gcp.cloud.compute import LABEL, default_credentials
from tfcluster.errors import ClusterError


def prove_gone(api, cluster, announce: Callable[[str], None]) -> None:
    """Says what was verified gone, or raises one error naming every resource still there and how to
    delete it (then `down` again)."""
    left = api.leftovers(cluster.zone, cluster.name)
    iam = iam_leftovers(cluster.project, cluster.name, default_credentials())
    if left or iam.found:
        raise ClusterError(f"still there after destroy: {', '.join(left + iam.found)}; delete them in the "
                           f"console (project {cluster.project}) or with `gcloud compute ... delete`, "
                           "`gcloud iam service-accounts delete` and `gcloud iam roles delete`, "
                           "then run `invoke down` again")
    announce(f"verified through the Compute API (label {LABEL}={cluster.name} and network "
             f"{cluster.name}-net): nothing left that bills by the hour")
    if iam.unchecked:
        announce(f"could not check that the service accounts and custom role are gone: {iam.unchecked}")
    else:
        announce("verified through IAM: no service account of the cluster's VMs ("
                 f"{service_account_email(cluster.project, cluster.name, 'N')}) and no watchdog role is left")
