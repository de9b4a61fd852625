"""OS Login (tfcluster/backends/gcp/access/oslogin.py) against the world's OS Login, Org Policy and Compute
(tests/world/oslogin.py): which identity `auto` picks and why, `check`'s one line per missing piece
of IAM, the key's import with an expiry and its deletion, and Google's refusals. The booted
scenario (tests/test_booted_cluster.py) runs a whole cluster in OS Login mode, and its sshd's
refusals (a metadata key with OS Login on, an expired key, no role, OS Login off)."""

from __future__ import annotations

import json
import time

import pytest

from tfcluster import config
from tfcluster.backends.gcp.access import check, oslogin
from tfcluster.errors import ClusterError

PUBLIC = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHq3tN1lGQ8m0v9JUbq0nq6x1n9b2Hn6YxkqkC2f6d3Y tfcluster-default"


def settings(**overrides) -> config.Settings:
    return config.load({"backend": "gcp", "project": "demo-project", "zone": "us-west1-b", "workers": 2,
                        "operator_cidr": "203.0.113.9/32", **overrides})


def lines(**overrides) -> dict[str, str]:
    report = check.run(settings(**overrides))
    return {finding.subject: finding.line() for finding in report.findings} | {"identity": report.identity}


@pytest.mark.parametrize("constraint", ["compute.requireOsLogin", "compute.managed.requireOsLogin"])
def test_auto_picks_os_login_where_the_project_requires_it_and_every_check_holds(world, constraint):
    world.project_apis.apis.policies[constraint] = [{"enforce": True}]
    found = lines()
    assert found["identity"] == oslogin.Identity("oslogin", f"constraints/{constraint} is enforced")
    assert found[f"constraints/{constraint}"] == \
        f"✓ constraints/{constraint}: enforced: the VMs log in through OS Login (enable-oslogin=TRUE)"
    assert found["ssh identity"] == f"✓ ssh identity: OS Login (constraints/{constraint} is enforced)"
    assert found["OS Login IAM"] == ("✓ OS Login IAM: operator@demo-project.iam.gserviceaccount.com may log in to "
                                     "the VMs and act as their service accounts")
    assert [line for line in found.values() if str(line).startswith("✗")] == []
    # Asked for metadata keys, the same project refuses the cluster, and the line says what to do.
    assert lines(ssh_identity="metadata")[f"constraints/{constraint}"].startswith(
        f"✗ constraints/{constraint}: enforced: the VMs take the cluster's SSH key from metadata (enable-oslogin=false), "
        "which it rejects; use --ssh-identity oslogin (or auto), or ask your organisation's admin")


def test_auto_follows_the_project_metadata_and_is_metadata_otherwise(world):
    assert lines()["identity"] == oslogin.Identity("metadata", "no organisation policy or project metadata requires "
                                                               "OS Login")
    assert "ssh identity" not in lines()  # The sandbox's check is as before: no extra line.
    world.compute.state.project_metadata["enable-oslogin"] = "TRUE"
    assert lines()["identity"] == oslogin.Identity("oslogin", "the project's metadata sets enable-oslogin=TRUE")
    assert lines(ssh_identity="metadata")["identity"] == oslogin.Identity("metadata", "--ssh-identity metadata")


def test_check_names_each_missing_role_on_its_own_line(world):
    state = world.compute.state
    state.missing_permissions |= {"compute.instances.osLogin", "compute.instances.osAdminLogin",
                                  "iam.serviceAccounts.actAs"}
    found = lines(ssh_identity="oslogin")
    assert found["OS Login role"] == (
        "✗ OS Login role: operator@demo-project.iam.gserviceaccount.com has neither roles/compute.osAdminLogin nor "
        "roles/compute.osLogin on the VMs: ask a project owner for roles/compute.osAdminLogin in project demo-project")
    assert found["OS Login service accounts"] == (
        "✗ OS Login service accounts: operator@demo-project.iam.gserviceaccount.com lacks roles/iam.serviceAccountUser "
        "on the VMs' service accounts (default-vm-0@demo-project.iam.gserviceaccount.com, "
        "default-vm-1@demo-project.iam.gserviceaccount.com): ask a project owner for it in project demo-project")
    assert "OS Login IAM" not in found
    state.missing_permissions -= {"compute.instances.osLogin"}  # osLogin alone is enough to log in.
    assert "OS Login role" not in lines(ssh_identity="oslogin")


def outsider(world, tmp_path) -> str:
    """The operator's key made an account of another project, in another organisation."""
    key = json.loads(world.credentials.read_text())
    key["client_email"] = "operator@outside-project.iam.gserviceaccount.com"
    world.credentials.write_text(json.dumps(key))
    world.oslogin.state.operator_email = key["client_email"]
    world.project_apis.apis.ancestry.update({"demo-project": "111", "outside-project": "222"})
    return key["client_email"]


def test_an_operator_from_outside_the_organisation_needs_the_external_user_role(world, tmp_path):
    assert "OS Login external user" not in lines(ssh_identity="oslogin")  # No organisation: no outside.
    email = outsider(world, tmp_path)
    world.compute.state.missing_permissions.add("compute.oslogin.updateExternalUser")
    assert lines(ssh_identity="oslogin")["OS Login external user"] == (
        f"✗ OS Login external user: {email} is not in the organisation of project demo-project: ask the "
        "organisation's admin for roles/compute.osLoginExternalUser on the organisation")
    # And OS Login refuses the import, in Google's words; `up` says so and names `check`.
    world.oslogin.state.external.add(email)
    with pytest.raises(ClusterError) as refused:
        oslogin.import_key(tmp_path, "demo-project", PUBLIC, 1)
    assert str(refused.value) == (f"OS Login refused the cluster's key for {email} (403 PERMISSION_DENIED: The caller "
                                  "does not have permission); `invoke check` names the IAM OS Login needs")
    world.compute.state.missing_permissions.clear()  # Granted: a service account's username, "sa_" + its ID.
    assert oslogin.import_key(tmp_path, "demo-project", PUBLIC, 1) == "sa_111111111111111111111"
    world.project_apis.apis.ancestry["outside-project"] = "111"  # The same organisation: not outside.
    assert "OS Login external user" not in lines(ssh_identity="oslogin")


def test_the_key_goes_into_the_profile_with_an_expiry_and_down_deletes_it(world, tmp_path):
    email = "operator@demo-project.iam.gserviceaccount.com"
    before = time.time()
    assert oslogin.import_key(tmp_path, "demo-project", PUBLIC, 12) == "sa_111111111111111111111"
    [(fingerprint, key)] = world.oslogin.state.profiles[email]["keys"].items()
    assert key["key"] == PUBLIC
    # Expires with the VMs' deadline (12 hours) plus an hour: a killed run's key goes by itself.
    assert before + 13 * 3600 <= int(key["expirationTimeUsec"]) / 1e6 <= time.time() + 13 * 3600
    assert ("GET", f"/v1/users/{email}/loginProfile") in world.oslogin.state.requests
    # A restart (`up` on the cluster) moves the expiry to the new deadline's.
    key["expirationTimeUsec"] = str(int(before * 1e6))
    oslogin.renew_key(tmp_path, 2)
    assert before + 3 * 3600 <= int(key["expirationTimeUsec"]) / 1e6 <= time.time() + 3 * 3600
    said = []
    oslogin.forget_key(tmp_path, said.append)
    assert said == [f"deleted the cluster's key from your OS Login profile (users/{email}/sshPublicKeys/{fingerprint})"]
    assert world.oslogin.state.profiles[email]["keys"] == {}
    assert not (tmp_path / oslogin.RECORD).exists()
    oslogin.forget_key(tmp_path, said.append)  # Nothing recorded: nothing to do.
    assert len(said) == 1


def test_os_login_refuses_another_users_profile_and_compute_refuses_enable_oslogin_false(world):
    from tfcluster.backends.gcp.cloud.compute import default_credentials

    google = oslogin.Api(default_credentials())
    with pytest.raises(oslogin.Refused) as other:
        google.call("GET", "https://oslogin.googleapis.com/v1/users/someone@example.com/loginProfile")
    assert (other.value.status, other.value.message) == (403, "The caller does not have permission")
    body = {"name": "vm", "machineType": "zones/us-west1-b/machineTypes/n1-standard-8",
            "metadata": {"items": [{"key": "enable-oslogin", "value": "false"}]}}
    url = "https://compute.googleapis.com/compute/v1/projects/demo-project/zones/us-west1-b/instances"
    for constraint in ("compute.requireOsLogin", "compute.managed.requireOsLogin"):
        world.project_apis.apis.policies.clear()
        world.project_apis.apis.policies[constraint] = [{"enforce": True}]
        with pytest.raises(oslogin.Refused) as refused:
            google.call("POST", url, json=body)
        assert (refused.value.status, refused.value.message) == (
            412, f"Constraint constraints/{constraint} violated for project projects/demo-project. See "
                 "https://cloud.google.com/resource-manager/docs/organization-policy/org-policy-constraints for more "
                 "information.")
    body["metadata"]["items"][0]["value"] = "TRUE"  # OS Login on: accepted.
    google.call("POST", url, json=body)
    assert "vm" in world.compute.state.instances
