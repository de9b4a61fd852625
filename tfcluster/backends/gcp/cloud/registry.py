"""The cluster's Artifact Registry repository seen through the API: what it holds (for `down`),
and adopting one a previous `down` kept (for `up`).

A repository kept by `down` leaves Terraform's state but keeps its name (CLUSTER-images), so the
next `up` of the cluster would fail to create it (CreateRepository answers 409 ALREADY_EXISTS);
`up` imports it back instead, images and all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tfcluster.backends.gcp.cloud.compute import region_of
from tfcluster.backends.gcp.cloud.terraform import Terraform, TerraformError

REPOSITORY = "google_artifact_registry_repository.images"


@dataclass
class Stored:
    """What one storage resource of the cluster holds right now."""

    # "gs://BUCKET" or "REGION-docker.pkg.dev/PROJECT/REPO": how the user names it.
    label: str
    # Objects (old versions included) or Docker images (digests) in it.
    items: int
    # Bytes they take, as billed.
    size: int


def registry_of(project: str, zone: str, cluster: str) -> str:
    """terraform/registry.tf's naming rule: REGION-docker.pkg.dev/PROJECT/CLUSTER-images."""
    return f"{region_of(zone)}-docker.pkg.dev/{project}/{cluster}-images"


def resource_name(registry: str) -> str:
    """REGION-docker.pkg.dev/PROJECT/REPO -> projects/PROJECT/locations/REGION/repositories/REPO."""
    host, project, repository = registry.split("/")[:3]
    return f"projects/{project}/locations/{host.removesuffix('-docker.pkg.dev')}/repositories/{repository}"


def repository_path(cluster) -> tuple[str, str]:
    """(registry, API resource name) of a ClusterState's repository; state written before the
    registry output existed names none, so fall back to the naming rule."""
    registry = cluster.registry or registry_of(cluster.project, cluster.zone, cluster.name)
    return registry, resource_name(registry)


def _client():
    from google.cloud import artifactregistry_v1

    from tfcluster.backends.gcp.cloud.compute import default_credentials

    # REST, not gRPC: the same HTTPS+JSON the other Google clients here speak, through one CA setup.
    return artifactregistry_v1.ArtifactRegistryClient(credentials=default_credentials(), transport="rest")


def usage(registry: str) -> Stored | None:
    """What the repository holds (repositories.get sizeBytes, the billed storage, and the
    images of dockerImages.list); None if there is no such repository."""
    from google.api_core import exceptions

    client, name = _client(), resource_name(registry)
    try:
        repository = client.get_repository(name=name)
        images = sum(1 for _ in client.list_docker_images(parent=name))
    except exceptions.NotFound:
        return None
    return Stored(registry, images, repository.size_bytes)


def delete_repository(name: str) -> None:
    """repositories.delete ("deletes a repository and all of its contents", a long-running operation,
    https://cloud.google.com/artifact-registry/docs/reference/rest/v1/projects.locations.repositories/delete)."""
    _client().delete_repository(name=name).result(timeout=300)


def repository_usage(cluster) -> Stored | None:
    """What a ClusterState's repository holds; None if it is gone."""
    return usage(repository_path(cluster)[0])


def adopt_kept_repository(terraform: Terraform, project: str, region: str, cluster: str,
                          announce: Callable[[str], None]) -> None:
    """Before `up` applies: a repository with this cluster's name that the state does not hold
    was kept by an earlier `down`; import it, so apply uses it instead of failing to create it."""
    registry = f"{region}-docker.pkg.dev/{project}/{cluster}-images"  # As registry_of, in registry_location.
    stored = usage(registry)
    if stored is None:
        return
    try:
        if REPOSITORY in terraform.run("state", "list").split():
            return  # Ours already: a resumed `up`.
    except TerraformError as error:  # A first `up` has no state yet: "No state file was found!"
        if "No state file was found" not in error.stderr:
            raise
    announce(f"reusing registry {registry} kept by an earlier `down` ({stored.items} images)")
    terraform.run("import", "-input=false", "-no-color", REPOSITORY, resource_name(registry))
