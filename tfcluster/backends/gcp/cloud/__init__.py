"""The gcp backend's lowest room: the clients every other room stands on, one Google service (or tool) a
module. errors (Google's errors, and terraform's, as one line naming the fix; `translated`), compute
(the Compute Engine API: readiness, host keys, operations, preemption records, stops, with backoff),
terraform (the CLI wrapper and its typed outputs; MODULE_DIR), storage (Cloud Storage transfers),
registry (the Artifact Registry repository: what it holds, adopting a kept one).

May import: the bottom layer (tfcluster.errors, gpus, state) and Google's client libraries; no other
room of the gcp backend. Everyone outside tfcluster/backends/gcp/ imports only what __all__ names.
"""

from tfcluster.backends.gcp.cloud import storage
from tfcluster.backends.gcp.cloud.compute import ComputeApi, default_credentials, region_of
from tfcluster.backends.gcp.cloud.errors import GoogleError, explain, translated
from tfcluster.backends.gcp.cloud.registry import adopt_kept_repository
from tfcluster.backends.gcp.cloud.terraform import MODULE_DIR, Terraform

__all__ = ["ComputeApi", "GoogleError", "MODULE_DIR", "Terraform", "adopt_kept_repository", "default_credentials",
           "explain", "region_of", "storage", "translated"]
