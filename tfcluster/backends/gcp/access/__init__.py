"""Who may reach what, and what a project must offer first: iam (the VMs' service accounts and the
custom role `down` proves gone), address (the operator's public IP for the SSH firewall rule), check
(`invoke check`: what the project offers, asked of Google: credentials, services, permissions,
constraints, image, quota, prices) and prerequisites (its rules, judged without a network).

May import: the cloud, quotas, prices and zones rooms, tfcluster.backends.base and the bottom layer.
Outside tfcluster/backends/gcp/, only what __all__ names.
"""

from tfcluster.backends.gcp.access.check import (Google, Refused, credentials_finding, permissions_finding,
                                                 services_finding, terraform_finding)

__all__ = ["Google", "Refused", "credentials_finding", "permissions_finding", "services_finding",
           "terraform_finding"]
