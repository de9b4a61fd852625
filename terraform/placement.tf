# Compact placement: the cluster's VMs as close together as Compute can place them (a lower-latency
# all-reduce). tfcluster decides compact_placement from Google's rules, each with its source
# (tfcluster/backends/gcp/zones/placement.py): G2, A2 and A3 series, 2 to 150 VMs, not for VMs that consume
# a reservation or Flex-start (they bring their own placement), never for N1. vm_count stays unset
# (compute.v1 ResourcePolicyGroupPlacementPolicy.vmCount: "Google does not recommend that you use this
# field unless ... this exact number of VMs").
resource "google_compute_resource_policy" "placement" {
  count  = local.compact_placement ? 1 : 0
  name   = "${var.cluster_name}-placement"
  region = local.vm_region
  group_placement_policy {
    collocation = "COLLOCATED"
  }
}
