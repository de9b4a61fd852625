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
                 num_workers: int = 1, training: bool = True, seed: int = 0,
                 cache: bool = False) -> tf.data.Dataset:
    """The batches (global batch) of ``split`` with an explicit shard policy.

    Training: shuffled and repeated, full batches only, so every worker runs exactly
    steps_per_epoch steps whatever its share of the files and no worker waits on a collective that
    never comes. Evaluation (``training=False``): one pass over the split in a fixed order, the last
    batch partial, so every held-out image is scored once per pass (MultiWorkerMirroredStrategy
    evaluates partial and uneven batches). ``cache``: the serialized records are kept in memory
    after the first pass (see ``fits_in_memory``)."""
    manifest = read_manifest(data_dir)
    files = [os.path.join(data_dir, name) for name in manifest["shards"][split]]
    if not files:
        raise ValueError(f"{data_dir} has no {split} shards; regenerate it with a larger set")
    stored_size = manifest["image_size"]
    dataset = tf.data.TFRecordDataset(files, num_parallel_reads=AUTOTUNE)  # Deterministic interleave.
    if cache:
        dataset = dataset.cache()
    if training:
        # Shuffle the small serialized records, not decoded float images (4x the bytes), in a buffer
        # of SHUFFLE_BYTES (the files are shuffled already: create_tfrecords spreads them).
        dataset = dataset.shuffle(shuffle_buffer(manifest), seed=seed, reshuffle_each_iteration=True).repeat()
    if manifest.get("encoding", "raw") == "jpeg":
        dataset = dataset.map(decode_jpeg_fn(stored_size), num_parallel_calls=AUTOTUNE)
        dataset = dataset.batch(global_batch, drop_remainder=training)
        dataset = dataset.map(lambda images, labels: (scale_and_resize(tf, images, image_size), labels),
                              num_parallel_calls=AUTOTUNE)
    else:
        dataset = dataset.batch(global_batch, drop_remainder=training)
        dataset = dataset.map(parse_batch_fn(stored_size, image_size), num_parallel_calls=AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = shard_policy(len(files), num_workers)
    return dataset.prefetch(AUTOTUNE).with_options(options)


# The shuffle buffer's records: at most 4096, and about SHUFFLE_BYTES of them (at 224 px a raw record
# is 147 KB: 4096 of them took 600 MB per worker, and filling them delayed the first batch).
SHUFFLE_RECORDS = 4096
SHUFFLE_BYTES = 64 * 2 ** 20


def shuffle_buffer(manifest: dict) -> int:
    """Records in the training shuffle buffer, from the stored size (a JPEG record is about a ninth)."""
    record = manifest["image_size"] ** 2 * 3 // (9 if manifest.get("encoding") == "jpeg" else 1)
    return max(256, min(SHUFFLE_RECORDS, SHUFFLE_BYTES // max(1, record)))


# The share of this machine's available memory a worker's cached records may take (several
# workers can share one machine, and training needs the rest).
CACHE_SHARE = 0.25


def split_bytes(data_dir: str, split: str) -> int:
    """The bytes of a split's shards (a stat per shard, on gs:// too)."""
    return sum(tf.io.gfile.stat(os.path.join(data_dir, name)).length
               for name in read_manifest(data_dir)["shards"][split])


def fits_in_memory(bytes_read: int, available: int | None = None) -> bool:
    """Whether records of ``bytes_read`` (what this worker reads) may be cached: at most CACHE_SHARE
    of the machine's available memory (/proc/meminfo's MemAvailable; never where it is unknown)."""
    if available is None:
        available = mem_available()
    return available is not None and bytes_read <= CACHE_SHARE * available


def mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def split_size(data_dir: str, split: str) -> int:
    return sum(read_manifest(data_dir)["counts"][split].values())
