"""Docker on the VMs signs in to Artifact Registry with the VM's own service account.

Google's authentication page exempts only GKE, Cloud Run and Cloud Build from configuring Docker
(https://cloud.google.com/artifact-registry/docs/docker/authentication); a Compute Engine VM gives
Docker an access token: `docker login -u oauth2accesstoken --password-stdin https://LOCATION-docker.pkg.dev`
(the page's "Access token" method), the token taken from the metadata server
(https://cloud.google.com/compute/docs/access/authenticate-workloads#applications, at
instance/service-accounts/default/token, header Metadata-Flavor: Google). Tokens last about an
hour, so the login is made again before every pull. The service account may pull because
terraform/registry.tf grants it roles/artifactregistry.reader on the cluster's repository alone.
"""

from __future__ import annotations

import shlex

from tfcluster.backends.docker import distinct_hosts
from tfcluster.backends.group import in_parallel
from tfcluster.errors import ClusterError

# Artifact Registry's Docker hosts (https://cloud.google.com/artifact-registry/docs/docker/names).
DOCKER_HOST_SUFFIX = "-docker.pkg.dev"
# The token, printed by the VM's own python3 (no gcloud on the image). GCE_METADATA_HOST is what
# Google's client libraries read too; on a VM it is unset and the name is the metadata server's.
TOKEN = ("import json, os, urllib.request; "
         "host = os.environ.get('GCE_METADATA_HOST', 'metadata.google.internal'); "
         "request = urllib.request.Request(f'http://{host}/computeMetadata/v1/instance/service-accounts/default/token', "
         "headers={'Metadata-Flavor': 'Google'}); "
         "print(json.load(urllib.request.urlopen(request, timeout=10))['access_token'])")


def registry_of(image: str) -> str | None:
    """The Artifact Registry host an image is pulled from, or None for any other registry."""
    host = image.split("/", 1)[0] if "/" in image else ""
    return host if host.endswith(DOCKER_HOST_SUFFIX) else None


def login_command(registry: str) -> list[str]:
    script = (f"token=$(python3 -c {shlex.quote(TOKEN)}) || exit 3; "
              f"printf %s \"$token\" | docker login --username oauth2accesstoken --password-stdin "
              f"{shlex.quote('https://' + registry)}")
    return ["sh", "-c", script]


def log_in(hosts, image: str) -> None:
    """Every machine's Docker signed in to the image's Artifact Registry host (nothing for others)."""
    registry = registry_of(image)
    if registry is None:
        return

    def login(host) -> None:
        signed_in = host.run_command(login_command(registry), timeout=60)
        if signed_in.code == 0:
            return
        if signed_in.code == 3:
            raise ClusterError(f"cannot get the VM's access token from the metadata server ({signed_in.last_line}); "
                               "the VM needs its service account (terraform/instances.tf service_account)")
        raise ClusterError(f"docker login to {registry} with the VM's service account failed ({signed_in.last_line})")

    in_parallel(distinct_hosts(hosts), login, lambda h: f"{h.record.name} ({h.record.ssh_address or h.record.address})",
                f"signing in to {registry}")
