"""End to end on the embedded local cluster, through the invoke CLI, with real MWMS workers."""

from __future__ import annotations

import hashlib
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

from tests.conftest import REPO, assert_stopped_by, events_of, run_on_terminal, stop_while_attached, wait_for
from tests.test_console import assert_console_folds_tensorflow_noise_and_logs_keep_it
from tests.test_throughput import check_run_speed, install_fake_nvidia_smi, tensorboard_scalars
from tfcluster.backends.local import processes_with_env
from tfcluster.commands import script_layout


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
    # The launcher's own imports, as Python reports each (-X importtime, on its stderr).
    result = cli.run("train", "--workers", "3", "--", "--epochs", "3", python_flags=("-X", "importtime"))
    assert result.returncode == 0, result.stdout + result.stderr
    imported = [line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")]
    assert "tfcluster.throughput" in imported and "rich" in imported, result.stderr[-2000:]
    assert not [name for name in imported if name.split(".")[0] in ("tensorflow", "tensorboard", "keras", "tf_keras")]
    # So nothing of TensorFlow's C++ logging comes from the launcher itself (workers' lines are folded).
    own = [line for line in (result.stdout + result.stderr).splitlines()
           if not line.startswith("import time:") and not re.match(r"worker-\d +│", line)]
    assert not [line for line in own if "absl" in line or re.match(r"[IWEF]\d{4} ", line)], own
    run_dir, run = cli.latest_run()
    summary = run["summary"]
    assert run["outcome"] == "succeeded"
    assert summary["replicas_in_sync"] == 3
    assert summary["last_epoch"] == 3
    assert summary["collective"] == "ring over gRPC (CPU)"  # The summary's row (tfcluster/collective.py).
    assert "replicas in sync" in result.stdout and "validation accuracy" in result.stdout
    assert_console_folds_tensorflow_noise_and_logs_keep_it(cli, result.stdout, workers=3)
    # Without a terminal, the progress is one line per epoch: its metrics, the speed, the time left.
    ends = re.findall(r"^worker-0 +│ epoch (\d)/3  accuracy .* · \d[\d,]* images/s · ETA (\d+)m(\d\d)s$", result.stdout,
                      re.M)
    assert [int(epoch) for epoch, _, _ in ends] == [1, 2, 3], result.stdout[-4000:]
    left = [int(minutes) * 60 + int(seconds) for _, minutes, seconds in ends]
    assert left[0] >= left[1] >= left[2] == 0 and left[0] > 0, left

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
        # No GPU: TensorFlow's ring, asked for by name (trainer/collective.py).
        assert (strategy["collective"], strategy["communication"]) == ("ring", "RING")
    assert tasks == {("chief", 0), ("worker", 0), ("worker", 1)}
    assert ("precision float32 (auto: no GPU), all-reduce RING (auto: no GPU), XLA off, 1 step(s) per execution, "
            "training data cached in memory") \
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
    # 1 replica and x sqrt(3) on 3, reached after the default one-epoch warm-up from 0 (2+ replicas),
    # then the default cosine decay to 0 at the last step, in the header, the summary and each epoch's end.
    assert one_run["summary"]["learning_rate"]["effective"] == 2e-3
    assert one_run["summary"]["learning_rate"]["warmup_steps"] == 0  # One replica: nothing to ramp.
    plan = summary["learning_rate"]
    assert plan["effective"] == pytest.approx(2e-3 * 3 ** 0.5) and plan["schedule"] == "cosine"
    steps = 1280 // 96
    assert (plan["warmup_steps"], plan["decay_steps"]) == (steps, 2 * steps)
    schedule = f"learning rate 0.003464 (adam, sqrt: 0.002 at batch 32 x 1 replica, x sqrt(3 replicas); warm-up " \
               f"from 0 over 1 epochs ({steps} steps)), then cosine decay to 0 over {2 * steps} steps"
    assert schedule in result.stdout  # The header.
    assert re.search(rf"│ learning rate +│ {re.escape(schedule.removeprefix('learning rate '))}", result.stdout)
    ends = [e for e in events_of((run_dir / "worker-0.log").read_text()) if e["event"] == "epoch_end"]

    def rate(step: int) -> float:  # tf_keras's CosineDecay with its linear warm-up.
        if step < steps:
            return plan["effective"] * step / steps
        return plan["effective"] * 0.5 * (1 + math.cos(math.pi * (step - steps) / (2 * steps)))

    assert [e["learning_rate"] for e in ends] == [pytest.approx(rate(e["epoch"] * steps - 1), rel=1e-4) for e in ends]
    # Validation is one pass over the whole held-out split each epoch: 320 images, the last batches
    # partial and uneven (16 shards over 3 workers), each scored once (each worker counts its own).
    scored = [[e["held_out_images"] for e in events_of((run_dir / f"worker-{index}.log").read_text())
               if e["event"] == "epoch_end"] for index in range(3)]
    assert [sum(epoch) for epoch in zip(*scored)] == [320] * 3, scored
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
folders = [os.path.isdir(os.environ[key]) for key in ("AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR")]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
task = json.loads(os.environ["TF_CONFIG"])["task"]
print("USER", task["type"], task["index"], strategy.num_replicas_in_sync, sys.argv[1:], "folders", folders, flush=True)
if task["type"] == "chief":  # As on Vertex AI: save into AIP_MODEL_DIR, which exists.
    open(os.path.join(os.environ["AIP_MODEL_DIR"], "marker"), "w").write("chief")
    tf.saved_model.save(tf.Module(), os.environ["AIP_MODEL_DIR"])
"""


def test_user_script_gets_tf_config_and_arguments(cli, tmp_path):
    script = tmp_path / "my_train.py"
    script.write_text(USER_SCRIPT)
    assert cli.run("up", "--workers", "2").returncode == 0
    result = cli.run("train", "--script", str(script), "--", "--lr", "0.1")
    assert result.returncode == 0, result.stdout + result.stderr
    # Each found AIP_MODEL_DIR and its siblings made before it started.
    assert "USER chief 0 2 ['--lr', '0.1'] folders [True, True, True]" in result.stdout
    assert "USER worker 0 2 ['--lr', '0.1'] folders [True, True, True]" in result.stdout
    run_dir, run = cli.latest_run()
    assert (run_dir / "output" / "model" / "marker").read_text() == "chief"
    assert "n/a" in result.stdout  # No trainer events: the summary says what it does not know.
    assert re.search(r"│ replicas in sync +│ 2 ", result.stdout)  # But the layout its TF_CONFIG gave it (issue 47).
    # But it finds the model the script saved (no event names it).
    model = str(run_dir / "output" / "model")
    assert run["summary"]["saved_model_path"] == model and re.search(rf"│ model +│ {re.escape(model)} +│", result.stdout)

    # `exec --all` (issue 47): a command on every worker, in its folder (local: the run's), prefixed as the logs are.
    ran = cli.run("exec", "--all", "--", "pwd; cat output/model/marker")
    assert ran.returncode == 0 and ran.stdout.splitlines() == [
        f"worker-{i} │ {line}" for i in range(2) for line in (str(run_dir), "chief")], ran.stdout + ran.stderr
    failed = cli.run("exec", "--worker", "1", "--", "echo no such file >&2; exit 3")
    assert failed.returncode == 2 and failed.stderr.strip().splitlines() == [
        "error: the command failed on 1 of 1 worker(s): worker-1 (exit 3: no such file)"], failed.stderr
    shell = cli.run("ssh", "worker-1", "--", "pwd")
    assert shell.returncode == 0 and shell.stdout.strip() == str(run_dir), shell.stdout + shell.stderr


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


def test_a_detached_run_outlives_its_launcher_and_logs_follow_reattaches(cli, sleeper):
    """`train --detach` starts the run and returns at once (the laptop may go); `status` and
    `logs --follow` from any shell watch it to its end. (test_ssh_backend kills an attached launcher.)"""
    cli.env["SLEEP"] = "4"
    assert cli.run("up", "--workers", "2").returncode == 0
    refused = cli.run("train", "--detach", "--retries", "1", "--script", str(sleeper))
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "error: --retries needs the launcher attached (it restarts the workers after a failure); drop --detach, "
        "or --retries"], refused.stderr
    started = time.monotonic()
    detached = cli.run("train", "--detach", "--script", str(sleeper))
    assert detached.returncode == 0 and time.monotonic() - started < 30, detached.stdout + detached.stderr
    run_id = cli.latest_run()[1]["run_id"]
    assert f"✓ Run {run_id} started on 2 worker(s), detached. Follow it with `invoke logs --follow`" in detached.stdout
    wait_for(lambda: len(_cluster_processes(cli)) >= 2, 30, what="workers running")
    assert "running" in cli.run("status").stdout
    follow = cli.run("logs", "--follow", timeout=60)
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert follow.stdout.count("finished") == 2 and "succeeded" in follow.stdout
    only_one = cli.run("logs", "--worker", "1")
    assert "worker-1" in only_one.stdout and "worker-0 " not in only_one.stdout


def test_stop_and_down_win_over_an_attached_launcher(cli, sleeper):
    """`stop`, then `down`, from another shell while `train --retries 2` is attached: no retry, the
    launcher's one line names who stopped it and it exits 1, run.json says stopped, the command's ✓
    comes after the launcher exited, and no process is left."""
    assert cli.run("up", "--workers", "3").returncode == 0
    for command in ("stop", "down"):
        launcher = cli.popen("train", "--retries", "2", "--script", str(sleeper))
        try:
            wait_for(lambda: len(_cluster_processes(cli)) >= 3, 30, what="workers running")
            if command == "stop":
                assert "error: a run is still active" in cli.run("train", "--script", str(sleeper)).stderr
            said, output, exited, pid = stop_while_attached(cli, launcher, command)
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait(timeout=10)
        assert launcher.returncode == 1, output
        run_dir, run = cli.latest_run()
        assert_stopped_by(output, run["run_id"], command, pid)
        assert run["outcome"] == "stopped" and run["attempts"] == 1, run
        assert exited, f"`{command}` printed its ✓ before the launcher exited:\n{said}"
        assert "Traceback" not in output + said
        if command == "stop":
            assert f"✓ Run {run['run_id']} stopped; no worker is left running; its launcher (pid {launcher.pid}) " \
                "exited." in said, said
            status = cli.run("status").stdout
            assert "lost" not in status and status.count("stopped") >= 4, status  # The run and its 3 workers.
        else:
            assert "verified that no worker process is left" in said, said
    assert cli.cluster() is None
    assert _cluster_processes(cli) == []


TICKER = """
import time, tfcluster
for step in range(1, 41):
    tfcluster.progress(step, total=40)
    time.sleep(0.2)
"""


def test_the_live_line_and_status_show_where_the_run_is(cli, tmp_path):
    """On a terminal the launcher's live line says the step of steps, the speed and the ETA (not only
    until the first step); `status` from another shell shows each worker's last step and its age, the
    run's speed, ETA and cost so far."""
    script = tmp_path / "ticker.py"
    script.write_text(TICKER)
    assert cli.run("up", "--workers", "2").returncode == 0
    status = None

    def mid_run(screen: bytes) -> None:
        nonlocal status
        if status is None and re.search(rb"Training: step (1[2-9]|2\d)/40", screen):  # Mid-run, from another shell.
            status = cli.run("status")

    code, text = run_on_terminal(cli.argv("train", "--script", str(script)), cli.env, mid_run, timeout=120)
    assert code == 0, text[-3000:]
    assert re.search(r"Training: step (2\d|3\d)/40 · 0\.2\d* s/step · ETA 0m0\ds", text), text[-3000:]
    assert status is not None and status.returncode == 0, status and status.stderr
    rows = {line.split("│")[1].strip(): line for line in status.stdout.splitlines() if "│ worker-" in line}
    for row in rows.values():
        assert re.search(r"│ running +│ \d+ +│ - +│ step \d+/40 +│ 0m0\ds ago", row), status.stdout
    assert re.search(r"^now: step \d+/40 · 0\.2\d* s/step · ETA 0m\d\ds$", status.stdout, re.M), status.stdout
    assert "run cost so far: " in status.stdout


TUTORIAL_COUNT = """
import json, os
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config['cluster']['worker'])
global_batch_size = 64 * num_workers
"""


def test_a_short_worker_count_or_a_short_data_set_is_warned_once(cli, tmp_path):
    """Issue 47: TensorFlow's tutorial counts len(TF_CONFIG['cluster']['worker']), one short beside a
    chief (a global batch of 128 instead of 192 on three workers); the launcher says so, once."""
    assert cli.run("up", "--workers", "3").returncode == 0
    script = tmp_path / "tutorial.py"
    for text, said in [
        (TUTORIAL_COUNT, "! tutorial.py counts the workers as len(TF_CONFIG['cluster']['worker']), which is 2 on this "
                         "run of 3: TF_CONFIG names the chief apart (cluster: chief 1, worker 2)"),
        ("NUM_WORKERS = 2  # as the tutorial had it\n", "! tutorial.py sets NUM_WORKERS = 2, and this run has 3 workers"),
        ("NUM_WORKERS = 3\n", None)]:
        script.write_text(text)
        planned = cli.run("train", "--script", str(script), "--dry-run")
        assert planned.returncode == 0, planned.stdout + planned.stderr
        warned = [line for line in planned.stdout.splitlines() if line.startswith("! ")]
        assert (len(warned), warned[0].startswith(said) if said else True) == ((1, True) if said else (0, True)), \
            planned.stdout
    # The shipped example counts the chief (its docstring quotes the tutorial's count: code only is read).
    example = REPO / "examples" / "keras_script" / "train.py"
    assert script_layout.worker_count_note(example.name, example.read_text(), 3) is None

    # The bundled trainer on 49 images under a global batch of 96: one step an epoch, said once (issue 47).
    small = tmp_path / "small"
    small.mkdir()
    (small / "manifest.json").write_text(json.dumps({"counts": {"train": {"circle": 25, "square": 24}}}))
    cli.env["INVOKE_TFCLUSTER_DATA_DIR"] = str(small)
    planned = cli.run("train", "--dry-run")
    assert planned.returncode == 0 and [line for line in planned.stdout.splitlines() if line.startswith("! ")] == [
        "! the data has 49 training images and the global batch is 96 (32 x 3 replicas): an epoch is 1 step(s), too "
        "few to learn from; use a smaller --batch-size after `--`, fewer --workers, or more data"], planned.stdout
    assert not [line for line in cli.run("train", "--dry-run", "--", "--batch-size", "8").stdout.splitlines()
                if line.startswith("! ")]


def test_requirements_go_with_a_resumed_run(cli, tmp_path):
    """`train --requirements` on a local cluster installs once for the one interpreter; `train --resume`
    installs the same file again where it is missing (VMs made anew), here nothing: it says unchanged."""
    assert cli.run("up", "--workers", "2").returncode == 0
    wanted = tmp_path / "requirements.txt"
    wanted.write_text("# this script needs nothing beyond TensorFlow\n")
    digest = hashlib.sha256(wanted.read_bytes()).hexdigest()[:16]
    failing = tmp_path / "fails.py"
    failing.write_text("import sys\nprint('failing on purpose', flush=True)\nsys.exit(3)\n")
    first = cli.run("train", "--script", str(failing), "--requirements", str(wanted))
    assert first.returncode != 0 and \
        f"Requirements on all workers (one interpreter): installed (sha256 {digest})" in first.stdout, first.stdout
    run_id = cli.latest_run()[1]["run_id"]
    resumed = cli.run("train", "--resume", run_id)
    assert f"Requirements on all workers (one interpreter): unchanged (sha256 {digest}), nothing installed" \
        in resumed.stdout, resumed.stdout + resumed.stderr
