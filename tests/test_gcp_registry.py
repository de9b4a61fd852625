"""The cluster's Artifact Registry repository on `down` and the next `up`: kept while it holds
images (like the bucket of results), deleted when empty or with --delete-bucket.

Google's Artifact Registry API is tests/fake_artifact_registry.py behind
artifactregistry.googleapis.com (tests/world/names.py); the real terraform's google provider
stand-in creates, imports and deletes the repository there (tests/world/provider/google_other.py).
"""

from __future__ import annotations

import pytest

from tests.hostlab import HostLab
from tests.test_gcp_backend import make_gcp_cli, needs_hosts, terraform_log

REPO = "projects/demo-project/locations/us-west1/repositories/default-images"
REGISTRY = "us-west1-docker.pkg.dev/demo-project/default-images"


@pytest.fixture
def gcp_cli(tmp_path, world, synthetic_data):
    lab = HostLab(tmp_path / "lab", 1, tag="tr", listen_all=True, vm_login=True)
    cli = make_gcp_cli(tmp_path, world, lab, synthetic_data)
    cli.env.update({"INVOKE_TFCLUSTER_WORKERS": "1"})
    cli.artifacts = world.artifacts.state
    yield cli
    if cli.cluster() is not None:
        cli.run("down", "--delete-bucket", timeout=120)
    lab.teardown()


def calls(cli) -> list[list[str]]:
    return terraform_log(cli)


@needs_hosts
def test_down_deletes_an_empty_registry(gcp_cli):
    up = gcp_cli.run("up", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    assert gcp_cli.cluster()["registry"] == REGISTRY
    assert REPO in gcp_cli.artifacts.repositories
    down = gcp_cli.run("down", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "and the empty bucket and registry" in down.stdout and "kept registry" not in down.stdout
    assert ["state", "rm", "-no-color", "google_artifact_registry_repository.images"] not in calls(gcp_cli)
    assert REPO not in gcp_cli.artifacts.repositories
    assert ("GET", f"/v1/{REPO}") in gcp_cli.artifacts.requests  # It looked before destroying.


@needs_hosts
def test_registry_with_images_is_kept_reused_and_deleted_when_asked(gcp_cli):
    assert gcp_cli.run("up", timeout=180).returncode == 0
    gcp_cli.artifacts.add_image(REPO, "trainer", "1", 1_500_000_000)
    gcp_cli.artifacts.add_image(REPO, "trainer", "2", 500_000_000)
    down = gcp_cli.run("down", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert ["state", "rm", "-no-color", "google_artifact_registry_repository.images"] in calls(gcp_cli)
    text = " ".join(down.stdout.split())  # Rich wraps long lines.
    # 2.0e9 bytes = 1.86 GiB at $0.10 per GiB-month (tfcluster/prices.json).
    assert (f"kept registry {REGISTRY}: 2 images, 2.00 GB, about $0.19/month in Artifact Registry storage "
            "(the first 0.5 GB per billing account is free)") in text
    assert ("gcloud artifacts repositories delete default-images --location=us-west1 --project=demo-project"
            in text)
    assert "nothing left that bills by the hour" in text
    assert len(gcp_cli.artifacts.repositories[REPO]) == 2
    assert gcp_cli.compute.state.instances == {} and gcp_cli.cluster() is None

    # The next `up` of the same cluster adopts it (creating it would fail: 409 already exists).
    up = gcp_cli.run("up", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    assert f"reusing registry {REGISTRY} kept by an earlier `down` (2 images)" in " ".join(up.stdout.split())
    assert ["import", "-input=false", "-no-color", "google_artifact_registry_repository.images", REPO] in calls(gcp_cli)

    gone = gcp_cli.run("down", "--delete-bucket", timeout=120)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert f"deleting registry {REGISTRY} with its 2 images (2.00 GB)" in " ".join(gone.stdout.split())
    assert REPO not in gcp_cli.artifacts.repositories and gcp_cli.cluster() is None


@needs_hosts
def test_registry_api_disabled_is_one_line(gcp_cli):
    assert gcp_cli.run("up", timeout=180).returncode == 0
    gcp_cli.artifacts.service_disabled = True
    down = gcp_cli.run("down", timeout=120)
    assert down.returncode == 2 and "Traceback" not in down.stderr
    [line] = down.stderr.strip().splitlines()
    assert line.startswith("error: ") and "artifactregistry.googleapis.com" in line
    assert gcp_cli.cluster() is not None  # Nothing destroyed: `down` can be run again.
    gcp_cli.artifacts.service_disabled = False
