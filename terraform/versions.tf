terraform {
  # 1.9: a variable's validation refers to another variable (variables.tf), which 1.5-1.8 refuse to load.
  required_version = ">= 1.9.0, < 2.0.0"

  required_providers {
    google = {
      source = "hashicorp/google"
      # 7.41.0 is the first release whose google_compute_instance takes provisioning_model FLEX_START and
      # RESERVATION_BOUND (CHANGELOG 7.41.0; GoogleCloudPlatform/magic-modules#17417).
      version = ">= 7.41.0, < 8.0.0"
    }
    random = {
      source  = "hashicorp/random"
      version = ">= 3.5.0, < 4.0.0"
    }
  }
}

provider "google" {
  project = var.project
  region  = local.region
  zone    = var.zone
}
