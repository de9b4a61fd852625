"""The hashicorp/google stand-in: the resources terraform/ uses, and the provider block's settings."""

from __future__ import annotations

from tests.world.provider.base import Provider
from tests.world.provider.google_compute import Firewall, Network, ResourcePolicy, Subnetwork
from tests.world.provider.google_iam import (BucketIamMember, CustomRole, InstanceIamMember, RepositoryIamMember,
                                             ServiceAccount)
from tests.world.provider.google_instance import Instance
from tests.world.provider.google_other import Bucket, Repository


class Google(Provider):
    name = "google"
    resources = [Network, Subnetwork, Firewall, Instance, InstanceIamMember, ServiceAccount, CustomRole,
                 Bucket, BucketIamMember, Repository, RepositoryIamMember, ResourcePolicy]

    def region(self) -> str:
        return self.config.get("region") or "-".join(str(self.config.get("zone", "")).split("-")[:2])


def main() -> None:
    from tests.world.provider.servicer import run

    run(Google())
