"""Google's refusals as one `error:` line that names the fix, through the real client libraries and
the CLI: an account that lacks a permission, and a login whose refresh token Google revoked."""

from __future__ import annotations

import json

from tests.conftest import Cli
from tests.test_gcp_backend import fake_compute  # noqa: F401 - fixture


def _gcp_cli(tmp_path, world, synthetic_data) -> Cli:
    """`invoke up` in the test world; terraform is never reached (the preflight refuses first)."""
    wrapper = tmp_path / "terraform"
    wrapper.write_text("#!/bin/sh\nexit 0\n")
    wrapper.chmod(0o755)
    cli = Cli(tmp_path / "state", synthetic_data)
    cli.env.update({"INVOKE_TFCLUSTER_BACKEND": "gcp", "INVOKE_TFCLUSTER_PROJECT": world.compute.state.project,
                    "INVOKE_TFCLUSTER_ZONE": "us-west1-b", "INVOKE_TFCLUSTER_OPERATOR_CIDR": "10.0.0.1/32",
                    "TFCLUSTER_TERRAFORM": str(wrapper)})
    cli.enter(world)
    return cli


def test_a_missing_permission_is_named(tmp_path, world, synthetic_data, fake_compute):  # noqa: F811
    fake_compute.state.missing_permissions = {"compute.regions.get"}
    cli = _gcp_cli(tmp_path, world, synthetic_data)
    up = cli.run("up", timeout=120)
    assert up.returncode == 2, up.stdout + up.stderr
    assert up.stderr.strip().splitlines() == [
        "error: up: your account lacks the permission compute.regions.get in project demo-project; ask a project "
        "owner for roles/compute.admin, roles/storage.admin, roles/iam.serviceAccountAdmin and roles/iam.roleAdmin "
        "(or roles/owner on a sandbox project), then re-run the same command"]
    assert cli.cluster() is None


def test_an_expired_login_names_the_command_that_renews_it(tmp_path, world, synthetic_data,
                                                            fake_compute):  # noqa: F811
    # Application Default Credentials as `gcloud auth application-default login` writes them.
    adc = tmp_path / "application_default_credentials.json"
    adc.write_text(json.dumps({"type": "authorized_user", "client_id": "764086051850-test.apps.googleusercontent.com",
                               "client_secret": "d-FL95Q19q7MQmFpd7hHD0Ty", "refresh_token": "1//revoked-token",
                               "quota_project_id": "demo-project"}))
    fake_compute.state.revoked_refresh_tokens = {"1//revoked-token"}
    cli = _gcp_cli(tmp_path, world, synthetic_data)
    cli.env["GOOGLE_APPLICATION_CREDENTIALS"] = str(adc)
    up = cli.run("up", timeout=120)
    assert up.returncode == 2, up.stdout + up.stderr
    assert up.stderr.strip().splitlines() == [
        "error: up: your Google credentials expired or were revoked; run `gcloud auth application-default login`"]
    assert any(r["path"] == "/token" for r in fake_compute.state.requests), "the refresh never reached Google"
    assert cli.cluster() is None
