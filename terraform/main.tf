# Derived rules, in one place.
locals {
  # The VMs' region (their subnet), and the cluster's own region, where its registry and (unless
  # bucket_location says otherwise) its bucket live: registry_location, which tfcluster writes at
  # the first `up`, so a zone failover to another region never moves (replaces) either.
  vm_region = join("-", slice(split("-", var.zone), 0, 2))
  region    = var.registry_location != "" ? var.registry_location : local.vm_region
  tag       = "tfcluster-${var.cluster_name}"
  labels    = { "tfcluster-cluster" = var.cluster_name }

  # The GPU and machine family rules, generated from tfcluster/gpus.py (one table for both sides).
  gpu_table = jsondecode(file("${path.module}/machine_types.json"))
  has_gpu   = var.gpu_count > 0
  # N1 takes T4 and V100 as guest_accelerator; G2, A2 and A3 types come with their GPUs.
  attached_gpu = local.has_gpu && startswith(var.machine_type, "n1-")
  family       = split("-", var.machine_type)[0]
  nic_type     = var.nic_type != "" ? var.nic_type : lookup(local.gpu_table.required_nic, local.family, null)
  # The provisioning model (`spot = true` is SPOT, as before provisioning_model existed).
  provisioning_model = var.spot ? "SPOT" : var.provisioning_model
  # GPUs cannot live-migrate, and SPOT and FLEX_START VMs cannot either: all must TERMINATE on host maintenance.
  on_host_maintenance = (local.has_gpu || local.provisioning_model != "STANDARD") ? "TERMINATE" : "MIGRATE"
  # SPOT VMs may not restart automatically, nor FLEX_START ones (the provider's own FLEX_START test sets
  # automatic_restart = false); standard ones come back after a host error.
  automatic_restart = local.provisioning_model == "STANDARD"
  # Spot VMs cannot consume reservations, and Google's Flex-start requests consume none
  # (https://cloud.google.com/compute/docs/instances/reservations-consume; .../ai-hypercomputer/docs/create/create-vm).
  reservation_affinity = contains(["STANDARD", "RESERVATION_BOUND"], local.provisioning_model) ? var.reservation_affinity : "NO_RESERVATION"
  # Compact placement as tfcluster chose it (tfcluster/backends/gcp/zones/placement.py), except where the VMs'
  # own model brings a placement: a specific reservation ("only with single-project reservations",
  # https://cloud.google.com/compute/docs/instances/define-instance-placement) and Flex-start (VMs
  # created together are colocated best-effort), and a DENSE reservation's VMs (RESERVATION_BOUND), which
  # its blocks place (GoogleCloudPlatform/cluster-toolkit#3362). Per model, so `--capacity auto`'s rungs follow it.
  compact_placement = var.compact_placement && !contains(["FLEX_START", "RESERVATION_BOUND"], local.provisioning_model) && local.reservation_affinity != "SPECIFIC_RESERVATION"
  # Types with bundled Local SSD (A3 High, A2 Ultra): a stop at the deadline must discard it.
  local_ssd = try(local.gpu_table.machine_types[var.machine_type].local_ssd_gb, 0) > 0

  startup_script = file(var.startup_script != "" ? var.startup_script : "${path.module}/../startup/startup.sh")
  # The watchdog package as one metadata value, {"file.py": source}: startup.sh writes the files out.
  watchdog_folder  = var.watchdog_source != "" ? var.watchdog_source : "${path.module}/../startup/tfcluster_watchdog"
  watchdog_package = jsonencode({ for name in fileset(local.watchdog_folder, "*.py") : name => file("${local.watchdog_folder}/${name}") })
}

# Custom role IDs stay reserved for weeks after deletion, so each cluster gets a fresh suffix.
resource "random_id" "suffix" {
  byte_length = 3
}
