# The VMs' identities: one service account per VM, so that the watchdog's delete permission,
# granted on each instance to that instance's account alone, lets a VM delete itself and no other
# (Compute checks an instance's IAM policy for the caller's own principal:
# https://cloud.google.com/compute/docs/access/iam). Only what training and the idle watchdog need,
# nothing project-wide. account_id must be 6 to 30 characters, [a-z][-a-z0-9]*[a-z0-9]
# (https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts/create): with
# cluster_name at most 21 (variables.tf) and workers at most 64, "<name>-vm-63" is at most 27.
# A project holds 100 service accounts unless its quota was raised
# (https://cloud.google.com/iam/quotas): a cluster uses one per worker.
resource "google_service_account" "vm" {
  count        = var.workers
  account_id   = "${var.cluster_name}-vm-${count.index}"
  display_name = "tfcluster ${var.cluster_name} VM ${count.index}"
  description  = "Runs VM ${count.index} of tfcluster ${var.cluster_name}: objects in its bucket, and deleting its own instance."
}

# Read and write objects in the cluster bucket only (data, checkpoints, models, TensorBoard).
# Every VM's account: each VM writes its own checkpoints and logs.
resource "google_storage_bucket_iam_member" "vm_objects" {
  count  = var.workers
  bucket = google_storage_bucket.cluster.name
  role   = "roles/storage.objectAdmin"
  member = "serviceAccount:${google_service_account.vm[count.index].email}"
}

# TensorFlow's gs:// client reads the bucket itself (storage.buckets.get) before it creates the
# first folder of a run, which objectAdmin does not include; legacyBucketReader adds just that and
# storage.objects.list (IAM roles for Cloud Storage). On this bucket only, nothing project-wide.
resource "google_storage_bucket_iam_member" "vm_bucket_reader" {
  count  = var.workers
  bucket = google_storage_bucket.cluster.name
  role   = "roles/storage.legacyBucketReader"
  member = "serviceAccount:${google_service_account.vm[count.index].email}"
}

# Just what the idle watchdog calls on its own VM.
resource "google_project_iam_custom_role" "watchdog" {
  count       = var.workers > 0 ? 1 : 0 # None without VMs (workers = 0).
  role_id     = "tfclusterWatchdog_${replace(var.cluster_name, "-", "_")}_${random_id.suffix.hex}"
  title       = "tfcluster idle watchdog (${var.cluster_name})"
  description = "Lets a tfcluster VM delete itself (idle action delete); granted per instance, never project-wide."
  # Only what startup/tfcluster_watchdog calls: instances.delete. Its stop action halts the guest from
  # inside (shutdown -h), which needs no permission.
  permissions = ["compute.instances.delete"]
}

# Granted on instance i to account i alone: a VM may delete itself, and its token is refused (403)
# on every other instance, its siblings included.
resource "google_compute_instance_iam_member" "watchdog" {
  count         = var.workers
  zone          = var.zone
  instance_name = google_compute_instance.worker[count.index].name
  role          = google_project_iam_custom_role.watchdog[0].id
  member        = "serviceAccount:${google_service_account.vm[count.index].email}"
}
