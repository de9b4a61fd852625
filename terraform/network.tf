resource "google_compute_network" "cluster" {
  name                    = "${var.cluster_name}-net"
  auto_create_subnetworks = false
}

resource "google_compute_subnetwork" "cluster" {
  name                     = "${var.cluster_name}-subnet"
  network                  = google_compute_network.cluster.id
  region                   = local.region
  ip_cidr_range            = "10.128.0.0/20"
  private_ip_google_access = true

  log_config {
    aggregation_interval = "INTERVAL_10_MIN"
    flow_sampling        = 0.5
    metadata             = "INCLUDE_ALL_METADATA"
  }
}

# SSH only from the operator's address, only to this cluster's VMs.
resource "google_compute_firewall" "ssh_from_operator" {
  name          = "${var.cluster_name}-ssh-from-operator"
  network       = google_compute_network.cluster.id
  direction     = "INGRESS"
  source_ranges = [var.operator_cidr]
  target_tags   = [local.tag]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }
}

# The TensorFlow port and `invoke tune`'s oracle port only between members of the cluster (tag to tag).
resource "google_compute_firewall" "tf_between_members" {
  name        = "${var.cluster_name}-tf-between-members"
  network     = google_compute_network.cluster.id
  direction   = "INGRESS"
  source_tags = [local.tag]
  target_tags = [local.tag]

  allow {
    protocol = "tcp"
    ports    = [tostring(var.tf_port), tostring(var.oracle_port)]
  }
}
