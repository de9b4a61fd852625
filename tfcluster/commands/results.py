"""Data and results: TFRecords from images (and to the bucket), pull from the bucket, TensorBoard."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tfcluster import launch, tflog
from tfcluster.commands.common import backend_for_cluster, console, require_cluster, run_or_latest
from tfcluster.config import Settings, parse_int
from tfcluster.errors import ClusterError, ConfigError, TfClusterError
from tfcluster.state import StateStore


# Shards per worker by default: FILE sharding needs one per worker, and a few each keep
# every worker's reads parallel and its share even when the files differ in size.
SHARDS_PER_WORKER = 4
MIN_SHARDS = 16


def default_shards(cluster) -> int:
    """max(16, 4 x the cluster's workers); 16 without a cluster."""
    return max(MIN_SHARDS, SHARDS_PER_WORKER * cluster.workers) if cluster is not None else MIN_SHARDS


def data(settings: Settings, src: str | None, out: str | None, synthetic: bool,
         image_size: int | None = None, shards: int | None = None, encoding: str | None = None,
         val_fraction: str | None = None, test_fraction: str | None = None, processes: int | None = None) -> Path:
    """Run trainer/create_tfrecords.py; the set it makes is `train`'s default data from then on."""
    if bool(src) == bool(synthetic):
        raise ConfigError("give exactly one of --src IMAGE_FOLDER or --synthetic")
    if src and not Path(src).expanduser().is_dir():
        raise ConfigError(f"--src {src} is not a folder; give a folder with one sub-folder per class")
    store = StateStore(settings)
    cluster = store.load_cluster()
    if shards is None:
        shards = default_shards(cluster)
    elif not str(shards).strip().isdigit() or int(shards) < 1:  # invoke hands over the text.
        raise ConfigError(f"--shards must be a whole number of at least 1 (got {shards}); "
                          f"omit it for the default, {default_shards(cluster)}")
    shards = int(shards)
    if cluster is not None and shards < cluster.workers:
        console.print(f"[yellow]Note:[/] {shards} shards for {cluster.workers} workers: each worker reads "
                      f"every shard and keeps 1/{cluster.workers} (DATA sharding); --shards "
                      f"{cluster.workers} or more lets each read only its own files")
    source = Path(src).expanduser() if src else None
    # An image folder's set is named after it (data/flowers, gs://<bucket>/data/flowers).
    target = Path(out or settings.data_dir or (store.data_dir_for(source.resolve()) if source
                                               else store.synthetic_data_dir)).expanduser()
    argv = [settings.python or sys.executable, "-m", "trainer.create_tfrecords", "--out", str(target),
            "--shards", str(shards)]
    argv += ["--synthetic"] if synthetic else ["--src", str(source)]
    if image_size is not None:
        argv += ["--image-size", str(parse_int("image_size", image_size, 1))]
    if processes is not None:
        argv += ["--processes", str(parse_int("processes", processes, 1))]
    if encoding is not None:
        from trainer.create_tfrecords import ENCODINGS  # Checked here too: one error line, not argparse's two.

        argv += ["--encoding", _choice("encoding", encoding, ENCODINGS)]
    for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(_fraction(name, value))]
    result = subprocess.run(argv, cwd=str(Path(launch.__file__).resolve().parent.parent))
    if result.returncode != 0:
        raise TfClusterError(f"create_tfrecords failed (exit {result.returncode}); see the error above")
    if cluster is not None and cluster.bucket:
        from tfcluster.backends.gcp.cloud import storage as gcs

        url = f"gs://{cluster.bucket}/data/{target.name}"
        client = gcs.client(cluster.project)
        with console.status(f"Uploading the shards to {url} ..."):
            result = gcs.upload_dir(client, target, url)
            # Shards of an earlier conversion the new manifest does not list go, once it is in place.
            pruned = gcs.delete_unlisted(client, url, listed_files(target))
        cluster.data_url = url
        store.save_cluster(cluster)
        already = f" ({len(result.unchanged)} already there)" if result.unchanged else ""
        removed = f"; removed {len(pruned)} stale file(s) the manifest does not list" if pruned else ""
        console.print(f"[green]✓[/] Uploaded {len(result.uploaded)} files to {url}{already}{removed}; "
                      "`invoke train` reads them from there.")
        return target
    if settings.data_dir:
        return target
    store.remember_data(target)
    console.print(f"`invoke train` trains on {target} from now on (INVOKE_TFCLUSTER_DATA_DIR or tfcluster.data_dir "
                  "in invoke.yaml choose another)")
    return target


def _choice(key: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"--{key} must be one of {', '.join(choices)} (got {value!r})")
    return value


def _fraction(key: str, value) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 <= number < 1:
        raise ConfigError(f"--{key.replace('_', '-')} must be a number in [0, 1) (got {value})")
    return number


def listed_files(folder: Path) -> set[str]:
    """The manifest and every shard it lists, as names under the set's folder."""
    manifest = json.loads((folder / "manifest.json").read_text())
    return {"manifest.json", *(name for names in manifest["shards"].values() for name in names)}


def pull(settings: Settings, run_id: str | None = None) -> Path:
    """Download a run's model and TensorBoard logs from the cluster bucket into its run folder."""
    from tfcluster.backends.gcp.cloud import storage as gcs

    store = StateStore(settings)
    cluster = require_cluster(store)
    if not cluster.bucket:
        raise ClusterError(f"cluster '{cluster.name}' has no bucket: `train` already fetched the results "
                           f"into {store.runs_dir}")
    run = run_or_latest(store, run_id)
    storage = gcs.client(cluster.project)
    destination = store.run_dir(run.run_id) / "output"
    count = 0
    tensorboard = backend_for_cluster(store, cluster).tensorboard_folder  # Vertex AI's is logs/.
    for part, local in (("model", "model"), (tensorboard, "tensorboard")):
        url = f"gs://{cluster.bucket}/runs/{run.run_id}/{part}"
        count += len(gcs.download_prefix(storage, url, destination / local))
    if count == 0:
        raise ClusterError(f"nothing under gs://{cluster.bucket}/runs/{run.run_id}/ yet (did the run finish?)")
    console.print(f"[green]✓[/] Downloaded {count} files of run {run.run_id} into {destination}")
    return destination


def tensorboard_logdir(settings: Settings, run_id: str | None = None) -> str:
    """A run's TensorBoard folder: on the bucket for gcp clusters, else the local run folder."""
    store = StateStore(settings)
    run = run_or_latest(store, run_id)
    cluster = store.load_cluster()
    if cluster is not None and cluster.bucket:
        return f"gs://{cluster.bucket}/runs/{run.run_id}/{backend_for_cluster(store, cluster).tensorboard_folder}"
    logdir = store.run_dir(run.run_id) / "output" / "tensorboard"
    if not logdir.exists():
        raise ClusterError(f"run {run.run_id} has no TensorBoard logs at {logdir}")
    return str(logdir)


def serve_tensorboard(logdir: str, port: int) -> int:
    """TensorBoard on ``logdir`` until it ends (Ctrl-C); its output as it comes, with TensorFlow's C++
    start-up lines folded as `train` folds them (TF 2.21 prints them whatever TF_CPP_MIN_LOG_LEVEL says).
    Returns its exit code."""
    fold = tflog.StartupFold()
    process = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    try:
        for line in process.stdout:
            if not fold.hides(line.rstrip("\n")):
                print(line, end="", flush=True)
    except KeyboardInterrupt:  # Ctrl-C: TensorBoard ends too (a terminal sent it the same; a kill did not).
        process.send_signal(signal.SIGINT)
    finally:
        try:
            code = process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
    return code
