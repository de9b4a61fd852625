# The VMs' identity: only what training and the idle watchdog need, nothing project-wide.
resource "google_service_account" "vm" {
  account_id   = "${var.cluster_name}-vm"
  display_name = "tfcluster ${var.cluster_name} VMs"
  description  = "Runs the tfcluster VMs of ${var.cluster_name}: objects in its bucket, and get/stop/delete of its own instances."
}

# Read and write objects in the cluster bucket only (data, checkpoints, models, TensorBoard).
resource "google_storage_bucket_iam_member" "vm_objects" {
  bucket = google_storage_bucket.cluster.name
  role   = "roles/storage.objectAdmin"
  member = "serviceAccount:${google_service_account.vm.email}"
}

# TensorFlow's gs:// client reads the bucket itself (storage.buckets.get) before it creates the
# first folder of a run, which objectAdmin does not include; legacyBucketReader adds just that and
# storage.objects.list (IAM roles for Cloud Storage). On this bucket only, nothing project-wide.
resource "google_storage_bucket_iam_member" "vm_bucket_reader" {
  bucket = google_storage_bucket.cluster.name
  role   = "roles/storage.legacyBucketReader"
  member = "serviceAccount:${google_service_account.vm.email}"
}

# Just what the idle watchdog calls on its own VM.
resource "google_project_iam_custom_role" "watchdog" {
  role_id     = "tfclusterWatchdog_${replace(var.cluster_name, "-", "_")}_${random_id.suffix.hex}"
  title       = "tfcluster idle watchdog (${var.cluster_name})"
  description = "Lets a tfcluster VM delete itself (idle action delete); granted per instance, never project-wide."
  # Only what startup/watchdog.py calls: instances.delete. Its stop action halts the guest from
  # inside (shutdown -h), which needs no permission.
  permissions = ["compute.instances.delete"]
}

# Granted on each instance, so a VM can stop or delete only the cluster's own VMs.
resource "google_compute_instance_iam_member" "watchdog" {
  count         = var.workers
  zone          = var.zone
  instance_name = google_compute_instance.worker[count.index].name
  role          = google_project_iam_custom_role.watchdog.id
  member        = "serviceAccount:${google_service_account.vm.email}"
}
