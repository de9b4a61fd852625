"""terraform/: `terraform fmt`, structure parsed with python-hcl2, and checkov.

`terraform init/validate/plan` need the google provider, which cannot be downloaded here,
so correctness is checked statically.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import hcl2
import pytest
from hcl2 import SerializationOptions

from tests.conftest import REPO

TF = REPO / "terraform"
OPTIONS = SerializationOptions(strip_string_quotes=True, explicit_blocks=False)


def parse(name: str, directory: Path = TF, options: SerializationOptions = OPTIONS) -> dict:
    with open(directory / name) as handle:
        return hcl2.load(handle, serialization_options=options)


def resources(kind: str) -> dict:
    found = {}
    for path in TF.glob("*.tf"):
        for block in parse(path.name).get("resource", []):
            found.update(block.get(kind, {}))
    return found


def one(block):
    """hcl2 gives nested blocks as one-element lists."""
    assert isinstance(block, list) and len(block) == 1, block
    return block[0]


def test_terraform_fmt():
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform is not installed")
    result = subprocess.run([terraform, "fmt", "-check", "-recursive", "-diff", str(TF)],
                            capture_output=True, text=True, env={**os.environ, "CHECKPOINT_DISABLE": "1"})
    assert result.returncode == 0, result.stdout


def test_versions_are_bounded():
    terraform = one(parse("versions.tf")["terraform"])
    assert re.fullmatch(r">= 1\.\d+\.\d+, < 2\.0\.0", terraform["required_version"])
    google = one(terraform["required_providers"])["google"]
    assert google["source"] == "hashicorp/google"
    assert re.fullmatch(r">= \d+\.\d+\.\d+, < \d+\.\d+\.\d+", google["version"])


def test_every_variable_has_a_description_and_a_validation():
    variables = {}
    for block in parse("variables.tf")["variable"]:
        variables.update(block)
    assert len(variables) >= 15
    for name, body in variables.items():
        assert body.get("description"), f"{name} has no description"
        if body.get("type") != "bool":
            assert body.get("validation"), f"{name} has no validation"
    # The GPU and family rules read the table generated from tfcluster/gpus.py (test_terraform_agreement.py).
    assert "contains(local.gpu_table.accelerators, var.gpu_type)" in one(variables["gpu_type"]["validation"])["condition"]
    assert "^n1-" in variables["machine_type"]["validation"][0]["condition"]
    assert 'var.operator_cidr != "0.0.0.0/0"' in one(variables["operator_cidr"]["validation"])["condition"]
    assert "var.workers >= 1" in one(variables["workers"]["validation"])["condition"]
    assert 'contains(["STOP", "DELETE"], var.termination_action)' in one(
        variables["termination_action"]["validation"])["condition"]
    assert variables["bucket_force_destroy"]["default"] is False


def test_gpu_forces_terminate_on_host_maintenance():
    local = {}
    for block in parse("main.tf")["locals"]:
        local.update(block)
    assert local["has_gpu"] == "${var.gpu_count > 0}"
    assert local["on_host_maintenance"] == '${(local.has_gpu || local.provisioning_model != "STANDARD") ? "TERMINATE" : "MIGRATE"}'
    worker = resources("google_compute_instance")["worker"]
    scheduling = one(worker["scheduling"])
    assert scheduling["on_host_maintenance"] == "${local.on_host_maintenance}"
    # Attached only on N1: G2, A2 and A3 types come with their GPUs.
    assert local["attached_gpu"] == '${local.has_gpu && startswith(var.machine_type, "n1-")}'
    accelerator = one(worker["dynamic"])["guest_accelerator"]
    assert accelerator["for_each"] == "${local.attached_gpu ? [1] : []}"


def test_hypervisor_deadline_and_vm_hardening():
    worker = resources("google_compute_instance")["worker"]
    scheduling = one(worker["scheduling"])
    # max_run_hours, or sooner what `up --budget` buys (tfcluster/backends/gcp/spend/budget.py), never later.
    assert one(scheduling["max_run_duration"])["seconds"] == ("${var.budget_run_seconds > 0 ? min(var.budget_run_seconds, "
                                                              "var.max_run_hours * 3600) : var.max_run_hours * 3600}")
    assert scheduling["instance_termination_action"] == "${var.termination_action}"
    assert scheduling["provisioning_model"] == "${local.provisioning_model}"
    shielded = one(worker["shielded_instance_config"])
    assert shielded["enable_vtpm"] is True and shielded["enable_integrity_monitoring"] is True
    metadata = worker["metadata"]
    assert metadata["block-project-ssh-keys"] == "true"
    assert metadata["enable-guest-attributes"] == "TRUE"
    assert metadata["ssh-keys"] == '${var.ssh_identity == "oslogin" ? "" : "${var.ssh_user}:${var.ssh_public_key}"}'
    assert metadata["enable-oslogin"] == '${var.ssh_identity == "oslogin" ? "TRUE" : "false"}'
    for key in ("tfcluster-idle-minutes", "tfcluster-idle-action", "startup-script", "tfcluster-watchdog"):
        assert key in metadata
    # Each VM runs as its own service account (iam.tf: one per VM).
    assert one(worker["service_account"])["email"] == "${google_service_account.vm[count.index].email}"
    image = parse("variables.tf")
    default_image = [b for b in image["variable"] if "image" in b][0]["image"]["default"]
    assert re.search(r"common-cu129-ubuntu-2204-nvidia-580-v\d{8}$", default_image)


def test_firewall_ssh_only_from_operator_and_every_tcp_port_between_members_by_tag():
    firewalls = resources("google_compute_firewall")
    for name, rule in firewalls.items():
        assert "0.0.0.0/0" not in json.dumps(rule), f"{name} is open to the world"
    ssh = firewalls["ssh_from_operator"]
    assert ssh["source_ranges"] == ["${var.operator_cidr}"]
    assert one(ssh["allow"])["ports"] == ["22"]
    tf_rule = firewalls["tf_between_members"]
    assert tf_rule["source_tags"] == ["${local.tag}"] and tf_rule["target_tags"] == ["${local.tag}"]
    assert "source_ranges" not in tf_rule
    # Every TCP port (no `ports`): NCCL's sockets are ephemeral, not tf_port or oracle_port.
    assert one(tf_rule["allow"]) == {"protocol": "tcp"}
    network = resources("google_compute_network")["cluster"]
    assert network["auto_create_subnetworks"] is False
    # No billed flow logs by default.
    assert "log_config" not in resources("google_compute_subnetwork")["cluster"]


def test_bucket_is_private_with_lifecycle():
    bucket = resources("google_storage_bucket")["cluster"]
    assert bucket["uniform_bucket_level_access"] is True
    assert bucket["public_access_prevention"] == "enforced"
    assert bucket["force_destroy"] == "${var.bucket_force_destroy}"
    assert bucket["lifecycle_rule"]
    for binding in resources("google_storage_bucket_iam_member").values():
        assert "allUsers" not in binding["member"] and "allAuthenticatedUsers" not in binding["member"]


def test_service_account_has_no_primitive_roles():
    text = "\n".join(path.read_text() for path in TF.glob("*.tf"))
    for role in ("roles/owner", "roles/editor", "roles/viewer"):
        assert role not in text
    assert not resources("google_project_iam_member") and not resources("google_project_iam_binding")
    role = resources("google_project_iam_custom_role")["watchdog"]
    # Exactly what the watchdog calls: the Compute API requests in startup/tfcluster_watchdog, each
    # mapped to its permission (https://cloud.google.com/compute/docs/reference/rest/v1/instances/delete
    # needs compute.instances.delete). Its stop action is a guest halt and needs none.
    import re

    source = "".join(path.read_text() for path in (REPO / "startup" / "tfcluster_watchdog").glob("*.py"))
    calls = set(re.findall(r'method="(GET|POST|DELETE)"', source))
    assert "/instances/{name}" in source and calls == {"DELETE"}
    assert role["permissions"] == ["compute.instances.delete"]
    # One account per VM; the delete on instance i is granted to account i alone, so a VM's token
    # is refused on its siblings (the booted scenario shows the 403 from inside VM 0).
    accounts = resources("google_service_account")
    assert sorted(accounts) == ["jobs", "vm"] and accounts["vm"]["count"] == "${var.workers}"
    assert accounts["jobs"]["count"] == "${var.vertex ? 1 : 0}"  # A Vertex AI cluster's jobs (vertex.tf).
    assert accounts["vm"]["account_id"] == "${var.cluster_name}-vm-${count.index}"
    grant = resources("google_compute_instance_iam_member")["watchdog"]
    assert grant["count"] == "${var.workers}"
    assert grant["instance_name"] == "${google_compute_instance.worker[count.index].name}"
    assert grant["member"] == "serviceAccount:${google_service_account.vm[count.index].email}"
    objects = resources("google_storage_bucket_iam_member")["vm_objects"]
    assert objects["role"] == "roles/storage.objectAdmin"
    reader = resources("google_storage_bucket_iam_member")["vm_bucket_reader"]
    assert reader["role"] == "roles/storage.legacyBucketReader"  # buckets.get: tests/test_gcs_iam.py
    assert objects["bucket"] == "${google_storage_bucket.cluster.name}"
    for binding in (objects, reader):  # Every VM's account.
        assert binding["count"] == "${var.workers}"
        assert binding["member"] == "serviceAccount:${google_service_account.vm[count.index].email}"


def test_outputs_the_python_side_reads():
    outputs = {}
    for block in parse("outputs.tf")["output"]:
        outputs.update(block)
    assert {"instances", "bucket", "service_accounts", "labels"} <= set(outputs)
    assert outputs["service_accounts"]["value"] == "${google_service_account.vm[*].email}"
    instances = outputs["instances"]["value"]
    for field in ("name", "zone", "internal_ip", "external_ip"):
        assert field in instances


def test_checkov_passes():
    checkov = os.environ.get("CHECKOV_BIN") or shutil.which("checkov")
    local = REPO / ".venv-checkov" / "bin" / "checkov"
    if not checkov and local.exists():
        checkov = str(local)
    if not checkov:
        pytest.skip("checkov is not installed (.ci/run installs it in its own venv)")
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKPOINT_DISABLE": "1"}
    result = subprocess.run([checkov, "-d", str(TF), "--framework", "terraform", "--skip-download",
                             "--compact", "--quiet", "-o", "json"], capture_output=True, text=True, env=env)
    report = json.loads(result.stdout)
    failed = report["results"]["failed_checks"] if isinstance(report, dict) else []
    assert result.returncode == 0 and not failed, [(c["check_id"], c["resource"]) for c in failed]
    assert report["summary"]["passed"] > 20


def test_registry_is_the_clusters_own_and_the_vms_may_only_read_it():
    repository = resources("google_artifact_registry_repository")["images"]
    assert repository["format"] == "DOCKER" and repository["labels"] == "${local.labels}"
    assert repository["repository_id"] == "${var.cluster_name}-images"
    grants = resources("google_artifact_registry_repository_iam_member")
    assert list(grants) == ["vm_reader"]
    assert grants["vm_reader"]["role"] == "roles/artifactregistry.reader"
    assert grants["vm_reader"]["count"] == "${var.workers}"  # Every VM's own account.
    assert grants["vm_reader"]["member"] == "serviceAccount:${google_service_account.vm[count.index].email}"
    assert grants["vm_reader"]["repository"] == "${google_artifact_registry_repository.images.name}"
    outputs = {}
    for block in parse("registry.tf")["output"]:
        outputs.update(block)
    assert outputs["registry"]["value"].startswith("${local.region}-docker.pkg.dev/${var.project}/")
