"""What a killed command made in the project that terraform's state does not name, found and removed.

A terraform killed mid-apply has made resources that it records only once the provider returns them
(tfcluster/backends/gcp/cloud/terraform_remains.py mends the folder itself). Before the next `up` and
around `down`'s last destroy, resources of the cluster that the state does not name (instances, disks,
addresses and empty buckets by the cluster's label; firewall rules and subnetworks by the cluster's
network; the network, its service accounts, custom role and empty registry by their names) are
deleted, so `up` makes them again and `down` leaves none (what stands on the cluster's network before
`down`'s destroy deletes the network, the rest after it); an unrecorded VM's start and deletion go
into the cost ledger first. It says so in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tfcluster.backends.gcp.cloud.terraform_remains import state_names
from tfcluster.errors import ClusterError


def _recorded(item: str, names: set[str]) -> bool:
    ident = item.rsplit(" ", 1)[-1]
    return ident in names or any(name.endswith("/" + ident) for name in names)


def unrecorded(api, project: str, zone: str, cluster: str, workdir: Path, keep: tuple[str, ...] = ()) -> list[str]:
    """The cluster's resources in the project that terraform's state does not name ("instance sweep-0"),
    but for ``keep`` (a bucket `down` keeps for its results)."""
    from tfcluster.backends.gcp.cloud.compute import default_credentials
    from tfcluster.backends.gcp.access.iam import iam_leftovers

    names = state_names(workdir)
    found = (api.leftovers(zone, cluster) + iam_leftovers(project, cluster, default_credentials()).found
             + _empty_buckets(project, cluster) + _empty_repository(project, zone, cluster, workdir))
    return [item for item in found if not _recorded(item, names) and item.rsplit(" ", 1)[-1] not in keep]


def _empty_buckets(project: str, cluster: str) -> list[str]:
    """The cluster's empty buckets, by its label (terraform/main.tf local.labels): a killed `up` that made
    one and lost its random suffix (random_id.suffix) makes another next time. One that holds objects is
    never taken for an orphan: it is a bucket `down` kept, or the user's."""
    from tfcluster.backends.gcp.cloud import storage
    from tfcluster.backends.gcp.cloud.compute import LABEL

    client = storage.client(project)
    return [f"bucket {bucket.name}" for bucket in client.list_buckets(project=project)
            if (bucket.labels or {}).get(LABEL) == cluster
            and not list(client.list_blobs(bucket.name, max_results=1, versions=True))]


def _empty_repository(project: str, zone: str, cluster: str, workdir: Path) -> list[str]:
    """The cluster's Artifact Registry repository (terraform/registry.tf: CLUSTER-images, in the
    registry_location its first `up` pinned), when it is empty: a killed `up` may have made it and never
    recorded it. One that holds images was kept by an earlier `down` (the next `up` adopts it,
    registry.adopt_kept_repository), never taken for an orphan."""
    import json

    from tfcluster.backends.gcp.cloud import registry
    from tfcluster.backends.gcp.cloud.compute import region_of

    tfvars = workdir / "terraform.tfvars.json"
    location = (json.loads(tfvars.read_text()).get("registry_location") if tfvars.exists() else "") or region_of(zone)
    path = f"{location}-docker.pkg.dev/{project}/{cluster}-images"
    stored = registry.usage(path)
    return [f"registry {registry.resource_name(path)}"] if stored is not None and not stored.items else []


# Deleted in this order: what uses a thing goes before it (an instance before its disk and network).
ORDER = ("instance", "disk", "address", "firewall rule", "subnetwork", "network", "service account", "custom role",
         "bucket", "registry")


# What stands on the cluster's network, and what bills by the hour: Compute refuses to delete a network
# still in use (networks.delete, https://cloud.google.com/compute/docs/reference/rest/v1/networks/delete,
# answers 400 resourceInUseByAnotherResource: "The network resource '...' is already being used by '...'").
ON_THE_NETWORK = ("instance", "disk", "address", "firewall rule", "subnetwork")


def _kind(item: str) -> str:
    return next(kind for kind in ORDER if item.startswith(kind + " "))


def remove_unrecorded(api, project: str, zone: str, cluster: str, workdir: Path,
                      announce: Callable[[str], None], keep: tuple[str, ...] = (),
                      kinds: tuple[str, ...] = ORDER) -> list[str]:
    """Delete the cluster's resources of ``kinds`` that the state does not name (but ``keep``); returns them."""
    items = sorted((item for item in unrecorded(api, project, zone, cluster, workdir, keep) if _kind(item) in kinds),
                   key=lambda item: ORDER.index(_kind(item)))
    if not items:
        return []
    announce(f"removing {len(items)} resource(s) of '{cluster}' that a killed terraform made but never recorded: "
             f"{', '.join(items)}")
    for item in items:
        if item.startswith("instance "):
            _ledger_the_unrecorded(api, zone, item.split(" ", 1)[1], workdir.parent.parent, cluster)
        _delete(api, project, zone, item)
    return items


def _ledger_the_unrecorded(api, zone: str, name: str, state_dir: Path, cluster: str) -> None:
    """A VM that the killed command made bills from its start (the ledger may never have seen it: that
    command died before its sync), until the deletion this module makes: both go into the cost ledger,
    its start at Compute's own timestamp, never twice (a start already there at that time stands)."""
    import time

    from tfcluster.backends.gcp.spend.ledger_events import seen_of
    from tfcluster.ledger import DELETE, OBSERVED, OWN, START, Event, Ledger

    vm = api.instance_or_none(zone, name)
    started = seen_of(vm).last_start if vm is not None else None
    book = Ledger(state_dir, cluster)
    if started is not None and not any(e.instance == name and e.kind == START and abs(e.at - started) < 1.0
                                       for e in book.events()):
        book.append([Event(at=started, instance=name, kind=START, source=OBSERVED, detail="lastStartTimestamp")])
    book.append([Event(at=time.time(), instance=name, kind=DELETE, source=OWN,
                       detail="deleted: made by a killed command, never recorded by terraform")])


def _delete(api, project: str, zone: str, item: str) -> None:
    from google.api_core import exceptions

    from tfcluster.backends.gcp.cloud.compute import region_of

    kind, name = item.rsplit(" ", 1)
    v1, kwargs, region = api.compute_v1, api.client_kwargs, region_of(zone)
    try:
        if kind == "instance":
            api.instances.delete(project=project, zone=zone, instance=name).result(timeout=300)
        elif kind == "disk":
            v1.DisksClient(**kwargs).delete(project=project, zone=zone, disk=name).result(timeout=300)
        elif kind == "address":
            v1.AddressesClient(**kwargs).delete(project=project, region=region, address=name).result(timeout=300)
        elif kind == "firewall rule":
            v1.FirewallsClient(**kwargs).delete(project=project, firewall=name).result(timeout=300)
        elif kind == "subnetwork":
            v1.SubnetworksClient(**kwargs).delete(project=project, region=region, subnetwork=name).result(timeout=300)
        elif kind == "network":
            v1.NetworksClient(**kwargs).delete(project=project, network=name).result(timeout=300)
        elif kind == "bucket":
            from tfcluster.backends.gcp.cloud import storage

            storage.client(project).bucket(name).delete()  # Refused (409) if an object came since: kept.
        elif kind == "registry":
            from tfcluster.backends.gcp.cloud import registry

            registry.delete_repository(name)
        else:
            _delete_iam(project, kind, name)
    except exceptions.NotFound:
        pass  # Gone already: what was wanted.
    except exceptions.Conflict:
        pass  # A bucket that holds an object now: never deleted with it.


def _delete_iam(project: str, kind: str, name: str) -> None:
    """projects.serviceAccounts.delete / projects.roles.delete (IAM v1 REST)."""
    from google.auth.transport.requests import AuthorizedSession

    from tfcluster.backends.gcp.cloud.compute import default_credentials
    from tfcluster.backends.gcp.access.iam import IAM

    path = f"projects/{project}/serviceAccounts/{name}" if kind == "service account" else name
    answer = AuthorizedSession(default_credentials()).delete(f"{IAM}/{path}", timeout=60)
    if answer.status_code not in (200, 204, 404):
        raise ClusterError(f"could not delete {kind} {name} ({answer.status_code}: {answer.text[:200]}); delete it in "
                           f"the console (project {project}), then run this again")


def remove_before_destroy(api, cluster, workdir: Path, announce: Callable[[str], None]) -> list[str]:
    """Before `down`'s last destroy, which deletes the network: what a killed apply made on the network
    but never recorded (a subnetwork or firewall rule whose insert was answered after the kill, an
    instance), and what bills by the hour. Else Compute refuses the network, terraform destroy fails,
    and so does every `down` after it (the sweep's `up then down`, issue 46)."""
    if not cluster.zone:
        return []
    return remove_unrecorded(api, cluster.project, cluster.zone, cluster.name, workdir, announce, kinds=ON_THE_NETWORK)


def remove_after_destroy(api, cluster, workdir: Path, announce: Callable[[str], None],
                         kept_bucket: str | None) -> list[str]:
    """After `down`'s destroy: what a killed apply made but never recorded goes too. Only ``kept_bucket``,
    the bucket this `down` kept for its results, stays: the record's bucket is not the state's when a kill
    cut the state (the backup's random suffix named another), and an empty one is never kept (the sweep's
    leak, issue 46)."""
    if not cluster.zone:
        return []
    held = (kept_bucket,) if kept_bucket else ()
    return remove_unrecorded(api, cluster.project, cluster.zone, cluster.name, workdir, announce, keep=held)
