"""Real training on gs://: two TensorFlow workers on the test hosts, the gcp backend's path end
to end, with checkpoints, the model and TensorBoard logs in the cluster bucket.

Each host sees the test world through `ip netns exec`'s /etc/netns/<host>/: a hosts file that
puts www/storage.googleapis.com on the IAM-checking storage door and metadata.google.internal on
a metadata stand-in (which hands out the VMs' token, as on a VM), and an /etc/ssl that trusts
the test CA. Nothing in the product or the trainer knows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import events_of, wait_for
from tests.fake_metadata import FakeMetadataServer
from tests.hostlab import BRIDGE, SUBNET, HostLab, available
from tests.test_gcp_backend import make_gcp_cli
from tests.world.names import STORAGE_NAMES, VM_TOKEN

pytestmark = pytest.mark.skipif(available() is not None, reason=f"test hosts: {available()}")


@pytest.fixture
def gs_cli(tmp_path, world, synthetic_data):
    storage_address, metadata_address = f"{SUBNET}.2", f"{SUBNET}.3"
    etc = {"hosts": f"127.0.0.1 localhost\n{storage_address} {' '.join(STORAGE_NAMES)}\n"
                    f"{metadata_address} metadata.google.internal\n",
           "ssl": world.trust_store(tmp_path / "ssl")}
    lab = HostLab(tmp_path / "lab", 2, tag="tt", listen_all=True, etc=etc, vm_login=True)
    for address in (storage_address, metadata_address):
        subprocess.run(["ip", "addr", "add", f"{address}/24", "dev", BRIDGE], check=True)
    world.storage_proxy.listen(storage_address, 443, world.tls_context)
    world.storage_proxy.listen(storage_address, 80, None)
    metadata = FakeMetadataServer({
        # https://cloud.google.com/compute/docs/access/authenticate-workloads#applications
        "instance/service-accounts/default/token": json.dumps(
            {"access_token": VM_TOKEN, "expires_in": 3599, "token_type": "Bearer"}),
        "instance/service-accounts/default/email": "default-vm@demo-project.iam.gserviceaccount.com",
        "project/project-id": "demo-project", "instance/zone": "projects/1/zones/us-west1-b",
    }, bind=(metadata_address, 80))
    cli = make_gcp_cli(tmp_path, world, lab, synthetic_data)
    yield cli
    if cli.cluster() is not None:
        cli.run("down", "--delete-bucket", timeout=180)
    metadata.close()
    lab.teardown()


def test_two_workers_train_on_gs_and_the_results_come_back(gs_cli, world, tmp_path):
    up = gs_cli.run("up", timeout=240)
    assert up.returncode == 0, up.stdout + up.stderr
    train = gs_cli.run("train", "--", "--epochs", "2", timeout=600)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    run_dir, run = gs_cli.latest_run()
    assert run["summary"]["replicas_in_sync"] == 2
    prefix = f"runs/{run['run_id']}/"
    from tfcluster.backends.gcp import storage as gcs

    bucket = gs_cli.cluster()["bucket"]
    names = [blob.name for blob in gcs.client("demo-project").list_blobs(bucket, prefix=prefix)]
    assert any(n.startswith(prefix + "model/") and n.endswith("model.keras") for n in names), names
    assert any(n.startswith(prefix + "tensorboard/") and "tfevents" in n for n in names), names
    # The launcher's throughput figures go beside them, where `invoke tensorboard` reads on gcp.
    assert any(n.startswith(prefix + "tensorboard/throughput/") and "tfevents" in n for n in names), names
    assert f"gs://{bucket}/{prefix}tensorboard/throughput" in train.stdout
    # IAM allowed every request of the VMs' identity, and every object of the run came from it:
    # checkpoints, model and TensorBoard, all but the launcher's own throughput figures.
    vm = [entry for entry in world.storage_proxy.log if entry[2] == VM_TOKEN]
    assert vm and all(allowed for *_, allowed in vm)
    run_writes = [(token, name) for token, name in world.storage_proxy.object_writes if name.startswith(prefix)]
    by_vms = {name for token, name in run_writes if token == VM_TOKEN}
    assert any("/model/" in f"/{name}" for name in by_vms) and any("checkpoint" in name for name in by_vms), by_vms
    by_others = {name for token, name in run_writes if token != VM_TOKEN}
    assert all(name.startswith(prefix + "tensorboard/throughput/") for name in by_others), by_others

    pulled = gs_cli.run("pull", timeout=120)
    assert pulled.returncode == 0, pulled.stderr
    assert (run_dir / "output" / "model" / "model.keras").is_file()
    served = run_dir / "output" / "model" / "1"  # Pulled in TF Serving's layout; it takes raw pixels.
    predict = subprocess.run([sys.executable, "-c", (
        "import numpy as np, tensorflow as tf; "
        f"m = tf.saved_model.load({str(served)!r}); "
        "print('PRED', m.signatures['serving_uint8'](images=tf.zeros((2, 40, 40, 3), tf.uint8))"
        "['probabilities'].shape)")],
        capture_output=True, text=True, timeout=180)
    assert "PRED (2, 4)" in predict.stdout, predict.stdout + predict.stderr[-2000:]
    events = list((run_dir / "output" / "tensorboard").rglob("*tfevents*"))
    assert events, "no TensorBoard event files came back"

    # A worker dies in the next run: --retries 1 resumes every worker from the backup in the
    # bucket, and no finished epoch is done again.
    launcher = gs_cli.popen("train", "--retries", "1", "--", "--epochs", "3")
    try:
        run_dir = wait_for(lambda: gs_cli.runs() and gs_cli.runs()[-1].name != run["run_id"] and gs_cli.runs()[-1],
                           60, what="the second run's folder")
        def on_vm(worker: int) -> Path:  # The product's remote folder, in the login's home on that VM.
            return gs_cli.lab.home(worker) / ".tfcluster-remote" / "default" / "runs" / run_dir.name / f"worker-{worker}"

        def epoch_done():
            log = on_vm(0) / "worker-0.log"
            return log.exists() and any(e["event"] == "epoch_end" for e in events_of(log.read_text()))

        wait_for(epoch_done, 240, what="the chief's first epoch")
        os.kill(int((on_vm(1) / "worker-1.attempt1.pid").read_text()), signal.SIGKILL)
        output, _ = launcher.communicate(timeout=400)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, output[-3000:]
    again = json.loads((run_dir / "run.json").read_text())
    finished = max(e["epoch"] for e in events_of((run_dir / "worker-0.log").read_text().split("attempt 2 on")[0])
                   if e["event"] == "epoch_end")
    assert again["attempts"] == 2 and again["summary"]["resumed_at"]["2"] == finished + 1 > 1
