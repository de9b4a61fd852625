"""TensorFlow's own gs:// client against Cloud Storage's IAM, with the roles terraform/ grants.

The real TensorFlow binary runs in the test world (tests/world): storage.googleapis.com and
www.googleapis.com resolve to the IAM-checking proxy before gcp-storage-emulator, its libcurl
trusts the test CA (CURL_CA_BUNDLE), and it presents the VMs' access token
(GOOGLE_AUTH_TOKEN_FOR_TESTING, as it would get from the metadata server on a VM).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.world.iam import vm_bucket_roles
from tests.world.iam_api import create_account
from tests.world.names import token_for
from tfcluster.backends.gcp.cloud import storage as gcs

BUCKET = "demo-project-default-a1b2c3"
# VM 0's own service account, as terraform/iam.tf names it (google_service_account.vm[0]), and the
# token its metadata server hands it.
VM_EMAIL = "default-vm-0@demo-project.iam.gserviceaccount.com"
VM, TOKEN = f"serviceAccount:{VM_EMAIL}", token_for(VM_EMAIL)
# What the trainer does first on a fresh run prefix: make the folders, then write into them.
TF_FIRST_WRITE = f"""
import tensorflow as tf
try:
    tf.io.gfile.makedirs("gs://{BUCKET}/runs/r1/tensorboard/train")
    with tf.io.gfile.GFile("gs://{BUCKET}/runs/r1/model/hello.txt", "w") as handle:
        handle.write("hi")
    print("LISTED", sorted(tf.io.gfile.listdir("gs://{BUCKET}/runs/r1/")))
except tf.errors.OpError as error:
    print("DENIED", type(error).__name__, str(error).splitlines()[0][:300])
"""


def run_tensorflow_as_the_vm(world) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "CURL_CA_BUNDLE": str(world.ca), "GOOGLE_AUTH_TOKEN_FOR_TESTING": TOKEN,
           "TF_CPP_MIN_LOG_LEVEL": "2", "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": "10",
           "HOME": str(world.ca.parent)}
    return subprocess.run([*world.prefix(), sys.executable, "-c", TF_FIRST_WRITE], env=env, capture_output=True,
                          text=True, timeout=300, cwd=REPO)


@pytest.fixture
def bucket(world):
    gcs.client("demo-project").create_bucket(BUCKET)  # The operator's credentials: the owner.
    # The VM's service account, made as terraform's google_service_account makes it: IAM now
    # resolves its token to it.
    create_account(world.compute.state, "demo-project", VM_EMAIL.split("@")[0], {})
    # The bindings terraform/ makes on the bucket (iam.tf's google_storage_bucket_iam_member).
    world.storage_proxy.policies[BUCKET] = [{"role": role, "members": [VM]}
                                            for role in vm_bucket_roles(REPO / "terraform")]
    return world


def test_the_terraform_grants_let_tensorflow_write_its_first_run(bucket):
    roles = vm_bucket_roles(REPO / "terraform")
    assert sorted(roles) == ["roles/storage.legacyBucketReader", "roles/storage.objectAdmin"]
    result = run_tensorflow_as_the_vm(bucket)
    assert "LISTED ['model/', 'tensorboard/']" in result.stdout, result.stdout + result.stderr[-2000:]
    vm_requests = [(method, path, allowed) for method, path, token, allowed in bucket.storage_proxy.log
                   if token == TOKEN]
    # TensorFlow reads the bucket itself before its first folder: that is storage.buckets.get.
    assert ("GET", f"/storage/v1/b/{BUCKET}", True) in vm_requests
    assert all(allowed for _, _, allowed in vm_requests)


def test_object_admin_alone_is_refused_at_tensorflows_first_makedirs(bucket):
    """The grant before this fix: roles/storage.objectAdmin lacks storage.buckets.get."""
    bucket.storage_proxy.policies[BUCKET] = [{"role": "roles/storage.objectAdmin", "members": [VM]}]
    result = run_tensorflow_as_the_vm(bucket)
    assert "DENIED PermissionDeniedError" in result.stdout, result.stdout + result.stderr[-2000:]
    denied = [(method, path) for method, path, token, allowed in bucket.storage_proxy.log
              if token == TOKEN and not allowed]
    assert denied == [("GET", f"/storage/v1/b/{BUCKET}")]
