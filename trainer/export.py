"""The model ready to serve: a SavedModel that takes raw images, where Vertex AI and TF Serving look.

    <model dir>/model.keras         the Keras model (float images in [0, 1], for fine-tuning)
    <model dir>/saved_model.pb, variables/, ...
                                    the SavedModel, at the root of the model dir: Vertex AI's custom
                                    training writes AIP_MODEL_DIR, and a model imported from there
                                    needs saved_model.pb at its root ("Export model artifacts for
                                    prediction", Vertex AI docs)
    <export base>/<version>/        with --export-base: the same SavedModel in TF Serving's layout,
                                    one version more than the highest there (1, 2, ...), for a
                                    folder or gs:// prefix that several runs share

Every export is written under a temporary name first. A folder of its own (a new version) is then
renamed into place; at the model dir's root the files are moved in with ``saved_model.pb`` last.
Either way a reader that finds ``saved_model.pb`` finds a complete model (on gs://, where a
rename is a copy then a delete, that is the guarantee: Cloud Storage has no folder rename).

Everything a client would otherwise have to repeat lives inside the SavedModel (Géron, ch. 19):
decoding, resizing to the trained size and the /255 scaling. Two signatures:

- ``serving_default``: ``image_bytes`` (tf.string [None]), each a JPEG or PNG file's bytes. Vertex
  AI's prediction service decodes base64 only for inputs whose name ends in ``_bytes``
  (``{"image_bytes": {"b64": "..."}}``, "Format your input for online prediction", Vertex AI
  docs); TF Serving's REST API takes ``{"b64": ...}`` for any string input.
- ``serving_uint8``: ``images`` (uint8 [None, None, None, 3]), a batch of RGB pixels of any size.

Both answer ``probabilities`` [None, classes], ``class_id`` and ``class_name``.
"""

from __future__ import annotations

import os
import uuid

SERVE_TAG = "serve"


def scale_and_resize(tf, images, image_size: int):
    """uint8 RGB [N, H, W, 3] (any H, W) -> float32 [N, size, size, 3] in [0, 1].

    Antialiased bilinear, as PIL's BILINEAR that create_tfrecords uses when it shrinks an image.
    Images already at ``image_size`` are only scaled: the resize would be the identity, yet it
    costs more than the rest of the training pipeline together (bench/bench_local.py). The
    training pipeline knows its sizes when it is built and the serving signatures check them per
    batch, so both see the same pixels for the same image.
    """
    # A product, not a division: grappler may turn x / 255 into x * (1 / 255) in one graph and not in
    # another, one float32 ulp apart; written as the product, training and serving compute the same.
    scaled = tf.cast(images, tf.float32) * (1.0 / 255.0)
    height, width = images.shape[1], images.shape[2]
    if height is None or width is None:  # Serving: any size, known per batch.
        shape = tf.shape(images)
        scaled = tf.cond(tf.logical_and(tf.equal(shape[1], image_size), tf.equal(shape[2], image_size)),
                         lambda: scaled, lambda: _resize(tf, scaled, image_size))
        scaled.set_shape([None, image_size, image_size, None])
    elif (height, width) != (image_size, image_size):
        scaled = _resize(tf, scaled, image_size)
    return scaled


def _resize(tf, scaled, image_size: int):
    """Antialiased bilinear weights are positive and sum to 1: values stay in [0, 1] but for
    rounding, which the clip removes."""
    return tf.clip_by_value(tf.image.resize(scaled, [image_size, image_size], antialias=True), 0.0, 1.0)


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


def _temporary(folder: str, name: str) -> str:
    """A name beside ``name`` in ``folder`` that no reader takes for a model (TF Serving serves
    integer folders only; Vertex reads saved_model.pb at the root)."""
    return os.path.join(folder, f".{name}.{uuid.uuid4().hex[:8]}.tmp")


def save_keras(tf, model, model_dir: str) -> str:
    """``model_dir/model.keras``, written under a temporary name and renamed."""
    tf.io.gfile.makedirs(model_dir)
    path = os.path.join(model_dir, "model.keras")
    temporary = _temporary(model_dir, "model") + ".keras"  # Keras wants the suffix.
    model.save(temporary)
    tf.io.gfile.rename(temporary, path, overwrite=True)
    return path


def export(tf, model, model_dir: str, image_size: int, classes: list[str]) -> str:
    """Write the serving SavedModel at the root of ``model_dir``; returns ``model_dir``."""
    module = build_serving_module(tf, model, image_size, classes)
    signatures = {"serving_default": module.serve_bytes.get_concrete_function(),
                  "serving_uint8": module.serve_uint8.get_concrete_function()}
    tf.io.gfile.makedirs(model_dir)
    temporary = _temporary(model_dir, "saved_model")
    tf.saved_model.save(module, temporary, signatures=signatures)
    # An earlier export's graph must not meet this one's variables: its saved_model.pb goes first.
    if tf.io.gfile.exists(os.path.join(model_dir, SAVED_MODEL)):
        tf.io.gfile.remove(os.path.join(model_dir, SAVED_MODEL))
    _move_files(tf, temporary, model_dir)
    return model_dir.rstrip("/") or model_dir


def export_version(tf, saved_model_dir: str, base: str) -> str:
    """Copy the SavedModel at ``saved_model_dir`` to ``base/<next version>/`` (written under a
    temporary name, then renamed); returns that folder. Two runs that pick the same version: the
    second rename fails and it takes the next one."""
    tf.io.gfile.makedirs(base)
    temporary = _temporary(base, "version")
    for source in _files(tf, saved_model_dir, skip=("model.keras",)):
        target = os.path.join(temporary, os.path.relpath(source, saved_model_dir))
        tf.io.gfile.makedirs(os.path.dirname(target))
        tf.io.gfile.copy(source, target, overwrite=True)
    for _ in range(100):
        path = os.path.join(base, str(next_version(tf, base)))
        try:
            if path.startswith("gs://"):
                if tf.io.gfile.exists(path):
                    continue
                _move_files(tf, temporary, path)
            else:
                os.rename(temporary, path)  # Atomic; fails if another run took the version.
            return path
        except OSError:
            continue
    raise RuntimeError(f"could not take a new version under {base}")


SAVED_MODEL = "saved_model.pb"


def _files(tf, folder: str, skip: tuple[str, ...] = ()) -> list[str]:
    """Every file under ``folder`` (local or gs://), hidden temporaries and ``skip`` left out."""
    found = []
    for root, _, names in tf.io.gfile.walk(folder):
        relative = os.path.relpath(root, folder)
        if relative != "." and relative.startswith("."):
            continue  # A temporary folder of another export.
        found += [os.path.join(root, name) for name in names
                  if not name.startswith(".") and not (root.rstrip("/") == folder.rstrip("/") and name in skip)]
    return found


def _move_files(tf, source: str, target: str) -> None:
    """Move every file of ``source`` into ``target``, ``saved_model.pb`` last, then remove ``source``."""
    files = sorted(_files(tf, source), key=lambda path: os.path.basename(path) == SAVED_MODEL)
    for path in files:
        destination = os.path.join(target, os.path.relpath(path, source))
        tf.io.gfile.makedirs(os.path.dirname(destination))
        tf.io.gfile.rename(path, destination, overwrite=True)
    tf.io.gfile.rmtree(source)


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
