"""`invoke tune`: Keras Tuner's distributed mode on the cluster, with real oracle and tuner processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import Cli, events_of, wait_for
from tests.hostlab import HostLab, available
from tfcluster.backends.local import processes_with_env

FAST = ["--", "--epochs", "1", "--steps-per-epoch", "5"]


def _left_running(cli) -> list:
    cluster = cli.cluster()
    return processes_with_env(f"TFCLUSTER_CLUSTER_ID={cluster['cluster_id']}") if cluster else []


def _oracle_events(run_dir: Path) -> list[dict]:
    return events_of((run_dir / "oracle.log").read_text())


def _completed(run: dict) -> list[dict]:
    return [t for t in run["summary"]["trials"] if t["status"] == "COMPLETED"]


def _check_search(result, run_dir: Path, run: dict, trials: int, tuners: int) -> dict:
    """What every successful search must show; returns best.json."""
    assert result.returncode == 0, result.stdout + result.stderr
    assert run["kind"] == "tune" and run["outcome"] == "succeeded"
    completed = _completed(run)
    assert len({t["trial_id"] for t in completed}) == trials == len(run["summary"]["trials"])
    # Every tuner ran at least one trial, and nothing else did.
    assert {t["tuner"] for t in completed} == {f"tuner{i}" for i in range(tuners)}
    assert result.stdout.count("✓ trial ") == trials  # One live line per finished trial.
    # The oracle ran as Keras Tuner's chief, on the port the launcher gave it.
    ready = [e for e in _oracle_events(run_dir) if e["event"] == "oracle_ready"]
    assert len(ready) == 1 and ready[0]["port"] == run["oracle_port"]
    best = json.loads((run_dir / "best.json").read_text())
    scores = [t["score"] for t in completed]
    assert best["score"] == max(scores) and best["objective"] == "val_accuracy"
    assert best["trial_id"] == run["summary"]["best_trial"]
    return best


def _loads(model: str) -> None:
    check = textwrap.dedent(f"""
        import os, numpy as np
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        import tf_keras
        model = tf_keras.models.load_model({model!r})
        p = model.predict(np.zeros((2, 32, 32, 3), np.float32), verbose=0)
        assert p.shape == (2, 4), p.shape
        print("ok")
    """)
    loaded = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert loaded.stdout.strip().endswith("ok"), loaded.stderr[-2000:]


def test_three_local_tuners_run_six_trials(cli):
    assert cli.run("up", "--workers", "3").returncode == 0
    result = cli.run("tune", "--max-trials", "6", *FAST)
    run_dir, run = cli.latest_run()
    best = _check_search(result, run_dir, run, trials=6, tuners=3)
    # The best trial's own checkpoint, its hyperparameters, and the command that trains with them.
    assert Path(best["model"]).is_relative_to(run_dir) and Path(best["model"]).is_file()
    _loads(best["model"])
    assert set(best["hyperparameters"]) == {"learning_rate", "batch_size", "width", "depth", "dropout"}
    assert best["train_command"].startswith("invoke train -- ") and "--learning-rate" in best["train_command"]
    assert best["train_command"] in result.stdout
    assert "sorted by val_accuracy" in result.stdout

    status = cli.run("status")
    assert "trials: 6 done, 0 running, 0 left" in status.stdout and "oracle" in status.stdout
    one = cli.run("logs", "--worker", "1")
    assert "worker-1" in one.stdout and "worker-0 " not in one.stdout and "oracle " not in one.stdout
    assert _left_running(cli) == []


def test_dry_run_prints_every_process_and_starts_nothing(cli):
    assert cli.run("up", "--workers", "2").returncode == 0
    result = cli.run("tune", "--dry-run", "--max-trials", "4")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("KERASTUNER_ORACLE_PORT=") == 3  # 2 tuners + the oracle.
    for tuner_id in ("chief", "tuner0", "tuner1"):
        assert f"KERASTUNER_TUNER_ID={tuner_id}" in result.stdout
    assert "TF_CONFIG" not in result.stdout and "-m trainer.tune" in result.stdout
    assert cli.runs() == [] and _left_running(cli) == []


def test_killed_tuner_restarts_and_gets_its_trial_again(cli):
    assert cli.run("up", "--workers", "3").returncode == 0
    launcher = cli.popen("tune", "--max-trials", "4", "--retries", "1", "--",
                         "--epochs", "2", "--steps-per-epoch", "15")
    try:
        run_dir = wait_for(lambda: cli.runs() and cli.runs()[-1], 60, what="run folder")

        def tuner1_trial():
            log = run_dir / "oracle.log"
            starts = [e for e in events_of(log.read_text() if log.exists() else "")
                      if e["event"] == "trial_start" and e["tuner_id"] == "tuner1"]
            return starts and starts[0]["trial_id"]

        victim_trial = wait_for(tuner1_trial, 180, what="tuner1's first trial")
        os.kill(int((run_dir / "worker-1.attempt1.pid").read_text()), signal.SIGKILL)
        output, _ = launcher.communicate(timeout=400)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, output
    assert "worker-1 (tuner1 on 127.0.0.1) was killed by SIGKILL" in output
    assert f"tuner1 on worker-1; the oracle hands it trial {victim_trial} again" in output
    run = json.loads((run_dir / "run.json").read_text())
    assert run["attempt_of"]["worker-1"] == 2 and run["attempt_of"]["oracle"] == 1
    # The killed trial was handed to tuner1 again, ran to completion once, and all 4 trials completed.
    events = _oracle_events(run_dir)
    starts = [e["tuner_id"] for e in events if e["event"] == "trial_start" and e["trial_id"] == victim_trial]
    ends = [e for e in events if e["event"] == "trial_end" and e["trial_id"] == victim_trial]
    assert starts == ["tuner1", "tuner1"] and [e["status"] for e in ends] == ["COMPLETED"]
    assert len({t["trial_id"] for t in _completed(run)}) == 4
    assert json.loads((run_dir / "best.json").read_text())["score"] is not None
    assert _left_running(cli) == []


def test_launcher_gone_status_shows_trials_and_stop_ends_the_search(cli):
    assert cli.run("up", "--workers", "2").returncode == 0
    # Trials long enough that none ends between the second trial's start and `status`, however
    # loaded the machine (with 30 steps an epoch, one did under CI's 4 workers); `stop` ends them.
    launcher = cli.popen("tune", "--max-trials", "8", "--", "--epochs", "3", "--steps-per-epoch", "3000")
    run_dir = wait_for(lambda: cli.runs() and cli.runs()[-1], 60, what="run folder")
    log = run_dir / "oracle.log"
    wait_for(lambda: log.exists() and sum(e["event"] == "trial_start" for e in events_of(log.read_text())) == 2,
             120, what="both tuners' first trials")
    launcher.kill()  # The laptop goes away; the search does not.
    launcher.wait(timeout=10)
    status = cli.run("status")
    assert "running" in status.stdout and "trials: 0 done, 2 running, 6 left" in status.stdout, status.stdout
    stop = cli.run("stop", timeout=120)
    assert stop.returncode == 0 and "no worker is left running" in stop.stdout
    assert _left_running(cli) == []


USER_SEARCH = '''
"""In the style of the Keras Tuner distributed-tuning guide; makes its own data (nothing downloads)."""
import keras
import keras_tuner
import numpy as np


def build_model(hp):
    model = keras.Sequential([
        keras.layers.Input((8,)),
        keras.layers.Dense(hp.Int("units", min_value=4, max_value=32, step=4), activation="relu"),
        keras.layers.Dense(1, activation="sigmoid"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(hp.Float("lr", 1e-3, 1e-1, sampling="log")),
                  loss="binary_crossentropy", metrics=["accuracy"])
    return model


rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x[:, 0] + x[:, 1] > 0).astype("float32")
tuner = keras_tuner.RandomSearch(build_model, objective="val_accuracy", max_trials=4, seed=7,
                                 overwrite=False, directory="results_dir", project_name="my_search")
tuner.search(x, y, epochs=2, validation_split=0.25, verbose=2)
'''


def test_users_own_keras_tuner_script(cli, tmp_path):
    script = tmp_path / "my_search.py"
    script.write_text(USER_SEARCH)
    assert cli.run("up", "--workers", "2").returncode == 0
    result = cli.run("tune", "--script", str(script))
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir, run = cli.latest_run()
    completed = _completed(run)
    assert len({t["trial_id"] for t in completed}) == 4 and {t["tuner"] for t in completed} == {"tuner0", "tuner1"}
    best = json.loads((run_dir / "best.json").read_text())
    assert set(best["hyperparameters"]) == {"units", "lr"} and best["train_command"] is None
    # The script's relative directory is the shared folder; Keras 3's checkpoint of the best trial is there.
    assert Path(best["trial_dir"]) == (run_dir / "tune" / "results_dir" / "my_search" / f"trial_{best['trial_id']}")
    assert (Path(best["trial_dir"]) / "checkpoint.weights.h5").is_file()
    assert _left_running(cli) == []


NO_SEARCH = "import keras_tuner\nprint('built nothing')\n"
FIXED_ONLY = USER_SEARCH.replace('hp.Int("units", min_value=4, max_value=32, step=4)', 'hp.Fixed("units", 8)') \
    .replace('hp.Float("lr", 1e-3, 1e-1, sampling="log")', 'hp.Fixed("lr", 0.01)')


def _one_error_line(result, text: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_bad_input_is_one_error_line(cli, tmp_path):
    assert cli.run("up", "--workers", "1").returncode == 0
    _one_error_line(cli.run("tune", "--max-trials", "0"), "--max-trials must be a whole number >= 1 (got 0)")
    assert cli.runs() == []

    pinned = cli.run("tune", "--", "--learning-rate", "0.01", "--batch-size", "32", "--width", "16",
                     "--depth", "2", "--dropout", "0.1")
    _one_error_line(pinned, "every hyperparameter of the bundled search space is pinned")

    never = tmp_path / "never.py"
    never.write_text(NO_SEARCH)
    _one_error_line(cli.run("tune", "--script", str(never)), "never.py finished without calling tuner.search()")

    fixed = tmp_path / "fixed.py"
    fixed.write_text(FIXED_ONLY)
    _one_error_line(cli.run("tune", "--script", str(fixed)), "the search space has no tunable value")
    assert _left_running(cli) == []


# ------------------------------------------------------------ ssh namespace hosts

@pytest.mark.skipif(available() is not None, reason=f"test hosts: {available()}")
def test_three_ssh_hosts_search_and_the_best_checkpoint_comes_back(tmp_path, synthetic_data):
    lab = HostLab(tmp_path / "lab", 3)
    cli = Cli(tmp_path / "state", synthetic_data)
    remote = tmp_path / "remote"
    cli.env.update({
        "INVOKE_TFCLUSTER_BACKEND": "ssh", "INVOKE_TFCLUSTER_HOSTS": ",".join(h.address for h in lab.hosts),
        "INVOKE_TFCLUSTER_SSH_KEY": str(lab.client_key), "INVOKE_TFCLUSTER_KNOWN_HOSTS": str(lab.known_hosts),
        "INVOKE_TFCLUSTER_PYTHON": sys.executable, "INVOKE_TFCLUSTER_REMOTE_DIR": str(remote)})
    try:
        up = cli.run("up")
        assert up.returncode == 0, up.stdout + up.stderr
        result = cli.run("tune", "--max-trials", "6", *FAST, timeout=400)
        run_dir, run = cli.latest_run()
        best = _check_search(result, run_dir, run, trials=6, tuners=3)
        ready = [e for e in _oracle_events(run_dir) if e["event"] == "oracle_ready"][0]
        assert ready["address"] == lab.hosts[0].address and ready["port"] == 23457
        # Each trial's checkpoint was written on its tuner's host, then gathered into the local run folder.
        for trial in _completed(run):
            index = int(trial["tuner"].removeprefix("tuner"))
            on_host = remote / "default" / "runs" / run["run_id"] / f"worker-{index}" / "tune" / "search"
            assert (on_host / f"trial_{trial['trial_id']}" / "model.keras").is_file()
            assert (run_dir / "tune" / "search" / f"trial_{trial['trial_id']}" / "model.keras").is_file()
        assert Path(best["model"]) == run_dir / "tune" / "search" / f"trial_{best['trial_id']}" / "model.keras"
        _loads(best["model"])
        assert (run_dir / "oracle.log").is_file() and (run_dir / "worker-2.log").is_file()
    finally:
        if cli.cluster() is not None:
            cli.run("down", timeout=120)
        lab.teardown()


def test_a_suggested_command_says_each_value_as_a_person_writes_it():
    """Issue 47: `tune` suggested `--dropout 0.30000000000000004` (Keras Tuner's 0.1 steps)."""
    from tfcluster.commands.tune_loop import _flag_value

    assert [_flag_value(value) for value in (0.1 * 3, 0.0012345678, 2e-3, 32, 0.5)] == [
        "0.3", "0.0012345678", "0.002", "32", "0.5"]
