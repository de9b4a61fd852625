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
    # `up` checks first (projects.testIamPermissions): the permission, who needs it and the role.
    assert up.stderr.strip().splitlines() == [
        "error: your account lacks compute.regions.get (up) in project demo-project; ask a project owner for "
        "roles/compute.admin"]
    assert "? quota: cannot read it (" in up.stdout  # Refused to read, not claimed short.
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
        "error: Google refused your credentials (invalid_grant: Token has been expired or revoked.); run "
        "`gcloud auth application-default login` again"]
    assert "✗ credentials: Google refused your credentials" in up.stdout
    assert any(r["path"] == "/token" for r in fake_compute.state.requests), "the refresh never reached Google"
    assert cli.cluster() is None


def test_a_rate_limit_is_named_as_one_whatever_its_status():
    """Compute answers a rate limit with 403 and reason rateLimitExceeded
    (https://cloud.google.com/compute/docs/api-rate-limits): not a missing permission."""
    from google.api_core import exceptions

    from tfcluster.backends.gcp.cloud.errors import from_exception, terraform_error_line

    rate = "Google is rate-limiting this project right now (retried with backoff already)"
    forbidden = exceptions.Forbidden("Rate Limit Exceeded", errors=[
        {"message": "Rate Limit Exceeded", "domain": "usageLimits", "reason": "rateLimitExceeded"}])
    assert rate in str(from_exception(forbidden, "demo-project", "up"))
    # As the google provider prints it (googleapi's "Error <code>: <message>, <reason>").
    provider = ("╷\n│ Error: Error creating instance: googleapi: Error 403: Rate Limit Exceeded, rateLimitExceeded\n"
                "│\n│   with google_compute_instance.worker[0],\n╵")
    assert terraform_error_line(provider, "demo-project").startswith("Google is rate-limiting")
    # An operation refused for too many operations on one resource.
    operation = ("Error: Error waiting for instance to create: Operation rate exceeded for resource "
                 "'projects/demo-project/zones/us-west1-b/instances/default-0'. (RESOURCE_OPERATION_RATE_EXCEEDED)")
    assert terraform_error_line(operation, "demo-project").startswith("Google is rate-limiting")
    # A real missing permission still reads as one.
    denied = exceptions.Forbidden("Required 'compute.regions.get' permission for 'projects/p/regions/r'",
                                  errors=[{"reason": "forbidden"}])
    assert "lacks the permission compute.regions.get" in str(from_exception(denied, "demo-project", "up"))


def test_a_full_zone_is_recognised_from_the_providers_message():
    """The google provider prints an operation error's message, not its code (provider source:
    ComputeOperationError.Error() -> writeOperationError)."""
    from tfcluster.backends.gcp.cloud.errors import capacity_code, terraform_error_line

    message = ("The zone 'projects/demo-project/zones/us-west1-b' does not have enough resources available to "
               "fulfill the request.  Try a different zone, or try again later.")
    stderr = f"╷\n│ Error: Error waiting for instance to create: {message}\n│\n│   with google_compute_instance.worker[1],\n╵"
    assert terraform_error_line(stderr, "demo-project").startswith("the zone has no capacity for these VMs")
    assert capacity_code(RuntimeError(f"503 SERVICE UNAVAILABLE {message}")) == "ZONE_RESOURCE_POOL_EXHAUSTED"
