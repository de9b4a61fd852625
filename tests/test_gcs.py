"""Cloud Storage transfers with the real google-cloud-storage client and the operator's credentials,
against gcp-storage-emulator behind storage.googleapis.com in the test world (tests/world)."""

from __future__ import annotations

import json

import pytest

from tfcluster.backends.gcp.cloud import storage as gcs
from tfcluster.config import Settings
from tfcluster.state import ClusterState, RunRecord, StateStore

BUCKET = "demo-project-default-a1b2c3"


@pytest.fixture
def emulator(world):
    gcs.client("demo-project").create_bucket(BUCKET)
    return world


def test_upload_then_download_round_trip(emulator, synthetic_data, tmp_path):
    client = gcs.client("demo-project")
    names = gcs.upload_dir(client, synthetic_data, f"gs://{BUCKET}/data/shapes").uploaded
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
    bucket.blob(f"runs/{run.run_id}/model/saved_model.pb").upload_from_string(b"pb")
    bucket.blob(f"runs/{run.run_id}/tensorboard/train/events.out").upload_from_string(b"ev")
    bucket.blob(f"runs/{run.run_id}/checkpoints/chief/ckpt").upload_from_string(b"not pulled")
    pulled = cli.run("pull")
    assert pulled.returncode == 0, pulled.stderr
    output = store.run_dir(run.run_id) / "output"
    assert (output / "model" / "model.keras").read_bytes() == b"keras-bytes"
    assert (output / "model" / "saved_model.pb").read_bytes() == b"pb"
    assert (output / "tensorboard" / "train" / "events.out").read_bytes() == b"ev"
    assert not (output / "checkpoints").exists()

    from tfcluster import commands

    assert commands.tensorboard_logdir(settings) == f"gs://{BUCKET}/runs/{run.run_id}/tensorboard"


def test_a_killed_upload_resumes_with_only_the_missing_shards(emulator, cli, tmp_path):
    """`invoke data` killed after 3 object writes: the re-run writes only what is missing, the
    manifest last; a shard changed in place (same size) is written again, under no manifest."""
    from tests.conftest import wait_for
    from tests.world.storage import is_object_write
    from trainer.synthetic import write_image_folder

    cli.enter(emulator)
    store = StateStore(Settings(state_dir=str(cli.state_dir)))
    store.save_cluster(ClusterState(name="default", backend="gcp", hosts=[], project="demo-project",
                                    zone="us-west1-b", bucket=BUCKET))
    write_image_folder(tmp_path / "images", per_class=5, size=16)
    records = tmp_path / "records"
    argv = ("data", "--src", str(tmp_path / "images"), "--out", str(records), "--image-size", "16",
            "--shards", "6")
    proxy = emulator.storage_proxy

    def writes_since(start: int) -> list[str]:
        return [path for method, path, *_ in proxy.log[start:] if is_object_write(method, path)]

    proxy.hold_writes_after = 3
    launcher = cli.popen(*argv)
    try:
        wait_for(proxy.holding.is_set, 120, what="the fourth object write")
    finally:
        launcher.kill()
        launcher.communicate(timeout=60)
    proxy.hold_writes_after = None
    proxy.release.set()
    client = gcs.client("demo-project")
    landed = {b.name for b in client.list_blobs(BUCKET, prefix="data/records/")}
    assert len(landed) == 3 and "data/records/manifest.json" not in landed

    local = sorted(p.name for p in records.iterdir())
    assert len(local) == 11  # 6 train shards, 4 val shards (4 val images), the manifest.
    start = len(proxy.log)
    again = cli.run(*argv)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "(3 already there)" in again.stdout
    written = writes_since(start)
    assert len(written) == 11 - 3 and written[-1].endswith("/o")  # 7 shards, then the manifest:
    uploads = [b for b in client.list_blobs(BUCKET, prefix="data/records/")]
    assert sorted(b.name.rsplit("/", 1)[-1] for b in uploads) == local
    assert max(uploads, key=lambda b: b.updated).name == "data/records/manifest.json"
    for blob in uploads:
        assert blob.crc32c == gcs.crc32c_of(records / blob.name.rsplit("/", 1)[-1])

    # Same size, other bytes: only the CRC32C tells. The manifest goes first, and comes back last.
    shard = records / next(name for name in local if name.endswith(".tfrecord"))
    payload = bytearray(shard.read_bytes())
    payload[-1] ^= 0xFF
    shard.write_bytes(bytes(payload))
    start = len(proxy.log)
    result = gcs.upload_dir(client, records, f"gs://{BUCKET}/data/records")
    assert result.uploaded == [f"data/records/{shard.name}", "data/records/manifest.json"]
    written = [(method, path) for method, path, *_ in proxy.log[start:] if is_object_write(method, path)]
    assert [m for m, _ in written] == ["DELETE", "POST", "POST"] and written[0][1].endswith("manifest.json")
    start = len(proxy.log)
    assert gcs.upload_dir(client, records, f"gs://{BUCKET}/data/records").uploaded == []
    assert writes_since(start) == []


def test_a_new_conversion_leaves_no_stale_shard_on_the_bucket(emulator, cli, tmp_path):
    """`data --shards 8` then `--shards 4` of the same folder: the bucket then holds exactly what the
    new manifest lists (a script that globs train-*.tfrecord reads each image once), and the stale
    shards went only after the new manifest was in place. An image folder's set is named after it."""
    from tests.world.storage import is_object_write
    from trainer.synthetic import write_image_folder

    cli.enter(emulator)
    store = StateStore(Settings(state_dir=str(cli.state_dir)))
    store.save_cluster(ClusterState(name="default", backend="gcp", hosts=[], project="demo-project",
                                    zone="us-west1-b", bucket=BUCKET))
    write_image_folder(tmp_path / "flowers", per_class=5, size=16)
    cli.env.pop("INVOKE_TFCLUSTER_DATA_DIR", None)  # The default output: named after the source.
    for shards in ("8", "4"):
        start = len(emulator.storage_proxy.object_writes)
        result = cli.run("data", "--src", str(tmp_path / "flowers"), "--image-size", "16", "--shards", shards)
        assert result.returncode == 0, result.stdout + result.stderr
    assert "removed 8 stale file(s) the manifest does not list" in result.stdout  # 8 train shards -> 4.
    target = cli.state_dir / "data" / "flowers"
    manifest = json.loads((target / "manifest.json").read_text())
    listed = {"manifest.json", *(name for names in manifest["shards"].values() for name in names)}
    assert len(manifest["shards"]["train"]) == 4 and sorted(p.name for p in target.iterdir()) == sorted(listed)
    assert json.loads(store.cluster_file.read_text())["data_url"] == f"gs://{BUCKET}/data/flowers"
    client = gcs.client("demo-project")
    on_bucket = {b.name.removeprefix("data/flowers/") for b in client.list_blobs(BUCKET, prefix="data/flowers/")}
    assert on_bucket == listed
    # The second run's object writes in order (uploads and deletions, by object name): the new manifest,
    # then the 8 train shards of the first conversion.
    written = [name.removeprefix("data/flowers/") for _, name in emulator.storage_proxy.object_writes[start:]]
    stale = [i for i, name in enumerate(written) if name.startswith("train-") and name.endswith("-of-00008.tfrecord")]
    manifest_last = max(i for i, name in enumerate(written) if name == "manifest.json")
    assert len(stale) == 8 and min(stale) > manifest_last, written
