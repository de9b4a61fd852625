output "instances" {
  description = "Every VM in worker order (index 0 is the chief): name, zone, internal and external IP."
  value = [
    for vm in google_compute_instance.worker : {
      name        = vm.name
      zone        = vm.zone
      internal_ip = vm.network_interface[0].network_ip
      external_ip = vm.network_interface[0].access_config[0].nat_ip
    }
  ]
}

output "bucket" {
  description = "The cluster bucket (data, checkpoints, models, TensorBoard logs)."
  value       = google_storage_bucket.cluster.name
}

output "service_accounts" {
  description = "Email of each VM's own service account, in worker order."
  value       = google_service_account.vm[*].email
}

output "labels" {
  description = "Labels on every VM; `invoke down` lists instances by them to prove none is left."
  value       = local.labels
}
