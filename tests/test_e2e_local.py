"""End to end on the embedded local cluster, through the invoke CLI, with real MWMS workers."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import events_of, wait_for
from tests.test_console import assert_console_folds_tensorflow_noise_and_logs_keep_it
from tests.test_throughput import check_run_speed, install_fake_nvidia_smi, tensorboard_scalars
from tfcluster.backends.local import processes_with_env


def _cluster_processes(cli) -> list:
    cluster = cli.cluster()
    return processes_with_env(f"TFCLUSTER_CLUSTER_ID={cluster['cluster_id']}") if cluster else []


def test_three_worker_training_end_to_end(cli, tmp_path):
    """The README's quick start, as a user's shell runs it, and everything it promises."""
    cli.env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # As a user's shell has it: TensorFlow's own default.
    install_fake_nvidia_smi(cli, tmp_path / "bin")
    assert cli.run("up", "--workers", "3").returncode == 0
    # A short 1-worker run of the same configuration (model, image size, per-replica batch, data, the
    # trainer's other flags, backend, machine, GPUs; not epochs or steps): the 3-worker run's scaling reference.
    one = cli.run("train", "--workers", "1", "--", "--epochs", "1", "--steps-per-epoch", "6")
    assert one.returncode == 0, one.stdout + one.stderr
    one_dir, one_run = cli.latest_run()
    result = cli.run("train", "--workers", "3", "--", "--epochs", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir, run = cli.latest_run()
    summary = run["summary"]
    assert run["outcome"] == "succeeded"
    assert summary["replicas_in_sync"] == 3
    assert summary["last_epoch"] == 3
    assert "replicas in sync" in result.stdout and "validation accuracy" in result.stdout
    assert_console_folds_tensorflow_noise_and_logs_keep_it(cli, result.stdout, workers=3)

    # Every worker joined the same 3-replica collective, each as its own task.
    tasks = set()
    for index in range(3):
        strategy = [e for e in events_of((run_dir / f"worker-{index}.log").read_text())
                    if e["event"] == "strategy"][0]
        assert strategy["replicas_in_sync"] == 3 and strategy["num_workers"] == 3
        tasks.add((strategy["task_type"], strategy["task_id"]))
        # 3 epochs read the 6 MB of records three times: each worker keeps its share in memory after
        # the first pass (the 1-worker run's 6 steps read less than one pass: nothing to cache).
        assert strategy["cache"] is True and strategy["precision"] == "float32"
    assert tasks == {("chief", 0), ("worker", 0), ("worker", 1)}
    assert "precision float32 (auto: no GPU), XLA off, 1 step(s) per execution, training data cached in memory" \
        in result.stdout
    assert [e for e in events_of((one_dir / "worker-0.log").read_text()) if e["event"] == "strategy"][0]["cache"] is False

    # Only the chief's output directory holds the model, the SavedModel at its root (AIP_MODEL_DIR's,
    # as Vertex AI reads it); non-chief scratch dirs are gone.
    model_dir = run_dir / "output" / "model"
    assert summary["model_dir"] == str(model_dir)
    assert sorted(p.name for p in model_dir.iterdir()) == ["fingerprint.pb", "model.keras", "saved_model.pb",
                                                            "variables"]
    assert sorted(summary["scratch_dirs"]) == ["1", "2"]
    for path in summary["scratch_dirs"].values():
        assert not Path(path).exists()
    assert sorted(summary["scratch_removed"]) == sorted(summary["scratch_dirs"].values())
    assert (run_dir / "output" / "tensorboard" / "train").is_dir()

    # The learning rate follows the global batch: Adam's default sqrt rule, the reference rate on
    # 1 replica and x sqrt(3) on 3, then the default cosine decay to 0 at the last step, in the
    # header, the summary and each epoch's end.
    assert one_run["summary"]["learning_rate"]["effective"] == 2e-3
    plan = summary["learning_rate"]
    assert plan["effective"] == pytest.approx(2e-3 * 3 ** 0.5) and plan["schedule"] == "cosine"
    steps = 1280 // 96
    assert (plan["warmup_steps"], plan["decay_steps"]) == (0, 3 * steps)
    schedule = f"learning rate 0.003464 (adam, sqrt: 0.002 at batch 32 x 1 replica, x sqrt(3 replicas)), then " \
               f"cosine decay to 0 over {3 * steps} steps"
    assert schedule in result.stdout  # The header.
    assert re.search(rf"│ learning rate +│ {re.escape(schedule.removeprefix('learning rate '))}", result.stdout)
    ends = [e for e in events_of((run_dir / "worker-0.log").read_text()) if e["event"] == "epoch_end"]
    assert [e["learning_rate"] for e in ends] == [
        pytest.approx(plan["effective"] * 0.5 * (1 + math.cos(math.pi * (e["epoch"] * steps - 1) / (3 * steps))),
                      rel=1e-4) for e in ends]
    # Validation is one pass over the whole held-out split each epoch: 320 images, the last batches
    # partial and uneven (16 shards over 3 workers), each scored once.
    assert [e["metrics"]["val_images"] for e in ends] == [320.0] * 3
    # Throughput in both summaries, per epoch and per worker, with each worker's GPU use.
    check_run_speed(one_dir, one_run, 1)
    check_run_speed(run_dir, run, 3)
    assert [e["epoch"] for e in summary["throughput"]["epochs"]] == [1, 2, 3]
    assert "Throughput per epoch" in result.stdout and "w2 89%" in result.stdout
    # The summary's throughput: wall clock beside the median step, then each worker's own.
    speed = summary["throughput"]
    row = next(line for line in result.stdout.splitlines() if re.match(r"│ throughput +│", line))
    assert (f"│ {speed['wall_images_per_second']:.0f} images/s by wall clock, {speed['global_images_per_second']:.0f} "
            f"at the median step ({speed['median_step_seconds'] * 1000:.1f} ms); per worker: w0 ") in row, row
    # Scaling efficiency against the 1-worker run, in the summary and in TensorBoard.
    assert one_run["summary"]["scaling"] is None
    scaling = summary["scaling"]
    rates = [r["summary"]["throughput"]["global_images_per_second"] for r in (one_run, run)]
    assert scaling["reference_run"] == one_run["run_id"]
    assert scaling["efficiency"] == pytest.approx(rates[1] / (3 * rates[0]), abs=1e-3)
    row = next(line for line in result.stdout.splitlines() if "scaling efficiency" in line)
    assert f"{scaling['efficiency']:.2f} ({scaling['speedup']:.2f}x the 1-worker run {one_run['run_id']}" in row
    scalars = tensorboard_scalars(run_dir / "output" / "tensorboard" / "throughput")
    assert scalars["throughput/global_images_per_second"] == [
        (e["epoch"], pytest.approx(e["global_images_per_second"], abs=1e-3)) for e in summary["throughput"]["epochs"]]
    assert scalars["gpu/worker_2_utilization_percent"] == [(1, 89.0), (2, 89.0), (3, 89.0)]
    assert [step for step, _ in scalars["throughput/scaling_efficiency"]] == [1, 2, 3]
    assert not list((run_dir / "output" / "checkpoints").glob("**/*.index"))  # Backup cleared on success.

    # The saved models load and predict.
    check = textwrap.dedent(f"""
        import os, numpy as np
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        import tensorflow as tf, tf_keras
        x = np.random.default_rng(0).random((4, 32, 32, 3), dtype=np.float32)
        model = tf_keras.models.load_model({str(model_dir / "model.keras")!r})
        p = model.predict(x, verbose=0)
        assert p.shape == (4, 4) and np.allclose(p.sum(axis=1), 1, atol=1e-4), p
        # The served model takes uint8 pixels and scales them itself (trainer/export.py).
        pixels = np.round(x * 255).astype(np.uint8)
        p = model.predict(pixels.astype(np.float32) / 255, verbose=0)
        served = tf.saved_model.load({str(model_dir)!r})
        q = served.signatures["serving_uint8"](images=tf.constant(pixels))["probabilities"].numpy()
        assert np.allclose(p, q, atol=1e-4)
        print("ok")
    """)
    loaded = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert loaded.stdout.strip().endswith("ok"), loaded.stderr[-2000:]

    status = cli.run("status")
    assert status.returncode == 0 and "succeeded" in status.stdout
    # The cost ledger on own hosts: the same figures, hours and no prices, in the summary, `status`,
    # `down` and `invoke costs` (which outlives the cluster).
    assert "(own hosts: no prices)" in result.stdout
    assert "spent so far (since the first `up`, across restarts): " in status.stdout

    down = cli.run("down")
    assert down.returncode == 0 and "no worker process is left" in down.stdout
    assert cli.cluster() is None
    hours = re.search(r"final cost of cluster default: ([\d.]+) VM-hours", down.stdout)
    assert hours and float(hours[1]) > 0, down.stdout  # 3 workers from `up` to `down`.
    costs = cli.run("costs")
    assert costs.returncode == 0 and re.search(r"default .*down .*VM-hours", costs.stdout), costs.stdout
    assert (run_dir / "output" / "model" / "model.keras").exists()  # Results outlive the cluster.


def test_killed_worker_fails_fast_then_retries_resume(cli):
    assert cli.run("up", "--workers", "3").returncode == 0
    # SGD: linear scaling with a 5-epoch warm-up (the default), so the resume lands inside it.
    launcher = cli.popen("train", "--retries", "1", "--", "--epochs", "5", "--optimizer", "sgd")
    try:
        run_dir = wait_for(lambda: cli.runs() and cli.runs()[-1], 60, what="run folder")
        chief_log = run_dir / "worker-0.log"

        def epoch_done():
            text = chief_log.read_text() if chief_log.exists() else ""
            return any(e["event"] == "epoch_end" for e in events_of(text))

        wait_for(epoch_done, 180, what="first epoch on the chief")
        victim = int((run_dir / "worker-2.attempt1.pid").read_text())
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        output, _ = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, output
    assert "worker-2 (worker:1 on 127.0.0.1" in output and "was killed by SIGKILL" in output
    # Fail fast: attempt 2 began (after stopping the survivors) well within 30 s of the kill.
    restarted_at = (run_dir / "worker-0.attempt2.sh").stat().st_mtime
    assert restarted_at - killed_at < 30

    run = json.loads((run_dir / "run.json").read_text())
    assert run["attempts"] == 2 and run["outcome"] == "succeeded"
    # Attempt 2 resumed after the epochs attempt 1 finished; none was redone.
    chief_text = chief_log.read_text()
    first, second = chief_text.split("attempt 2 on")
    finished_first = max(e["epoch"] for e in events_of(first) if e["event"] == "epoch_end")
    begun_second = [e["epoch"] for e in events_of(second) if e["event"] == "epoch_begin"]
    assert begun_second[0] == finished_first + 1 > 1
    assert run["summary"]["resumed_at"]["2"] == begun_second[0]
    assert f"resumed at epoch {begun_second[0]}" in output
    assert run["summary"]["last_epoch"] == 5

    # The warm-up is a schedule of the optimiser's step, restored with the backup: each epoch of
    # attempt 2 ends at the rate of its global step (not the rate of a warm-up started over).
    plan = run["summary"]["learning_rate"]
    assert plan["rule"] == "linear" and plan["effective"] == pytest.approx(3 * 2e-3) and plan["warmup_steps"] > 0
    steps = [e for e in events_of(chief_text) if e["event"] == "first_step"][0]["steps"]
    assert plan["warmup_steps"] == 5 * steps

    def rate_at(step):
        return plan["reference"] + (plan["effective"] - plan["reference"]) * min(step, plan["warmup_steps"]) \
            / plan["warmup_steps"]

    resumed = [e for e in events_of(second) if e["event"] == "epoch_end"]
    assert resumed[0]["epoch"] < 5  # Inside the warm-up.
    for event in resumed:
        assert event["learning_rate"] == pytest.approx(rate_at(event["epoch"] * steps - 1), rel=1e-5)


USER_SCRIPT = """
import json, os, sys
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
task = json.loads(os.environ["TF_CONFIG"])["task"]
print("USER", task["type"], task["index"], strategy.num_replicas_in_sync, sys.argv[1:], flush=True)
if task["type"] == "chief":
    os.makedirs(os.environ["AIP_MODEL_DIR"], exist_ok=True)
    open(os.path.join(os.environ["AIP_MODEL_DIR"], "marker"), "w").write("chief")
"""


def test_user_script_gets_tf_config_and_arguments(cli, tmp_path):
    script = tmp_path / "my_train.py"
    script.write_text(USER_SCRIPT)
    assert cli.run("up", "--workers", "2").returncode == 0
    result = cli.run("train", "--script", str(script), "--", "--lr", "0.1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "USER chief 0 2 ['--lr', '0.1']" in result.stdout
    assert "USER worker 0 2 ['--lr', '0.1']" in result.stdout
    run_dir, run = cli.latest_run()
    assert (run_dir / "output" / "model" / "marker").read_text() == "chief"
    assert "n/a" in result.stdout  # No trainer events: the summary says what it does not know.


SLEEPER = """
import os, sys, time
print("worker", os.environ["TFCLUSTER_WORKER_INDEX"], "up", flush=True)
if os.environ["TFCLUSTER_WORKER_INDEX"] == os.environ.get("FAIL_INDEX"):
    print("boom: bad learning rate", flush=True)
    sys.exit(3)
time.sleep(float(os.environ.get("SLEEP", "600")))
print("finished", flush=True)
"""


@pytest.fixture
def sleeper(tmp_path):
    path = tmp_path / "sleeper.py"
    path.write_text(SLEEPER)
    return path


def test_nonzero_exit_names_the_worker_and_stops_the_rest(cli, sleeper):
    cli.env["FAIL_INDEX"] = "1"
    assert cli.run("up", "--workers", "3").returncode == 0
    result = cli.run("train", "--script", str(sleeper), timeout=60)
    assert result.returncode == 1
    assert "worker-1 (worker:0 on 127.0.0.1" in result.stdout and "exited with code 3" in result.stdout
    assert "boom: bad learning rate" in result.stdout  # The tail of its log.
    assert result.stderr.strip().splitlines()[-1].startswith("error: run default-")
    assert "Traceback" not in result.stderr
    assert _cluster_processes(cli) == []


def test_ctrl_c_stops_every_worker(cli, sleeper):
    assert cli.run("up", "--workers", "3").returncode == 0
    launcher = cli.popen("train", "--script", str(sleeper))
    run_dir = wait_for(lambda: cli.runs() and cli.runs()[-1], 30, what="run folder")
    wait_for(lambda: len(_cluster_processes(cli)) >= 3, 30, what="workers running")
    launcher.send_signal(signal.SIGINT)
    output, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 1
    assert "stopped by Ctrl-C; no worker is left running" in output
    assert _cluster_processes(cli) == []
    assert json.loads((run_dir / "run.json").read_text())["outcome"] == "stopped"


def test_job_outlives_the_launcher_and_logs_follow_reattaches(cli, sleeper):
    cli.env["SLEEP"] = "4"
    assert cli.run("up", "--workers", "2").returncode == 0
    launcher = cli.popen("train", "--script", str(sleeper))
    wait_for(lambda: len(_cluster_processes(cli)) >= 2, 30, what="workers running")
    launcher.kill()  # The laptop goes away; the job does not.
    launcher.wait(timeout=10)
    assert "running" in cli.run("status").stdout
    follow = cli.run("logs", "--follow", timeout=60)
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert follow.stdout.count("finished") == 2 and "succeeded" in follow.stdout
    only_one = cli.run("logs", "--worker", "1")
    assert "worker-1" in only_one.stdout and "worker-0 " not in only_one.stdout


def test_stop_and_down_leave_no_process(cli, sleeper):
    assert cli.run("up", "--workers", "3").returncode == 0
    launcher = cli.popen("train", "--script", str(sleeper))
    try:
        wait_for(lambda: len(_cluster_processes(cli)) >= 3, 30, what="workers running")
        assert "error: a run is still active" in cli.run("train", "--script", str(sleeper)).stderr
        down = cli.run("down", timeout=60)
        assert down.returncode == 0, down.stderr
        assert "verified that no worker process is left" in down.stdout
    finally:
        launcher.kill()
        launcher.wait(timeout=10)
    assert cli.cluster() is None
