variable "project" {
  description = "Google Cloud project ID that holds every resource of the cluster."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be a project ID: 6-30 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "zone" {
  description = "Zone for the VMs, e.g. us-west1-b. It must offer the GPU type (tfcluster checks before apply)."
  type        = string
  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z]$", var.zone))
    error_message = "zone must look like us-west1-b."
  }
}

variable "cluster_name" {
  description = "Name of the cluster; prefixes every resource and labels them tfcluster-cluster=<name>."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,19}[a-z0-9]$", var.cluster_name))
    error_message = "cluster_name must be 3 to 21 lowercase letters, digits and hyphens, starting with a letter and not ending with a hyphen (it names the VMs' service accounts and the network tag)."
  }
}

variable "workers" {
  description = "Number of VMs; VM 0 is the chief. 0 with vertex: the jobs run on Vertex AI's machines."
  type        = number
  validation {
    condition     = var.workers >= 1 && var.workers <= 64 && floor(var.workers) == var.workers || var.vertex && var.workers == 0
    error_message = "workers must be a whole number from 1 to 64 (or 0 with vertex)."
  }
}

variable "vertex" {
  description = "The cluster trains on Vertex AI custom jobs (`--backend vertex`): one service account for the jobs, with the bucket's object roles (vertex.tf); give workers = 0 for no VMs."
  type        = bool
  default     = false
}

variable "machine_type" {
  description = "N1 machine type for attached T4 or V100 GPUs (e.g. n1-standard-8), or the G2, A2 or A3 type that comes with the GPUs (machine_types.json)."
  type        = string
  default     = "n1-standard-8"
  validation {
    condition     = can(regex("^n1-(standard|highmem|highcpu)-[0-9]+$", var.machine_type)) || contains(keys(local.gpu_table.machine_types), var.machine_type)
    error_message = "machine_type must be an N1 type such as n1-standard-8 (T4, V100) or a G2, A2 or A3 type from machine_types.json."
  }
  validation {
    # N1 takes attached GPUs; a G2, A2 or A3 type comes with its own, which gpu_type and gpu_count must name.
    condition     = can(regex("^n1-", var.machine_type)) ? var.gpu_count == 0 || contains(lookup(local.gpu_table.attached, var.gpu_type, []), var.gpu_count) : try(local.gpu_table.machine_types[var.machine_type].accelerator == var.gpu_type && local.gpu_table.machine_types[var.machine_type].gpus == var.gpu_count, false)
    error_message = "gpu_type and gpu_count must be what machine_type takes: T4 or V100 attached to N1 (machine_types.json attached), or the GPUs a G2, A2 or A3 type comes with."
  }
  validation {
    condition     = !try(local.gpu_table.machine_types[var.machine_type].spot_only, false) || var.spot || var.provisioning_model != "STANDARD"
    error_message = "machine_type is offered only as Spot or Flex-start (spot = true, or provisioning_model = \"FLEX_START\")."
  }
  validation {
    # "Flex-start VMs support all accelerator-optimized machine types (except A4X and G4)": not N1.
    condition     = var.provisioning_model != "FLEX_START" || !startswith(var.machine_type, "n1-")
    error_message = "provisioning_model FLEX_START needs an accelerator-optimized machine type (G2, A2 or A3), not N1."
  }
}

variable "gpu_type" {
  description = "The VMs' GPU: attached on N1, or the one their G2, A2 or A3 machine type comes with."
  type        = string
  default     = "nvidia-tesla-t4"
  validation {
    condition     = contains(local.gpu_table.accelerators, var.gpu_type)
    error_message = "gpu_type must be one of the accelerators in machine_types.json."
  }
}

variable "gpu_count" {
  description = "GPUs per VM (0 for a CPU-only N1 cluster)."
  type        = number
  default     = 1
  validation {
    condition     = contains([0, 1, 2, 4, 8, 16], var.gpu_count)
    error_message = "gpu_count must be 0, 1, 2, 4, 8 or 16."
  }
}

variable "boot_disk_type" {
  description = "Boot disk type; each machine family takes its own (machine_types.json disk_types: A3 and G2 take no pd-standard)."
  type        = string
  default     = "pd-balanced"
  validation {
    condition     = contains(lookup(local.gpu_table.disk_types, split("-", var.machine_type)[0], []), var.boot_disk_type)
    error_message = "boot_disk_type must be one the machine family supports (machine_types.json disk_types)."
  }
}

variable "nic_type" {
  description = "NIC type, VIRTIO_NET or GVNIC; empty is what the family needs (GVNIC on A3), else Google's default."
  type        = string
  default     = ""
  validation {
    condition     = contains(["", "VIRTIO_NET", "GVNIC"], var.nic_type) && (var.nic_type == "" || lookup(local.gpu_table.required_nic, split("-", var.machine_type)[0], var.nic_type) == var.nic_type)
    error_message = "nic_type must be empty, VIRTIO_NET or GVNIC, and GVNIC where the family requires it (machine_types.json required_nic)."
  }
}

variable "image" {
  description = "Boot image, pinned by exact name: TensorFlow Deep Learning VM images are deprecated, so this is a CUDA image and startup/ installs TensorFlow."
  type        = string
  default     = "projects/deeplearning-platform-release/global/images/common-cu129-ubuntu-2204-nvidia-580-v20261001"
  validation {
    condition     = can(regex("^projects/[a-z0-9-]+/global/images/[a-z0-9-]+-v[0-9]{8}$", var.image))
    error_message = "image must be an exact image (projects/P/global/images/NAME-vYYYYMMDD), not a family, so every VM boots the same bits."
  }
}

variable "boot_disk_gb" {
  description = "Boot disk size in GB (the CUDA image needs at least 50)."
  type        = number
  default     = 100
  validation {
    condition     = var.boot_disk_gb >= 50 && var.boot_disk_gb <= 2000
    error_message = "boot_disk_gb must be between 50 and 2000."
  }
}

variable "spot" {
  description = "Use SPOT VMs: much cheaper, but Google may stop them at any time (training resumes from the checkpoint)."
  type        = bool
  default     = false
}

variable "provisioning_model" {
  description = "STANDARD, SPOT (as spot = true), FLEX_START (Dynamic Workload Scheduler: discounted, runs at most 7 days, accelerator-optimized types only) or RESERVATION_BOUND (on-demand VMs on a DENSE reservation, named by reservation_name)."
  type        = string
  default     = "STANDARD"
  validation {
    condition     = contains(["STANDARD", "SPOT", "FLEX_START", "RESERVATION_BOUND"], var.provisioning_model) && !(var.spot && contains(["FLEX_START", "RESERVATION_BOUND"], var.provisioning_model))
    error_message = "provisioning_model must be STANDARD, SPOT, FLEX_START or RESERVATION_BOUND (VMs on a DENSE reservation), and not FLEX_START or RESERVATION_BOUND with spot = true."
  }
}

variable "reservation_affinity" {
  description = "Which reservation on-demand VMs consume: ANY_RESERVATION (Compute's default), NO_RESERVATION, or SPECIFIC_RESERVATION (reservation_name). Spot and Flex-start VMs consume none."
  type        = string
  default     = "ANY_RESERVATION"
  validation {
    condition     = contains(["ANY_RESERVATION", "NO_RESERVATION", "SPECIFIC_RESERVATION"], var.reservation_affinity) && ((var.reservation_affinity == "SPECIFIC_RESERVATION") == (var.reservation_name != ""))
    error_message = "reservation_affinity must be ANY_RESERVATION, NO_RESERVATION or SPECIFIC_RESERVATION, with reservation_name set for SPECIFIC_RESERVATION only."
  }
}

variable "reservation_name" {
  description = "The reservation SPECIFIC_RESERVATION consumes (in the VMs' zone; it must require specific targeting)."
  type        = string
  default     = ""
  validation {
    condition     = var.reservation_name == "" || can(regex("^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$", var.reservation_name))
    error_message = "reservation_name must be a reservation's name (lowercase letters, digits and dashes)."
  }
}

variable "compact_placement" {
  description = "Place the VMs close together with a COLLOCATED group placement policy (placement.tf). tfcluster sets it for multi-VM clusters of a series that supports it (tfcluster/backends/gcp/zones/placement.py); the setting compact_placement = false keeps it off."
  type        = bool
  default     = false
}

variable "docker" {
  description = "Install and start Docker on every VM (and the NVIDIA container toolkit on GPU VMs), for `train --image`. tfcluster sets it when an image is configured."
  type        = bool
  default     = false
}

variable "operator_cidr" {
  description = "The only source allowed to reach SSH (tcp:22): the operator's public IP as a /32. tfcluster detects it. Empty without VMs (workers = 0)."
  type        = string
  default     = ""
  validation {
    condition     = can(cidrhost(var.operator_cidr, 0)) && var.operator_cidr != "0.0.0.0/0" && !endswith(var.operator_cidr, "/0") || var.workers == 0 && var.operator_cidr == ""
    error_message = "operator_cidr must be a CIDR such as 203.0.113.7/32, never 0.0.0.0/0 (empty only with workers = 0)."
  }
}

variable "tf_port" {
  description = "TensorFlow gRPC port, opened only between the cluster's VMs."
  type        = number
  default     = 23456
  validation {
    condition     = var.tf_port >= 1024 && var.tf_port <= 65535
    error_message = "tf_port must be between 1024 and 65535."
  }
}

variable "oracle_port" {
  description = "Keras Tuner oracle port of `invoke tune` on the chief VM, opened only between the cluster's VMs."
  type        = number
  default     = 23457
  validation {
    condition     = var.oracle_port >= 1024 && var.oracle_port <= 65535 && var.oracle_port != var.tf_port
    error_message = "oracle_port must be between 1024 and 65535 and differ from tf_port."
  }
}

variable "ssh_user" {
  description = "Login created on the VMs for the cluster's own SSH key."
  type        = string
  default     = "tfcluster"
  validation {
    condition     = can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.ssh_user))
    error_message = "ssh_user must be a valid Linux user name."
  }
}

variable "ssh_identity" {
  description = "How the operator logs in: metadata (the cluster's key in ssh-keys, OS Login off) or oslogin (enable-oslogin=TRUE; the key is in the operator's OS Login profile)."
  type        = string
  default     = "metadata"
  validation {
    condition     = contains(["metadata", "oslogin"], var.ssh_identity)
    error_message = "ssh_identity must be metadata or oslogin."
  }
}

variable "ssh_public_key" {
  description = "The cluster's own public key (generated by `invoke up`, private half kept 0600 in the cluster state). Empty without VMs (workers = 0)."
  type        = string
  default     = ""
  validation {
    condition     = can(regex("^ssh-ed25519 [A-Za-z0-9+/=]+", var.ssh_public_key)) || var.workers == 0 && var.ssh_public_key == ""
    error_message = "ssh_public_key must be an ssh-ed25519 public key line (empty only with workers = 0)."
  }
}

variable "boot_grace_minutes" {
  description = "Minutes the boot script's work (installs, driver wait) counts as activity for the idle watchdog, at most: a slow first boot is not stopped, a hung one does not bill for ever."
  type        = number
  default     = 45
  validation {
    condition     = var.boot_grace_minutes >= 1 && var.boot_grace_minutes <= 1440
    error_message = "boot_grace_minutes must be between 1 and 1440."
  }
}

variable "idle_minutes" {
  description = "In-VM watchdog: act after this many idle minutes; 0 disables it (the hypervisor deadline still applies)."
  type        = number
  default     = 30
  validation {
    condition     = var.idle_minutes >= 0 && var.idle_minutes <= 1440
    error_message = "idle_minutes must be between 0 (off) and 1440."
  }
}

variable "idle_action" {
  description = "What the watchdog does to an idle VM: stop (disks keep billing) or delete."
  type        = string
  default     = "stop"
  validation {
    condition     = contains(["stop", "delete"], var.idle_action)
    error_message = "idle_action must be stop or delete."
  }
}

variable "max_run_hours" {
  description = "Hypervisor deadline: Compute Engine applies termination_action this many hours after each start, whatever runs."
  type        = number
  default     = 12
  validation {
    condition     = var.max_run_hours >= 1 && var.max_run_hours <= 168
    error_message = "max_run_hours must be between 1 and 168 (one week)."
  }
}

variable "budget_run_seconds" {
  description = "Budget deadline: when set (tfcluster computes it from `up --budget` and the prices), the VMs' max_run_duration is this many seconds if sooner than max_run_hours; 0 means no budget."
  type        = number
  default     = 0
  validation {
    condition     = var.budget_run_seconds == 0 || (var.budget_run_seconds >= 30 && var.budget_run_seconds == floor(var.budget_run_seconds))
    error_message = "budget_run_seconds must be 0 (no budget) or a whole number of seconds, at least 30."
  }
}

variable "termination_action" {
  description = "What the hypervisor deadline does: STOP or DELETE."
  type        = string
  default     = "STOP"
  validation {
    condition     = contains(["STOP", "DELETE"], var.termination_action)
    error_message = "termination_action must be STOP or DELETE."
  }
}

variable "registry_location" {
  description = "Region of the cluster's Artifact Registry repository (and of its bucket when bucket_location is empty); empty means the VMs' region. tfcluster writes the first zone's region here at the first `up`, so a zone failover never moves (replaces) either."
  type        = string
  default     = ""
  validation {
    condition     = var.registry_location == "" || can(regex("^[a-z]+-[a-z]+[0-9]+$", var.registry_location))
    error_message = "registry_location must be a region such as us-west1."
  }
}

variable "bucket_location" {
  description = "Location of the cluster bucket; empty means the VMs' region."
  type        = string
  default     = ""
  validation {
    condition     = var.bucket_location == "" || can(regex("^[A-Za-z0-9-]+$", var.bucket_location))
    error_message = "bucket_location must be a GCS location such as US or us-west1."
  }
}

variable "bucket_retention_days" {
  description = "Opt-in lifecycle rule: live objects older than this many days are deleted from the cluster bucket; 0 keeps them until you delete them. Old versions of a replaced object always go a day later."
  type        = number
  default     = 0
  validation {
    condition     = var.bucket_retention_days >= 0 && var.bucket_retention_days <= 3650
    error_message = "bucket_retention_days must be between 0 (keep objects) and 3650."
  }
}

variable "bucket_force_destroy" {
  description = "Let `terraform destroy` delete a bucket that still holds objects (models, checkpoints). Off by default: `invoke down` says what it would delete."
  type        = bool
  default     = false
}

variable "startup_script" {
  description = "Path of the boot script (startup/startup.sh); its content goes into the VMs' metadata."
  type        = string
  default     = ""
  validation {
    condition     = var.startup_script == "" || endswith(var.startup_script, ".sh")
    error_message = "startup_script must be a path to a .sh file, or empty for startup/startup.sh."
  }
}

variable "watchdog_source" {
  description = "Folder of the idle watchdog package (startup/tfcluster_watchdog), delivered through metadata as one JSON value and installed by the startup script."
  type        = string
  default     = ""
  validation {
    condition     = var.watchdog_source == "" || endswith(var.watchdog_source, "tfcluster_watchdog")
    error_message = "watchdog_source must be the path of a tfcluster_watchdog folder, or empty for startup/tfcluster_watchdog."
  }
}

variable "boot_nonce" {
  description = "Fresh for every create or start by `invoke up`; the boot script publishes it with its readiness, so an answer from an earlier boot is never taken for this one."
  type        = string
  default     = ""
  validation {
    condition     = can(regex("^[0-9a-f]{0,32}$", var.boot_nonce))
    error_message = "boot_nonce must be up to 32 lowercase hex digits."
  }
}
