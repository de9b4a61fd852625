"""`down` on Google Cloud: destroy what bills by the hour; keep stored results and images unless told.

Two resources hold what a user may want after the VMs are gone, and `terraform destroy` treats
them differently:
- the bucket: destroy fails on a bucket that holds objects unless `force_destroy = true` was
  applied first (google provider, resource_storage_bucket.go: "Error trying to delete bucket ...
  containing objects without `force_destroy` set to true"), and every later destroy would fail
  the same way;
- the Artifact Registry repository: destroy succeeds and takes the images with it
  (repositories.delete "deletes a repository and all of its contents",
  https://cloud.google.com/artifact-registry/docs/reference/rest/v1/projects.locations.repositories/delete).
So each one that holds something is taken out of Terraform's state before the destroy (kept, and
named with its size, monthly cost and the command that deletes it), or, with `--delete-bucket`
(or bucket_force_destroy), deleted with the rest: the bucket after a targeted apply of
force_destroy, the repository as destroy does anyway. Empty ones always go.

The VMs go first, by a destroy targeted at them, before either is read: a Storage or Artifact
Registry call that is refused (a missing permission, an API turned off) or fails then stops
`down` with the VMs already gone, not billing while the user fixes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

from tfcluster.backends.gcp.prices.cost import PRICES
from tfcluster.backends.gcp.cloud.errors import translated
from tfcluster.backends.gcp.cloud.registry import REPOSITORY, Stored, repository_path, repository_usage
from tfcluster.backends.gcp.cloud.terraform import Terraform
from tfcluster.state import ClusterState

BUCKET = "google_storage_bucket.cluster"
WORKERS = "google_compute_instance.worker"


@dataclass
class Kept:
    """What `down` kept because it holds something: the caller says its lines, and removes nothing of it."""

    # The bucket's name, when it was kept for its objects (None: it went with the rest, or there was none).
    bucket: str | None = None
    # One line per kept bucket or registry (its size, monthly cost and the command that deletes it), and
    # the bucket's lifecycle rule after its line.
    lines: list[str] = field(default_factory=list)


def bucket_usage(project: str, bucket: str) -> Stored | None:
    """What the bucket holds, old versions included (they bill too); None if it is gone."""
    from google.api_core import exceptions

    from tfcluster.backends.gcp.cloud import storage

    try:
        blobs = list(storage.client(project).list_blobs(bucket, versions=True))
    except exceptions.NotFound:
        return None
    return Stored(f"gs://{bucket}", len(blobs), sum(blob.size or 0 for blob in blobs))


def bucket_rule(retention_days: int) -> str:
    """The bucket's lifecycle rules in force (terraform/bucket.tf), in words: `up` and `down` say
    them, since a rule deletes results without asking."""
    live = (f"objects older than {retention_days} days are deleted (bucket_retention_days)" if retention_days
            else "objects are kept until you delete them (bucket_retention_days: 0)")
    return f"bucket: {live}; an object's old versions are deleted a day after it is replaced"


def _prices() -> dict:
    return json.loads(PRICES.read_text())


def _kept_bucket(stored: Stored) -> str:
    per_gib_month = _prices()["standard_storage_gib_month"]
    return (f"kept bucket {stored.label}: {stored.items} objects, {stored.size / 1e9:.2f} GB, about "
            f"${stored.size / 2**30 * per_gib_month:.2f}/month in Standard storage. Get results with `invoke pull` "
            f"before `invoke down` next time, or delete it: gcloud storage rm --recursive {stored.label}")


def _kept_repository(stored: Stored, location: str, repository: str, project: str) -> str:
    prices = _prices()["artifact_registry"]
    return (f"kept registry {stored.label}: {stored.items} images, {stored.size / 1e9:.2f} GB, about "
            f"${stored.size / 2**30 * prices['storage_gib_month']:.2f}/month in Artifact Registry storage "
            f"(the first {prices['free_gib']:g} GB per billing account is free). Delete it: gcloud artifacts "
            f"repositories delete {repository} --location={location} --project={project}")


def destroy_keeping_results(cluster: ClusterState, terraform: Terraform, delete_stored: bool,
                            announce: Callable[[str], None], clear_network: Callable[[], object] = lambda: None) -> Kept:
    """Destroy the cluster's resources, the VMs first; returns what was kept (a bucket or registry that holds
    something, unless ``delete_stored``).
    What a killed terraform left in its folder is mended first (cloud/terraform_remains.py); what it made
    in the project but never recorded is the caller's to remove: ``clear_network()`` runs right before the
    last destroy, which deletes the network (leftovers/unrecorded.py)."""
    terraform.mend()
    vms = bool(terraform.variables().get("workers", 1))  # A Vertex AI cluster has none (terraform/vertex.tf).
    if vms:
        announce("destroying the VMs first (what bills by the hour), then looking at what the bucket and the registry hold")
        terraform.destroy([WORKERS])
    with translated(cluster.project, "down (the VMs are destroyed; the bucket, registry, network and service "
                                     "account are not yet)"):
        bucket = bucket_usage(cluster.project, cluster.bucket) if cluster.bucket else None
        images = repository_usage(cluster)
    delete_stored = delete_stored or bool(terraform.variables().get("bucket_force_destroy"))
    kept, deleted = Kept(), []
    if bucket is not None and bucket.items:
        if delete_stored:
            deleted.append(f"bucket {bucket.label} with its {bucket.items} objects ({bucket.size / 1e9:.2f} GB)")
            terraform.set_variables({"bucket_force_destroy": True})
            terraform.apply([BUCKET])
        else:
            terraform.forget(BUCKET)
            kept.bucket = cluster.bucket
            kept.lines.append(_kept_bucket(bucket))
            kept.lines.append(bucket_rule(int(terraform.variables().get("bucket_retention_days") or 0)))
    if images is not None and images.items:
        if delete_stored:
            deleted.append(f"registry {images.label} with its {images.items} images ({images.size / 1e9:.2f} GB)")
        else:
            terraform.forget(REPOSITORY)
            _, name = repository_path(cluster)
            kept.lines.append(_kept_repository(images, name.split("/")[3], name.split("/")[-1], name.split("/")[1]))
    rest = "the firewall rules, network and service account" if vms else "the jobs' service account"
    if deleted:
        announce(f"deleting {' and '.join(deleted)}, then {rest}")
    else:
        empty = [what for what, stored in (("bucket", bucket), ("registry", images))
                 if stored is not None and not stored.items]
        announce(f"destroying {rest}" + (f", and the empty {' and '.join(empty)}" if empty else "")
                 + ("; keeping what holds results and images" if kept.lines else ""))
    clear_network()
    terraform.destroy()
    return kept
