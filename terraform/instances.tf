resource "google_compute_instance" "worker" {
  # checkov:skip=CKV_GCP_40: An external IP is how the operator's SSH arrives; the firewall admits only operator_cidr.
  # checkov:skip=CKV_GCP_38: Google-managed encryption; customer-supplied keys would have to be handled by every user.
  # checkov:skip=CKV_GCP_34: With ssh_identity metadata the cluster's own key arrives in instance metadata, which OS Login would ignore; project keys are blocked (ssh_identity oslogin turns OS Login on).
  count        = var.workers
  name         = "${var.cluster_name}-${count.index}"
  machine_type = var.machine_type
  zone         = var.zone
  tags         = [local.tag]
  labels       = merge(local.labels, { "tfcluster-role" = count.index == 0 ? "chief" : "worker" })

  boot_disk {
    initialize_params {
      image  = var.image
      size   = var.boot_disk_gb
      type   = var.boot_disk_type
      labels = local.labels # So that `invoke down` can prove no disk of the cluster is left.
    }
  }

  dynamic "guest_accelerator" {
    for_each = local.attached_gpu ? [1] : []
    content {
      type  = var.gpu_type
      count = var.gpu_count
    }
  }

  scheduling {
    on_host_maintenance         = local.on_host_maintenance
    automatic_restart           = local.automatic_restart
    provisioning_model          = local.provisioning_model
    preemptible                 = local.provisioning_model == "SPOT"
    instance_termination_action = var.termination_action
    # The hypervisor's hard deadline: stops (or deletes) the VM even if nobody is watching; sooner
    # when the cluster's budget runs out first (tfcluster/backends/gcp/spend/budget.py).
    max_run_duration {
      seconds = var.budget_run_seconds > 0 ? min(var.budget_run_seconds, var.max_run_hours * 3600) : var.max_run_hours * 3600
    }
    # A stop of a VM with Local SSD must say what becomes of it (instances.stop discardLocalSsd is
    # "required if the instance has any attached Local SSD disks"); the deadline's stop discards it.
    dynamic "on_instance_stop_action" {
      for_each = local.local_ssd && var.termination_action == "STOP" ? [1] : []
      content {
        discard_local_ssd = true
      }
    }
  }

  # Compact placement (placement.tf), when tfcluster chose it for this cluster.
  resource_policies = local.compact_placement ? [google_compute_resource_policy.placement[0].id] : []

  reservation_affinity {
    type = local.reservation_affinity
    dynamic "specific_reservation" {
      for_each = local.reservation_affinity == "SPECIFIC_RESERVATION" ? [var.reservation_name] : []
      content {
        key    = "compute.googleapis.com/reservation-name"
        values = [specific_reservation.value]
      }
    }
  }

  shielded_instance_config {
    # The image's NVIDIA kernel modules are not signed for Secure Boot.
    enable_secure_boot          = false
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  network_interface {
    subnetwork = google_compute_subnetwork.cluster[0].id
    nic_type   = local.nic_type
    access_config {}
  }

  service_account {
    # Its own account (iam.tf): its token can delete this instance and no other.
    email = google_service_account.vm[count.index].email
    # Access is governed by the service account's IAM grants above, not by scopes.
    scopes = ["cloud-platform"]
  }

  # enable-oslogin and ssh-keys follow var.ssh_identity (tfcluster/backends/gcp/access/oslogin.py): with
  # OS Login the VMs ask the operator's login profile for the key and ignore metadata keys, so
  # none is set; else the cluster's key comes from ssh-keys and OS Login is off.
  metadata = {
    "block-project-ssh-keys"       = "true"
    "enable-oslogin"               = var.ssh_identity == "oslogin" ? "TRUE" : "false"
    "enable-guest-attributes"      = "TRUE"
    "serial-port-enable"           = "false"
    "install-nvidia-driver"        = local.has_gpu ? "True" : "False"
    "ssh-keys"                     = var.ssh_identity == "oslogin" ? "" : "${var.ssh_user}:${var.ssh_public_key}"
    "tfcluster-cluster"            = var.cluster_name
    "tfcluster-tf-port"            = tostring(var.tf_port)
    "tfcluster-idle-minutes"       = tostring(var.idle_minutes)
    "tfcluster-idle-action"        = var.idle_action
    "tfcluster-idle-probes"        = "jobs_and_ssh"
    "tfcluster-boot-grace-minutes" = tostring(var.boot_grace_minutes)
    "tfcluster-watchdog"           = local.watchdog_package
    "tfcluster-boot-nonce"         = var.boot_nonce
    "tfcluster-docker"             = var.docker ? "true" : "false"
    "startup-script"               = local.startup_script
  }

  lifecycle {
    # `invoke up` writes a new nonce before each start, `invoke idle` changes the watchdog
    # settings and `invoke train` hands it the run's stall limit and --then through the Compute
    # API; none of it is drift for Terraform to undo. Nor are bundled Local SSDs (below).
    ignore_changes = [
      metadata["tfcluster-boot-nonce"],
      metadata["tfcluster-idle-minutes"],
      metadata["tfcluster-idle-action"],
      metadata["tfcluster-stall-minutes"],
      metadata["tfcluster-then-stop"],
      metadata["tfcluster-budget-end"],
      # Compute attaches a type's bundled Local SSD itself; read back, it is not drift that would
      # replace the VM (cloud-foundation-fabric#4148, terraform-provider-google#19648).
      scratch_disk,
    ]
  }

  depends_on = [google_storage_bucket_iam_member.vm_objects, google_storage_bucket_iam_member.vm_bucket_reader]
}
