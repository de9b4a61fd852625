# The VMs' network: none without VMs (workers = 0, a Vertex AI cluster; vertex.tf).
resource "google_compute_network" "cluster" {
  count                   = var.workers > 0 ? 1 : 0
  name                    = "${var.cluster_name}-net"
  auto_create_subnetworks = false
}

resource "google_compute_subnetwork" "cluster" {
  # checkov:skip=CKV_GCP_26: VPC flow logs are billed (https://cloud.google.com/vpc/network-pricing#network-telemetry) and a cluster's traffic is SSH from one address and training between its own VMs; add a log_config where policy asks for them.
  count                    = var.workers > 0 ? 1 : 0
  name                     = "${var.cluster_name}-subnet"
  network                  = google_compute_network.cluster[0].id
  region                   = local.vm_region
  ip_cidr_range            = "10.128.0.0/20"
  private_ip_google_access = true
}

# SSH only from the operator's address, only to this cluster's VMs.
resource "google_compute_firewall" "ssh_from_operator" {
  count         = var.workers > 0 ? 1 : 0
  name          = "${var.cluster_name}-ssh-from-operator"
  network       = google_compute_network.cluster[0].id
  direction     = "INGRESS"
  source_ranges = [var.operator_cidr]
  target_tags   = [local.tag]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }
}

# Every TCP port, only between members of the cluster (tag to tag): TensorFlow's gRPC port and
# `invoke tune`'s oracle port are fixed, but NCCL, which TensorFlow's multi-worker guide
# recommends on GPUs, opens its bootstrap and data sockets on ephemeral ports
# (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html: NCCL_SOCKET_IFNAME, no
# fixed port), so a rule limited to tf_port and oracle_port makes a GPU run hang.
resource "google_compute_firewall" "tf_between_members" {
  count       = var.workers > 0 ? 1 : 0
  name        = "${var.cluster_name}-tf-between-members"
  network     = google_compute_network.cluster[0].id
  direction   = "INGRESS"
  source_tags = [local.tag]
  target_tags = [local.tag]

  allow {
    protocol = "tcp"
  }
}
