"""`down` on Google Cloud: destroy what bills by the hour; keep the bucket of results unless told.

`terraform destroy` fails on a bucket that holds objects unless `force_destroy = true` was
applied first (google provider, resource_storage_bucket.go: "Error trying to delete bucket ...
containing objects without `force_destroy` set to true"), and every later destroy would fail the
same way. So a bucket with objects is either taken out of Terraform's state before the destroy
(kept, and named with its size and cost), or, with `--delete-bucket` / bucket_force_destroy,
gets force_destroy applied to it alone (a targeted apply) before the destroy.
"""

from __future__ import annotations

import json
from typing import Callable

from tfcluster.backends.gcp.cost import PRICES
from tfcluster.backends.gcp.terraform import Terraform
from tfcluster.state import ClusterState

BUCKET = "google_storage_bucket.cluster"


def bucket_usage(project: str, bucket: str) -> tuple[int, int] | None:
    """(objects, bytes) in the bucket, old versions included (they bill too); None if it is gone."""
    from google.api_core import exceptions

    from tfcluster.backends.gcp import storage

    try:
        blobs = list(storage.client(project).list_blobs(bucket, versions=True))
    except exceptions.NotFound:
        return None
    return len(blobs), sum(blob.size or 0 for blob in blobs)


def destroy_keeping_results(cluster: ClusterState, terraform: Terraform, delete_bucket: bool,
                            announce: Callable[[str], None]) -> str | None:
    """Destroy the cluster's resources; returns a line about the kept bucket, if one was kept."""
    usage = bucket_usage(cluster.project, cluster.bucket) if cluster.bucket else None
    if usage is None or usage[0] == 0:
        announce("destroying the VMs, bucket (empty), firewall rules, network and service account")
        terraform.destroy()
        return None
    objects, size = usage
    if delete_bucket or terraform.variables().get("bucket_force_destroy"):
        announce(f"deleting bucket gs://{cluster.bucket} with its {objects} objects ({size / 1e9:.2f} GB), "
                 "then the VMs, firewall rules, network and service account")
        terraform.set_variables({"bucket_force_destroy": True})
        terraform.apply([BUCKET])
        terraform.destroy()
        return None
    announce("destroying the VMs, firewall rules, network and service account; keeping the bucket of results")
    terraform.forget(BUCKET)
    terraform.destroy()
    per_gb_month = json.loads(PRICES.read_text())["standard_storage_gib_month"]
    return (f"kept bucket gs://{cluster.bucket}: {objects} objects, {size / 1e9:.2f} GB, about "
            f"${size / 2**30 * per_gb_month:.2f}/month in Standard storage. Get results with `invoke pull` "
            f"before `invoke down` next time, or delete it: gcloud storage rm --recursive gs://{cluster.bucket}")
