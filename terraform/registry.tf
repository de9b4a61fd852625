# The cluster's container registry: `invoke image build` pushes the trainer image here and every
# VM pulls it (`train --image`, `up --image`). Private: only the VMs' service accounts may read.
# Destroying it deletes every image in it (repositories.delete "deletes a repository and all of
# its contents"), and the provider's deletion_policy defaults to "DELETE": so `invoke down` looks
# first and, when images are there and --delete-bucket was not given, takes the repository out of
# the state (`terraform state rm`, as for the bucket) rather than applying deletion_policy =
# "ABANDON", which would cost one more apply for the same effect.
resource "google_artifact_registry_repository" "images" {
  # checkov:skip=CKV_GCP_84: A customer-managed key would need a KMS key ring per cluster; images hold code, not data, and Google encrypts them at rest.
  location      = local.region
  repository_id = "${var.cluster_name}-images"
  format        = "DOCKER"
  description   = "tfcluster ${var.cluster_name}: trainer images the VMs run."
  labels        = local.labels
}

# Pull only (artifactregistry.reader), on this repository only, never project-wide; every VM's account.
resource "google_artifact_registry_repository_iam_member" "vm_reader" {
  count      = var.workers
  project    = google_artifact_registry_repository.images.project
  location   = google_artifact_registry_repository.images.location
  repository = google_artifact_registry_repository.images.name
  role       = "roles/artifactregistry.reader"
  member     = "serviceAccount:${google_service_account.vm[count.index].email}"
}

output "registry" {
  description = "Where `invoke image build` pushes and the VMs pull: LOCATION-docker.pkg.dev/PROJECT/REPO."
  value       = "${local.region}-docker.pkg.dev/${var.project}/${google_artifact_registry_repository.images.repository_id}"
}
