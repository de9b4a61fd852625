"""The model the trainer builds, the precision it computes in, and its evaluation step.

Precision (``--precision``): ``auto`` picks what the GPUs' tensor cores compute fastest, from
their CUDA compute capability (NVIDIA's CUDA GPUs table): ``mixed_bfloat16`` from 8.0 (A100 8.0,
L4 8.9, H100 9.0), which needs no loss scaling; ``mixed_float16`` from 7.0 (V100 7.0, T4 7.5), with
the loss scaling tf_keras adds at compile; ``float32`` below that and on CPU, where mixed
precision is slower (TensorFlow's mixed precision guide). The softmax stays in float32.
"""

from __future__ import annotations

MODELS = ("cnn", "densenet121", "resnet50")
WEIGHTS = ("none", "imagenet")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
# (compute capability, policy) from the highest: the first one every GPU reaches wins.
AUTO_PRECISION = (((8, 0), "mixed_bfloat16"), ((7, 0), "mixed_float16"))


def choose_precision(requested: str, capabilities: list[tuple[int, int] | None]) -> tuple[str, str]:
    """(policy, why) for ``requested`` on GPUs of these compute capabilities (none: CPU only)."""
    if requested != "auto":
        return requested, "as asked"
    if not capabilities:
        return "float32", "auto: no GPU"
    if any(capability is None for capability in capabilities):
        return "float32", "auto: a GPU without a known compute capability"
    lowest = min(capabilities)
    for floor, policy in AUTO_PRECISION:
        if lowest >= floor:
            return policy, f"auto: compute capability {lowest[0]}.{lowest[1]}"
    return "float32", f"auto: compute capability {lowest[0]}.{lowest[1]}, below 7.0"


def gpu_capabilities(tf) -> list[tuple[int, int] | None]:
    """The compute capability of each GPU TensorFlow sees."""
    found = []
    for gpu in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        found.append(tuple(capability) if capability else None)
    return found


def build_model(keras, name: str, num_classes: int, image_size: int, weights: str,
                width: int = 32, depth: int = 3, dropout: float = 0.0):
    """``width``, ``depth`` and ``dropout`` shape the cnn (the defaults are the demo's 32-64-96)."""
    inputs = keras.Input((image_size, image_size, 3), name="image")  # RGB in [0, 1]
    if name == "cnn":
        x = inputs
        for filters in [width * (block + 1) for block in range(depth)]:
            x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
            x = keras.layers.MaxPooling2D()(x)
        # Flatten, not global pooling: where a corner or an arm sits is the signal
        # (measured: pooling stayed at chance on the shapes set, Flatten reached 0.9).
        x = keras.layers.Flatten()(x)
        if dropout:
            x = keras.layers.Dropout(dropout)(x)
        x = keras.layers.Dense(64, activation="relu")(x)
    else:
        application, preprocess = {
            "densenet121": (keras.applications.DenseNet121, keras.applications.densenet.preprocess_input),
            "resnet50": (keras.applications.ResNet50, keras.applications.resnet50.preprocess_input),
        }[name]
        base = application(include_top=False, input_shape=(image_size, image_size, 3),
                           weights=None if weights == "none" else "imagenet")
        # Transfer learning freezes pretrained features; from scratch, everything trains.
        base.trainable = weights == "none"
        x = preprocess(inputs * 255.0)
        x = base(x, training=weights == "none")
        x = keras.layers.GlobalAveragePooling2D()(x)
        x = keras.layers.Dropout(0.2)(x)
    # Softmax in float32: float16 logits lose precision under mixed precision.
    outputs = keras.layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name=f"tfcluster_{name}")


def skip_empty_batches(keras, tf, model) -> None:
    """Evaluation that skips the forward pass for an empty batch.

    When one worker's share of a held-out split ends before the others', MultiWorkerMirroredStrategy
    hands it empty batches until all are done (a finite dataset, partial batches). TensorFlow 2.21's
    oneDNN Conv2D on CPU gets an empty batch's shape wrong (verified here: a 3x3 convolution of a
    [0, 32, 32, 3] batch yields depth 3, not its filters', and the next one fails "input depth must be
    evenly divisible by filter depth: 3 vs 32"; right with TF_ENABLE_ONEDNN_OPTS=0). So the model's
    test step (tf_keras's own, engine/training.py) predicts nothing for an empty batch; its loss and
    metrics then add nothing. The model itself is unchanged, so model.keras loads anywhere.
    """
    def test_step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        empty = tf.zeros([0, model.output_shape[-1]], model.output.dtype)
        y_pred = tf.cond(tf.shape(x)[0] > 0, lambda: model(x, training=False), lambda: empty)
        model.compute_loss(x, y, y_pred, sample_weight)
        return model.compute_metrics(x, y, y_pred, sample_weight)

    model.test_step = test_step
