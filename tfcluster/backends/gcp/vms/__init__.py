"""What is done to a cluster's VMs once they are made: vm_control (halting VMs for `--then` and host
maintenance; the stall limit and the budget's end time in their metadata), vm_status (what `status` shows
of each VM: state, capacity, uptime, cost; its hypervisor deadline), teardown (`down`: destroy, keeping a
bucket or registry that holds data), docker_login (the VMs' Docker signing in to the registry).

May import: the cloud, prices and zones rooms, tfcluster.backends.{base,docker,group} and the bottom
layer. Outside tfcluster/backends/gcp/, only what __all__ names.
"""

from tfcluster.backends.gcp.vms.teardown import Kept, bucket_rule, destroy_keeping_results

__all__ = ["Kept", "bucket_rule", "destroy_keeping_results"]
