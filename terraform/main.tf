# Derived rules, in one place.
locals {
  region = join("-", slice(split("-", var.zone), 0, 2))
  tag    = "tfcluster-${var.cluster_name}"
  labels = { "tfcluster-cluster" = var.cluster_name }

  has_gpu = var.gpu_count > 0
  # GPUs cannot live-migrate, and SPOT VMs cannot either: both must TERMINATE on host maintenance.
  on_host_maintenance = (local.has_gpu || var.spot) ? "TERMINATE" : "MIGRATE"
  # SPOT VMs may not restart automatically; standard ones come back after a host error.
  automatic_restart = !var.spot

  startup_script  = file(var.startup_script != "" ? var.startup_script : "${path.module}/../startup/startup.sh")
  watchdog_script = file(var.watchdog_script != "" ? var.watchdog_script : "${path.module}/../startup/watchdog.py")
}

# Custom role IDs stay reserved for weeks after deletion, so each cluster gets a fresh suffix.
resource "random_id" "suffix" {
  byte_length = 3
}
