"""The model ready to serve: a SavedModel that takes raw images, in TF Serving's version layout.

    <model dir>/model.keras      the Keras model (float images in [0, 1], for fine-tuning)
    <model dir>/<version>/       the SavedModel TF Serving and Vertex AI load (version: 1, 2, ...)

Everything a client would otherwise have to repeat lives inside the SavedModel (Géron, ch. 19):
decoding, resizing to the trained size and the /255 scaling. Two signatures:

- ``serving_default``: ``image_bytes`` (tf.string [None]), each a JPEG or PNG file's bytes. The
  ``_bytes`` suffix is what makes TF Serving's REST API accept ``{"image_bytes": {"b64": "..."}}``.
- ``serving_uint8``: ``images`` (uint8 [None, None, None, 3]), a batch of RGB pixels of any size.

Both answer ``probabilities`` [None, classes], ``class_id`` and ``class_name``.
"""

from __future__ import annotations

import os

SERVE_TAG = "serve"


def scale_and_resize(tf, images, image_size: int):
    """uint8 RGB [N, H, W, 3] (any H, W) -> float32 [N, size, size, 3] in [0, 1].

    Antialiased bilinear, as PIL's BILINEAR that create_tfrecords uses when it shrinks an image.
    Images already at ``image_size`` are only scaled: the resize would be the identity, yet it
    costs more than the rest of the training pipeline together (bench/bench_local.py). The
    training pipeline knows its sizes when it is built and the serving signatures check them per
    batch, so both see the same pixels for the same image.
    """
    images = tf.cast(images, tf.float32)
    height, width = images.shape[1], images.shape[2]
    if height is None or width is None:  # Serving: any size, known per batch.
        shape = tf.shape(images)
        images = tf.cond(tf.logical_and(tf.equal(shape[1], image_size), tf.equal(shape[2], image_size)),
                         lambda: images, lambda: _resize(tf, images, image_size))
        images.set_shape([None, image_size, image_size, None])
    elif (height, width) != (image_size, image_size):
        images = _resize(tf, images, image_size)
    # A product, not a division: grappler may turn x / 255 into x * (1 / 255) in one graph and not in
    # another, one float32 ulp apart; written as the product, training and serving compute the same.
    return tf.clip_by_value(images * (1.0 / 255.0), 0.0, 1.0)


def _resize(tf, images, image_size: int):
    return tf.image.resize(images, [image_size, image_size], antialias=True)


def build_serving_module(tf, model, image_size: int, classes: list[str]):
    """A tf.Module around the Keras model with the two serving functions."""
    class_names = tf.constant(list(classes))

    def answer(images):
        probabilities = tf.cast(model(images, training=False), tf.float32)
        class_id = tf.argmax(probabilities, axis=-1)
        return {"probabilities": probabilities, "class_id": class_id,
                "class_name": tf.gather(class_names, class_id)}

    def decode_one(data):
        # expand_animations=False: a GIF or APNG gives its first frame, always rank 3.
        image = tf.io.decode_image(data, channels=3, expand_animations=False)
        return scale_and_resize(tf, image[tf.newaxis], image_size)[0]

    class Serving(tf.Module):
        def __init__(self):
            super().__init__(name="tfcluster_serving")
            self.model = model  # Tracked: its variables are saved with the functions.

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
        def serve_bytes(self, image_bytes):
            images = tf.map_fn(decode_one, image_bytes,
                               fn_output_signature=tf.TensorSpec([image_size, image_size, 3], tf.float32))
            return answer(images)

        @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8, name="images")])
        def serve_uint8(self, images):
            return answer(scale_and_resize(tf, images, image_size))

    return Serving()


def next_version(tf, base: str) -> int:
    """One more than the highest integer folder under ``base`` (TF Serving serves the highest)."""
    if not tf.io.gfile.isdir(base):
        return 1
    versions = [int(name.rstrip("/")) for name in tf.io.gfile.listdir(base) if name.rstrip("/").isdigit()]
    return max(versions, default=0) + 1


def export(tf, model, base: str, image_size: int, classes: list[str], version: int | None = None) -> str:
    """Write the serving SavedModel to ``base/<version>/``; returns that path."""
    module = build_serving_module(tf, model, image_size, classes)
    path = os.path.join(base, str(version or next_version(tf, base)))
    signatures = {"serving_default": module.serve_bytes.get_concrete_function(),
                  "serving_uint8": module.serve_uint8.get_concrete_function()}
    tf.saved_model.save(module, path, signatures=signatures)
    return path


def describe_signatures(tf, path: str) -> str:
    """The signatures as ``saved_model_cli show --dir PATH --all`` prints them (without the
    ops and concrete functions it adds, and without the internal __saved_model_init_op)."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(os.path.join(path, "saved_model.pb"), "rb") as handle:
        saved.ParseFromString(handle.read())
    dtype_names = {value: key for key, value in types_pb2.DataType.items()}
    lines = []
    for meta in saved.meta_graphs:
        if SERVE_TAG not in meta.meta_info_def.tags:
            continue
        for key in sorted(k for k in meta.signature_def if not k.startswith("__")):
            signature = meta.signature_def[key]
            lines.append(f"signature_def['{key}']:")
            for title, kind, infos in (("input(s)", "inputs", signature.inputs),
                                       ("output(s)", "outputs", signature.outputs)):
                lines.append(f"  The given SavedModel SignatureDef contains the following {title}:")
                for name in sorted(infos):
                    info = infos[name]
                    if info.tensor_shape.unknown_rank:
                        shape = "unknown_rank"
                    else:
                        shape = "(" + ", ".join(str(dim.size) for dim in info.tensor_shape.dim) + ")"
                    lines += [f"    {kind}['{name}'] tensor_info:", f"        dtype: {dtype_names[info.dtype]}",
                              f"        shape: {shape}", f"        name: {info.name}"]
            lines.append(f"  Method name is: {signature.method_name}")
            lines.append("")
    return "\n".join(lines).rstrip("\n")
