"""The bundled trainer's flags (``python -m trainer.task --help``), and the hash that names a run's
configuration for throughput comparisons."""

from __future__ import annotations

import argparse
import hashlib
import json
import os

from trainer import lr
from trainer.collective import COLLECTIVES
from trainer.model import MODELS, PRECISIONS, WEIGHTS

# Flags that do not change what one training step costs: two runs that differ only in these are
# the same configuration for the scaling efficiency (tfcluster/throughput.py). Where the data
# lives is not one either; what it holds is fingerprinted on its own.
NOT_STEP_COST = ("epochs", "steps_per_epoch", "data_dir", "model_dir", "checkpoint_dir", "tensorboard_dir",
                 "export_base", "seed", "early_stopping", "backup_every_steps")


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum} (got {value})")
        return value
    return parse


def _float_where(holds, rule: str):
    """An argparse type: a number for which ``holds`` is true, else "must be <rule>"."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not holds(value):
            raise argparse.ArgumentTypeError(f"must be {rule} (got {value})")
        return value
    return parse


_positive_float = _float_where(lambda value: value > 0, "> 0")
_non_negative_float = _float_where(lambda value: value >= 0, ">= 0")
_fraction = _float_where(lambda value: 0 <= value < 1, "in [0, 1)")


def parse_args(argv=None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(prog="trainer.task", description="Multi-worker image-classification "
                                     "training with MultiWorkerMirroredStrategy.")
    parser.add_argument("--data-dir", default=env.get("TFCLUSTER_DATA_DIR"),
                        help="TFRecords from create_tfrecords (default: $TFCLUSTER_DATA_DIR)")
    parser.add_argument("--model", choices=MODELS, default="cnn")
    parser.add_argument("--weights", choices=WEIGHTS, default="none",
                        help="imagenet needs a download; 'none' trains from scratch")
    parser.add_argument("--epochs", type=_int_at_least(1), default=8)
    parser.add_argument("--batch-size", type=_int_at_least(1), default=32,
                        help="per replica; the global batch is this x replicas in sync")
    parser.add_argument("--learning-rate", type=_positive_float, default=2e-3,
                        help="the rate for the reference batch (--batch-size on 1 replica); "
                             "--lr-scaling makes it follow the replicas in sync")
    parser.add_argument("--optimizer", choices=lr.OPTIMIZERS, default="adam",
                        help=f"sgd is SGD with momentum {lr.SGD_MOMENTUM}; adamw is Adam with decoupled "
                             "weight decay")
    parser.add_argument("--weight-decay", type=_non_negative_float, default=None,
                        help=f"adamw: decoupled weight decay (default {lr.DEFAULT_WEIGHT_DECAY}, tf_keras's)")
    parser.add_argument("--lr-scaling", choices=lr.RULES, default=None,
                        help="how the rate follows the replicas: x replicas, x sqrt(replicas), or not "
                             "(default: sqrt for adam, adamw and rmsprop, linear for sgd)")
    parser.add_argument("--lr-schedule", choices=lr.SCHEDULES, default="cosine",
                        help="after the warm-up: cosine decay to 0 at the last step (default), x 0.1 at 50%% "
                             "and 75%% of the steps, or constant")
    parser.add_argument("--warmup-epochs", type=_non_negative_float, default=None,
                        help="epochs over which the rate rises to the scaled one: from the reference rate for "
                             "sgd (default 5), from 0 for adam, adamw and rmsprop (default 1 with 2+ replicas, else 0)")
    parser.add_argument("--width", type=_int_at_least(4), default=32,
                        help="cnn: filters of the first conv block (block i has i x width)")
    parser.add_argument("--depth", type=_int_at_least(1), default=3, help="cnn: conv blocks")
    parser.add_argument("--dropout", type=_fraction, default=0.0, help="cnn: dropout before the dense layer")
    parser.add_argument("--image-size", type=_int_at_least(32), default=None,
                        help="input side in pixels (default: the size stored in the shards)")
    parser.add_argument("--steps-per-epoch", type=_int_at_least(1), default=None,
                        help="default: train images // global batch")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="auto: mixed_bfloat16 on GPUs of compute capability >= 8.0 (A100, L4, H100), "
                             "mixed_float16 from 7.0 (V100, T4), float32 below and on CPU")
    parser.add_argument("--collective", choices=COLLECTIVES, default="auto",
                        help="the all-reduce: auto is NCCL on GPU workers, TensorFlow's ring (gRPC) on CPU; "
                             "nccl needs GPUs")
    parser.add_argument("--xla", action="store_true", help="compile the training step with XLA (jit_compile)")
    parser.add_argument("--steps-per-execution", type=_int_at_least(1), default=1,
                        help="training steps per call of the compiled step function (fewer Python round "
                             "trips for small steps); progress, backups and input watch count steps")
    parser.add_argument("--early-stopping", type=_int_at_least(1), default=None, metavar="PATIENCE",
                        help="stop after PATIENCE epochs without a better validation accuracy")
    parser.add_argument("--model-dir", default=env.get("AIP_MODEL_DIR", "output/model"),
                        help="model.keras and the SavedModel (at its root, as Vertex AI expects; "
                             "default: $AIP_MODEL_DIR)")
    parser.add_argument("--export-base", default=None, metavar="DIR",
                        help="also export to DIR/<version>/, one more than the highest there (TF Serving's "
                             "layout; a shared folder or gs:// prefix)")
    parser.add_argument("--checkpoint-dir", default=env.get("AIP_CHECKPOINT_DIR", "output/checkpoints"))
    parser.add_argument("--tensorboard-dir",
                        default=env.get("AIP_TENSORBOARD_LOG_DIR", "output/tensorboard"))
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the weights' initialisation, dropout and the shuffle order, so a run can be "
                             "repeated")
    parser.add_argument("--backup-every-steps", type=_int_at_least(1), default=None,
                        help="also back up to the checkpoint dir every N training steps (default: epoch ends only); "
                             "each epoch's last step is always backed up")
    args = parser.parse_args(argv)
    if not args.data_dir:
        parser.error("--data-dir is required (or set TFCLUSTER_DATA_DIR); "
                     "make one with: invoke data --synthetic")
    if not args.data_dir.startswith("gs://") and not os.path.isfile(
            os.path.join(args.data_dir, "manifest.json")):
        parser.error(f"--data-dir {args.data_dir} has no manifest.json; "
                     "make it with: python -m trainer.create_tfrecords --synthetic --out DIR")
    if args.weight_decay is not None and args.optimizer != "adamw":
        parser.error(f"--weight-decay goes with --optimizer adamw (got --optimizer {args.optimizer})")
    return args


def config_hash(args: argparse.Namespace) -> str:
    """Names what makes one training step cost what it does: every flag but NOT_STEP_COST's."""
    kept = {key: value for key, value in sorted(vars(args).items()) if key not in NOT_STEP_COST}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]
