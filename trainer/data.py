"""The tf.data input pipeline over the shards written by create_tfrecords."""

import os

import tensorflow as tf

from trainer.create_tfrecords import read_manifest
from trainer.export import scale_and_resize

AUTOTUNE = tf.data.AUTOTUNE


def shard_policy(num_files: int, num_workers: int) -> "tf.data.experimental.AutoShardPolicy":
    """FILE sharding when every worker gets at least one file, DATA otherwise.

    FILE lets each worker read only its own shards; with fewer files than workers
    it would leave a worker empty, so DATA (read all, keep 1/N) is the safe choice.
    """
    policy = tf.data.experimental.AutoShardPolicy
    return policy.FILE if num_files >= num_workers else policy.DATA


def parse_batch_fn(stored_size: int, image_size: int):
    """Parses a batch of serialized raw-pixel examples at once (vectorized: one op per batch)."""
    features = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(serialized):
        examples = tf.io.parse_example(serialized, features)
        images = tf.io.decode_raw(examples["image"], tf.uint8)
        images = tf.reshape(images, [-1, stored_size, stored_size, 3])
        # The same resize and scaling the served model applies to raw images (trainer/export.py).
        return scale_and_resize(tf, images, image_size), examples["label"]

    return parse


def decode_jpeg_fn(stored_size: int):
    """Parses one example whose image is a JPEG (create_tfrecords --encoding jpeg) to uint8 pixels:
    JPEG decoding works image by image, so this runs before batching."""
    features = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(serialized):
        example = tf.io.parse_single_example(serialized, features)
        image = tf.io.decode_jpeg(example["image"], channels=3)
        return tf.ensure_shape(image, [stored_size, stored_size, 3]), example["label"]

    return parse


def make_dataset(data_dir: str, split: str, global_batch: int, image_size: int,
                 num_workers: int = 1, shuffle: bool = True, seed: int = 0) -> tf.data.Dataset:
    """Batched (global batch), repeated dataset for ``split`` with an explicit shard policy."""
    manifest = read_manifest(data_dir)
    files = [os.path.join(data_dir, name) for name in manifest["shards"][split]]
    if not files:
        raise ValueError(f"{data_dir} has no {split} shards; regenerate it with a larger set")
    stored_size = manifest["image_size"]
    dataset = tf.data.TFRecordDataset(files, num_parallel_reads=AUTOTUNE)
    if shuffle:
        # Shuffle the small serialized records, not decoded float images (16x the bytes).
        dataset = dataset.shuffle(4096, seed=seed, reshuffle_each_iteration=True)
    # Repeat before batching: every worker then runs exactly steps_per_epoch steps,
    # whatever its share of the files, so no worker waits on a collective that never comes.
    if manifest.get("encoding", "raw") == "jpeg":
        dataset = dataset.map(decode_jpeg_fn(stored_size), num_parallel_calls=AUTOTUNE)
        dataset = dataset.repeat().batch(global_batch, drop_remainder=True)
        dataset = dataset.map(lambda images, labels: (scale_and_resize(tf, images, image_size), labels),
                              num_parallel_calls=AUTOTUNE)
    else:
        dataset = dataset.repeat().batch(global_batch, drop_remainder=True)
        dataset = dataset.map(parse_batch_fn(stored_size, image_size), num_parallel_calls=AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = shard_policy(len(files), num_workers)
    return dataset.prefetch(AUTOTUNE).with_options(options)


def split_size(data_dir: str, split: str) -> int:
    return sum(read_manifest(data_dir)["counts"][split].values())
