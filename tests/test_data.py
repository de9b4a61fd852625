"""create_tfrecords and the tf.data pipeline on image folders the tests make."""

import io
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
    # A quarter of the 26 files listed, less the unreadable ones that fell in the validation share.
    assert round(26 * 0.25) - 3 <= sum(manifest["counts"]["val"].values()) <= round(26 * 0.25)
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


def test_parallel_decoding_writes_the_same_shards_as_one_process(tmp_path):
    """Two processes, each writing its own shards, write byte for byte the single-process shards;
    the validation share is round(files x fraction) (here the unreadable file is a training one)."""
    write_image_folder(tmp_path / "shapes", per_class=15, size=20, seed=4, suffix="jpg")
    (tmp_path / "shapes" / "circle" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0")
    one = create_tfrecords.convert(tmp_path / "shapes", tmp_path / "one", image_size=16, shards=5,
                                   val_fraction=0.3, processes=1)
    two = create_tfrecords.convert(tmp_path / "shapes", tmp_path / "two", image_size=16, shards=5,
                                   val_fraction=0.3, processes=2)
    assert one == {**two, "source": one["source"]}
    assert len(one["shards"]["train"]) == 5 and len(one["skipped"]) == 1
    assert sum(one["counts"]["val"].values()) == round(61 * 0.3)
    for name in one["shards"]["train"] + one["shards"]["val"]:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


def test_jpeg_shards_decode_in_the_pipeline_to_the_raw_pixels(tmp_path):
    import tensorflow as tf

    from trainer import data

    write_image_folder(tmp_path / "shapes", per_class=8, size=24, seed=5)
    batches = {}
    for encoding in create_tfrecords.ENCODINGS:
        out = tmp_path / encoding
        manifest = create_tfrecords.convert(tmp_path / "shapes", out, image_size=24, shards=2,
                                            encoding=encoding)
        assert manifest["encoding"] == encoding
        dataset = data.make_dataset(str(out), "train", global_batch=8, image_size=32, training=False)
        batches[encoding] = next(iter(dataset))
    sizes = {e: sum(p.stat().st_size for p in (tmp_path / e).glob("train-*")) for e in batches}
    assert sizes["jpeg"] < sizes["raw"]
    (raw_images, raw_labels), (jpeg_images, jpeg_labels) = batches["raw"], batches["jpeg"]
    assert jpeg_images.shape == raw_images.shape == (8, 32, 32, 3) and jpeg_images.dtype == tf.float32
    assert jpeg_labels.numpy().tolist() == raw_labels.numpy().tolist()
    assert float(tf.reduce_mean(tf.abs(jpeg_images - raw_images))) < 0.03  # JPEG at quality 95.


def test_invoke_data_makes_four_shards_per_cluster_worker(tmp_path):
    """With a 5-worker cluster the default is 20 train shards, so FILE sharding holds; a bad
    --shards is one error line."""
    from tests.conftest import Cli
    from tfcluster.config import Settings
    from tfcluster.state import ClusterState, HostRecord, StateStore

    import tensorflow as tf

    from trainer import data

    cli = Cli(tmp_path / "state", None)
    hosts = [HostRecord(name=f"worker-{i}", address="127.0.0.1", tf_port=20000 + i) for i in range(5)]
    StateStore(Settings(state_dir=str(cli.state_dir))).save_cluster(
        ClusterState(name="default", backend="local", hosts=hosts))
    write_image_folder(tmp_path / "shapes", per_class=10, size=16, seed=6)
    result = cli.run("data", "--src", str(tmp_path / "shapes"), "--out", str(tmp_path / "records"),
                     "--image-size", "16")
    assert result.returncode == 0, result.stdout + result.stderr
    manifest = json.loads((tmp_path / "records" / "manifest.json").read_text())
    assert len(manifest["shards"]["train"]) == 20
    for split in ("train", "val"):  # 8 validation files: 8 validation shards.
        assert data.shard_policy(len(manifest["shards"][split]), 5) == tf.data.experimental.AutoShardPolicy.FILE
    bad = cli.run("data", "--src", str(tmp_path / "shapes"), "--shards", "0")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == ["error: --shards must be a whole number of at least 1 (got 0); omit it for the default, 20"], bad.stderr
    bad = cli.run("data", "--src", str(tmp_path / "shapes"), "--encoding", "png")
    assert bad.stderr.strip().splitlines() == ["error: --encoding must be one of raw, jpeg (got 'png')"], bad.stderr

    # The converter's own options pass through; the set is named after its source, and the bundled
    # trainer's default data from then on.
    result = cli.run("data", "--src", str(tmp_path / "shapes"), "--image-size", "16", "--encoding", "jpeg",
                     "--val-fraction", "0.25", "--test-fraction", "0.1", "--processes", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    target = cli.state_dir / "data" / "shapes"
    manifest = json.loads((target / "manifest.json").read_text())
    sizes = {split: sum(manifest["counts"][split].values()) for split in create_tfrecords.SPLITS}
    assert manifest["encoding"] == "jpeg" and sizes == {"train": 26, "val": 10, "test": 4}
    from tfcluster.state import StateStore as Store

    assert Store(Settings(state_dir=str(cli.state_dir))).default_data_dir() == target
    assert f"`invoke train` trains on {target} from now on" in result.stdout


def test_records_are_byte_for_byte_what_tensorflow_writes(tmp_path):
    import tensorflow as tf

    from trainer import records

    image = bytes(range(256)) * 3
    ours = records.example({"image": image, "label": [3], "height": [300], "width": [0]})
    feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
               "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[3])),
               "height": tf.train.Feature(int64_list=tf.train.Int64List(value=[300])),
               "width": tf.train.Feature(int64_list=tf.train.Int64List(value=[0]))}
    theirs = tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)
    assert ours == theirs
    with records.RecordWriter(tmp_path / "ours.tfrecord") as writer:
        writer.write(ours)
        writer.write(b"")
    with tf.io.TFRecordWriter(str(tmp_path / "theirs.tfrecord")) as writer:
        writer.write(theirs)
        writer.write(b"")
    assert (tmp_path / "ours.tfrecord").read_bytes() == (tmp_path / "theirs.tfrecord").read_bytes()


def _ops(tf, fn, spec) -> set[str]:
    return {op.type for op in tf.function(fn).get_concrete_function(spec).graph.get_operations()}


def test_training_resizes_only_when_the_sizes_differ_and_sees_the_served_pixels(tmp_path):
    """At the stored size the pipeline only scales (an antialiased resize there is the identity and
    cost the pipeline half its speed); either way a record's training pixels are what the serving
    signature makes of the same image sent as PNG bytes."""
    import tensorflow as tf

    from trainer import data, export

    batch = tf.TensorSpec([None], tf.string)
    assert "ScaleAndTranslate" not in _ops(tf, data.parse_batch_fn(24, 24), batch)
    assert "ScaleAndTranslate" in _ops(tf, data.parse_batch_fn(24, 32), batch)

    write_image_folder(tmp_path / "shapes", per_class=2, size=24, seed=7)
    out = tmp_path / "records"
    create_tfrecords.convert(tmp_path / "shapes", out, image_size=24, shards=1, val_fraction=0.0)
    stored = []
    for record in tf.data.TFRecordDataset(str(out / "train-00000-of-00001.tfrecord")):
        image = tf.train.Example.FromString(record.numpy()).features.feature["image"].bytes_list.value[0]
        stored.append(np.frombuffer(image, np.uint8).reshape(24, 24, 3))
    pngs = []
    for pixels in stored:
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        pngs.append(buffer.getvalue())
    for size in (24, 32):  # The stored size, and a larger one (both resize).
        trained, _ = next(iter(data.make_dataset(str(out), "train", len(stored), size, training=False)))
        # A model that answers its input: the served "probabilities" are the pixels it was given.
        identity = tf_keras_identity(size)
        module = export.build_serving_module(tf, identity, size, [str(i) for i in range(size * size * 3)])
        served = module.serve_bytes(tf.constant(pngs))["probabilities"].numpy().reshape(-1, size, size, 3)
        assert np.array_equal(trained.numpy(), served), (size, np.abs(trained.numpy() - served).max())


def tf_keras_identity(size: int):
    import os

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras as keras

    inputs = keras.Input((size, size, 3))
    return keras.Model(inputs, keras.layers.Flatten()(inputs))


def test_sixteen_bit_images_keep_their_high_byte_as_the_serving_decoder_does(tmp_path):
    """A 16-bit greyscale PNG at 3000 is 11 in the record (3000 >> 8), what tf.io.decode_image gives
    the served model for the same file; PIL's convert("RGB") alone gave 255."""
    import tensorflow as tf

    root = tmp_path / "images"
    for name in ("deep", "flat"):
        (root / name).mkdir(parents=True)
    values = np.array([[3000, 51528], [65535, 255]], dtype=np.uint16)  # 11, 201, 255, 0.
    Image.fromarray(values).save(root / "deep" / "grey16.png")
    Image.fromarray(np.full((2, 2, 3), 7, np.uint8)).save(root / "flat" / "rgb8.png")
    out = tmp_path / "records"
    manifest = create_tfrecords.convert(root, out, image_size=2, shards=1, val_fraction=0.0)
    assert Image.open(root / "deep" / "grey16.png").mode == "I;16"
    stored = {}
    for record in tf.data.TFRecordDataset(str(out / manifest["shards"]["train"][0])):
        feature = tf.train.Example.FromString(record.numpy()).features.feature
        stored[feature["label"].int64_list.value[0]] = np.frombuffer(
            feature["image"].bytes_list.value[0], np.uint8).reshape(2, 2, 3)
    assert stored[0][..., 0].tolist() == [[11, 201], [255, 0]]
    served = tf.io.decode_image((root / "deep" / "grey16.png").read_bytes(), channels=3).numpy()
    assert np.array_equal(stored[0], served)
    assert stored[1].tolist() == np.full((2, 2, 3), 7).tolist()


def test_pil_warnings_are_one_line_each_and_bombs_are_skipped(tmp_path):
    """PIL warns above MAX_IMAGE_PIXELS and refuses twice that. The limit is lowered here (PIL's own
    setting, 89 megapixels by default) so that small files cross it: the warned file is converted and
    named on one line, the refused one is skipped as unreadable, and no raw Python warning shows."""
    root = tmp_path / "images"
    for name in ("big", "small"):
        (root / name).mkdir(parents=True)
    Image.fromarray(np.zeros((60, 60, 3), np.uint8)).save(root / "big" / "warned.png")  # 3600 px.
    Image.fromarray(np.zeros((100, 100, 3), np.uint8)).save(root / "big" / "refused.png")  # 10000 px.
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "small" / "fine.png")
    code = ("import sys, PIL.Image; PIL.Image.MAX_IMAGE_PIXELS = 3000; "
            "from trainer.create_tfrecords import main; sys.exit(main(sys.argv[1:]))")
    result = subprocess.run([sys.executable, "-c", code, "--src", str(root), "--out", str(tmp_path / "r"),
                             "--image-size", "8", "--val-fraction", "0"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # No raw `warnings.warn` lines.
    lines = result.stdout.splitlines()
    warned = [line for line in lines if line.startswith("warning: ")]
    assert warned == [f"warning: {root / 'big' / 'warned.png'}: DecompressionBombWarning: Image size (3600 pixels) "
                      "exceeds limit of 3000 pixels, could be decompression bomb DOS attack."], lines
    assert any(line.startswith(f"  skipped {root / 'big' / 'refused.png'}: DecompressionBombError") for line in lines)
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["counts"]["train"] == {"big": 1, "small": 1}


def test_an_empty_class_folder_is_dropped_with_a_warning(tmp_path):
    root = tmp_path / "images"
    write_image_folder(root, per_class=3, size=8)
    (root / "unicorn" / "nested").mkdir(parents=True)  # No file, however deep.
    (root / "unicorn" / ".DS_Store").write_text("")
    result = subprocess.run([sys.executable, "-m", "trainer.create_tfrecords", "--src", str(root),
                             "--out", str(tmp_path / "r"), "--image-size", "8"], cwd=REPO, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert "warning: class folder 'unicorn' has no file: dropped (not a class)" in result.stdout.splitlines()
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["classes"] == sorted(CLASSES) and manifest["empty_classes"] == ["unicorn"]


def test_a_new_conversion_replaces_the_old_one_whole(tmp_path):
    """--shards 8 then --shards 4 into one folder: only the second set is left (the first conversion
    wrote beside it before), nothing temporary stays beside it, and a folder that holds something
    else is refused, not replaced."""
    write_image_folder(tmp_path / "shapes", per_class=6, size=8, seed=2)
    out = tmp_path / "records"
    create_tfrecords.convert(tmp_path / "shapes", out, image_size=8, shards=8)
    manifest = create_tfrecords.convert(tmp_path / "shapes", out, image_size=8, shards=4)
    listed = [name for split in create_tfrecords.SPLITS for name in manifest["shards"][split]]
    assert sorted(p.name for p in out.iterdir()) == sorted(listed + ["manifest.json"])
    assert len(manifest["shards"]["train"]) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records", "shapes"]
    with pytest.raises(ValueError, match="exists and is not a TFRecord folder"):
        create_tfrecords.convert(tmp_path / "shapes", tmp_path / "shapes" / "circle", image_size=8)


def test_a_test_split_is_held_out_beside_validation(tmp_path):
    write_image_folder(tmp_path / "shapes", per_class=25, size=8, seed=3)
    one = create_tfrecords.convert(tmp_path / "shapes", tmp_path / "one", image_size=8, shards=3,
                                   val_fraction=0.2, test_fraction=0.1, processes=1)
    two = create_tfrecords.convert(tmp_path / "shapes", tmp_path / "two", image_size=8, shards=3,
                                   val_fraction=0.2, test_fraction=0.1, processes=2)
    sizes = {split: sum(one["counts"][split].values()) for split in create_tfrecords.SPLITS}
    assert sizes == {"train": 70, "val": 20, "test": 10}
    assert one == {**two, "source": one["source"]} and len(one["shards"]["test"]) == 3
    # Without a test fraction, the same files go to validation as before there was a test split.
    plain = create_tfrecords.SplitPlan(100, 0.2)
    assert [plain.split_of(i, 0) == "val" for i in range(100)] == [round((i + 1) * 0.2) > round(i * 0.2)
                                                                   for i in range(100)]
