"""Throughput in every run summary: images/s (all workers and each), the median step time from the
shared measure, GPU utilisation from nvidia-smi, scaling efficiency, and the same in TensorBoard."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import events_of
from tfcluster import throughput
from tfcluster.config import Settings
from tfcluster.state import RunRecord, StateStore
from tfcluster.steptime import StepClock
from trainer import gpu

# Two workers, global batch 64 (32 each), steps of 0.1 s (worker 1: 0.125 s in epoch 2, as its own
# events report it), 20 steps per epoch, events every 5 steps.
STRATEGY = {"event": "strategy", "replicas_in_sync": 2, "local_replicas": 1, "global_batch": 64}


def _steps(seconds_per_step: dict[int, float]) -> list[dict]:
    """One worker's step events; ``seconds_per_step``: epoch -> its steady step time."""
    events, now, done = [], 0.0, 1
    for epoch, seconds in seconds_per_step.items():
        for step in (1, 5, 10, 15, 20) if epoch == 1 else (5, 10, 15, 20):
            now += seconds * ((epoch - 1) * 20 + step - done)
            done = (epoch - 1) * 20 + step
            events.append({"event": "first_step" if not events else "step", "time": now, "epoch": epoch,
                           "step": step, "steps": 20, "batch": 64})
    return events


def test_figures_per_epoch_and_per_worker_from_each_workers_step_events():
    meter = throughput.ThroughputMeter()
    for worker, timing in ((0, {1: 0.1, 2: 0.1}), (1, {1: 0.1, 2: 0.125})):
        meter.observe(worker, {**STRATEGY})
        for event in _steps(timing):
            meter.observe(worker, event)
        meter.observe(worker, {"event": "epoch_end", "epoch": 2, "gpu": {"utilization": 80.0 + worker}})
    summary = meter.summary()
    assert summary["global_batch"] == 64 and summary["median_step_seconds"] == pytest.approx(0.1)
    assert summary["global_images_per_second"] == pytest.approx(640)
    first, second = summary["epochs"]
    assert first == {"epoch": 1, "median_step_seconds": pytest.approx(0.1), "global_images_per_second": 640.0,
                     "per_worker_images_per_second": {"0": 320.0, "1": 320.0},
                     "wall_images_per_second": None, "per_worker_wall_images_per_second": {}}  # No epoch end.
    assert second["per_worker_images_per_second"] == {"0": 320.0, "1": 256.0}
    assert second["gpu_utilization"] == {"0": 80.0, "1": 81.0}


def test_wall_clock_counts_the_time_outside_the_steps_for_each_worker_by_its_own_events():
    """Steps of 0.1 s, then 0.5 s of validation after each epoch (the step rate does not see it);
    worker 1 also spends 1 s after its epoch 2 (a slow callback of its own)."""
    meter = throughput.ThroughputMeter()
    for worker in (0, 1):
        meter.observe(worker, {**STRATEGY})
        shift = 0.0
        for event in _steps({1: 0.1, 2: 0.1}):
            meter.observe(worker, {**event, "time": event["time"] + shift})
            if event["step"] == 20:
                shift += 0.5 + (1.0 if worker == 1 and event["epoch"] == 2 else 0.0)
                meter.observe(worker, {"event": "epoch_end", "epoch": event["epoch"], "time": event["time"] + shift})
    summary = meter.summary()
    assert summary["global_images_per_second"] == pytest.approx(640)  # At the median step: 64 / 0.1 s.
    # From the first step (1) to epoch 1's end: 19 steps in 1.9 + 0.5 s; epoch 2: 20 steps in 2.0 + 0.5 s.
    assert summary["wall_images_per_second"] == pytest.approx(round(39 * 64 / 4.9, 1))
    assert [e["wall_images_per_second"] for e in summary["epochs"]] == [pytest.approx(round(19 * 64 / 2.4, 1)),
                                                                       pytest.approx(round(20 * 64 / 2.5, 1))]
    # Each worker's share (half the batch) by its own events: worker 1's epoch 2 took 3.5 s.
    assert summary["per_worker_wall_images_per_second"] == {"0": pytest.approx(round(39 * 32 / 4.9, 1)),
                                                            "1": pytest.approx(round(39 * 32 / 5.9, 1))}
    assert summary["epochs"][1]["per_worker_wall_images_per_second"]["1"] == pytest.approx(round(20 * 32 / 3.5, 1))


def _record(store: StateStore, run_id: str, started: float, workers: int, config: dict, rate: float | None,
            outcome: str = "succeeded") -> None:
    store.save_run(RunRecord(run_id=run_id, cluster="default", workers=workers, command=[], retries=0,
                             started_at=started, outcome=outcome,
                             summary={"config": config, "throughput": {"global_images_per_second": rate}}))


def test_scaling_is_against_the_last_one_worker_run_of_the_same_configuration(tmp_path):
    store = StateStore(Settings(state_dir=str(tmp_path)))
    config = throughput.run_config({"model": "cnn", "image_size": 32, "batch_size": 32, "data": "abc",
                                    "args": "f00d", "gpus": ["Tesla T4"]}, "gcp", "n1-standard-8")
    assert config["gpus"] == "1 x Tesla T4"
    other_batch = {**config, "batch_size": 64}
    _record(store, "old", 1.0, 1, config, 100.0)
    _record(store, "last", 2.0, 1, config, 120.0)
    _record(store, "failed", 3.0, 1, config, 500.0, outcome="failed")
    _record(store, "bigger-batch", 4.0, 1, other_batch, 900.0)
    _record(store, "two-workers", 5.0, 2, config, 200.0)
    # A narrower, shallower model (--width 4 --depth 1): another hash of the trainer's flags.
    _record(store, "tiny-model", 6.0, 1, {**config, "args": "beef"}, 2000.0)
    reference = throughput.reference_run(store, config, exclude="now")
    assert reference.run_id == "last"
    figures = throughput.scaling(3, {"global_images_per_second": 270.0}, reference)
    assert figures == {"workers": 3, "efficiency": 0.75, "speedup": 2.25, "reference_run": "last",
                       "reference_images_per_second": 120.0}
    assert throughput.reference_run(store, {**config, "machine_type": "n1-standard-16"}, "now") is None
    assert throughput.scaling(1, {"global_images_per_second": 120.0}, reference) is None


def test_nvidia_smi_output_skips_what_a_gpu_cannot_report():
    # nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits
    assert gpu.parse("0, 87, 10240\n1, [N/A], 300\n2, 15, [Not Supported]\n") == {0: (87.0, 10240.0)}


FAKE_NVIDIA_SMI = """#!/bin/sh
# A stand-in for nvidia-smi (NVIDIA's nvidia-smi manual, --query-gpu): one CSV line per GPU with the
# fields in the order asked, no header and no units with --format=csv,noheader,nounits. An unknown
# field or a missing --format is refused with exit 2, as nvidia-smi does.
query=""; format=""
for arg in "$@"; do
  case "$arg" in
    --query-gpu=*) query="${arg#--query-gpu=}" ;;
    --format=*) format="${arg#--format=}" ;;
  esac
done
if [ "$query" != "index,utilization.gpu,memory.used" ] || [ "$format" != "csv,noheader,nounits" ]; then
  echo "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help." >&2
  exit 2
fi
echo "0, 87, 10240"
echo "1, 91, 10300"
"""


def install_fake_nvidia_smi(cli, folder: Path) -> None:
    """Puts on the test host's PATH (the local workers inherit the CLI's environment) an nvidia-smi
    reporting two GPUs at 87 % and 91 % (mean 89 %)."""
    folder.mkdir()
    (folder / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (folder / "nvidia-smi").chmod(0o755)
    cli.env["PATH"] = f"{folder}{os.pathsep}{cli.env['PATH']}"


def check_run_speed(run_dir: Path, run: dict, workers: int) -> None:
    """What every summary of the bundled trainer must show about speed (see tests/test_e2e_local.py)."""
    speed = run["summary"]["throughput"]
    assert speed["global_batch"] == 32 * workers
    # The median step time is the shared measure's, over the chief's own step events.
    clock = StepClock()
    for event in events_of((run_dir / "worker-0.log").read_text()):
        clock.observe(event)
    assert speed["median_step_seconds"] == pytest.approx(clock.median_step_seconds, abs=1e-5)
    assert speed["global_images_per_second"] == pytest.approx(32 * workers / clock.median_step_seconds, rel=1e-3)
    # By wall clock: the images after the first step over the seconds from it to the last epoch's end.
    chief = events_of((run_dir / "worker-0.log").read_text())
    first = next(e for e in chief if e["event"] == "first_step")
    last = [e for e in chief if e["event"] == "epoch_end"][-1]
    images = (last["epoch"] * first["steps"] - (first["epoch"] - 1) * first["steps"] - first["step"]) * 32 * workers
    assert speed["wall_images_per_second"] == pytest.approx(images / (last["time"] - first["time"]), rel=1e-3)
    assert sorted(speed["per_worker_wall_images_per_second"]) == [str(w) for w in range(workers)]
    for epoch in speed["epochs"]:
        assert sorted(epoch["per_worker_images_per_second"]) == [str(w) for w in range(workers)]
        assert sorted(epoch["per_worker_wall_images_per_second"]) == [str(w) for w in range(workers)]
        # Each worker sampled the nvidia-smi on its PATH: the mean of 87 % and 91 %.
        assert epoch["gpu_utilization"] == {str(w): 89.0 for w in range(workers)}


def tensorboard_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(logdir))
    accumulator.Reload()
    return {tag: [(e.step, round(e.value, 3)) for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def test_gpu_sampler_reads_the_nvidia_smi_on_the_path(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (folder / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    sampler = gpu.GpuSampler.start_if_available()
    try:
        epoch = sampler.take_epoch()  # At least one sample: taken now if the thread has none yet.
    finally:
        sampler.stop()
    assert epoch["utilization"] == 89.0 and epoch["per_gpu"] == {"0": 87.0, "1": 91.0}
    assert epoch["memory_used_mib"] == {"0": 10240.0, "1": 10300.0} and epoch["samples"] >= 1
    # An nvidia-smi that refuses the query (no driver loaded), or none at all: no sampler.
    refusing = tmp_path / "refusing"
    refusing.mkdir()
    (refusing / "nvidia-smi").write_text(  # What nvidia-smi says, exit 9, on a machine whose driver is not up.
        "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\"\nexit 9\n")
    (refusing / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{refusing}{os.pathsep}{os.environ['PATH']}")
    assert gpu.GpuSampler.start_if_available() is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpu.GpuSampler.start_if_available() is None


def test_the_pace_says_where_a_run_is_and_when_it_ends():
    """tfcluster/pace.py: the trainer's epochs and steps, and a script's step of its total."""
    from tfcluster.commands.run_view import pace_after_epoch as _pace_after_epoch
    from tfcluster.pace import of_events

    trainer = [{"event": "epoch_begin", "epoch": 1, "epochs": 3, "time": 0.0},
               {"event": "first_step", "epoch": 1, "step": 1, "steps": 100, "batch": 64, "time": 10.0},
               *({"event": "step", "epoch": 1, "step": step, "steps": 100, "batch": 64, "time": 10.0 + (step - 1) * 0.5}
                 for step in range(11, 101, 10))]
    pace = of_events(trainer)
    # 0.5 s a step, 64 images a step; left: 9 steps of epoch 1 (the last event was step 91), then 2 x 100.
    assert pace.line() == "epoch 1/3 · step 91/100 · 128 images/s · ETA 1m44s"
    pace.observe({"event": "epoch_end", "epoch": 1, "epochs": 3, "time": 60.0})
    assert pace.position() == "epoch 1/3 · step 100/100" and pace.eta_seconds() == 100.0
    assert _pace_after_epoch(pace) == "  · 128 images/s · ETA 1m40s"
    script = of_events([{"event": "progress", "step": step, "total": 40, "time": step * 2.0} for step in (1, 2, 3, 4)])
    assert script.line() == "step 4/40 · 2 s/step · ETA 1m12s" and script.line(eta=False) == "step 4/40 · 2 s/step"
    assert of_events([]).line() == "" and of_events([]).eta_seconds() is None


def test_the_throughput_event_file_is_written_without_tensorflow_and_read_by_it(tmp_path):
    """The launcher's own event file (tfcluster/throughput.py): TensorFlow's record reader checks its
    CRCs and protobufs, and TensorBoard finds every scalar; no TensorFlow was needed to write it."""
    import subprocess
    import sys

    script = ("import sys; from pathlib import Path; from tfcluster import throughput; "
              f"throughput.write_tensorboard(Path({str(tmp_path)!r}), [('throughput/global_images_per_second', 1, 812.5), "
              "('throughput/global_images_per_second', 2, 900.0), ('gpu/worker_0_utilization_percent', 1, 55.0)]); "
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorboard')))")
    written = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parent.parent)
    assert written.stdout.strip() == "[]" and written.stderr == ""
    [path] = tmp_path.iterdir()
    assert path.name.startswith("events.out.tfevents.")
    import tensorflow as tf

    read = [(event.file_version, event.step, [(v.tag, v.simple_value) for v in event.summary.value])
            for event in tf.compat.v1.train.summary_iterator(str(path))]
    assert read[0][0] == "brain.Event:2" and [(step, values) for _, step, values in read[1:]] == [
        (1, [("throughput/global_images_per_second", 812.5)]), (2, [("throughput/global_images_per_second", 900.0)]),
        (1, [("gpu/worker_0_utilization_percent", 55.0)])]
    assert tensorboard_scalars(tmp_path) == {"throughput/global_images_per_second": [(1, 812.5), (2, 900.0)],
                                             "gpu/worker_0_utilization_percent": [(1, 55.0)]}


def _keras_epoch(steps: int, ms: int) -> str:
    """A worker's log line for one epoch of tf_keras's bar (verbose=1): its redraws, then the final state."""
    return (f"\r1/{steps} [>.............................] - ETA: 3s - loss: 1.3863" + "\b" * 60
            + f"\r{steps}/{steps} [==============================] - 1s {ms}ms/step - loss: 0.7251")


def test_a_scripts_summary_has_its_speed_and_learning_rate_from_its_keras_bars_and_its_code(monkeypatch):
    """Issue 47: a `--script` run's summary said n/a for the learning rate and the throughput. The
    script reports neither; its code gives the global batch and the rate, its Keras bars the step time."""
    from types import SimpleNamespace

    from tfcluster import launch, ui
    from tfcluster.commands import run_summary, run_view, script_facts

    example = (Path(__file__).parents[1] / "examples" / "keras_script" / "train.py").read_text()
    facts = script_facts.read(example, ["--epochs", "2", "--per-worker-batch=32"], workers=3, replicas=3)
    assert facts["global_batch"] == 96  # args.per_worker_batch x every task of TF_CONFIG's cluster.
    assert facts["learning_rate"] == {
        "value": 0.001, "text": "0.001 (the script's SGD(learning_rate=0.001), read from its code)"}
    tutorial = ("import json, os\nimport tensorflow as tf\ntf_config = json.loads(os.environ['TF_CONFIG'])\n"
                "num_workers = len(tf_config['cluster']['worker'])\nBATCH = 64\n"
                "ds = make().batch(BATCH * num_workers)\nmodel.compile(optimizer='adam')\n")
    assert script_facts.read(tutorial, [], workers=3, replicas=3) == {  # The tutorial's one short.
        "global_batch": 128, "learning_rate": {"value": 0.001, "text": "0.001 (Keras's default for "
                                               "optimizer='adam', read from the script's code)"}}
    unknown = "ds = make().batch(size_from_a_file())\nopt = tf.keras.optimizers.Adam(learning_rate=schedule)\n"
    assert script_facts.read(unknown, [], 2, 2) == {"global_batch": None, "learning_rate": {
        "text": "n/a: the script's Adam(learning_rate=schedule) is known only as it runs"}}

    plans = [SimpleNamespace(index=index, name=f"worker-{index}") for index in range(2)]
    progress = launch.Progress()
    view = run_view.RunView(plans, meter=progress.throughput)
    with ui.console.capture():
        for ms in (200, 100, 120):  # Three epochs; worker 1 a little slower in the second.
            for plan in plans:
                view.line(plan, "Epoch 1/3")
                view.line(plan, _keras_epoch(20, ms + 25 * plan.index * (ms == 100)))
    progress.throughput.global_batch = facts["global_batch"]
    speed = progress.throughput.summary()
    assert speed["median_step_seconds"] == 0.12 and speed["global_images_per_second"] == 800.0  # 96 / 0.12 s.
    assert speed["per_worker_images_per_second"] == {"0": 400.0, "1": 384.0}  # 48 each / its median 0.12, 0.125 s.
    assert [(e["epoch"], e["median_step_seconds"], e["per_worker_images_per_second"]["1"])
            for e in speed["epochs"]] == [(1, 0.2, 240.0), (2, 0.1, 384.0), (3, 0.12, 400.0)]
    monkeypatch.setattr(ui.console, "width", 250)  # One line per row.
    run = RunRecord(run_id="default-1", cluster="default", workers=2, command=[], retries=0, outcome="succeeded",
                    summary={"throughput": speed, "learning_rate": facts["learning_rate"], "script": facts})
    with ui.console.capture() as captured:
        run_summary.print_summary(run, progress, 10.0)
    table = captured.get()
    assert "0.001 (the script's SGD(learning_rate=0.001)" in table, table
    assert "800 at the median step (120.0 ms) by Keras's time per step, global batch 96" in table, table
    assert "n/a" not in table.split("throughput")[1].split("\n")[0]

    progress.throughput.global_batch = None  # A batch its code does not give: steps/s, and why.
    run.summary.update(throughput=progress.throughput.summary(), learning_rate=None)
    with ui.console.capture() as captured:
        run_summary.print_summary(run, progress, 10.0)
    assert "8.33 steps/s (120 ms/step, Keras's); images/s needs the global batch" in captured.get()
    assert "n/a (the script's code names no optimizer" in captured.get()
