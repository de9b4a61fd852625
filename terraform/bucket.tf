resource "google_storage_bucket" "cluster" {
  # checkov:skip=CKV_GCP_62: Access logs would need a second bucket per cluster; the bucket is private (enforced) and short-lived.
  name                        = "${var.project}-${var.cluster_name}-${random_id.suffix.hex}"
  location                    = var.bucket_location != "" ? var.bucket_location : upper(local.region)
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = var.bucket_force_destroy
  labels                      = local.labels

  versioning {
    enabled = true
  }

  # Live objects (models, checkpoints) are deleted by age only when the user asks for it.
  dynamic "lifecycle_rule" {
    for_each = var.bucket_retention_days > 0 ? [var.bucket_retention_days] : []
    content {
      condition {
        age = lifecycle_rule.value
      }
      action {
        type = "Delete"
      }
    }
  }

  # Checkpoints are rewritten every epoch: old versions only cost money after a day.
  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 1
      with_state                 = "ARCHIVED"
    }
    action {
      type = "Delete"
    }
  }
}
