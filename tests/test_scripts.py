"""User scripts, written the way TensorFlow's tutorials write them, run unchanged with `train --script`
on real local workers (tests/scripts/): 3 where the script counts workers, 2 where a third would prove
nothing more. Keras 3's fit fails there (keras-team/keras#20585) and the
failure message says so, with the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "scripts"
REPLICAS = re.compile(r"^(worker-\d+) +│ .*replicas in sync: (\d+)", re.M)
# A TensorFlow C++ log line (absl format) or absl's preamble, after the console's worker prefix.
CPP_IN_CONSOLE = re.compile(r"│ ([IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\]|WARNING: All log messages before absl)")


def _train(cli, script: str, *args: str, workers: int = 3):
    assert cli.run("up", "--workers", str(workers)).returncode == 0
    return cli.run("train", "--script", str(SCRIPTS / script), *args, timeout=240)


@pytest.mark.parametrize("script, args, every_worker_prints, workers", [
    # TensorFlow's multi-worker tutorial: tf.keras model compiled in strategy.scope(), then fit.
    ("tutorial_fit.py", [], "fit done, loss", 2),
    # Keras 3 with a custom loop (strategy.run) works, under --keras 3. It also shows everything.
    ("keras3_custom_loop.py", ["--keras", "3", "--verbose"], "custom loop done", 2),
    ("tf_keras_fit.py", [], "tf_keras fit done", 2),
    # Counts the chief job and both tasks of the worker job: 3 workers.
    ("tf_config_count.py", [], "of 3 workers", 3),
    ("datasets_from_function.py", [], "distributed fit done", 2),
    ("chief_saves.py", [], "replicas in sync: 2", 2),
], ids=["tutorial-fit", "keras3-custom-loop", "tf-keras", "tf-config", "datasets-from-function",
        "chief-saves"])
def test_script_runs_unchanged_on_every_worker(cli, script, args, every_worker_prints, workers):
    result = _train(cli, script, *args, workers=workers)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-2000:]
    names = [f"worker-{index}" for index in range(workers)]
    # Every worker joined one collective of all the replicas, as each printed.
    assert dict(REPLICAS.findall(out)) == {name: str(workers) for name in names}, out[-3000:]
    for worker in names:
        assert re.search(rf"^{worker} +│ .*{re.escape(every_worker_prints)}", out, re.M), (worker, out[-3000:])
    # The console folds TensorFlow's C++ noise unless --verbose; the logs keep it either way.
    assert bool(CPP_IN_CONSOLE.search(out)) == ("--verbose" in args), out[-3000:]
    run_dir, run = cli.latest_run()
    assert run["outcome"] == "succeeded"
    assert "failed call to cuInit" in (run_dir / f"{names[-1]}.log").read_text()

    if script == "tutorial_fit.py":  # Issue 47: its summary's rate and speed, not n/a (commands/script_facts.py).
        assert run["summary"]["learning_rate"]["text"].startswith("0.01 (Keras's default for optimizer='sgd'")
        speed = run["summary"]["throughput"]
        assert speed["global_batch"] == 16 and speed["global_images_per_second"] > 0, speed  # 8 x 2 replicas.
        assert [record["epoch"] for record in speed["epochs"]] == [1, 2], speed
        assert re.search(r"│ throughput +│ \d+ at the median step", out), out[-3000:]
    if script == "keras3_custom_loop.py":
        assert out.count("tf.keras is keras: True replicas in sync: 2") == 2  # Keras 3, not tf_keras.
    if script == "tf_config_count.py":
        for task in ("chief:0", "worker:0", "worker:1"):
            assert f"{task} of 3 workers" in out
        assert "first global batch sums to 66" in out  # 0+..+11: a global batch of 4 x 3 workers.
    if script == "datasets_from_function.py":
        assert sorted(re.findall(r"input pipeline (\d) of 2", out)) == ["0", "1"]
    if script == "chief_saves.py":
        assert out.count("removed temp dir") == 1 and out.count("chief saved") == 1
        model_dir = run_dir / "output" / "model"
        assert sorted(p.name for p in model_dir.iterdir()) == ["model.keras"]  # No workertemp_* left.


def test_keras3_fit_fails_and_the_message_names_the_cause_and_the_fix(cli):
    result = _train(cli, "tutorial_fit.py", "--keras", "3", workers=2)  # Fails with any 2 or more.
    assert result.returncode == 1, result.stdout[-3000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: run default-") and "keras-team/keras#20585" in error, result.stderr
    assert "--keras 2" in error and "strategy.run" in error
    assert "Traceback" not in result.stderr
    # The console shows the traceback and one line with the cause, besides the log tail.
    assert "Traceback (most recent call last)" in result.stdout
    assert "Attempt to convert a value (PerReplica" in result.stdout
    assert len(re.findall(r"^Cause: .*keras#20585", result.stdout, re.M)) == 1, result.stdout[-3000:]


def test_the_script_helper_scales_as_the_bundled_trainer_does(monkeypatch):
    """tfcluster.scaled_learning_rate (staged beside a script, standard library only) and trainer/lr.py
    (the bundled trainer's) give the same rate for every optimiser, rule and replica count; the
    replicas default to TFCLUSTER_REPLICAS, what the launcher puts in each worker's environment."""
    import tfcluster
    from trainer import lr

    for replicas in (1, 2, 3, 8):
        for optimizer in lr.OPTIMIZERS:
            for rule in (None, *lr.RULES):
                ours = lr.plan(optimizer, 0.01, rule, replicas, 32, 0, 10).effective
                assert tfcluster.scaled_learning_rate(0.01, optimizer, replicas, rule) == pytest.approx(ours)
    monkeypatch.setenv("TFCLUSTER_REPLICAS", "4")
    assert tfcluster.scaled_learning_rate(0.1, "sgd") == pytest.approx(0.4)
    assert tfcluster.scaled_learning_rate(1e-3, "adam") == pytest.approx(2e-3)
    with pytest.raises(ValueError, match="optimizer one of adam, adamw, rmsprop, sgd"):
        tfcluster.scaled_learning_rate(0.1, "adagrad")
