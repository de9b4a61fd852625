# A Vertex AI cluster (`--backend vertex`): no VMs (workers = 0); its custom jobs run as this one
# service account (CustomJobSpec.serviceAccount, "the workload run-as account"), which holds what
# training needs and nothing project-wide: the objects of the cluster's bucket, and reading the
# bucket itself, as each VM's account does (iam.tf says why). Vertex AI pulls the image with its
# own service agent, not with this account ("you can't configure a custom service account to pull
# images from Artifact Registry", https://cloud.google.com/vertex-ai/docs/general/custom-service-account),
# so the account needs no role on the registry. account_id: the cluster name (at most 21
# characters, variables.tf) and "-jobs", within IAM's 6 to 30.
resource "google_service_account" "jobs" {
  count        = var.vertex ? 1 : 0
  account_id   = "${var.cluster_name}-jobs"
  display_name = "tfcluster ${var.cluster_name} Vertex AI jobs"
  description  = "Runs the Vertex AI custom jobs of tfcluster ${var.cluster_name}: objects in its bucket."
}

resource "google_storage_bucket_iam_member" "jobs_objects" {
  count  = var.vertex ? 1 : 0
  bucket = google_storage_bucket.cluster.name
  role   = "roles/storage.objectAdmin"
  member = "serviceAccount:${google_service_account.jobs[0].email}"
}

resource "google_storage_bucket_iam_member" "jobs_bucket_reader" {
  count  = var.vertex ? 1 : 0
  bucket = google_storage_bucket.cluster.name
  role   = "roles/storage.legacyBucketReader"
  member = "serviceAccount:${google_service_account.jobs[0].email}"
}

output "jobs_service_account" {
  description = "The account a Vertex AI cluster's jobs run as (\"\" without vertex)."
  value       = var.vertex ? google_service_account.jobs[0].email : ""
}
