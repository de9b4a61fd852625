"""Cloud Storage transfers with the real google-cloud-storage client and the operator's credentials,
against gcp-storage-emulator behind storage.googleapis.com in the test world (tests/world)."""

from __future__ import annotations

import json

import pytest

from tfcluster.backends.gcp import storage as gcs
from tfcluster.config import Settings
from tfcluster.state import ClusterState, RunRecord, StateStore

BUCKET = "demo-project-default-a1b2c3"


@pytest.fixture
def emulator(world):
    gcs.client("demo-project").create_bucket(BUCKET)
    return world


def test_upload_then_download_round_trip(emulator, synthetic_data, tmp_path):
    client = gcs.client("demo-project")
    names = gcs.upload_dir(client, synthetic_data, f"gs://{BUCKET}/data/shapes")
    local = sorted(p.name for p in synthetic_data.iterdir())
    assert sorted(n.rsplit("/", 1)[-1] for n in names) == local
    assert names[-1] == "data/shapes/manifest.json"  # Last: its presence means the set is complete.
    listed = sorted(b.name for b in client.list_blobs(BUCKET, prefix="data/shapes/"))
    assert listed == sorted(names)
    copies = gcs.download_prefix(client, f"gs://{BUCKET}/data/shapes", tmp_path / "back")
    assert sorted(p.name for p in copies) == local
    for path in copies:
        assert path.read_bytes() == (synthetic_data / path.name).read_bytes()


def test_bad_url_is_one_clear_line():
    with pytest.raises(Exception, match="'s3://x' is not a gs:// URL"):
        gcs.split_url("s3://x")


def test_invoke_data_uploads_and_pull_downloads(emulator, cli, tmp_path):
    cli.enter(emulator)
    settings = Settings(state_dir=str(cli.state_dir))
    store = StateStore(settings)
    store.save_cluster(ClusterState(name="default", backend="gcp", hosts=[], project="demo-project",
                                    zone="us-west1-b", bucket=BUCKET))
    images = tmp_path / "images"
    from trainer.synthetic import write_image_folder

    write_image_folder(images, per_class=5, size=16)
    result = cli.run("data", "--src", str(images), "--out", str(tmp_path / "records"), "--image-size", "16")
    assert result.returncode == 0, result.stdout + result.stderr
    cluster = json.loads(store.cluster_file.read_text())
    assert cluster["data_url"] == f"gs://{BUCKET}/data/records"
    client = gcs.client("demo-project")
    uploaded = {b.name for b in client.list_blobs(BUCKET, prefix="data/records/")}
    assert "data/records/manifest.json" in uploaded and len(uploaded) >= 3

    # A finished run whose chief wrote to the bucket.
    run = RunRecord(run_id="default-20261122-060000-abcd", cluster="default", workers=2, command=[], retries=0)
    store.save_run(run)
    bucket = client.bucket(BUCKET)
    bucket.blob(f"runs/{run.run_id}/model/model.keras").upload_from_string(b"keras-bytes")
    bucket.blob(f"runs/{run.run_id}/model/saved_model/saved_model.pb").upload_from_string(b"pb")
    bucket.blob(f"runs/{run.run_id}/tensorboard/train/events.out").upload_from_string(b"ev")
    bucket.blob(f"runs/{run.run_id}/checkpoints/chief/ckpt").upload_from_string(b"not pulled")
    pulled = cli.run("pull")
    assert pulled.returncode == 0, pulled.stderr
    output = store.run_dir(run.run_id) / "output"
    assert (output / "model" / "model.keras").read_bytes() == b"keras-bytes"
    assert (output / "model" / "saved_model" / "saved_model.pb").read_bytes() == b"pb"
    assert (output / "tensorboard" / "train" / "events.out").read_bytes() == b"ev"
    assert not (output / "checkpoints").exists()

    from tfcluster import commands

    assert commands.tensorboard_logdir(settings) == f"gs://{BUCKET}/runs/{run.run_id}/tensorboard"
