"""Hyperparameter search over the bundled trainer's CNN, with Keras Tuner's distributed mode.

    KERASTUNER_TUNER_ID=chief|tuner0|... KERASTUNER_ORACLE_IP=... KERASTUNER_ORACLE_PORT=... \\
    python -m trainer.tune --max-trials 12 --epochs 5

The process whose tuner id contains "chief" runs the oracle (it serves and blocks); every other
process is a tuner that asks it for trials. Each trial trains on this one machine, without
TF_CONFIG, the same model `python -m trainer.task` trains, with tf_keras (see task.py), and
keeps its best epoch in ``<trial folder>/model.keras``.

Search space (name = the trainer flag that sets it; giving the flag pins the value):
learning_rate (1e-4..1e-2, log), batch_size (16, 32, 64), width (16, 32, 48), depth (2..3),
dropout (0..0.5, step 0.1). Objective: val_accuracy, maximised.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Before TensorFlow: tf.keras is tf_keras.

from trainer import lr, tune_hooks  # noqa: E402
from trainer.flags import _fraction, _int_at_least, _positive_float  # noqa: E402

OBJECTIVE = "val_accuracy"
PROJECT = "search"


def _space(hp, pinned: dict):
    """The search space; a pinned name becomes hp.Fixed."""
    declare = {
        "learning_rate": lambda: hp.Float("learning_rate", 1e-4, 1e-2, sampling="log"),
        "batch_size": lambda: hp.Choice("batch_size", [16, 32, 64]),
        "width": lambda: hp.Choice("width", [16, 32, 48]),
        "depth": lambda: hp.Int("depth", 2, 3),
        "dropout": lambda: hp.Float("dropout", 0.0, 0.5, step=0.1),
    }
    return {name: hp.Fixed(name, pinned[name]) if pinned.get(name) is not None else make()
            for name, make in declare.items()}


SPACE_NAMES = ("learning_rate", "batch_size", "width", "depth", "dropout")


def parse_args(argv=None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(prog="trainer.tune", description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=env.get("TFCLUSTER_DATA_DIR"))
    parser.add_argument("--max-trials", type=_int_at_least(1), default=10)
    parser.add_argument("--epochs", type=_int_at_least(1), default=3, help="per trial")
    parser.add_argument("--steps-per-epoch", type=_int_at_least(1), default=None)
    parser.add_argument("--seed", type=_int_at_least(0), default=0, help="the oracle's sampling seed")
    parser.add_argument("--directory", default=env.get("TFCLUSTER_TUNE_DIR", "tune"),
                        help="Keras Tuner's shared folder (default: $TFCLUSTER_TUNE_DIR)")
    # Pins: a given flag fixes that hyperparameter.
    parser.add_argument("--learning-rate", type=_positive_float)
    parser.add_argument("--batch-size", type=_int_at_least(1))
    parser.add_argument("--width", type=_int_at_least(4))
    parser.add_argument("--depth", type=_int_at_least(1))
    parser.add_argument("--dropout", type=_fraction)
    args = parser.parse_args(argv)
    if not args.data_dir:
        parser.error("--data-dir is required (or set TFCLUSTER_DATA_DIR)")
    return args


def make_tuner(args, manifest: dict):
    import keras_tuner as kt
    import tensorflow as tf
    import tf_keras as keras

    from trainer import data
    from trainer.model import build_model

    pinned = {name: getattr(args, name) for name in SPACE_NAMES}
    num_classes, image_size = len(manifest["classes"]), manifest["image_size"]
    train_count = sum(manifest["counts"]["train"].values())

    def build(hp):
        values = _space(hp, pinned)
        model = build_model(keras, "cnn", num_classes, image_size, "none",
                            values["width"], values["depth"], values["dropout"])
        # One replica at the trial's batch: the rate searched is the trainer's reference rate
        # (trainer/lr.py), built the same way, so `train -- --learning-rate R` starts from it.
        # The trainer's default schedule over the trial's steps, so the best rate carries over.
        steps = args.steps_per_epoch or max(1, train_count // values["batch_size"])
        rate = lr.plan("adam", values["learning_rate"], None, replicas=1, batch_size=values["batch_size"],
                       warmup_epochs=None, steps_per_epoch=steps, schedule="cosine",
                       total_steps=args.epochs * steps)
        model.compile(optimizer=lr.build_optimizer(keras, rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"])
        return model

    class ShapesTuner(kt.engine.base_tuner.BaseTuner):
        """Runs a trial as `trainer.task` would train on one machine, with tf_keras."""

        def run_trial(self, trial):
            hp = trial.hyperparameters
            model = self.hypermodel.build(hp)
            batch = hp.get("batch_size")
            train_ds = data.make_dataset(args.data_dir, "train", batch, image_size, seed=args.seed)
            val_ds = data.make_dataset(args.data_dir, "val", batch, image_size, training=False)
            checkpoint = os.path.join(self.get_trial_dir(trial.trial_id), "model.keras")
            history = model.fit(
                train_ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch or max(1, train_count // batch),
                validation_data=val_ds, verbose=2,
                callbacks=[keras.callbacks.ModelCheckpoint(checkpoint, monitor=OBJECTIVE, mode="max",
                                                           save_best_only=True)])
            best = max(range(len(history.history[OBJECTIVE])), key=history.history[OBJECTIVE].__getitem__)
            print(f"trial {trial.trial_id}: {OBJECTIVE} {history.history[OBJECTIVE][best]:.4f} "
                  f"(epoch {best + 1}), model {checkpoint}", flush=True)
            return {key: float(values[best]) for key, values in history.history.items()}

        def load_model(self, trial):
            return keras.models.load_model(os.path.join(self.get_trial_dir(trial.trial_id), "model.keras"))

    tf.random.set_seed(args.seed)
    oracle = kt.oracles.RandomSearchOracle(objective=kt.Objective(OBJECTIVE, "max"),
                                           max_trials=args.max_trials, seed=args.seed + 1)
    return ShapesTuner(oracle=oracle, hypermodel=build, directory=args.directory, project_name=PROJECT,
                       overwrite=False)


def main(argv=None) -> int:
    args = parse_args(argv)
    tune_hooks.install()
    if all(getattr(args, name) is not None for name in SPACE_NAMES):
        tune_hooks.fail("every hyperparameter of the bundled search space is pinned by a flag "
                        f"({', '.join('--' + n.replace('_', '-') for n in SPACE_NAMES)}); "
                        "drop at least one so there is something to tune")
    from trainer.create_tfrecords import read_manifest

    tuner = make_tuner(args, read_manifest(args.data_dir))
    tuner.search()
    return 0


if __name__ == "__main__":
    sys.exit(main())
