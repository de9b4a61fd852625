"""create_tfrecords and the tf.data pipeline on image folders the tests make."""

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.conftest import REPO
from trainer import create_tfrecords
from trainer.synthetic import CLASSES, render, write_image_folder


@pytest.fixture
def image_folder(tmp_path):
    """3 classes with 10, 7 and 5 good images, plus corrupt and non-image files."""
    root = tmp_path / "images"
    rng = np.random.default_rng(1)
    for name, count in (("cat", 10), ("dog", 7), ("eel", 5)):
        (root / name).mkdir(parents=True)
        for i in range(count):
            size = (20 + i, 30) if i % 2 else (48, 48)  # Mixed sizes are resized.
            Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    (root / "cat" / "truncated.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 20)  # JPEG header only
    (root / "dog" / "notes.txt").write_text("not an image")
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(root / "eel" / "gray.png")  # Greyscale is fine.
    good = root / "dog" / "half.png"
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(good)
    good.write_bytes(good.read_bytes()[:40])  # Truncated PNG.
    return root


def test_corrupt_images_are_skipped_and_counted(image_folder, tmp_path):
    out = tmp_path / "records"
    manifest = create_tfrecords.convert(image_folder, out, image_size=16, shards=3, val_fraction=0.25)
    assert manifest["classes"] == ["cat", "dog", "eel"]
    skipped = sorted(item["path"].rsplit("/", 1)[-1] for item in manifest["skipped"])
    assert skipped == ["half.png", "notes.txt", "truncated.jpg"]
    total = {name: manifest["counts"]["train"][name] + manifest["counts"]["val"][name]
             for name in manifest["classes"]}
    assert total == {"cat": 10, "dog": 7, "eel": 6}
    assert sum(manifest["counts"]["val"].values()) == round(23 * 0.25)
    assert len(manifest["shards"]["train"]) == 3
    assert json.loads((out / "manifest.json").read_text()) == manifest

    import tensorflow as tf

    labels = []
    for name in manifest["shards"]["train"] + manifest["shards"]["val"]:
        for record in tf.data.TFRecordDataset(str(out / name)):
            example = tf.train.Example.FromString(record.numpy())
            feature = example.features.feature
            assert len(feature["image"].bytes_list.value[0]) == 16 * 16 * 3
            labels.append(feature["label"].int64_list.value[0])
    assert np.bincount(labels).tolist() == [10, 7, 6]


def test_cli_reports_skips_and_rejects_a_bad_folder(image_folder, tmp_path):
    result = subprocess.run([sys.executable, "-m", "trainer.create_tfrecords", "--src", str(image_folder),
                             "--out", str(tmp_path / "r")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "skipped 3 unreadable" in result.stdout
    result = subprocess.run([sys.executable, "-m", "trainer.create_tfrecords", "--src", str(tmp_path / "none"),
                             "--out", str(tmp_path / "r2")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2
    assert "--src" in result.stderr and "is not a folder" in result.stderr


def test_pipeline_batches_parsed_images_with_valid_labels(tmp_path):
    import tensorflow as tf

    from trainer import data

    write_image_folder(tmp_path / "shapes", per_class=12, size=24, seed=3)
    out = tmp_path / "records"
    create_tfrecords.convert(tmp_path / "shapes", out, image_size=24, shards=4, val_fraction=0.25)
    dataset = data.make_dataset(str(out), "train", global_batch=8, image_size=32, num_workers=2)
    assert dataset.options().experimental_distribute.auto_shard_policy == \
        tf.data.experimental.AutoShardPolicy.FILE
    images, labels = next(iter(dataset))
    assert images.shape == (8, 32, 32, 3) and images.dtype == tf.float32
    assert 0.0 <= float(tf.reduce_min(images)) and float(tf.reduce_max(images)) <= 1.0
    assert set(labels.numpy().tolist()) <= set(range(len(CLASSES)))
    assert data.shard_policy(1, 3) == tf.data.experimental.AutoShardPolicy.DATA
    assert data.split_size(str(out), "train") + data.split_size(str(out), "val") == 48


def test_synthetic_shapes_differ_by_class():
    rng = np.random.default_rng(0)
    images = {shape: render(shape, 32, rng) for shape in CLASSES}
    assert all(image.shape == (32, 32, 3) and image.dtype == np.uint8 for image in images.values())
    with pytest.raises(ValueError, match="valid: circle"):
        render("hexagon", 32, rng)
