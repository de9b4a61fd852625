"""terraform/ against the providers' own schemas: what `terraform validate` would say.

The google provider cannot be downloaded here, so `terraform validate` cannot run. The schemas in
tests/provider_schema/*.json are extracted (tests/provider_schema/extract.py) from the prebuilt
CDK Terrain bindings on PyPI, which are generated from the provider's schema:
cdktn-provider-google 20.3.1 = hashicorp/google 7.46.1, cdktn-provider-random 15.0.1 =
hashicorp/random 3.9.1 (github.com/cdktn-io/cdktn-provider-google, -random; each JSON's `source`).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.provider_schema.check import Finding, ModuleChecker, load_schemas
from tests.test_terraform import TF, one, parse


def check(directory: Path) -> list[Finding]:
    return ModuleChecker(directory, load_schemas()).run()


def satisfies(version: str, constraint: str) -> bool:
    """Terraform's version constraint syntax (developer.hashicorp.com/terraform/language/expressions/version-constraints)."""
    have = tuple(int(part) for part in version.split("."))
    for clause in constraint.split(","):
        op, want_text = re.fullmatch(r"\s*(>=|<=|!=|~>|>|<|=)?\s*([\d.]+)\s*", clause).groups()
        want = tuple(int(part) for part in want_text.split("."))
        padded = want + (0,) * (len(have) - len(want))
        if op == "~>":  # the rightmost given part may grow: ~> 7.4 is >= 7.4, < 8.0
            upper = want[:-2] + (want[-2] + 1,) if len(want) > 1 else (want[0] + 1,)
            ok = padded <= have < upper + (0,) * (len(have) - len(upper))
        else:
            ok = {"=": have == padded, None: have == padded, "!=": have != padded, ">": have > padded,
                  ">=": have >= padded, "<": have < padded, "<=": have <= padded}[op]
        if not ok:
            return False
    return True


def test_schemas_cite_their_source_and_match_versions_tf():
    schemas = load_schemas()
    assert {"google", "random"} <= set(schemas)
    required = one(one(parse("versions.tf")["terraform"])["required_providers"])
    for name, schema in schemas.items():
        source = schema["source"]
        assert source["wheel"].startswith(f"cdktn_provider_{name}-") and source["package"].startswith("@cdktn/")
        assert schema["file"] == f"{name}-{schema['version']}.json"
        # versions.tf allows a range (google >= 6.0.0, < 8.0.0): the schema is the one version checked.
        assert satisfies(schema["version"], required[name]["version"]), (name, schema["version"])
    assert schemas["google"]["version"] == "7.46.1"


def test_version_constraints_are_read_like_terraform():
    assert satisfies("7.46.1", ">= 6.0.0, < 8.0.0") and not satisfies("8.0.0", ">= 6.0.0, < 8.0.0")
    assert satisfies("7.46.1", "~> 7.4") and not satisfies("8.1.0", "~> 7.4")
    assert satisfies("3.9.1", "~> 3.9.0") and not satisfies("3.10.0", "~> 3.9.0")


def test_terraform_matches_the_provider_schema():
    findings = check(TF)
    assert not findings, "\n".join(str(finding) for finding in findings)


def test_every_type_in_terraform_has_a_schema():
    types = {type_name for path in TF.glob("*.tf")
             for type_name in re.findall(r'^(?:resource|data) "(\w+)"', path.read_text(), re.M)}
    schemas = load_schemas()
    for type_name in types:
        provider = schemas[type_name.split("_", 1)[0]]
        assert type_name in provider["resource_schemas"] or type_name in provider["data_source_schemas"]
    assert "google_compute_instance" in types and "random_id" in types


# Each planted mistake: file, the text it replaces, the replacement, and the findings it must cause.
PLANTS = [
    ("instances.tf", "machine_type = var.machine_type", "machine_typo = var.machine_type", [
        ("google_compute_instance.worker", "machine_typo", "unsupported argument"),
        ("google_compute_instance.worker", "machine_type", "missing required argument")]),
    ("instances.tf", "  tags         = [local.tag]\n", "  tags         = [local.tag]\n  cpu_platform = \"Intel\"\n", [
        ("google_compute_instance.worker", "cpu_platform", "computed-only")]),
    ("instances.tf", 'dynamic "guest_accelerator"', 'dynamic "guest_accelerators"', [
        ("google_compute_instance.worker", "dynamic.guest_accelerators", "unsupported block type")]),
    ("instances.tf", "      seconds = var.budget_run_seconds", "      second = var.budget_run_seconds", [
        ("google_compute_instance.worker", "scheduling.max_run_duration.second", "unsupported argument"),
        ("google_compute_instance.worker", "scheduling.max_run_duration.seconds", "missing required argument")]),
    ("instances.tf", "  boot_disk {", "  boot_disks {", [
        ("google_compute_instance.worker", "boot_disks", "unsupported block"),
        ("google_compute_instance.worker", "boot_disk", "missing required block")]),
    ("instances.tf", "      image  = var.image", "      image  = data.google_compute_image.boot.self_link", [
        ("google_compute_instance.worker", "data.google_compute_image.boot.self_link",
         "undeclared data google_compute_image.boot")]),
    ("versions.tf", "  zone    = var.zone", "  zones   = var.zone", [
        ("provider.google", "zones", "unsupported argument")]),
    ("iam.tf", '  role   = "roles/storage.objectAdmin"\n', "", [
        ("google_storage_bucket_iam_member.vm_objects", "role", "missing required argument")]),
    ("bucket.tf", "  versioning {", "  versioning = {", [
        ("google_storage_bucket.cluster", "versioning", "is a block, not an argument")]),
    ("bucket.tf", "  labels                      = local.labels\n", "  labels {\n    a = \"b\"\n  }\n", [
        ("google_storage_bucket.cluster", "labels", "is an argument, not a block")]),
    ("network.tf", '"google_compute_firewall" "tf_between_members"', '"google_compute_firewal" "tf_between_members"', [
        ("google_compute_firewal.tf_between_members", "google_compute_firewal", "has no resource type")]),
    ("outputs.tf", "google_service_account.vm[*].email", "google_service_account.vm[*].emial", [
        ("output.service_accounts", "google_service_account.vm[*].emial", "has no attribute emial")]),
    ("outputs.tf", "access_config[0].nat_ip", "access_config[0].nat_ipp", [
        ("output.instances", "vm.network_interface[0].access_config[0].nat_ipp", "has no attribute nat_ipp")]),
    ("iam.tf", '"vm_objects" {\n  count  = var.workers\n  bucket = google_storage_bucket.cluster.name',
     '"vm_objects" {\n  count  = var.workers\n  bucket = google_storage_bucket.clustr.name', [
        ("google_storage_bucket_iam_member.vm_objects", "google_storage_bucket.clustr.name",
         "undeclared resource google_storage_bucket.clustr")]),
]


def test_planted_mistakes_are_reported_with_file_and_resource(tmp_path):
    module = tmp_path / "terraform"
    shutil.copytree(TF, module)
    expected = []
    for file, old, new, findings in PLANTS:
        text = (module / file).read_text()
        assert text.count(old) == 1, (file, old)
        (module / file).write_text(text.replace(old, new))
        expected += [(file, *finding) for finding in findings]
    found = check(module)
    for file, address, path, message in expected:
        assert any(f.file == file and f.address == address and f.path.startswith(path) and message in f.message
                   for f in found), (file, address, path, message, [str(f) for f in found])
    assert len(found) == len(expected), [str(f) for f in found]


@pytest.mark.parametrize("file, old, new, findings", PLANTS, ids=[plant[2][:40] for plant in PLANTS])
def test_each_planted_mistake_alone_fails_the_module(tmp_path, file, old, new, findings):
    module = tmp_path / "terraform"
    shutil.copytree(TF, module)
    (module / file).write_text((module / file).read_text().replace(old, new))
    found = check(module)
    assert {(f.file, f.address) for f in found} == {(file, finding[0]) for finding in findings}
